package activator

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

func testRevision(backends int, limit int32) *revision {
	r := newRevision("hello-00001", "hello", "default", nil)
	p := testPool(backends, limit, PolicyFirstAvailable)
	p.rr = &r.rr
	r.pool.Store(p)
	return r
}

// waitQueued waits until n requests wait in r's queue.
func waitQueued(t *testing.T, r *revision, n int) {
	t.Helper()
	deadline := time.Now().Add(testbin.Bound(20 * time.Second))
	for {
		r.mu.Lock()
		got := r.waiters.Len()
		r.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d waiting, want %d", got, n)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestQueueReleasesInArrivalOrder(t *testing.T) {
	r := testRevision(1, 1)
	first, _, err := r.acquire(context.Background(), 100, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	const n = 20
	order := make(chan int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, waited, err := r.acquire(context.Background(), 100, time.Minute)
			if err != nil || !waited {
				t.Errorf("waiter %d: err=%v waited=%v", i, err, waited)
				return
			}
			order <- i
			r.release(b)
		}()
		waitQueued(t, r, i+1) // arrival order is i
	}
	r.release(first)
	wg.Wait()
	close(order)
	want := 0
	for i := range order {
		if i != want {
			t.Fatalf("released waiter %d, want %d", i, want)
		}
		want++
	}
	if want != n {
		t.Fatalf("%d waiters served, want %d", want, n)
	}
	if q := r.queued.Load(); q != 0 {
		t.Fatalf("queued = %d after all were served", q)
	}
}

func TestQueueFullAndTimeout(t *testing.T) {
	r := testRevision(0, 1) // no instance at all: everything waits
	ctx := context.Background()
	done := make(chan error, 2)
	// The waiters outlast the third request by far, so the queue it finds
	// is full on a busy machine too.
	waiterTimeout := testbin.Bound(2 * time.Second)
	for range 2 {
		go func() {
			_, _, err := r.acquire(ctx, 2, waiterTimeout)
			done <- err
		}()
	}
	waitQueued(t, r, 2)
	if _, _, err := r.acquire(ctx, 2, time.Minute); !errors.Is(err, errQueueFull) {
		t.Fatalf("third request: %v, want queue full", err)
	}
	// At once: both waiters still wait (they leave only at their timeout).
	if q := r.queued.Load(); q != 2 {
		t.Fatalf("queued = %d when the full queue answered, want the 2 waiters", q)
	}
	for range 2 {
		if err := <-done; !errors.Is(err, errQueueTimeout) {
			t.Fatalf("waiter: %v, want queue timeout", err)
		}
	}
	if q := r.queued.Load(); q != 0 {
		t.Fatalf("queued = %d after timeouts", q)
	}
}

func TestCanceledWaiterFreesItsPlace(t *testing.T) {
	r := testRevision(1, 1)
	first, _, _ := r.acquire(context.Background(), 10, time.Minute)
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan error, 1)
	go func() {
		_, _, err := r.acquire(ctx, 10, time.Minute)
		gone <- err
	}()
	waitQueued(t, r, 1)
	next := make(chan error, 1)
	go func() {
		b, _, err := r.acquire(context.Background(), 10, time.Minute)
		if err == nil {
			r.release(b)
		}
		next <- err
	}()
	waitQueued(t, r, 2)
	cancel()
	if err := <-gone; !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled waiter: %v", err)
	}
	r.release(first)
	if err := <-next; err != nil {
		t.Fatalf("the waiter behind the canceled one: %v", err)
	}
	if n := r.pool.Load().backends[0].inflight.Load(); n != 0 {
		t.Fatalf("in flight %d, want 0: a slot leaked", n)
	}
}

func TestNewInstancesServeWaiters(t *testing.T) {
	r := testRevision(0, 1)
	const n = 5
	var served atomic.Int32
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b, _, err := r.acquire(context.Background(), 100, time.Minute)
			if err != nil {
				t.Error(err)
				return
			}
			served.Add(1)
			r.release(b)
		}()
	}
	waitQueued(t, r, n)
	p := testPool(1, 1, PolicyFirstAvailable)
	r.setPool(p)
	wg.Wait()
	if served.Load() != n {
		t.Fatalf("served %d of %d", served.Load(), n)
	}
}

func TestClosedRevisionFailsWaiters(t *testing.T) {
	r := testRevision(0, 1)
	done := make(chan error, 1)
	go func() {
		_, _, err := r.acquire(context.Background(), 10, time.Minute)
		done <- err
	}()
	waitQueued(t, r, 1)
	r.close(errRevisionGone)
	if err := <-done; !errors.Is(err, errRevisionGone) {
		t.Fatalf("waiter of a removed revision: %v", err)
	}
	if _, _, err := r.acquire(context.Background(), 10, time.Minute); !errors.Is(err, errRevisionGone) {
		t.Fatalf("new request to a removed revision: %v", err)
	}
}

// In the path, a newcomer queues behind waiters even if a slot is free for
// a moment; out of the path it takes the free slot at once.
func TestInPathKeepsArrivalOrder(t *testing.T) {
	r := testRevision(1, 1)
	r.ebc.Store(0)
	r.ebcKnown.Store(true)
	r.cfg.Store(&revisionConfig{timeout: time.Minute, concurrency: 1, burstCapacity: 10})
	if r.inPath(r.pool.Load()) {
		t.Fatal("ebc 0 with an instance should be out of the path")
	}
	r.ebcKnown.Store(false)
	if !r.inPath(r.pool.Load()) {
		t.Fatal("unknown ebc must keep the activator in the path")
	}
	r.ebcKnown.Store(true)
	r.cfg.Store(&revisionConfig{timeout: time.Minute, concurrency: 1, burstCapacity: -1})
	if !r.inPath(r.pool.Load()) {
		t.Fatal("burst capacity -1 must keep the activator in the path")
	}
	if !r.inPath(&pool{}) {
		t.Fatal("no routable instance must keep the activator in the path")
	}

	// A waiter ahead (as if it joined an instant before a slot freed).
	r.mu.Lock()
	ahead := &waiter{ch: make(chan *backend, 1)}
	ahead.el = r.waiters.PushBack(ahead)
	r.queued.Add(1)
	r.mu.Unlock()
	b, _, err := r.acquire(context.Background(), 10, 50*time.Millisecond)
	if !errors.Is(err, errQueueTimeout) || b != nil {
		t.Fatalf("in the path with a waiter ahead: got %v, %v; want to queue", b, err)
	}
	r.cfg.Store(&revisionConfig{timeout: time.Minute, concurrency: 1, burstCapacity: 10})
	b, waited, err := r.acquire(context.Background(), 10, 50*time.Millisecond)
	if err != nil || waited {
		t.Fatalf("out of the path: got %v waited=%v, want the free slot at once", err, waited)
	}
	r.release(b)
	// That release handed the slot to the waiter ahead.
	select {
	case got := <-ahead.ch:
		if got == nil {
			t.Fatal("waiter ahead got no backend")
		}
	default:
		t.Fatal("the release did not serve the waiter ahead")
	}
}
