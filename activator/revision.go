package activator

import (
	"container/list"
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Reasons a request gets no instance.
var (
	errQueueFull    = errors.New("queue full")
	errQueueTimeout = errors.New("queue wait timed out")
	errRevisionGone = errors.New("revision removed")
	errShutdown     = errors.New("gateway shutting down")
)

// revisionConfig is what the catalog says of a revision; replaced whole when
// the catalog changes (scaling changes in place).
type revisionConfig struct {
	timeout       time.Duration
	concurrency   int
	burstCapacity float64
}

// revision is the gateway's long-lived state for one revision: its routable
// instances and the activator's queue for it. It survives routing-table
// rebuilds, so counters and waiting requests carry over.
//
// Requests take a slot on an instance without a lock (pool.acquire). Only
// when no slot is free do they take the mutex and wait in a FIFO queue;
// releases and new instances hand slots to the queue's head.
type revision struct {
	name, service, namespace string
	// header is the value of X-Serverless-Revision, shared by every request
	// (net/http only reads it).
	header []string

	cfg  atomic.Pointer[revisionConfig]
	pool atomic.Pointer[pool]
	rr   atomic.Uint32

	// ebc is the autoscaler's excess burst capacity (float64 bits) and
	// whether it knows one; refreshed by Run.
	ebc      atomic.Uint64
	ebcKnown atomic.Bool

	// budget bounds the revision's retries (retry.go).
	budget *retryBudget

	// queued counts waiters, including one about to join (see wait);
	// inflight counts requests being proxied.
	queued   atomic.Int32
	inflight atomic.Int32
	lastWake atomic.Int64 // unix nanoseconds
	// active: the revision is in the gateway's set of revisions with
	// requests (Gateway.markActive); onActive puts it there.
	active   atomic.Bool
	onActive func(*revision)

	mu      sync.Mutex
	waiters list.List // of *waiter, oldest first
	closed  error     // set when the revision leaves the catalog

	// Owned by the table builder.
	tracker  *endpointTracker
	backends map[string]*backend

	// newMetrics makes the revision's metric series, on its first
	// request (metrics): made at once, they were most of the 14 KiB the
	// gateway held per revision, at zero or not (issue 45).
	newMetrics  func() *revisionMetrics
	metricsOnce sync.Once
	metricsM    *revisionMetrics
	// measure is what rollouts judge the revision on (measure.go).
	measure measure
	// wake asks the autoscaler for a decision (Gateway.maybeWake).
	wake func(*revision)
	// wakes times wakes from zero (wake.go); openWake is the one requests
	// that wait now join, nil while none is open.
	wakes    *wakeTracker
	openWake atomic.Pointer[wake]
}

type waiter struct {
	ch chan *backend // buffered 1: a dispatch never blocks
	// fn, when set, takes the slot instead of ch (enqueue: a relayed
	// HTTP/2 stream waits without a goroutine); called with no lock of
	// the revision's held, nil when the revision closed.
	fn func(*backend)
	el *list.Element // nil once dispatched or withdrawn; guarded by revision.mu
}

// handed is a slot given to a waiter's fn, called after the revision's
// lock is released.
type handed struct {
	fn func(*backend)
	b  *backend
}

func newRevision(name, service, namespace string, m func() *revisionMetrics) *revision {
	r := &revision{
		name:       name,
		service:    service,
		namespace:  namespace,
		header:     []string{name},
		tracker:    newEndpointTracker(),
		backends:   map[string]*backend{},
		newMetrics: m,
		budget:     mustRetryBudget(),
	}
	r.cfg.Store(&revisionConfig{timeout: spec.DefaultTimeout})
	r.pool.Store(&pool{rr: &r.rr})
	return r
}

// metrics are the revision's series, made on first use.
func (r *revision) metrics() *revisionMetrics {
	r.metricsOnce.Do(func() { r.metricsM = r.newMetrics() })
	return r.metricsM
}

// inPath tells whether the activator is in the request path (Knative's
// rule): no routable instance, burst capacity unlimited, or the autoscaler's
// excess burst capacity negative or unknown. In the path, requests keep
// strict arrival order behind any that wait; out of it, a request takes any
// free slot at once.
func (r *revision) inPath(p *pool) bool {
	if len(p.backends) == 0 || r.cfg.Load().burstCapacity == spec.Unlimited || !r.ebcKnown.Load() {
		return true
	}
	return math.Float64frombits(r.ebc.Load()) < 0
}

// acquire returns a backend with a slot reserved for the caller, waiting in
// the queue when none is free. The wait ends with errQueueFull at once when
// depth requests already wait, errQueueTimeout after queueTimeout, ctx's
// error when it ends (timeout, client gone), or errRevisionGone.
func (r *revision) acquire(ctx context.Context, depth int, queueTimeout time.Duration) (*backend, bool, error) {
	if b := r.tryAcquire(); b != nil {
		return b, false, nil
	}
	b, err := r.wait(ctx, depth, queueTimeout)
	return b, true, err
}

// tryAcquire is acquire's lock-free part: a free slot now, unless requests
// wait and the activator is in the path (they go first), or nil.
func (r *revision) tryAcquire() *backend {
	p := r.pool.Load()
	if r.queued.Load() == 0 || !r.inPath(p) {
		return p.acquire()
	}
	return nil
}

func (r *revision) wait(ctx context.Context, depth int, queueTimeout time.Duration) (*backend, error) {
	r.mu.Lock()
	if r.closed != nil {
		r.mu.Unlock()
		return nil, r.closed
	}
	if r.waiters.Len() >= depth {
		r.mu.Unlock()
		return nil, errQueueFull
	}
	// Announce before the last try: a release that happens after this try
	// sees queued > 0 and dispatches (under mu, so after we joined).
	r.queued.Add(1)
	if r.onActive != nil {
		r.onActive(r)
	}
	first := r.waiters.Len() == 0
	if first {
		if b := r.pool.Load().acquire(); b != nil {
			r.queued.Add(-1)
			r.mu.Unlock()
			return b, nil
		}
	}
	w := &waiter{ch: make(chan *backend, 1)}
	w.el = r.waiters.PushBack(w)
	r.mu.Unlock()
	// The first request held for a revision with no instance starts a
	// wake's timeline, before the autoscaler hears of it.
	if first && r.wakes != nil && len(r.pool.Load().backends) == 0 {
		r.wakes.open(r)
	}
	if r.wakes != nil && r.wakes.traced != nil {
		// Tracing on: the held request's span joins the wake it waits on.
		if wk := r.openWake.Load(); wk != nil {
			wk.join(ctx)
		}
	}
	if r.wake != nil {
		r.wake(r)
	}

	t := time.NewTimer(queueTimeout)
	defer t.Stop()
	var err error
	select {
	case b := <-w.ch:
		if b == nil {
			return nil, r.closedErr()
		}
		return b, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = errQueueTimeout
	}
	r.mu.Lock()
	if w.el != nil {
		r.waiters.Remove(w.el)
		w.el = nil
		r.queued.Add(-1)
		r.mu.Unlock()
		return nil, err
	}
	r.mu.Unlock()
	// Dispatched while we gave up: hand the slot on.
	if b := <-w.ch; b != nil {
		r.release(b)
	}
	return nil, err
}

// enqueue is wait for a caller that does not block (the HTTP/2 relay's
// streams, activator/relay.go): a free slot at once when none wait before
// it, or fn put in line, to get its slot (nil: the revision closed) from
// whichever goroutine frees one, never with the revision's lock held. The
// caller bounds the wait itself (withdraw).
func (r *revision) enqueue(depth int, fn func(*backend)) (*backend, *waiter, error) {
	r.mu.Lock()
	if r.closed != nil {
		r.mu.Unlock()
		return nil, nil, r.closed
	}
	if r.waiters.Len() >= depth {
		r.mu.Unlock()
		return nil, nil, errQueueFull
	}
	r.queued.Add(1)
	if r.onActive != nil {
		r.onActive(r)
	}
	first := r.waiters.Len() == 0
	if first {
		if b := r.pool.Load().acquire(); b != nil {
			r.queued.Add(-1)
			r.mu.Unlock()
			return b, nil, nil
		}
	}
	w := &waiter{fn: fn}
	w.el = r.waiters.PushBack(w)
	r.mu.Unlock()
	if first && r.wakes != nil && len(r.pool.Load().backends) == 0 {
		r.wakes.open(r)
	}
	if r.wake != nil {
		r.wake(r)
	}
	return nil, w, nil
}

// withdraw takes w out of line; false: it was handed a slot (or nil)
// already, or its fn is about to be.
func (r *revision) withdraw(w *waiter) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.el == nil {
		return false
	}
	r.waiters.Remove(w.el)
	w.el = nil
	r.queued.Add(-1)
	return true
}

