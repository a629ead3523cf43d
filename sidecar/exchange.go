package sidecar

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
)

// clientCheckInterval is how often a long request checks whether its
// client is still there, so an abandoned request stops occupying the app.
const clientCheckInterval = time.Second

// exchange is one request's state: the ResponseWriter the proxy writes
// through (recording status and bytes for metrics and the access log) and
// the timer that enforces the three timeouts and notices a departed client.
// Exchanges are pooled, timer included, so a request allocates none of this.
//
// The timer never touches the ResponseWriter. On expiry it only aborts the
// request's upstream side: it sets a past deadline on the app connection the
// request is using (or cancels the context, on the ReverseProxy paths). The
// handler goroutine, blocked on that connection, then fails and answers 504,
// or aborts the client connection if the response had started. So no lock
// guards the writer, unlike http.TimeoutHandler, which writes from a second
// goroutine; and a request needs no context of its own.
type exchange struct {
	h *Handler
	w http.ResponseWriter

	// Handler goroutine only.
	status      int
	bytes       int64
	wroteHeader bool
	// body tracks an HTTP/1 request body that may still be arriving when
	// the response starts (nil: none).
	body h1.EOFer
	// span is the request's server span (nil: tracing off, or not
	// sampled), ended by Handler.done with the status; appSpan the call
	// to the app's. A protocol switch ends both at its 101.
	span, appSpan trace.Span

	// Set before the timer is armed (Timer.Reset orders them before the
	// timer goroutine reads them).
	start     time.Time
	clientCtx context.Context
	timer     *time.Timer
	nextCheck time.Duration // timer goroutine only after arming

	// Shared with the timer goroutine.
	done       atomic.Bool  // the request finished; the timer must not re-arm
	dispatched atomic.Int64 // ns since start when the request went to the app, -1 before
	started    atomic.Bool  // response headers written (or connection upgraded)
	lastWrite  atomic.Int64 // ns since start of the last body write (idle timeout only)
	expired    atomic.Pointer[timeoutError]
	clientGone atomic.Bool
	aborted    atomic.Bool
	// conn is the app connection in use; whoever swaps it out owns it:
	// the handler to reuse it, the timer to break it.
	conn   atomic.Pointer[appConn]
	waiter atomic.Pointer[Waiter] // in the breaker's line
	cancel atomic.Pointer[context.CancelCauseFunc]
	runs   atomic.Uint32 // added to at the end of every timer run
}

// timeoutError is the cause of a request a timeout ended.
type timeoutError struct {
	kind  string
	limit time.Duration
}

func (e *timeoutError) Error() string { return e.kind + " timeout (" + e.limit.String() + ") passed" }

// bodyGrace is how long a response's head waits for the rest of its
// request body (see WriteHeader).
const bodyGrace = 5 * time.Millisecond

// pastDeadline makes every blocked read or write on a connection return.
var pastDeadline = time.Unix(1, 0)

func newExchange(h *Handler) *exchange {
	x := &exchange{h: h}
	x.timer = time.AfterFunc(time.Hour, x.onTimer)
	x.timer.Stop()
	return x
}

// begin readies a pooled exchange for a request. Plain fields are written
// before the atomics: the timer goroutine starts by loading done, which
// orders these writes before its reads (for the race detector as well).
func (x *exchange) begin(w http.ResponseWriter, clientCtx context.Context, start time.Time) {
	x.w = w
	x.status = 0
	x.bytes = 0
	x.wroteHeader = false
	x.body = nil
	x.span, x.appSpan = nil, nil
	x.start = start
	x.clientCtx = clientCtx
	x.nextCheck = clientCheckInterval
	x.dispatched.Store(-1)
	x.started.Store(false)
	x.lastWrite.Store(0)
	x.expired.Store(nil)
	x.clientGone.Store(false)
	x.aborted.Store(false)
	x.conn.Store(nil)
	x.waiter.Store(nil)
	x.cancel.Store(nil)
	x.done.Store(false)
	x.timer.Reset(min(x.h.cfg.Timeout, clientCheckInterval))
}

// finish stops the timer. It reports whether the exchange may go back to
// the pool: not if the timer's function is running, since it may still read
// the exchange.
func (x *exchange) finish() bool {
	x.done.Store(true)
	if !x.timer.Stop() {
		return false
	}
	// The timer's function ran before, if at all, and ended with an add to
	// runs; this load orders its reads before the writes below.
	x.runs.Load()
	x.w = nil
	x.clientCtx = nil
	x.body = nil
	x.span, x.appSpan = nil, nil
	return true
}

