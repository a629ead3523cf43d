package activator

import (
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// wakeTracker times every wake from zero this gateway holds a request for
// (spec.WakeTimeline). A wake opens when a request starts waiting for a
// revision that has no routable instance; the request that goes out first
// carries it (forward.wake) and stamps when it was sent and when its
// answer's first byte came back. Around it the tracker gathers, per
// revision, what the others report as it happens, with no request of its
// own:
//   - Nomad's event stream, through serve's feed (NoteScaledFromZero,
//     NoteEvaluation, NoteAllocation): the scale-up's write, its
//     evaluation, the allocation's placement and the client's task events;
//   - the gateway's probe of the new allocation, whose answer carries the
//     sidecar's own times (spec.InstanceTimesHeader);
//   - Consul's health, as the routing table sees the instance pass.
//
// A wake is done when every step of the allocation that answered is known,
// or settle after its first byte (a step that never came is reported
// missing), or, without a first byte, when bound has passed since it
// opened. Nothing polls: each report checks whether the wake is complete,
// and one timer per wake bounds the wait. Only requests that waited for a
// revision with no instance ever touch a wake.
type wakeTracker struct {
	replica string
	now     func() time.Time
	// after is time.AfterFunc (tests give a fake clock's); it returns the
	// timer's Stop.
	after func(d time.Duration, f func()) (stop func() bool)
	// settle bounds the wait for the steps after the first byte (Consul's
	// check, the client's task events), bound the life of a wake with no
	// first byte, factsTTL how long Nomad's news of a scale-up from zero
	// is kept for a wake that may follow.
	settle, bound, factsTTL time.Duration
	// done gets every finished timeline (outside the lock).
	done func(spec.WakeTimeline)
	// traced, if set (tracing on), gets every finished timeline whose
	// wake a traced request caused, with that request's hold span.
	traced func(cause trace.SpanContext, tl spec.WakeTimeline)

	// active counts revisions with state, so a routing-table rebuild skips
	// the lock when nothing is timed (the common case).
	active atomic.Int32

	mu   sync.Mutex
	revs map[string]*wakeState // by revision
}

// wakeState is what the tracker knows of one revision's last scale-up from
// zero, and the wake being timed, if any.
type wakeState struct {
	service string
	// raised is Nomad's time of the scale-up from zero (zero: not seen);
	// learned when it was reported, for expiry.
	raised, learned time.Time
	evals           map[string]time.Time       // evaluation ID -> created
	allocs          map[string]*allocationTime // by allocation ID, placed since the scale-up
	wake            *wake
}

// allocationTime is one allocation's steps.
type allocationTime struct {
	eval string
	at   map[spec.WakeStep]time.Time
}

// wake is one wake being timed.
type wake struct {
	t    *wakeTracker
	rev  *revision
	held time.Time

	// Guarded by t.mu.
	alloc           string // the allocation that answered
	sent, firstByte time.Time
	stop            func() bool
	finished        bool
	timeline        spec.WakeTimeline // once finished
	// cause is the hold span of the traced request the wake's timeline
	// belongs to (join); invalid when no held request was traced.
	cause trace.SpanContext
}

// AllocationTimes is what Nomad's event stream says of an allocation, for
// the wake timelines: its evaluation, when it was placed (its create time,
// the servers' clock), and, from the client's task events, when the client
// received it and started the sidecar's and the app's tasks. A zero time
// is not known yet.
type AllocationTimes struct {
	Revision, ID, EvalID                         string
	Placed, Received, SidecarStarted, AppStarted time.Time
	// InitDone is when the app's init steps finished (zero: it has none).
	InitDone time.Time
}

// The defaults of the tracker's bounds.
const (
	// wakeSettle: Consul's first check of a new instance runs within its
	// interval (1 s) of registration, and a Nomad client reports task
	// events in batches (a second or more on a busy client).
	wakeSettle = 15 * time.Second
	// wakeFactsTTL: a scale-up from zero this long ago is not the cause
	// of a wake opening now.
	wakeFactsTTL = 30 * time.Second
)

func newWakeTracker(replica string, bound time.Duration, done func(spec.WakeTimeline)) *wakeTracker {
	return &wakeTracker{
		replica: replica, now: time.Now,
		after:  func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop },
		settle: wakeSettle, bound: bound, factsTTL: wakeFactsTTL,
		done: done,
		revs: map[string]*wakeState{},
	}
}

