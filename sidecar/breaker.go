package sidecar

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// ErrQueueFull is returned by Breaker.Acquire when the concurrency limit is
// reached and the queue holds as many requests as it may.
var ErrQueueFull = errors.New("concurrency limit reached and queue full")

// Breaker lets at most Capacity requests into the app at once and holds at
// most QueueDepth more, in arrival order; requests beyond that fail at once
// with ErrQueueFull.
//
// The hot path is lock-free: while nobody waits, Acquire and Release are one
// compare-and-swap each on a word that packs (active, waiting), so a request
// that finds a free slot never touches a lock. The mutex guards only the
// waiting list, and is taken only when requests must wait anyway: a releaser
// that sees waiters hands its slot directly to the oldest one (active stays
// the same), so a newcomer can never overtake a queued request ("no barging",
// unlike Knative's semaphore), and waiters > 0 implies active == Capacity.
type Breaker struct {
	capacity uint64
	depth    uint64

	// state packs waiting<<32 | active.
	state atomic.Uint64

	mu      sync.Mutex
	waiters waitList // guarded by mu
	pool    sync.Pool
}

// NewBreaker returns a breaker admitting capacity requests at once with a
// queue of depth; capacity must be at least 1, depth at least 0.
func NewBreaker(capacity, depth int) (*Breaker, error) {
	if capacity < 1 || capacity > 1<<31 {
		return nil, fmt.Errorf("breaker capacity %d: want 1 to 2^31", capacity)
	}
	if depth < 0 || depth > 1<<31 {
		return nil, fmt.Errorf("breaker queue depth %d: want 0 to 2^31", depth)
	}
	b := &Breaker{capacity: uint64(capacity), depth: uint64(depth)}
	b.pool.New = func() any { return &Waiter{ready: make(chan struct{}, 1)} }
	return b, nil
}

func unpack(s uint64) (active, waiting uint64) { return s & (1<<32 - 1), s >> 32 }

// Active is the number of requests holding a slot (in the app).
func (b *Breaker) Active() int { a, _ := unpack(b.state.Load()); return int(a) }

// Waiting is the number of requests queued for a slot.
func (b *Breaker) Waiting() int { _, w := unpack(b.state.Load()); return int(w) }

// Capacity is the concurrency limit.
func (b *Breaker) Capacity() int { return int(b.capacity) }

// QueueDepth is how many requests may wait.
func (b *Breaker) QueueDepth() int { return int(b.depth) }

// TryAcquire takes a free slot if there is one and nobody is waiting for
// it; a true return must be paired with one Release.
func (b *Breaker) TryAcquire() bool {
	for {
		s := b.state.Load()
		active, waiting := unpack(s)
		if active >= b.capacity || waiting > 0 {
			return false
		}
		if b.state.CompareAndSwap(s, s+1) {
			return true
		}
	}
}

// Acquire takes a slot, waiting in line if none is free. It returns
// ErrQueueFull at once when the line is full, or ctx's error if ctx ends
// first (the place in line is then given up). Every nil return must be
// paired with one Release.
func (b *Breaker) Acquire(ctx context.Context) error {
	if b.TryAcquire() {
		return nil
	}
	w, err := b.Enqueue()
	if err != nil || w == nil {
		return err
	}
	select {
	case <-w.ready:
		err := b.waitResult(w)
		b.Recycle(w)
		return err
	case <-ctx.Done():
	}
	b.Cancel(w)
	if b.Wait(w) == nil {
		// Handed a slot at the moment ctx ended: pass it on.
		b.Release()
	}
	b.Recycle(w)
	return ctx.Err()
}

// errWaitCancelled is what a cancelled wait returns.
var errWaitCancelled = errors.New("wait for a slot cancelled")

// Enqueue is Acquire's slow half for callers that cancel a wait from
// another goroutine without a context (the request timer): it takes a slot
// that freed meanwhile (nil, nil), refuses when the line is full
// (ErrQueueFull), or puts the caller in line and returns its waiter for
// Wait, Cancel (from anywhere) and finally Recycle.
func (b *Breaker) Enqueue() (*Waiter, error) { return b.EnqueueFunc(nil, nil) }

