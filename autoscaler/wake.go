package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/catalog"
)

// BurstSink is what the activator needs of the autoscaler: a DemandSink
// that also knows the revisions' excess burst capacities. RemoteSink is
// one; Waker wraps one.
type BurstSink interface {
	DemandSink
	ExcessBurstCapacity(revision string) (ebc float64, known bool)
}

// WakerConfig configures a Waker. Revisions, Raiser and Next are required.
type WakerConfig struct {
	// Revisions gives a revision's count and activation scale (the
	// catalog).
	Revisions RevisionSource
	// Raiser raises a count to at least n (nomadjob's ScaleAtLeast).
	Raiser Raiser
	// Next is the way to the leader's autoscaler (RemoteSink): wakes and
	// demand reports go to it first.
	Next BurstSink
	// Local is this replica's autoscaler: while it leads, a wake is its
	// decision alone.
	Local *Autoscaler
	// HandOff bounds how long passing a wake on to the leader may take
	// before this replica raises the revision itself; default 300ms (a
	// leader answers in a millisecond; one that is gone refuses at once,
	// or, on a dead node, never).
	HandOff time.Duration
	// LeaderGrace is how long a revision may stay at zero, with requests
	// waiting, after the leader took its wake, before this replica raises
	// it itself (the leader lost its lock with the wake unanswered, or
	// cannot reach Nomad); default 2s. The activator's demand report,
	// every second, is when it is looked at again.
	LeaderGrace time.Duration
	// Recent is how long after a raise no other raise of the revision is
	// tried while the catalog has not caught up; default 5s.
	Recent time.Duration
	// Now is the clock; nil is time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Tracer, when set (tracing on), makes a raise of a wake a traced
	// request caused a span in its trace (tracing.go).
	Tracer trace.Tracer
}

// Waker is the activator's DemandSink on every replica. A wake of a
// revision at zero goes to the leader, as before, and the leader's
// decision raises it (with its scaling event). But when the leader does
// not take it (gone, not known yet, not running its autoscaler, too slow)
// or has not raised it LeaderGrace after it did, this replica raises it to
// its activation scale itself, without waiting for leadership to move.
// The raise is Raiser's "at least n": idempotent, safe against the other
// replicas doing the same and against the leader's own scale calls, and it
// never lowers a count. The leader's next decision takes it from there.
//
// One raise per revision is in flight at a time, and none is tried while
// the catalog already shows the count above zero (or one was just made
// and the catalog has not caught up): a burst of requests makes one raise.
type Waker struct {
	cfg WakerConfig
	log *slog.Logger

	mu    sync.Mutex
	state map[string]wakeState // by revision, while at zero or just raised

	bg sync.WaitGroup // raises started by a demand report
}

type wakeState struct {
	// handedAt is when the leader first took a wake or a report of the
	// revision at zero with requests waiting (zero: it has not).
	handedAt time.Time
	inFlight bool
	raisedAt time.Time // the last raise that found or set the count
}