// state returns a revision's state, made if need be; mu held.
func (t *wakeTracker) state(rev, service string) *wakeState {
	st := t.revs[rev]
	if st == nil {
		st = &wakeState{service: service, evals: map[string]time.Time{}, allocs: map[string]*allocationTime{}}
		t.revs[rev] = st
		t.active.Add(1)
	}
	return st
}

// drop forgets a revision's state; mu held.
func (t *wakeTracker) drop(rev string) {
	if _, ok := t.revs[rev]; ok {
		delete(t.revs, rev)
		t.active.Add(-1)
	}
}

// open starts timing a wake of r unless one is open: the activator holds
// a request for a revision with no routable instance.
func (t *wakeTracker) open(r *revision) {
	now := t.now()
	var finished *wake
	t.mu.Lock()
	if r.openWake.Load() != nil {
		t.mu.Unlock()
		return
	}
	st := t.state(r.name, r.service)
	if w := st.wake; w != nil {
		// The previous wake is still waiting for its last steps; the new
		// one replaces it, and it ends with what it has.
		finished = t.finishLocked(st, w)
	}
	if !st.learned.IsZero() && now.Sub(st.learned) > t.factsTTL {
		st.raised, st.learned = time.Time{}, time.Time{}
		clear(st.evals)
		clear(st.allocs)
	}
	w := &wake{t: t, rev: r, held: now}
	st.wake = w
	r.openWake.Store(w)
	w.stop = t.after(t.bound, func() { t.expire(w) })
	t.mu.Unlock()
	t.report(finished)
}

// NoteScaledFromZero: Nomad's job now has a count above zero where it had
// none, written at (the job's submit time). Evaluations and allocations
// seen before are of an earlier life of the revision.
func (t *wakeTracker) scaledFromZero(r *revision, at time.Time) {
	now := t.now()
	t.mu.Lock()
	defer t.mu.Unlock()
	// Forget what expired, here where it is cheap (scale-ups are rare).
	for name, st := range t.revs {
		if st.wake == nil && now.Sub(st.learned) > t.factsTTL {
			t.drop(name)
		}
	}
	st := t.state(r.name, r.service)
	st.raised, st.learned = at, now
	clear(st.evals)
	clear(st.allocs)
}

func (t *wakeTracker) evaluation(rev, id string, created time.Time) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if st := t.revs[rev]; st != nil && !created.IsZero() {
		if _, ok := st.evals[id]; !ok {
			st.evals[id] = created
		}
		t.checkLocked(st)
	}
}

// alloc returns an allocation's record, made if need be; mu held.
func (st *wakeState) alloc(id string) *allocationTime {
	a := st.allocs[id]
	if a == nil {
		a = &allocationTime{at: map[spec.WakeStep]time.Time{}}
		st.allocs[id] = a
	}
	return a
}

// set records a step's first time; mu held.
func (a *allocationTime) set(s spec.WakeStep, at time.Time) {
	if _, ok := a.at[s]; !ok && !at.IsZero() {
		a.at[s] = at
	}
}

func (t *wakeTracker) allocation(a AllocationTimes) {
	now := t.now()
	var finished *wake
	t.mu.Lock()
	if st := t.revs[a.Revision]; st != nil {
		at := st.alloc(a.ID)
		if a.EvalID != "" {
			at.eval = a.EvalID
		}
		at.set(spec.WakeSeen, now)
		at.set(spec.WakePlaced, a.Placed)
		at.set(spec.WakeReceived, a.Received)
		at.set(spec.WakeSidecarTask, a.SidecarStarted)
		at.set(spec.WakeAppTask, a.AppStarted)
		at.set(spec.WakeInitDone, a.InitDone)
		finished = t.checkLocked(st)
	}
	t.mu.Unlock()
	t.report(finished)
}

// probeReady: the gateway's probe found the allocation ready at at; the
// sidecar said when it started, and when its app accepted and was ready.
func (t *wakeTracker) probeReady(rev, alloc string, at time.Time, it spec.InstanceTimes) {
	var finished *wake
	t.mu.Lock()
	if st := t.revs[rev]; st != nil {
		a := st.alloc(alloc)
		a.set(spec.WakeProbeReady, at)
		a.set(spec.WakeSidecarUp, it.Started)
		a.set(spec.WakeAppAccepted, it.AppAccepted)
		a.set(spec.WakeAppReady, it.AppReady)
		finished = t.checkLocked(st)
	}
	t.mu.Unlock()
	t.report(finished)
}

