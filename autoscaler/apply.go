package autoscaler

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/trace"
)

// maxRetryBackoff caps the wait between two attempts of one scale call.
const maxRetryBackoff = 5 * time.Second

// transient reports whether err says it may succeed if tried again (nomadjob's
// errors implement Transient; anything else is final).
func transient(err error) bool {
	var t interface{ Transient() bool }
	return errors.As(err, &t) && t.Transient()
}

// maybeApply starts a scale call when the decision changes the count and no
// call for the revision is in flight. The loop never waits for Nomad: a
// slow call delays only its own revision, and the next decision sees the
// outcome.
func (l *loop) maybeApply(ctx context.Context, st *revState, dec Decision, now time.Time) {
	count := max(dec.Desired, 0)
	if m := max(st.scaling.Max, 0); m > 0 && count > m {
		count = m // never ask above the job's scaling max
	}
	if count == dec.Count {
		return
	}
	sh := st.sh
	sh.mu.Lock()
	if sh.applying || (sh.lastError != "" && sh.failedCount == count && now.Sub(sh.failedAt) < l.confirmWait()) {
		// In flight, or this very count just failed for good: do not
		// hammer Nomad every tick.
		sh.mu.Unlock()
		return
	}
	sh.applying = true
	sh.mu.Unlock()
	l.applies.Add(1)
	go l.apply(ctx, sh, st.name, count, dec.Reason(), dec.Meta(), l.wokenBy(st.name))
}

// apply calls the Scaler, retrying transient errors with backoff until
// RetryAttempts calls were made or ctx ends (leadership lost). woke is the
// trace of the wake behind the decision, if a traced request caused one:
// each call is a span in it.
func (l *loop) apply(ctx context.Context, sh *shared, revision string, count int, reason string, meta map[string]string, woke trace.SpanContext) {
	defer l.applies.Done()
	a := l.a
	var err error
	calls, failures := uint64(0), uint64(0)
	select {
	case l.sem <- struct{}{}:
		defer func() { <-l.sem }()
		backoff := a.cfg.RetryBackoff
		for attempt := 1; ; attempt++ {
			calls++
			sctx, sp := startScaleSpan(ctx, a.cfg.Tracer, woke, "autoscaler", revision, count, attempt, reason)
			err = a.cfg.Scaler.Scale(sctx, revision, count, reason, meta)
			endScaleSpan(sp, err)
			if err == nil {
				break
			}
			failures++
			if attempt >= a.cfg.RetryAttempts || !transient(err) || ctx.Err() != nil {
				break
			}
			a.log.Debug("scale failed, retrying", "revision", revision, "count", count, "attempt", attempt, "in", backoff, "err", err)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
			if ctx.Err() != nil {
				break
			}
			backoff = min(backoff*2, maxRetryBackoff)
		}
	case <-ctx.Done():
		err = ctx.Err()
	}

	now := a.cfg.Now()
	sh.mu.Lock()
	sh.applying = false
	sh.scaleCalls += calls
	sh.scaleFailures += failures
	if err == nil {
		sh.applied, sh.appliedAt = count, now
		sh.lastReason, sh.lastScale, sh.lastError = reason, now, ""
	} else {
		sh.lastError = err.Error()
		sh.failedCount, sh.failedAt = count, now
	}
	sh.mu.Unlock()
	if err == nil {
		a.log.Info("scaled", "revision", revision, "count", count, "reason", reason)
	} else if ctx.Err() == nil {
		a.log.Warn("scale failed", "revision", revision, "count", count, "reason", reason, "calls", calls, "err", err)
	}
}
