package activator

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"
)

// A request's deadlines follow Knative's timeouts: the revision's timeout
// bounds the wait for the response (queueing, a wake from zero and the
// app's work until its first byte), not the response. Once the response
// head has gone to the client, a response that keeps flowing (a download,
// server-sent events, a gRPC stream, a websocket) may outlive it; the
// sidecar's idle_timeout cuts one that stops. The gateway then keeps only
// stall bounds on the client's connection: a client that takes no byte of
// the response, or sends no byte of a body still coming, for a whole
// timeout is cut (stallGuard), so a stuck peer cannot hold a slot forever.
// See docs/design-notes.md.

// responseStart is the ReverseProxy path's deadline for the response head:
// at the deadline the attempt's context is cancelled with
// context.DeadlineExceeded as its cause, unless the head arrived first.
// Exactly one of the two wins.
type responseStart struct {
	phase atomic.Int32 // waiting, started or timedOut
	timer *time.Timer
}

const (
	waiting int32 = iota
	started
	timedOut
)

// errStartedLate is what modifyResponse returns for a head that arrived
// after the deadline had cancelled the attempt.
var errStartedLate = errors.New("the response started after the revision's timeout")

// arm cancels ctx (through cancel) at deadline unless start is called first.
func (s *responseStart) arm(deadline time.Time, cancel context.CancelCauseFunc) {
	s.timer = time.AfterFunc(time.Until(deadline), func() {
		if s.phase.CompareAndSwap(waiting, timedOut) {
			cancel(context.DeadlineExceeded)
		}
	})
}

// start records the response head; false: the deadline passed first.
func (s *responseStart) start() bool {
	if !s.phase.CompareAndSwap(waiting, started) {
		return false
	}
	s.timer.Stop()
	return true
}

// stop releases the timer (the request is over).
func (s *responseStart) stop() {
	if s.timer != nil {
		s.timer.Stop()
	}
}

// stallGuard moves a connection deadline ahead while bytes flow: each
// call to flowed sets it limit past now, at most once a second, so a
// response or body that streams for hours keeps its connection and one
// that stalls for limit is cut. A short response, over within the first
// second, never moves it and costs a clock reading per write.
type stallGuard struct {
	set   func(time.Time) error
	limit time.Duration
	next  time.Time // the earliest time to move it again
}

func newStallGuard(set func(time.Time) error, limit time.Duration) *stallGuard {
	return &stallGuard{set: set, limit: limit, next: time.Now().Add(time.Second)}
}

// flowed says bytes moved just now.
func (s *stallGuard) flowed() {
	if now := time.Now(); now.After(s.next) {
		_ = s.set(now.Add(s.limit))
		s.next = now.Add(time.Second)
	}
}

// stallWriter moves the client connection's write deadline ahead as the
// response's bytes are written (stallGuard) once the response started.
// Unwrap lets http.ResponseController reach the connection's own methods
// (Hijack for a protocol switch, deadlines).
type stallWriter struct {
	http.ResponseWriter
	guard atomic.Pointer[stallGuard] // nil until the response started
}

func (w *stallWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	if g := w.guard.Load(); g != nil && n > 0 {
		g.flowed()
	}
	return n, err
}

func (w *stallWriter) Flush() { _ = http.NewResponseController(w.ResponseWriter).Flush() }

func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// stallSlack is added to the revision's timeout to make the stall bound:
// more than the second a stallGuard waits between moves, so a flowing
// stream's deadline always moves before it passes.
const stallSlack = 2 * time.Second

// never is a deadline no request reaches.
var never = time.Date(9999, 1, 1, 0, 0, 0, 0, time.UTC)