func (r *revision) closedErr() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed != nil {
		return r.closed
	}
	return errRevisionGone
}

// release frees a slot and gives it to the oldest waiter, if any.
func (r *revision) release(b *backend) {
	b.inflight.Add(-1)
	if r.queued.Load() > 0 {
		r.dispatch()
	}
}

// dispatch hands free slots to waiters in arrival order.
func (r *revision) dispatch() {
	if r.queued.Load() == 0 {
		return
	}
	var buf [4]handed
	fns := buf[:0]
	r.mu.Lock()
	for e := r.waiters.Front(); e != nil; e = r.waiters.Front() {
		b := r.pool.Load().acquire()
		if b == nil {
			break
		}
		w := e.Value.(*waiter)
		r.waiters.Remove(e)
		w.el = nil
		r.queued.Add(-1)
		if w.fn != nil {
			fns = append(fns, handed{w.fn, b})
			continue
		}
		w.ch <- b
	}
	r.mu.Unlock()
	for _, h := range fns {
		h.fn(h.b)
	}
}

// close fails every waiter with err and refuses new ones.
func (r *revision) close(err error) {
	var fns []func(*backend)
	r.mu.Lock()
	r.closed = err
	for e := r.waiters.Front(); e != nil; e = r.waiters.Front() {
		w := e.Value.(*waiter)
		r.waiters.Remove(e)
		w.el = nil
		r.queued.Add(-1)
		if w.fn != nil {
			fns = append(fns, w.fn)
			continue
		}
		w.ch <- nil
	}
	r.mu.Unlock()
	for _, fn := range fns {
		fn(nil)
	}
}

// setPool installs a new set of routable instances and serves waiters from
// it.
func (r *revision) setPool(p *pool) {
	r.pool.Store(p)
	r.dispatch()
}