// dispatch marks the moment the request leaves the queue for the app: the
// response start timeout, and the idle timeout until the first byte, count
// from here.
func (x *exchange) dispatch(at time.Time) {
	if cfg := &x.h.cfg; cfg.ResponseStartTimeout > 0 || cfg.IdleTimeout > 0 {
		x.dispatched.Store(int64(at.Sub(x.start)))
		x.rearm(at)
	}
}

// rearm points the timer at the earliest deadline that applies now, or at
// the next look at the client if that comes first.
func (x *exchange) rearm(now time.Time) {
	if d, _ := x.nextDeadline(now); d > 0 {
		x.timer.Reset(min(d, clientCheckInterval))
	}
}

// noDeadline is nextDeadline's answer when no timeout applies.
const noDeadline = time.Duration(1<<63 - 1)

// nextDeadline returns how long until the earliest timeout, and which; a
// zero or negative duration means it has passed.
//
// As in Knative, the timeouts bound the wait for the response, not the
// response: until its first byte, timeout counts from the request's
// arrival (queueing included), response_start_timeout from its dispatch
// to the app, and idle_timeout too (an app silent that long is as stuck
// before its first byte as after it). Once the response has started only
// idle_timeout applies, between writes: a stream that keeps sending (a
// download, server-sent events, a gRPC stream) may outlive timeout, and
// one that stops is cut. See docs/design-notes.md.
func (x *exchange) nextDeadline(now time.Time) (time.Duration, *timeoutError) {
	cfg := &x.h.cfg
	elapsed := now.Sub(x.start)
	left, kind := noDeadline, (*timeoutError)(nil)
	earlier := func(l time.Duration, k *timeoutError) {
		if l < left {
			left, kind = l, k
		}
	}
	if !x.started.Load() {
		earlier(cfg.Timeout-elapsed, &x.h.timeouts.request)
		if at := x.dispatched.Load(); at >= 0 {
			if rst := cfg.ResponseStartTimeout; rst > 0 {
				earlier(time.Duration(at)+rst-elapsed, &x.h.timeouts.responseStart)
			}
			if idle := cfg.IdleTimeout; idle > 0 {
				earlier(time.Duration(at)+idle-elapsed, &x.h.timeouts.idle)
			}
		}
	} else if idle := cfg.IdleTimeout; idle > 0 {
		earlier(time.Duration(x.lastWrite.Load())+idle-elapsed, &x.h.timeouts.idle)
	}
	return left, kind
}

// onTimer runs in the timer's goroutine.
func (x *exchange) onTimer() {
	defer x.runs.Add(1)
	if x.done.Load() {
		return
	}
	now := time.Now()
	elapsed := now.Sub(x.start)
	if elapsed >= x.nextCheck {
		x.nextCheck = elapsed + clientCheckInterval
		if x.clientCtx.Err() != nil {
			x.clientGone.Store(true)
			x.abort(context.Canceled)
			return
		}
	}
	left, kind := x.nextDeadline(now)
	if left <= 0 && kind != nil {
		if x.expired.CompareAndSwap(nil, kind) {
			x.abort(kind)
		}
		return
	}
	x.timer.Reset(min(left, x.nextCheck-elapsed))
}

// abort breaks the request's upstream side (see exchange).
func (x *exchange) abort(cause error) {
	x.aborted.Store(true)
	if c := x.conn.Swap(nil); c != nil {
		_ = c.nc.SetDeadline(pastDeadline)
	}
	if w := x.waiter.Swap(nil); w != nil {
		x.h.breaker.Cancel(w)
	}
	if c := x.cancel.Load(); c != nil {
		(*c)(cause)
	}
}

// attach makes ac the connection a timeout breaks; false means the request
// was aborted already (ac is then broken or about to be).
func (x *exchange) attach(ac *appConn) bool {
	x.conn.Store(ac)
	if x.aborted.Load() {
		if x.conn.Swap(nil) != nil {
			_ = ac.nc.SetDeadline(pastDeadline)
		}
		return false
	}
	return true
}

