package keepalive

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// requestContext is the context of a request the loop serves (server.go).
// Like the context net/http gives a request, it is canceled when the
// client goes away and once the request is over; it carries the values of
// the connection's net/http context.
//
// net/http learns that a client left from a read it keeps pending on the
// connection during every request (a goroutine, a read and three deadline
// changes per request). This context learns it only when somebody asks:
//
//   - Err looks at the connection (a non-blocking peek) when the request is
//     older than clientCheckInterval since the last look, so code that
//     polls Err, such as the upstream read that wakes every
//     clientCheckInterval, sees a departed client within that interval
//     (once a watcher runs, below, Err leaves the looking to it);
//   - Done and AfterFunc, which only slow paths use (a request waiting in
//     the activator's queue), start a goroutine that waits for the
//     connection to become readable, as net/http's background read does.
//
// A request whose context nobody waited on costs no goroutine and no
// system call for this; its context is reused by the next request on the
// connection.
type requestContext struct {
	parent context.Context // values only; never canceled while in use
	conn   *conn
	// checked is when the client was last looked at (at first, when the
	// request began), in ns since clockBase. Atomic: a request's timer
	// may call Err from another goroutine while the next request begins.
	checked atomic.Int64

	err atomic.Pointer[error]

	// used is set (under mu) by Done and AfterFunc: the context is then
	// not reusable, and end has a watcher to stop and a cancel to do.
	// Atomic so that begin and end, once per request, take no lock for
	// the common context nobody waited on.
	used atomic.Bool

	mu      sync.Mutex
	done    chan struct{}
	afters  []*ctxAfter
	watcher *clientWatcher
}

// clientCheckInterval is how often Err looks at the client's socket at
// most; callers that wait long poll Err about as often (the gateway's
// upstream read and the sidecar's request timer wake every second).
const clientCheckInterval = time.Second

// clockBase anchors the monotonic times the contexts keep as integers.
var clockBase = time.Now()

// ctxAfter is one AfterFunc registration.
type ctxAfter struct {
	f       func()
	stopped bool // guarded by requestContext.mu
}

func newRequestContext(parent context.Context, c *conn) *requestContext {
	return &requestContext{parent: parent, conn: c}
}

// begin readies the context for a request starting at about now (a
// clock reading the loop already has: an earlier one only makes the first
// look at the client come sooner); it reports false when the context
// cannot be reused (a new one is needed).
func (rc *requestContext) begin(now time.Time) bool {
	if rc.used.Load() || rc.err.Load() != nil {
		return false
	}
	rc.checked.Store(int64(now.Sub(clockBase)))
	return true
}

// end is called when the request is over: a waiting watcher is stopped
// and, if anybody may still hold the context, it is canceled, as net/http
// does when the handler returns. A context nobody waited on has neither.
func (rc *requestContext) end() {
	if !rc.used.Load() {
		return
	}
	rc.mu.Lock()
	w := rc.watcher
	rc.watcher = nil
	rc.mu.Unlock()
	if w != nil {
		w.stop()
	}
	rc.cancel(context.Canceled)
}

func (rc *requestContext) Deadline() (time.Time, bool) { return time.Time{}, false }

func (rc *requestContext) Value(key any) any { return rc.parent.Value(key) }

// Err reports context.Canceled once the client is gone (looked at no more
// than once per clientCheckInterval) or the request is over.
func (rc *requestContext) Err() error {
	if p := rc.err.Load(); p != nil {
		return *p
	}
	if rc.used.Load() {
		// Done or AfterFunc started a watcher, which cancels the context
		// when the client leaves. A peek here would wait for it: the
		// watcher holds the socket's read lock while it waits for the
		// socket to become readable, so Err would block until the client
		// sent or left.
		return nil
	}
	now := int64(time.Since(clockBase))
	last := rc.checked.Load()
	if now-last < int64(clientCheckInterval) || !rc.checked.CompareAndSwap(last, now) {
		return nil
	}
	// Once Done or AfterFunc started a watcher, it looks at the client and
	// cancels the context when it leaves. A peek then would wait for the
	// socket's read lock, which the watcher holds until the client sends
	// or leaves: the request would hang as long as its client waits for
	// the answer. mu keeps a watcher from starting during the peek.
	rc.mu.Lock()
	gone := !rc.used.Load() && rc.conn.clientGone()
	rc.mu.Unlock()
	if gone {
		rc.cancel(context.Canceled)
		return context.Canceled
	}
	return nil
}

// Done returns a channel closed when the client goes away or the request
// is over; the first call starts watching the connection.
func (rc *requestContext) Done() <-chan struct{} {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.used.Store(true)
	if rc.done == nil {
		rc.done = make(chan struct{})
		if rc.err.Load() != nil {
			close(rc.done)
		}
	}
	rc.watchLocked()
	return rc.done
}

// AfterFunc lets context.WithDeadline and friends hook into this context
// without a goroutine of their own (the context package looks for it).
func (rc *requestContext) AfterFunc(f func()) func() bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.used.Store(true)
	if rc.err.Load() != nil {
		go f()
		return func() bool { return false }
	}
	a := &ctxAfter{f: f}
	rc.afters = append(rc.afters, a)
	rc.watchLocked()
	return func() bool {
		rc.mu.Lock()
		defer rc.mu.Unlock()
		for i, x := range rc.afters {
			if x == a {
				rc.afters = append(rc.afters[:i], rc.afters[i+1:]...)
				a.stopped = true
				return true
			}
		}
		return false
	}
}

// watchLocked starts the watcher if the request is still running.
func (rc *requestContext) watchLocked() {
	if rc.watcher == nil && rc.err.Load() == nil {
		rc.watcher = rc.conn.watchClient(func() { rc.cancel(context.Canceled) })
	}
}

// cancel ends the context with err (first call wins).
func (rc *requestContext) cancel(err error) {
	rc.mu.Lock()
	if rc.err.Load() != nil {
		rc.mu.Unlock()
		return
	}
	rc.err.Store(&err)
	if rc.done != nil {
		close(rc.done)
	}
	afters := rc.afters
	rc.afters = nil
	rc.mu.Unlock()
	for _, a := range afters {
		go a.f()
	}
}
