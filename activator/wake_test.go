package activator

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// fakeClock drives a wakeTracker: now is set by the test, and the timers
// the tracker starts fire when the test says.
type fakeClock struct {
	mu     sync.Mutex
	t      time.Time
	timers []*fakeTimer
}

type fakeTimer struct {
	at      time.Time
	f       func()
	stopped bool
}

func (c *fakeClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// set moves the clock to base+d (never fires timers: advance does).
func (c *fakeClock) set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func (c *fakeClock) after(d time.Duration, f func()) func() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	ft := &fakeTimer{at: c.t.Add(d), f: f}
	c.timers = append(c.timers, ft)
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		was := !ft.stopped
		ft.stopped = true
		return was
	}
}

// advance moves the clock to t and fires the timers due by then.
func (c *fakeClock) advance(t time.Time) {
	c.mu.Lock()
	c.t = t
	var due []*fakeTimer
	for _, ft := range c.timers {
		if !ft.stopped && !ft.at.After(t) {
			ft.stopped = true
			due = append(due, ft)
		}
	}
	c.mu.Unlock()
	for _, ft := range due {
		ft.f()
	}
}

type trackerRig struct {
	clk  *fakeClock
	t    *wakeTracker
	rev  *revision
	base time.Time
	mu   sync.Mutex
	done []spec.WakeTimeline
}

func newTrackerRig() *trackerRig {
	base := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	rig := &trackerRig{clk: &fakeClock{t: base}, base: base}
	rig.t = newWakeTracker("r1", time.Minute, func(tl spec.WakeTimeline) {
		rig.mu.Lock()
		rig.done = append(rig.done, tl)
		rig.mu.Unlock()
	})
	rig.t.now, rig.t.after = rig.clk.now, rig.clk.after
	rig.rev = newRevision("hello-00001", "hello", "default", nil)
	rig.rev.wakes = rig.t
	return rig
}

// at is the rig's base time plus ms milliseconds.
func (rig *trackerRig) at(ms float64) time.Time {
	return rig.base.Add(time.Duration(ms * float64(time.Millisecond)))
}

func (rig *trackerRig) finished() []spec.WakeTimeline {
	rig.mu.Lock()
	defer rig.mu.Unlock()
	return slices.Clone(rig.done)
}