// NewWaker validates cfg.
func NewWaker(cfg WakerConfig) (*Waker, error) {
	switch {
	case cfg.Revisions == nil:
		return nil, errors.New("autoscaler: WakerConfig.Revisions is nil: give it the catalog")
	case cfg.Raiser == nil:
		return nil, errors.New("autoscaler: WakerConfig.Raiser is nil: give it the Nomad client")
	case cfg.Next == nil:
		return nil, errors.New("autoscaler: WakerConfig.Next is nil: give it the RemoteSink")
	case cfg.HandOff < 0 || cfg.LeaderGrace < 0 || cfg.Recent < 0:
		return nil, errors.New("autoscaler: WakerConfig HandOff, LeaderGrace and Recent must not be negative")
	}
	if cfg.HandOff == 0 {
		cfg.HandOff = 300 * time.Millisecond
	}
	if cfg.LeaderGrace == 0 {
		cfg.LeaderGrace = 2 * time.Second
	}
	if cfg.Recent == 0 {
		cfg.Recent = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Waker{cfg: cfg, log: log.With("component", "waker"), state: map[string]wakeState{}}, nil
}

// ExcessBurstCapacity is the leader's, through Next.
func (w *Waker) ExcessBurstCapacity(revision string) (float64, bool) {
	return w.cfg.Next.ExcessBurstCapacity(revision)
}

// Wake implements DemandSink. It fails only when the wake reached nobody:
// a wake the leader could not take is no failure once the count is up.
func (w *Waker) Wake(ctx context.Context, replica string, d Demand) error {
	switch c, n := w.look(d.Revision); c {
	case atZero:
		hctx, cancel := context.WithTimeout(ctx, w.cfg.HandOff)
		err := w.cfg.Next.Wake(hctx, replica, d)
		cancel()
		if err == nil {
			w.handed(d.Revision)
			return nil
		}
		w.log.Debug("the leader did not take the wake: raising it here", "revision", d.Revision, "err", err)
		if rerr := w.raise(ctx, replica, d, n); rerr != nil {
			return errors.Join(rerr, err)
		}
		return nil
	case awake:
		if err := w.cfg.Next.Wake(ctx, replica, d); err != nil {
			w.log.Debug("wake not passed on to the leader (the revision's count is up already)", "revision", d.Revision, "err", err)
		}
		return nil
	default: // leading here, or not in this replica's catalog
		return w.cfg.Next.Wake(ctx, replica, d)
	}
}

// ReportDemand implements DemandSink: the report goes to the leader, and
// a revision at zero with requests waiting here is raised here when the
// leader could not take the report, or took its wake LeaderGrace ago and
// the count is still zero.
func (w *Waker) ReportDemand(ctx context.Context, replica string, demand []Demand) error {
	err := w.cfg.Next.ReportDemand(ctx, replica, demand)
	for _, d := range demand {
		if d.Queued <= 0 {
			continue
		}
		c, n := w.look(d.Revision)
		if c != atZero {
			continue
		}
		if err == nil && !w.overdue(d.Revision) {
			continue
		}
		// The report's context ends with the call; the raise has its own.
		w.bg.Go(func() {
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if rerr := w.raise(rctx, replica, d, n); rerr != nil {
				w.log.Warn("raise a revision at zero", "revision", d.Revision, "err", rerr)
			}
		})
	}
	return err
}

// Wait waits for the raises demand reports started (tests, shutdown).
func (w *Waker) Wait() { w.bg.Wait() }

// where is what a wake finds a revision at.
type where uint8

const (
	// atZero: at zero, and this replica may raise it (to n).
	atZero where = iota + 1
	// awake: its count is above zero, or a raise of it is in flight or
	// was just made: more capacity is the leader's decision.
	awake
	// leading: this replica leads; its autoscaler decides.
	leading
	// unknown: not in this replica's catalog (yet).
	unknown
)

// look tells where a revision is, from the catalog's count and the raises
// this Waker made, and the count a raise would set (the activation scale,
// at most max).
func (w *Waker) look(revision string) (where, int) {
	if l := w.cfg.Local; l != nil && l.Leading() {
		return leading, 0
	}
	r, known := lookupRevision(w.cfg.Revisions, revision)
	if !known {
		return unknown, 0
	}
	now := w.cfg.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	st, tracked := w.state[revision]
	if r.Desired > 0 {
		if tracked && !st.inFlight {
			delete(w.state, revision) // awake: a later zero starts afresh
		}
		return awake, 0
	}
	if st.inFlight || (!st.raisedAt.IsZero() && now.Sub(st.raisedAt) < w.cfg.Recent) {
		return awake, 0
	}
	s := effectiveScaling(r.Scaling)
	n := s.ActivationScale
	if s.Max > 0 {
		n = min(n, s.Max)
	}
	return atZero, n
}

// handed records that the leader took a wake of the revision at zero.
func (w *Waker) handed(revision string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state[revision]
	if st.handedAt.IsZero() {
		st.handedAt = w.cfg.Now()
		w.state[revision] = st
	}
}

// overdue tells whether the leader took a wake of the revision at least
// LeaderGrace ago; a report it takes counts as such a wake from now on.
func (w *Waker) overdue(revision string) bool {
	now := w.cfg.Now()
	w.mu.Lock()
	defer w.mu.Unlock()
	st := w.state[revision]
	if st.handedAt.IsZero() {
		st.handedAt = now
		w.state[revision] = st
		return false
	}
	return now.Sub(st.handedAt) >= w.cfg.LeaderGrace
}

// raise raises the revision to n unless a raise of it is in flight or was
// just made.
func (w *Waker) raise(ctx context.Context, replica string, d Demand, n int) error {
	now := w.cfg.Now()
	w.mu.Lock()
	st := w.state[d.Revision]
	if st.inFlight || (!st.raisedAt.IsZero() && now.Sub(st.raisedAt) < w.cfg.Recent) {
		w.mu.Unlock()
		return nil
	}
	st.inFlight = true
	w.state[d.Revision] = st
	w.mu.Unlock()

	reason := fmt.Sprintf("wake: %d %s waiting at the activator of replica %s", d.Queued, plural(d.Queued, "request", "requests"), replica)
	meta := map[string]string{"rule": RuleWake.String(), "replica": replica, "queued": strconv.Itoa(d.Queued)}
	sctx, sp := startScaleSpan(ctx, w.cfg.Tracer, wakeTrace(ctx), "waker", d.Revision, n, 1, reason)
	raised, err := w.cfg.Raiser.ScaleAtLeast(sctx, d.Revision, n, reason, meta)
	if sp != nil {
		sp.SetAttributes(attrRaised.Bool(raised))
	}
	endScaleSpan(sp, err)

	w.mu.Lock()
	st = w.state[d.Revision]
	st.inFlight = false
	if err == nil {
		// Raised by us, or found up already: either way the count is
		// there, and the catalog will say so in a moment.
		st.raisedAt, st.handedAt = w.cfg.Now(), time.Time{}
	}
	w.state[d.Revision] = st
	w.mu.Unlock()
	if err != nil {
		return fmt.Errorf("wake revision %s here: %w", d.Revision, err)
	}
	if raised {
		w.log.Info("raised a revision at zero without the leader", "revision", d.Revision, "to", n, "queued", d.Queued)
	}
	return nil
}

// lookupRevision finds one revision, by the source's fast path when it has
// one.
func lookupRevision(src RevisionSource, name string) (catalog.Revision, bool) {
	if lk, ok := src.(revisionLookup); ok {
		return lk.Revision(name)
	}
	for _, r := range src.Revisions() {
		if r.Name == name {
			return r, true
		}
	}
	return catalog.Revision{}, false
}