// EnqueueFunc is Enqueue for a caller with no goroutine to block in Wait
// (the sidecar's event loops): when a releaser hands w a slot, it calls
// notify (from the releaser's goroutine; it must not block) instead of
// waking a Wait, and Cancel wakes nobody. tag is the caller's, for
// ReleaseNext's caller to recognise its own waiters by.
func (b *Breaker) EnqueueFunc(notify func(), tag any) (*Waiter, error) {
	b.mu.Lock()
	for {
		s := b.state.Load()
		active, waiting := unpack(s)
		if active < b.capacity && waiting == 0 {
			// A slot freed while we took the lock.
			if b.state.CompareAndSwap(s, s+1) {
				b.mu.Unlock()
				return nil, nil
			}
			continue
		}
		if waiting >= b.depth {
			b.mu.Unlock()
			return nil, ErrQueueFull
		}
		// Counting ourselves while holding mu means a releaser that sees
		// us also finds us in the list (it takes mu to pop).
		if b.state.CompareAndSwap(s, s+1<<32) {
			break
		}
	}
	w := b.pool.Get().(*Waiter)
	w.cancelled = false
	w.notify, w.Tag = notify, tag
	b.waiters.pushBack(w)
	b.mu.Unlock()
	return w, nil
}

// Wait blocks until w is handed a slot (nil: pair it with Release) or
// cancelled (an error).
func (b *Breaker) Wait(w *Waiter) error {
	<-w.ready
	return b.waitResult(w)
}

func (b *Breaker) waitResult(w *Waiter) error {
	// cancelled was written under mu before the token was sent, and the
	// receive orders it before this read.
	if w.cancelled {
		return errWaitCancelled
	}
	return nil
}

// Cancel takes w out of line and wakes its Wait with an error, unless it
// was handed a slot already (then Wait returns nil as usual, and Cancel
// does nothing). Safe from any goroutine until w is recycled. removed says
// which: for an EnqueueFunc waiter, false means its notify is called (or
// was) and the slot is its caller's to release.
func (b *Breaker) Cancel(w *Waiter) (removed bool) {
	b.mu.Lock()
	if !w.inList {
		b.mu.Unlock()
		return false
	}
	b.waiters.remove(w)
	b.state.Add(^uint64(1<<32 - 1)) // waiting--
	w.cancelled = true
	b.mu.Unlock()
	if w.notify == nil {
		w.ready <- struct{}{}
	}
	return true
}

// Recycle returns w for reuse once its Wait returned and no goroutine can
// call Cancel on it any more. Not recycling is safe (the garbage collector
// takes it); recycling too early is not.
func (b *Breaker) Recycle(w *Waiter) { b.pool.Put(w) }

// Release gives back a slot taken by Acquire: to the oldest waiter if there
// is one, else to the pool of free slots.
func (b *Breaker) Release() {
	if w := b.ReleaseNext(); w != nil {
		w.Notify()
	}
}

// ReleaseNext is Release for a caller that wakes the next waiter itself:
// when the slot goes to a waiter, it returns it, and the caller must call
// its Notify (or, for a waiter of its own (Tag), act on the grant as
// Notify would have told it to). The sidecar's event loop grants its own
// waiters this way without a wake-up through its pipe.
func (b *Breaker) ReleaseNext() *Waiter {
	for {
		s := b.state.Load()
		active, waiting := unpack(s)
		if active == 0 {
			panic("sidecar: Breaker.Release without Acquire")
		}
		if waiting > 0 {
			break
		}
		if b.state.CompareAndSwap(s, s-1) {
			return nil
		}
	}
	b.mu.Lock()
	for {
		s := b.state.Load()
		if _, waiting := unpack(s); waiting == 0 {
			// Every waiter gave up meanwhile.
			if b.state.CompareAndSwap(s, s-1) {
				b.mu.Unlock()
				return nil
			}
			continue
		}
		// Hand over: one fewer waiting, active unchanged.
		if b.state.CompareAndSwap(s, s-1<<32) {
			break
		}
	}
	w := b.waiters.popFront()
	b.mu.Unlock()
	return w
}

// Notify tells w that it was handed a slot (ReleaseNext).
func (w *Waiter) Notify() {
	if w.notify != nil {
		w.notify()
		return
	}
	w.ready <- struct{}{}
}

// Waiter is one queued request. ready has room for the one token a
// releaser (slot handed over) or Cancel sends it, so neither blocks.
type Waiter struct {
	ready chan struct{}
	// notify, when set (EnqueueFunc), is how a granted waiter learns of
	// it; Tag is its owner's.
	notify     func()
	Tag        any
	prev, next *Waiter
	inList     bool // guarded by the breaker's mu
	cancelled  bool // guarded by the breaker's mu
}

// waitList is an intrusive FIFO: no allocation per queued request beyond
// the pooled waiter.
type waitList struct{ head, tail *Waiter }

func (l *waitList) pushBack(w *Waiter) {
	w.prev, w.next, w.inList = l.tail, nil, true
	if l.tail != nil {
		l.tail.next = w
	} else {
		l.head = w
	}
	l.tail = w
}

func (l *waitList) popFront() *Waiter {
	w := l.head
	l.remove(w)
	return w
}

func (l *waitList) remove(w *Waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		l.head = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		l.tail = w.prev
	}
	w.prev, w.next, w.inList = nil, nil, false
}