// A docker-like wake (the app's task starts before the sidecar's), fed in
// the order serve learns of its steps: the timeline has every step, in the
// order they happened, each delta the time since the step before, and it
// is reported once Consul's check passes, not at the first byte.
func TestWakeTimelineWholeWake(t *testing.T) {
	rig := newTrackerRig()
	tr, rev := rig.t, rig.rev
	tr.open(rev) // held at 0
	w := rev.openWake.Load()
	if w == nil {
		t.Fatal("no wake open after the first held request")
	}
	tr.open(rev) // a second held request joins it
	if rev.openWake.Load() != w {
		t.Fatal("a second held request opened another wake")
	}
	rig.clk.set(rig.at(2))
	tr.scaledFromZero(rev, rig.at(1.5))
	tr.evaluation(rev.name, "eval-1", rig.at(1.6))
	rig.clk.set(rig.at(12))
	tr.allocation(AllocationTimes{Revision: rev.name, ID: "alloc-1", EvalID: "eval-1", Placed: rig.at(10)})
	tr.probeReady(rev.name, "alloc-1", rig.at(701), spec.InstanceTimes{Started: rig.at(620), AppAccepted: rig.at(640), AppReady: rig.at(700)})
	rig.clk.set(rig.at(702))
	w.sending()
	rig.clk.set(rig.at(703))
	w.answered("alloc-1")
	if rev.openWake.Load() != nil {
		t.Error("the wake is still open to new requests after its first byte")
	}
	// The client's task events come after the first byte.
	rig.clk.set(rig.at(900))
	tr.allocation(AllocationTimes{Revision: rev.name, ID: "alloc-1", Received: rig.at(30), AppStarted: rig.at(400), SidecarStarted: rig.at(610)})
	if n := len(rig.finished()); n != 0 {
		t.Fatalf("%d timelines reported before Consul's check passed", n)
	}
	rig.clk.set(rig.at(1500))
	tr.consulPassing(rev.name, []string{"other", "alloc-1"})
	done := rig.finished()
	if len(done) != 1 {
		t.Fatalf("%d timelines reported, want 1", len(done))
	}
	tl := done[0]
	want := []struct {
		step        spec.WakeStep
		since, diff float64 // ms
	}{
		{spec.WakeHeld, 0, 0},
		{spec.WakeScaleWritten, 1.5, 1.5},
		{spec.WakeEvaluation, 1.6, 0.1},
		{spec.WakePlaced, 10, 8.4},
		{spec.WakeSeen, 12, 2},
		{spec.WakeReceived, 30, 18},
		{spec.WakeAppTask, 400, 370},
		{spec.WakeSidecarTask, 610, 210},
		{spec.WakeSidecarUp, 620, 10},
		{spec.WakeAppAccepted, 640, 20},
		{spec.WakeAppReady, 700, 60},
		{spec.WakeProbeReady, 701, 1},
		{spec.WakeSent, 702, 1},
		{spec.WakeFirstByte, 703, 1},
		{spec.WakeConsulPassing, 1500, 797},
	}
	if len(tl.Steps) != len(want) || len(tl.Missing) != 0 {
		t.Fatalf("timeline %+v: want %d steps and none missing", tl, len(want))
	}
	for i, s := range tl.Steps {
		if s.Step != want[i].step || s.Since != rig.at(want[i].since).Sub(rig.base) || s.Delta != rig.at(want[i].diff).Sub(rig.base) {
			t.Errorf("step %d: %s since %s delta %s; want %s since %vms delta %vms", i, s.Step, s.Since, s.Delta, want[i].step, want[i].since, want[i].diff)
		}
	}
	if tl.Service != "hello" || tl.Revision != rev.name || tl.Replica != "r1" || tl.Alloc != "alloc-1" {
		t.Errorf("timeline of %s/%s by %s, alloc %s", tl.Service, tl.Revision, tl.Replica, tl.Alloc)
	}
	if fb, _ := tl.FirstByte(); fb != 703*time.Millisecond {
		t.Errorf("first byte %s, want 703ms", fb)
	}
	if ours, _ := tl.OurShare(); ours != 3*time.Millisecond {
		t.Errorf("our share %s, want 3ms (app ready at 700, first byte at 703)", ours)
	}
	if bad := tl.OutOfOrder(0); len(bad) != 0 {
		t.Errorf("steps out of order: %v", bad)
	}
	if tr.active.Load() != 0 || len(tr.revs) != 0 {
		t.Errorf("the tracker keeps state after the wake: %d active, %v", tr.active.Load(), tr.revs)
	}
	// The next request at zero opens a new wake.
	rig.clk.set(rig.at(60_000))
	tr.open(rev)
	if w2 := rev.openWake.Load(); w2 == nil || w2 == w {
		t.Error("no new wake after the first one finished")
	}
}

