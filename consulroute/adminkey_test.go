package consulroute_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/adminauth"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

func adminKeyClient(t *testing.T, c *fakecluster.Cluster, replica string) *consulroute.Client {
	t.Helper()
	cl, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica(replica),
		consulroute.WithLogger(slog.New(slog.NewTextHandler(io.Discard, nil))),
		consulroute.WithBackoff(5*time.Millisecond, 50*time.Millisecond), consulroute.WithWaitTime(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// Replicas starting together agree on one keyring: the first check-and-set
// creates it, the others read the winner's.
func TestAdminKeysCreatedOnceByConcurrentReplicas(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	const n = 8
	ids := make([]string, n)
	var wg sync.WaitGroup
	for i := range n {
		cl := adminKeyClient(t, c, "r"+string(rune('a'+i)))
		wg.Go(func() {
			ring, _, err := cl.AdminKeys(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			ids[i] = ring.Signing(time.Now()).ID
		})
	}
	wg.Wait()
	for _, id := range ids[1:] {
		if id != ids[0] || id == "" {
			t.Fatalf("replicas read different keys: %v", ids)
		}
	}
	raw, ok := c.Consul.KV(consulroute.AdminKeysKey)
	if !ok {
		t.Fatal("no keyring in KV")
	}
	var rec struct {
		Version int `json:"version"`
		Keys    []struct {
			ID     string `json:"id"`
			Secret []byte `json:"secret"`
		} `json:"keys"`
	}
	if err := json.Unmarshal(raw, &rec); err != nil || rec.Version != 1 || len(rec.Keys) != 1 || rec.Keys[0].ID != ids[0] || len(rec.Keys[0].Secret) != adminauth.MinSecretLen {
		t.Fatalf("keyring in KV: %s (%v)", raw, err)
	}
}

// A rotation reaches a watching replica: the new key is accepted at once and
// signs from its NotBefore; a deleted keyring is made anew; one that does
// not decode leaves the last good one in force.
func TestWatchAdminKeysFollowsRotationAndDeletion(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	a, b := adminKeyClient(t, c, "a"), adminKeyClient(t, c, "b")
	first, _, err := a.AdminKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ring := &adminauth.Ring{}
	ring.Set(first)
	done := make(chan error, 1)
	go func() { done <- b.WatchAdminKeys(ctx, ring.Set) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	eventually := func(what string, cond func(*adminauth.Keyring) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !cond(ring.Keyring()) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: keyring %+v", what, ring.Keyring().Keys())
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	oldID := first.Signing(time.Now()).ID

	next, err := a.RotateAdminKeys(ctx, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	eventually("the rotated key reaches the watcher", func(k *adminauth.Keyring) bool { _, ok := k.Lookup(next.ID); return ok })
	kr := ring.Keyring()
	if k := kr.Signing(time.Now()); k.ID != oldID {
		t.Fatalf("before NotBefore the old key signs, got %s", k.ID)
	}
	if k := kr.Signing(time.Now().Add(time.Minute)); k.ID != next.ID {
		t.Fatalf("after NotBefore the new key signs, got %s", k.ID)
	}
	// Rotations keep three keys at most.
	for range 3 {
		if _, err := a.RotateAdminKeys(ctx, 0); err != nil {
			t.Fatal(err)
		}
	}
	cur, _, err := a.AdminKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(cur.Keys()); n != 3 {
		t.Fatalf("%d keys after four rotations, want 3", n)
	}
	eventually("the last rotation reaches the watcher", func(k *adminauth.Keyring) bool {
		return k.Signing(time.Now()).ID == cur.Signing(time.Now()).ID
	})

	// Garbage in KV: logged, the last good keyring stays.
	raw := b.API()
	if _, err := raw.KV().Put(&api.KVPair{Key: consulroute.AdminKeysKey, Value: []byte("not json")}, nil); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if ring.Keyring().Signing(time.Now()).ID != cur.Signing(time.Now()).ID {
		t.Fatal("a keyring that does not decode replaced the good one")
	}
	if _, _, err := a.AdminKeys(ctx); err == nil {
		t.Fatal("AdminKeys read a keyring that does not decode")
	}

	// Deleted: the watcher makes a new one, and uses it.
	if _, err := raw.KV().Delete(consulroute.AdminKeysKey, nil); err != nil {
		t.Fatal(err)
	}
	eventually("a deleted keyring is made anew", func(k *adminauth.Keyring) bool {
		_, had := k.Lookup(cur.Signing(time.Now()).ID)
		return !had && len(k.Keys()) == 1
	})
	if _, ok := c.Consul.KV(consulroute.AdminKeysKey); !ok {
		t.Fatal("no keyring in KV after the watcher recreated it")
	}
}

func TestAdminKeysNamesTheKeyWhenConsulRefuses(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	c.Consul.SetFault(fakecluster.Fault{Status: 403, PathPrefix: "/v1/kv/" + consulroute.AdminKeysKey})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _, err := adminKeyClient(t, c, "a").AdminKeys(ctx)
	if !errors.Is(err, consulroute.ErrPermissionDenied) {
		t.Fatalf("AdminKeys under a 403: %v, want ErrPermissionDenied", err)
	}
	if got := err.Error(); !strings.Contains(got, consulroute.AdminKeysKey) || !strings.Contains(got, "CONSUL_HTTP_TOKEN") {
		t.Fatalf("error %q should name the key and the token", got)
	}
	if _, err := adminKeyClient(t, c, "a").RotateAdminKeys(ctx, -time.Second); err == nil {
		t.Fatal("RotateAdminKeys with a negative grace accepted")
	}
}
