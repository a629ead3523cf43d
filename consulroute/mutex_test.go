package consulroute_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// The KV helpers keep a folder's semantics: a delete takes the key and
// what is below it as a folder, not its namesakes; a write stamps its
// time.
func TestKVFolderSemantics(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	cl := fakeClusterClient(t, c, "r1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := time.Now().Add(-time.Second)
	for _, k := range []string{"t/a/b", "t/a/bc", "t/a/b/c", "t/a/b/d/e"} {
		if err := cl.KVPut(ctx, k, []byte(k)); err != nil {
			t.Fatal(err)
		}
	}
	e, err := cl.KVGet(ctx, "t/a/b")
	if err != nil || string(e.Value) != "t/a/b" || e.Modified.Before(before) || e.Modified.After(time.Now()) {
		t.Fatalf("get t/a/b: %+v, %v", e, err)
	}
	if _, err := cl.KVGet(ctx, "t/a/none"); !errors.Is(err, consulroute.ErrNotFound) {
		t.Fatalf("get a missing key: %v, want ErrNotFound", err)
	}
	keys, err := cl.KVKeys(ctx, "t/a/", "/")
	if want := []string{"t/a/b", "t/a/b/", "t/a/bc"}; err != nil || !slices.Equal(keys, want) {
		t.Fatalf("keys one level down: %v, %v; want %v", keys, err, want)
	}
	if err := cl.KVDelete(ctx, "t/a/b"); err != nil {
		t.Fatal(err)
	}
	if got := c.Consul.KVKeys("t/"); !slices.Equal(got, []string{"t/a/bc"}) {
		t.Fatalf("after deleting t/a/b: %v, want only t/a/bc", got)
	}
	if keys, err := cl.KVKeys(ctx, "t/none/", ""); err != nil || len(keys) != 0 {
		t.Fatalf("keys of an empty folder: %v, %v", keys, err)
	}
}

// One replica holds a name at a time; the other waits on the key (no
// polling) and takes it the moment it is released; the key goes once
// nobody holds it.
func TestMutexesOneHolderAtATime(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waiting := make(chan string, 16)
	m1 := newMutexes(t, fakeClusterClient(t, c, "r1"), "r1")
	m2 := newMutexes(t, fakeClusterClient(t, c, "r2"), "r2", consulroute.WithMutexWaitHook(func(n string) { waiting <- n }))
	if err := m1.Lock(ctx, "issue_cert_a.example.com"); err != nil {
		t.Fatal(err)
	}
	key := m1.Key("issue_cert_a.example.com")
	if v, _ := c.Consul.KV(key); string(v) != "r1" {
		t.Errorf("the key's value %q does not name its holder r1", v)
	}
	if ok, err := m2.TryLock(ctx, "issue_cert_a.example.com"); ok || err != nil {
		t.Fatalf("r2 took a held lock: %v, %v", ok, err)
	}
	got := make(chan error, 1)
	go func() { got <- m2.Lock(ctx, "issue_cert_a.example.com") }()
	select {
	case n := <-waiting:
		if n != "issue_cert_a.example.com" {
			t.Fatalf("waits on %q", n)
		}
	case err := <-got:
		t.Fatalf("r2's Lock returned while r1 holds the name: %v", err)
	}
	// Another name is independent.
	if err := m2.Lock(ctx, "issue_cert_b.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := m1.Unlock(ctx, "issue_cert_a.example.com"); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if v, _ := c.Consul.KV(key); string(v) != "r2" {
		t.Errorf("after the hand-over the key names %q, want r2", v)
	}
	if held := m2.Held(); !slices.Equal(held, []string{"issue_cert_a.example.com", "issue_cert_b.example.com"}) {
		t.Errorf("r2 holds %v", held)
	}
	if err := m2.Lock(ctx, "issue_cert_a.example.com"); err == nil {
		t.Error("a second Lock of a held name succeeded: the locks are not reentrant")
	}
	for _, n := range m2.Held() {
		if err := m2.Unlock(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if keys := c.Consul.KVKeys(consulroute.TLSStorePrefix); len(keys) != 0 {
		t.Errorf("keys left after every lock was released: %v", keys)
	}
}

// A replica that dies holding a name frees it when Consul ends its session
// (TTL or node failure; here destroyed outright), after the lock delay.
func TestMutexesFreedWhenTheSessionEnds(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waiting := make(chan string, 16)
	m1 := newMutexes(t, fakeClusterClient(t, c, "r1"), "r1")
	m2 := newMutexes(t, fakeClusterClient(t, c, "r2"), "r2", consulroute.WithMutexWaitHook(func(n string) { waiting <- n }))
	if err := m1.Lock(ctx, "renew_cert_a.example.com"); err != nil {
		t.Fatal(err)
	}
	key := m1.Key("renew_cert_a.example.com")
	sess := c.Consul.KVHolder(key)
	got := make(chan error, 1)
	go func() { got <- m2.Lock(ctx, "renew_cert_a.example.com") }()
	<-waiting
	req, _ := http.NewRequest(http.MethodPut, c.Consul.Addr()+"/v1/session/destroy/"+sess, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if h := c.Consul.KVHolder(key); h == "" || h == sess {
		t.Fatalf("holder %q after r1's session %s ended", h, sess)
	}
	// r1 releasing what it lost changes nothing.
	_ = m1.Unlock(ctx, "renew_cert_a.example.com")
	if v, _ := c.Consul.KV(key); string(v) != "r2" {
		t.Errorf("r1's late unlock changed the key to %q", v)
	}
}

// A Lock waiting for a held name returns when its context ends; Close
// releases what is held, so a waiter gets it at once.
func TestMutexesContextAndClose(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	waiting := make(chan string, 16)
	m1 := newMutexes(t, fakeClusterClient(t, c, "r1"), "r1")
	m2 := newMutexes(t, fakeClusterClient(t, c, "r2"), "r2", consulroute.WithMutexWaitHook(func(n string) { waiting <- n }))
	if err := m1.Lock(ctx, "x"); err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithCancel(ctx)
	got := make(chan error, 1)
	go func() { got <- m2.Lock(wctx, "x") }()
	<-waiting
	wcancel()
	if err := <-got; !errors.Is(err, context.Canceled) {
		t.Fatalf("Lock after its context ended: %v", err)
	}
	go func() { got <- m2.Lock(ctx, "x") }()
	<-waiting

	if err := m1.Close(ctx); err != nil {
		t.Fatal(err)
	}

	if err := <-got; err != nil {
		t.Fatal(err)
	}
	if err := m1.Lock(ctx, "y"); err == nil {
		t.Error("Lock after Close succeeded")
	}

}

func TestMutexesArguments(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	cl := fakeClusterClient(t, c, "r1")
	for _, p := range []string{"", "no-slash", "/abs/"} {
		if _, err := cl.NewMutexes(p, "r1"); err == nil {
			t.Errorf("prefix %q accepted", p)
		}
	}
	if _, err := cl.NewMutexes("a/", ""); err == nil {
		t.Error("empty holder accepted")
	}
	m := newMutexes(t, cl, "r1")
	for _, n := range []string{"", "/x", "x/"} {
		if err := m.Lock(context.Background(), n); err == nil {
			t.Errorf("name %q accepted", n)
		}
	}
}

func newMutexes(t *testing.T, cl *consulroute.Client, holder string, opts ...consulroute.MutexOption) *consulroute.Mutexes {
	t.Helper()
	m, err := cl.NewMutexes(consulroute.TLSStorePrefix+"locks/", holder, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Close(context.Background()) })
	return m
}
