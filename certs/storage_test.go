package certs

import (
	"context"
	"errors"
	"io/fs"
	"slices"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

func fakeConsul(t *testing.T, c *fakecluster.Cluster, replica string) *consulroute.Client {
	t.Helper()
	cl, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica(replica))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

func newTestStorage(t *testing.T, cl *consulroute.Client, replica string) *Storage {
	t.Helper()
	locks, err := cl.NewMutexes(consulroute.TLSKVPrefix+"locks/", replica)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = locks.Close(context.Background()) })
	s, err := NewStorage(cl, consulroute.TLSStorePrefix, locks)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The store keeps certmagic's file-system semantics over KV: missing keys
// are fs.ErrNotExist, directories are key prefixes at a "/", a delete
// takes a directory whole and not its namesakes.
func TestStorageSemantics(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	s := newTestStorage(t, fakeConsul(t, c, "r1"), "r1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	files := map[string]string{
		"acme/ca/users/me/me.key":           "account key",
		"certificates/ca/a.com/a.com.crt":   "crt",
		"certificates/ca/a.com/a.com.key":   "key",
		"certificates/ca/a.com/a.com.json":  "{}",
		"certificates/ca/a.co/a.co.crt":     "crt",
		"certificates/ca/a.comx/a.comx.crt": "crt",
	}
	for k, v := range files {
		if err := s.Store(ctx, k, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := s.Load(ctx, "certificates/ca/a.com/a.com.key"); err != nil || string(b) != "key" {
		t.Fatalf("load: %q, %v", b, err)
	}
	if _, err := s.Load(ctx, "certificates/ca/none.crt"); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("load a missing key: %v, want fs.ErrNotExist", err)
	}
	for k, want := range map[string]bool{"certificates/ca/a.com": true, "certificates/ca/a.com/a.com.crt": true, "certificates/ca/a": false, "nothing": false} {
		if got := s.Exists(ctx, k); got != want {
			t.Errorf("Exists(%s) = %v, want %v", k, got, want)
		}
	}
	list, err := s.List(ctx, "certificates/ca", false)
	if want := []string{"certificates/ca/a.co", "certificates/ca/a.com", "certificates/ca/a.comx"}; err != nil || !slices.Equal(list, want) {
		t.Errorf("List one level: %v, %v; want %v", list, err, want)
	}
	list, err = s.List(ctx, "certificates/ca/a.com", true)
	if want := []string{"certificates/ca/a.com/a.com.crt", "certificates/ca/a.com/a.com.json", "certificates/ca/a.com/a.com.key"}; err != nil || !slices.Equal(list, want) {
		t.Errorf("List recursive: %v, %v; want %v", list, err, want)
	}
	if _, err := s.List(ctx, "ocsp", false); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("List of an empty directory: %v, want fs.ErrNotExist", err)
	}
	if list, err := s.List(ctx, "", false); err != nil || !slices.Equal(list, []string{"acme", "certificates"}) {
		t.Errorf("List of the root: %v, %v", list, err)
	}
	ki, err := s.Stat(ctx, "certificates/ca/a.com/a.com.crt")
	if err != nil || !ki.IsTerminal || ki.Size != 3 || time.Since(ki.Modified) > time.Minute {
		t.Errorf("Stat of a file: %+v, %v", ki, err)
	}
	if ki, err := s.Stat(ctx, "certificates/ca/a.com"); err != nil || ki.IsTerminal {
		t.Errorf("Stat of a directory: %+v, %v", ki, err)
	}
	if _, err := s.Stat(ctx, "certificates/ca/zzz"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Stat of nothing: %v", err)
	}
	if err := s.Delete(ctx, "certificates/ca/a.com"); err != nil {
		t.Fatal(err)
	}
	if got := c.Consul.KVKeys(consulroute.TLSStorePrefix + "certificates/"); !slices.Equal(got, []string{
		consulroute.TLSStorePrefix + "certificates/ca/a.co/a.co.crt",
		consulroute.TLSStorePrefix + "certificates/ca/a.comx/a.comx.crt",
	}) {
		t.Errorf("after deleting the directory a.com: %v", got)
	}
	if err := s.Delete(ctx, "certificates/ca/a.com"); err != nil {
		t.Errorf("deleting what is gone: %v", err)
	}
}

// Storage's locks are the cluster's: one replica at a time.
func TestStorageLocksAcrossReplicas(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	s1 := newTestStorage(t, fakeConsul(t, c, "r1"), "r1")
	s2 := newTestStorage(t, fakeConsul(t, c, "r2"), "r2")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s1.Lock(ctx, "issue_cert_a.com"); err != nil {
		t.Fatal(err)
	}
	if ok, err := s2.TryLock(ctx, "issue_cert_a.com"); ok || err != nil {
		t.Fatalf("r2 took r1's lock: %v, %v", ok, err)
	}
	if err := s1.Unlock(ctx, "issue_cert_a.com"); err != nil {
		t.Fatal(err)
	}
	if ok, err := s2.TryLock(ctx, "issue_cert_a.com"); !ok || err != nil {
		t.Fatalf("r2 could not take the released lock: %v, %v", ok, err)
	}
}