// consulPassing: Consul's health lists these allocations of the revision
// passing (the routing table saw it now).
func (t *wakeTracker) consulPassing(rev string, allocs []string) {
	if t.active.Load() == 0 || len(allocs) == 0 {
		return
	}
	now := t.now()
	var finished *wake
	t.mu.Lock()
	if st := t.revs[rev]; st != nil {
		for _, id := range allocs {
			if a, ok := st.allocs[id]; ok {
				a.set(spec.WakeConsulPassing, now)
			}
		}
		finished = t.checkLocked(st)
	}
	t.mu.Unlock()
	t.report(finished)
}

// sending: a request carrying the wake goes to an instance now (each
// attempt; the last one before the first byte counts).
func (w *wake) sending() {
	t := w.t
	now := t.now()
	t.mu.Lock()
	if w.firstByte.IsZero() {
		w.sent = now
	}
	t.mu.Unlock()
}

// answered: the first byte of a response from alloc came back. Later
// requests no longer join this wake, and its last steps are waited for at
// most settle.
func (w *wake) answered(alloc string) {
	t := w.t
	now := t.now()
	var finished *wake
	t.mu.Lock()
	if w.firstByte.IsZero() && !w.finished {
		w.firstByte, w.alloc = now, alloc
		if w.sent.IsZero() {
			w.sent = now
		}
		w.rev.openWake.CompareAndSwap(w, nil)
		w.stop()
		w.stop = t.after(t.settle, func() { t.expire(w) })
		if st := t.revs[w.rev.name]; st != nil {
			finished = t.checkLocked(st)
		}
	}
	t.mu.Unlock()
	t.report(finished)
}

// expire ends a wake whose bound or settle time passed, with what it has.
func (t *wakeTracker) expire(w *wake) {
	var finished *wake
	t.mu.Lock()
	if st := t.revs[w.rev.name]; st != nil && st.wake == w {
		t.drop(w.rev.name)
		finished = t.finishLocked(st, w)
	}
	t.mu.Unlock()
	t.report(finished)
}

// waitedFor are the steps of the answering allocation a wake waits for
// after its first byte. The sidecar's times and the probe's come before
// the first byte or never (an instance Consul made routable first, a
// sidecar that does not send them).
var waitedFor = []spec.WakeStep{spec.WakePlaced, spec.WakeSeen, spec.WakeReceived, spec.WakeSidecarTask, spec.WakeAppTask, spec.WakeConsulPassing}

// checkLocked finishes the revision's wake if every step is known, and
// returns it (report it after unlocking); mu held.
func (t *wakeTracker) checkLocked(st *wakeState) *wake {
	w := st.wake
	if w == nil || w.firstByte.IsZero() || st.raised.IsZero() {
		return nil
	}
	a := st.allocs[w.alloc]
	if a == nil {
		return nil
	}
	if _, ok := st.evals[a.eval]; !ok {
		return nil
	}
	for _, s := range waitedFor {
		if _, ok := a.at[s]; !ok {
			return nil
		}
	}
	// The revision is awake: nothing more to learn of this scale-up.
	t.drop(w.rev.name)
	return t.finishLocked(st, w)
}

// finishLocked ends w, the revision's wake, and builds its timeline; mu
// held. The caller reports w once it has unlocked.
func (t *wakeTracker) finishLocked(st *wakeState, w *wake) *wake {
	if w.finished {
		return nil
	}
	w.finished = true
	w.stop()
	w.rev.openWake.CompareAndSwap(w, nil)
	if st.wake == w {
		st.wake = nil
	}
	at := map[spec.WakeStep]time.Time{spec.WakeHeld: w.held, spec.WakeScaleWritten: st.raised}
	if !w.firstByte.IsZero() {
		at[spec.WakeSent], at[spec.WakeFirstByte] = w.sent, w.firstByte
	}
	if a := st.allocs[w.alloc]; a != nil {
		for s, v := range a.at {
			at[s] = v
		}
		at[spec.WakeEvaluation] = st.evals[a.eval]
	}
	w.timeline = spec.NewWakeTimeline(st.service, w.rev.name, t.replica, w.alloc, at)
	return w
}

// report hands a finished wake's timeline on (outside the lock).
func (t *wakeTracker) report(w *wake) {
	if w == nil {
		return
	}
	if t.done != nil {
		t.done(w.timeline)
	}
	if t.traced != nil && w.cause.IsSampled() {
		t.traced(w.cause, w.timeline)
	}
}
