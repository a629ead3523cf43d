package activator

import (
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"time"
)

// failure is what a failed attempt at an instance proves. The rules are
// pure (see TestFailureRules): whether the request may go to another
// instance whatever its method, and whether the instance leaves balancing
// until a probe passes (ejection.go).
//
// Only failures that prove the app never saw the request qualify, so a
// retry never runs a request twice:
//   - the gateway's dial to the sidecar failed (refused: nothing listens;
//     or timed out): no connection, nothing sent;
//   - the connection broke before any byte of the request was written to
//     it (a kept-alive connection the sidecar closed or reset meanwhile);
//   - the sidecar answered 502 with spec.NotServedHeader: its app is
//     unreachable and the request is, by the sidecar's rules, safe to
//     send elsewhere.
//
// One more qualifies for idempotent requests only (GET, HEAD, OPTIONS,
// TRACE without a body: h1.Replayable), as Envoy's retry_on: reset does for
// them and as the sidecar does in front of its app: the connection broke
// after the request was written and before any byte of a response came
// back. The instance (its node, its sidecar) died with the request in
// flight; running it again elsewhere is what the method allows.
//
// Anything else (a non-idempotent request dropped after it was written, a
// malformed response, a timeout) may have reached the app; it is answered,
// not retried, and does not eject: an app that fails one request is the
// app's business, not an outage of the instance.
type failure int

const (
	failOther     failure = iota // may have reached the app
	failDial                     // no connection to the sidecar
	failUnsent                   // the connection broke before a byte was written
	failNotServed                // the sidecar says its app did not serve it
	failReset                    // an idempotent request's connection broke before a response
)

// retryable reports whether the request may go to another instance (for
// failReset only ever classified for idempotent requests).
func (f failure) retryable() bool { return f != failOther }

// unseen reports whether the failure proves the app never saw the request
// (a reset with an idempotent request in flight does not: it may have).
func (f failure) unseen() bool { return f == failDial || f == failUnsent || f == failNotServed }

// ejects reports whether the instance leaves balancing until a probe
// passes. A connection that broke unwritten does not: it says the
// connection was stale, not that the instance is down (the attempt on a
// new connection finds out). Nor does a reset with a request in flight: a
// request that kills its app would otherwise eject every instance it is
// retried on; a dead instance's next attempt fails to dial and ejects.
func (f failure) ejects() bool { return f == failDial || f == failNotServed }

func (f failure) String() string {
	switch f {
	case failDial:
		return "connect failed"
	case failUnsent:
		return "connection broke before the request was sent"
	case failNotServed:
		return "the instance's app is unreachable"
	case failReset:
		return "connection broke before a response to an idempotent request"
	}
	return "failed"
}

// classifyDial is the failure of an error from dialing a sidecar.
func classifyDial(err error) failure {
	var op *net.OpError
	if errors.As(err, &op) && op.Op == "dial" {
		return failDial
	}
	return failOther
}

// errNotServed is an instance's 502 that says its app did not serve the
// request (spec.NotServedHeader).
var errNotServed = errors.New("the instance's app is unreachable (the sidecar answered 502 " + notServedKey + ")")

// Retry budget defaults: Envoy's retry budget (20 % of the requests) with
// Finagle's floor (a few retries a second are always allowed, so a fault
// under light load is hidden too).
const (
	// retryPercent of a revision's requests may be retries.
	retryPercent = 20
	// retryFloorPerSecond retries a second are allowed on top, whatever
	// the traffic.
	retryFloorPerSecond = 10
	// retryBurst is the most retries saved up: a revision that was
	// healthy for an hour may retry this many at once, then its rate.
	retryBurst = 100
	// maxRetries bounds the retries of one request.
	maxRetries = 3
)

// retryBudget bounds one revision's retries so that an outage of the
// whole revision is not amplified: every request deposits percent/100 of
// a retry, time deposits floorPerSecond retries a second, a retry
// withdraws one, and the balance is capped at burst retries. In an outage
// at R requests a second the instances see at most R + (percent/100)R +
// floorPerSecond attempts a second after the first burst; ejection
// (ejection.go) usually stops the retries sooner, as every instance
// leaves balancing and requests wait in the activator's queue instead.
//
// It is lock-free: a deposit is one atomic add on the request path; a
// withdrawal (only when a retry is wanted) a few compare-and-swaps. The
// caller passes the clock, so the rules are table-tested.
type retryBudget struct {
	percent, floorPerSecond, burst int64
	// balance is in hundredths of a retry.
	balance atomic.Int64
	// refilled is when time last deposited (unix ns).
	refilled atomic.Int64
}

func newRetryBudget(percent, floorPerSecond, burst int, now time.Time) (*retryBudget, error) {
	if percent < 0 || percent > 100 || floorPerSecond < 0 || burst < 1 {
		return nil, fmt.Errorf("retry budget %d%%, %d/s, burst %d: want 0-100 %%, 0 or more a second, a burst of 1 or more",
			percent, floorPerSecond, burst)
	}
	b := &retryBudget{percent: int64(percent), floorPerSecond: int64(floorPerSecond), burst: int64(burst)}
	// Start with a second's floor, so the first fault is covered.
	b.balance.Store(min(b.floorPerSecond, b.burst) * 100)
	b.refilled.Store(now.UnixNano())
	return b, nil
}

// deposit credits one request.
func (b *retryBudget) deposit() { b.balance.Add(b.percent) }

// withdraw takes one retry if the budget has one at now.
func (b *retryBudget) withdraw(now time.Time) bool {
	limit := b.burst * 100
	ns := now.UnixNano()
	if last := b.refilled.Load(); ns > last && b.refilled.CompareAndSwap(last, ns) {
		// At most a full burst's worth, however long it has been (and
		// without overflowing on the way).
		elapsed := min(ns-last, int64(time.Hour))
		b.balance.Add(min(elapsed*b.floorPerSecond*100/int64(time.Second), limit))
	}
	for {
		bal := b.balance.Load()
		// Deposits are plain adds, so the cap is applied here.
		avail := min(bal, limit)
		if avail < 100 {
			return false
		}
		if b.balance.CompareAndSwap(bal, avail-100) {
			return true
		}
	}
}

// mustRetryBudget is a budget with the defaults above (valid by
// construction).
func mustRetryBudget() *retryBudget {
	b, err := newRetryBudget(retryPercent, retryFloorPerSecond, retryBurst, time.Now())
	if err != nil {
		panic(err)
	}
	return b
}