// setCancel makes cancel what a timeout calls (ReverseProxy paths and the
// breaker's queue); if the request was aborted already it calls it now.
func (x *exchange) setCancel(cancel *context.CancelCauseFunc) {
	x.cancel.Store(cancel)
	if x.aborted.Load() {
		cause := error(context.Canceled)
		if t := x.timedOut(); t != nil {
			cause = t
		}
		(*cancel)(cause)
	}
}

// queue waits in the breaker's line for a slot, cancellable by the timer
// (abort) without a context. nil means a slot is held.
func (x *exchange) queue(b *Breaker) error {
	w, err := b.Enqueue()
	if err != nil || w == nil {
		return err
	}
	x.waiter.Store(w)
	if x.aborted.Load() && x.waiter.Swap(nil) != nil {
		// Aborted before the timer could see the waiter.
		b.Cancel(w)
	}
	err = b.Wait(w)
	// Whoever swaps the waiter out owns it: if the timer did, it may still
	// be calling Cancel, so the waiter is left to the garbage collector.
	if x.waiter.Swap(nil) == w {
		b.Recycle(w)
	}
	return err
}

// detach takes the connection back; false means the timer broke it.
func (x *exchange) detach(ac *appConn) bool { return x.conn.CompareAndSwap(ac, nil) }

// timedOut returns the timeout that ended the request, or nil.
func (x *exchange) timedOut() *timeoutError { return x.expired.Load() }

// http.ResponseWriter, with the optional interfaces the proxy needs
// (Flusher for streaming, Hijacker for upgrades, Unwrap for everything
// http.ResponseController knows).

func (x *exchange) Header() http.Header { return x.w.Header() }

func (x *exchange) WriteHeader(code int) {
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// Informational (103 Early Hints): passed on, not the response.
		x.w.WriteHeader(code)
		return
	}
	if x.wroteHeader {
		return
	}
	x.wroteHeader = true
	x.status = code
	if code != http.StatusSwitchingProtocols && (x.h.state.draining.Load() || x.body != nil && !h1.AwaitEOF(x.body, bodyGrace)) {
		// Lame duck: answer, then close the connection, so clients
		// reconnect (to another instance once Consul has caught up)
		// instead of reusing this one. Every response, the app's and the
		// sidecar's own, passes here; an upgrade keeps its connection.
		//
		// A response that starts before the request body was read to
		// its end (the app answered early, or echoes; or the body broke)
		// closes the connection too: the rest of the body will not be
		// read, and net/http, told the handler is full duplex, would
		// otherwise parse what follows on the connection as the next
		// request, a broken body's bytes included (a second response to
		// one request). Without full duplex net/http does the same. A
		// body sent in full is usually read within microseconds; an
		// answer that overtook it (an app that answers, then reads)
		// waits up to bodyGrace for it rather than lose the connection.
		x.w.Header()["Connection"] = connectionClose
	}
	idle := x.h.cfg.IdleTimeout > 0
	var now time.Time
	if idle {
		now = time.Now()
		x.lastWrite.Store(int64(now.Sub(x.start)))
	}
	x.started.Store(true)
	x.w.WriteHeader(code)
	if code == http.StatusSwitchingProtocols && x.span != nil {
		x.endSpansAtUpgrade()
	}
	if idle {
		x.rearm(now)
	}
}

func (x *exchange) Write(p []byte) (int, error) {
	if !x.wroteHeader {
		x.WriteHeader(http.StatusOK)
	}
	n, err := x.w.Write(p)
	x.bytes += int64(n)
	if x.h.cfg.IdleTimeout > 0 {
		x.lastWrite.Store(int64(time.Since(x.start)))
	}
	return n, err
}

func (x *exchange) Flush() {
	if !x.wroteHeader {
		x.WriteHeader(http.StatusOK)
	}
	if f, ok := x.w.(http.Flusher); ok {
		f.Flush()
		return
	}
	_ = http.NewResponseController(x.w).Flush()
}

// Hijack hands the client connection to the proxy for a protocol switch
// (websocket). The response has started: from here on no timeout applies
// (the tunnel's bytes do not pass through Write), only the client check
// and the drain.
func (x *exchange) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := http.NewResponseController(x.w).Hijack()
	if err == nil {
		x.wroteHeader = true
		x.status = http.StatusSwitchingProtocols
		x.started.Store(true)
	}
	return c, brw, err
}

func (x *exchange) Unwrap() http.ResponseWriter { return x.w }
