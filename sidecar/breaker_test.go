package sidecar

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

func TestBreakerLimitsAndQueues(t *testing.T) {
	b, err := NewBreaker(2, 1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := b.Acquire(ctx); err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
	}
	queued := make(chan error, 1)
	go func() { queued <- b.Acquire(ctx) }()
	waitFor(t, func() bool { return b.Waiting() == 1 })
	if err := b.Acquire(ctx); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("fourth acquire: %v, want ErrQueueFull", err)
	}
	select {
	case err := <-queued:
		t.Fatalf("queued request got through while the limit was reached: %v", err)
	default:
	}
	b.Release()
	if err := <-queued; err != nil {
		t.Fatal(err)
	}
	if b.Active() != 2 || b.Waiting() != 0 {
		t.Fatalf("active %d waiting %d after hand-off", b.Active(), b.Waiting())
	}
	b.Release()
	b.Release()
	if b.Active() != 0 {
		t.Fatalf("active %d at the end", b.Active())
	}
}

func TestBreakerZeroDepthRejectsAtLimit(t *testing.T) {
	b, _ := NewBreaker(1, 0)
	if err := b.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := b.Acquire(context.Background()); !errors.Is(err, ErrQueueFull) {
		t.Fatalf("got %v, want ErrQueueFull", err)
	}
}

// A waiter whose context ends leaves the line; the slot goes to the next.
func TestBreakerCancelledWaiterLeaves(t *testing.T) {
	b, _ := NewBreaker(1, 2)
	if err := b.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- b.Acquire(ctx) }()
	waitFor(t, func() bool { return b.Waiting() == 1 })
	second := make(chan error, 1)
	go func() { second <- b.Acquire(context.Background()) }()
	waitFor(t, func() bool { return b.Waiting() == 2 })
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled waiter: %v", err)
	}
	b.Release()
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	if b.Active() != 1 || b.Waiting() != 0 {
		t.Fatalf("active %d waiting %d", b.Active(), b.Waiting())
	}
}

// Waiters are served in arrival order and newcomers do not overtake them.
func TestBreakerFIFO(t *testing.T) {
	b, _ := NewBreaker(1, 10)
	if err := b.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := b.Acquire(context.Background()); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			b.Release()
		}()
		waitFor(t, func() bool { return b.Waiting() == i+1 })
	}
	b.Release()
	wg.Wait()
	for i, v := range order {
		if v != i {
			t.Fatalf("served in order %v, want arrival order", order)
		}
	}
}

// Under contention the limit holds and every acquire is paired.
func TestBreakerStress(t *testing.T) {
	const limit, workers, rounds = 3, 32, 300
	b, _ := NewBreaker(limit, workers)
	var in, maxIn atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < rounds; r++ {
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(r%3)*50*time.Microsecond+time.Millisecond)
				err := b.Acquire(ctx)
				cancel()
				if err != nil {
					continue
				}
				n := in.Add(1)
				for {
					m := maxIn.Load()
					if n <= m || maxIn.CompareAndSwap(m, n) {
						break
					}
				}
				in.Add(-1)
				b.Release()
			}
		}()
	}
	wg.Wait()
	if maxIn.Load() > limit {
		t.Fatalf("saw %d at once, limit %d", maxIn.Load(), limit)
	}
	if b.Active() != 0 || b.Waiting() != 0 {
		t.Fatalf("leaked: active %d waiting %d", b.Active(), b.Waiting())
	}
}

func TestNewBreakerValidates(t *testing.T) {
	if _, err := NewBreaker(0, 1); err == nil {
		t.Fatal("capacity 0 accepted")
	}
	if _, err := NewBreaker(1, -1); err == nil {
		t.Fatal("negative depth accepted")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	bound := testbin.Bound(30 * time.Second)
	deadline := time.Now().Add(bound)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not reached within %s", bound)
		}
		time.Sleep(time.Millisecond)
	}
}

// Cancel takes a waiter out of line; after a hand-off it does nothing.
func TestBreakerCancel(t *testing.T) {
	b, _ := NewBreaker(1, 5)
	if !b.TryAcquire() {
		t.Fatal("first TryAcquire failed")
	}
	w1, err := b.Enqueue()
	if err != nil || w1 == nil {
		t.Fatalf("enqueue: %v %v", w1, err)
	}
	w2, _ := b.Enqueue()
	if b.Waiting() != 2 {
		t.Fatalf("waiting %d", b.Waiting())
	}
	b.Cancel(w1)
	if err := b.Wait(w1); err == nil {
		t.Fatal("a cancelled wait returned a slot")
	}
	if b.Waiting() != 1 {
		t.Fatalf("waiting %d after cancel", b.Waiting())
	}
	b.Release() // hands the slot to w2
	if err := b.Wait(w2); err != nil {
		t.Fatal(err)
	}
	b.Cancel(w2) // too late: no effect
	if b.Active() != 1 || b.Waiting() != 0 {
		t.Fatalf("active %d waiting %d", b.Active(), b.Waiting())
	}
	b.Release()
	if b.Active() != 0 {
		t.Fatalf("active %d", b.Active())
	}
}

// A waiter without a goroutine (EnqueueFunc) learns of its slot through
// notify, from whoever released it; ReleaseNext leaves the notice to the
// releaser; Cancel says whether the waiter left the line before a grant.
func TestBreakerFuncWaiters(t *testing.T) {
	b, err := NewBreaker(1, 2)
	if err != nil {
		t.Fatal(err)
	}
	if !b.TryAcquire() {
		t.Fatal("the first slot")
	}
	var notified []string
	w1, err := b.EnqueueFunc(func() { notified = append(notified, "w1") }, "one")
	if err != nil || w1 == nil {
		t.Fatal(w1, err)
	}
	w2, err := b.EnqueueFunc(func() { notified = append(notified, "w2") }, "two")
	if err != nil || w2 == nil {
		t.Fatal(w2, err)
	}
	if _, err := b.EnqueueFunc(func() {}, nil); err != ErrQueueFull {
		t.Fatalf("third waiter: %v, want ErrQueueFull", err)
	}
	// ReleaseNext hands the slot to the oldest and leaves the notice to
	// the caller.
	next := b.ReleaseNext()
	if next != w1 || next.Tag != "one" || len(notified) != 0 || b.Active() != 1 || b.Waiting() != 1 {
		t.Fatalf("ReleaseNext: %v %v active %d waiting %d", next, notified, b.Active(), b.Waiting())
	}
	if b.Cancel(w1) {
		t.Fatal("Cancel of a granted waiter says it left the line")
	}
	// Release notifies.
	b.Release()
	if len(notified) != 1 || notified[0] != "w2" {
		t.Fatalf("notified %v, want [w2]", notified)
	}
	// A waiter cancelled in line is never notified, and wakes nobody.
	w3, _ := b.EnqueueFunc(func() { notified = append(notified, "w3") }, nil)
	if w3 == nil || !b.Cancel(w3) || b.Waiting() != 0 {
		t.Fatalf("cancel in line: %v waiting %d", w3, b.Waiting())
	}
	b.Release()
	if len(notified) != 1 || b.Active() != 0 {
		t.Fatalf("after cancel: notified %v, active %d", notified, b.Active())
	}
}