// A wake whose last steps never come ends settle after its first byte,
// with the steps it has and the rest named missing.
func TestWakeTimelineSettles(t *testing.T) {
	rig := newTrackerRig()
	tr, rev := rig.t, rig.rev
	tr.open(rev)
	w := rev.openWake.Load()
	rig.clk.set(rig.at(3))
	tr.scaledFromZero(rev, rig.at(2))
	tr.allocation(AllocationTimes{Revision: rev.name, ID: "a", EvalID: "e", Placed: rig.at(2.5)})
	rig.clk.set(rig.at(300))
	w.sending()
	w.answered("a")
	rig.clk.advance(rig.at(300).Add(wakeSettle - time.Millisecond))
	if len(rig.finished()) != 0 {
		t.Fatal("reported before the settle time")
	}
	rig.clk.advance(rig.at(300).Add(wakeSettle))
	done := rig.finished()
	if len(done) != 1 {
		t.Fatalf("%d timelines after the settle time, want 1", len(done))
	}
	tl := done[0]
	for _, s := range []spec.WakeStep{spec.WakeEvaluation, spec.WakeReceived, spec.WakeProbeReady, spec.WakeConsulPassing} {
		if !slices.Contains(tl.Missing, s) {
			t.Errorf("%s not among the missing steps %v", s, tl.Missing)
		}
	}
	if fb, ok := tl.FirstByte(); !ok || fb != 300*time.Millisecond {
		t.Errorf("first byte %s %v, want 300ms", fb, ok)
	}
	if _, ok := tl.OurShare(); ok {
		t.Error("our share known without the app's readiness")
	}
}

// A wake whose request never got an answer ends at its bound; a scale-up
// seen before the wake opened (another replica's wake) counts for it, one
// older than the facts' lifetime does not.
func TestWakeTimelineBoundAndEarlierScaleUp(t *testing.T) {
	rig := newTrackerRig()
	tr, rev := rig.t, rig.rev
	tr.scaledFromZero(rev, rig.at(-5))
	rig.clk.set(rig.at(0))
	tr.open(rev)
	rig.clk.advance(rig.at(0).Add(time.Minute))
	done := rig.finished()
	if len(done) != 1 {
		t.Fatalf("%d timelines at the bound, want 1", len(done))
	}
	if d, ok := done[0].Between(spec.WakeHeld, spec.WakeScaleWritten); !ok || d != -5*time.Millisecond {
		t.Errorf("scale written %s after the held request (%v), want the earlier scale-up's -5ms", d, ok)
	}
	if _, ok := done[0].FirstByte(); ok || !slices.Contains(done[0].Missing, spec.WakeFirstByte) {
		t.Errorf("a wake with no answer has a first byte: %+v", done[0])
	}
	if rev.openWake.Load() != nil {
		t.Error("the wake is still open after its bound")
	}

	// A scale-up long before the wake is not its cause.
	rig.clk.set(rig.at(100_000))
	tr.scaledFromZero(rev, rig.at(100_000))
	rig.clk.set(rig.at(100_000).Add(wakeFactsTTL + time.Second))
	tr.open(rev)
	w := rev.openWake.Load()
	w.answered("x")
	rig.clk.advance(rig.at(100_000).Add(wakeFactsTTL + time.Second + wakeSettle))
	done = rig.finished()
	if len(done) != 2 || !slices.Contains(done[1].Missing, spec.WakeScaleWritten) {
		t.Errorf("a stale scale-up counted for a later wake: %+v", done)
	}
}

// A request held again while the previous wake waits for its last steps
// (the revision went back to zero at once) ends that wake with what it has
// and opens a new one.
func TestWakeTimelineReplacedBySettlingOne(t *testing.T) {
	rig := newTrackerRig()
	tr, rev := rig.t, rig.rev
	tr.open(rev)
	w1 := rev.openWake.Load()
	rig.clk.set(rig.at(50))
	w1.answered("a")
	rig.clk.set(rig.at(80))
	tr.open(rev)
	w2 := rev.openWake.Load()
	if w2 == nil || w2 == w1 {
		t.Fatal("no new wake")
	}
	if done := rig.finished(); len(done) != 1 || done[0].Steps[0].At != rig.at(0) {
		t.Fatalf("the settling wake was not ended when the next opened: %+v", done)
	}
	// Its timer is stopped: nothing more is reported for it.
	rig.clk.advance(rig.at(50).Add(wakeSettle))
	if n := len(rig.finished()); n != 1 {
		t.Errorf("%d timelines after the first wake's settle time, want 1", n)
	}
}
