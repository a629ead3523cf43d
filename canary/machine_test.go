package canary

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

var t0 = time.Date(2030, 1, 1, 12, 0, 0, 0, time.UTC)

// planOf is the plan of a rollout block with the given duration or steps,
// judged every 15s.
func planOf(t *testing.T, d time.Duration, steps []int, bound spec.LatencyBound) Plan {
	t.Helper()
	r := rolloutOf(d, steps, 15*time.Second)
	r.Analysis.MaxErrorRate = 2
	r.Analysis.MaxLatency = bound
	p, err := PlanFor(r, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func config(p Plan) Config {
	return Config{Service: "hello", New: "hello-00002", Previous: "hello-00001", LatestPercent: 100, Plan: p}
}

// driver runs a machine as the leader does: a Tick every gap, and it
// keeps everything the machine said.
type driver struct {
	t      *testing.T
	m      *Machine
	now    time.Time
	events []Event
	routes []*Split
	wakes  []string
}

func start(t *testing.T, c Config) *driver {
	t.Helper()
	m, err := New(c, t0)
	if err != nil {
		t.Fatal(err)
	}
	return &driver{t: t, m: m, now: t0}
}

func (d *driver) keep(o Output) Output {
	d.events = append(d.events, o.Events...)
	d.routes = append(d.routes, o.Route)
	if o.Wake != "" {
		d.wakes = append(d.wakes, o.Wake)
	}
	return o
}

func (d *driver) tick(gap time.Duration, in Input) Output {
	d.t.Helper()
	d.now = d.now.Add(gap)
	o, err := d.m.Tick(d.now, in)
	if err != nil {
		d.t.Fatal(err)
	}
	return d.keep(o)
}

// until ticks every gap with in until the rollout ends or limit passes.
func (d *driver) until(gap, limit time.Duration, in Input) {
	d.t.Helper()
	for end := d.now.Add(limit); !d.m.Phase().Ended() && d.now.Before(end); {
		d.tick(gap, in)
	}
}

func (d *driver) kinds() []EventKind {
	var ks []EventKind
	for _, e := range d.events {
		ks = append(ks, e.Kind)
	}
	return ks
}

func (d *driver) judgments() []Judgment {
	var js []Judgment
	for _, e := range d.events {
		if e.Kind == EventJudged {
			js = append(js, *e.Judgment)
		}
	}
	return js
}

// newWeights are the distinct weights of the new revision the route
// held, in order.
func (d *driver) newWeights() []Weight {
	var ws []Weight
	for _, r := range d.routes {
		if r != nil && (len(ws) == 0 || ws[len(ws)-1] != r.NewWeight) {
			ws = append(ws, r.NewWeight)
		}
	}
	return ws
}

// good is steady traffic that passes every threshold: the new revision
// gets 50 requests a tick, the previous 500, both at 20ms.
var good = Input{New: meas(50, 0, 20*time.Millisecond), Previous: meas(500, 0, 20*time.Millisecond), NewReady: true}

// A good revision goes 1%, 25%, 50%, 75%, then 100%, one interval a step,
// and completes within the duration.
func TestRolloutCompletes(t *testing.T) {
	d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{Factor: 1.5, Absolute: 300 * time.Millisecond})))
	d.tick(0, good)
	d.until(5*time.Second, 10*time.Minute, good)
	if d.m.Phase() != PhaseCompleted {
		t.Fatalf("phase %s: %v", d.m.Phase(), d.kinds())
	}
	if want := t0.Add(time.Minute); !d.now.Equal(want) {
		t.Errorf("completed at %s, want at the end of the duration, %s", d.now, want)
	}
	if got, want := d.newWeights(), []Weight{100, 2500, 5000, 7500, 10000}; !reflect.DeepEqual(got, want) {
		t.Errorf("new revision's weights %v, want %v", got, want)
	}
	for _, r := range d.routes {
		if r.New != "hello-00002" || r.Previous != "hello-00001" || r.NewWeight+r.PreviousWeight != AllRequests {
			t.Fatalf("route %+v", r)
		}
	}
	want := []EventKind{EventStepStarted, EventJudged, EventStepStarted, EventJudged, EventStepStarted, EventJudged, EventStepStarted, EventJudged, EventCompleted}
	if !reflect.DeepEqual(d.kinds(), want) {
		t.Errorf("events %v, want %v", d.kinds(), want)
	}
	for i, j := range d.judgments() {
		// Three ticks of the window: 150 new requests, 1500 previous.
		if j.Verdict != VerdictPass || j.Step != i+1 || j.New.Requests != 150 || j.Previous.Requests != 1500 || !near(j.New.P99, 20*time.Millisecond) {
			t.Errorf("judgment %d: %+v", i+1, j)
		}
	}
	last := d.events[len(d.events)-1]
	if last.Message != "completed: hello-00002 holds the latest share (100% of all requests) after 4 steps; the last: step 4 (75%) passed" {
		t.Errorf("completion says %q", last.Message)
	}
	if len(d.wakes) != 0 {
		t.Errorf("a ready revision was woken: %v", d.wakes)
	}
	// The end is the end: nothing moves after it.
	n := len(d.events)
	o := d.tick(time.Minute, Input{New: meas(100, 100, time.Second), NewReady: true})
	if len(d.events) != n || o.Route.NewWeight != AllRequests {
		t.Errorf("after completion: %+v", o)
	}
}

// A failing step sends the whole share back at once, and says why.
func TestRolloutRollsBack(t *testing.T) {
	rel := spec.LatencyBound{Factor: 1.5}
	abs := spec.LatencyBound{Absolute: 300 * time.Millisecond}
	cases := []struct {
		name   string
		bound  spec.LatencyBound
		goodN  int // judgments passed before the bad input starts
		bad    Input
		step   int
		reason string // see matches
	}{
		{name: "errors at the first judged step", bad: Input{New: meas(100, 30, 20*time.Millisecond), Previous: meas(1000, 0, 20*time.Millisecond), NewReady: true},
			step: 1, reason: "error rate 30% > 2% over 300 requests at step 1%"},
		{name: "errors at step 25%", goodN: 1, bad: Input{New: meas(100, 30, 20*time.Millisecond), Previous: meas(1000, 0, 20*time.Millisecond), NewReady: true},
			step: 2, reason: "error rate 30% > 2% over 300 requests at step 25%"},
		{name: "three times slower", bound: rel, bad: Input{New: meas(100, 0, 300*time.Millisecond), Previous: meas(1000, 0, 100*time.Millisecond), NewReady: true},
			step: 1, reason: "p99 latency …> 1.5x the previous revision's …over 300 requests at step 1%"},
		{name: "over the absolute bound", bound: abs, goodN: 2, bad: Input{New: meas(100, 0, 400*time.Millisecond), Previous: meas(1000, 0, 400*time.Millisecond), NewReady: true},
			step: 3, reason: "p99 latency …> 300ms over 300 requests at step 50%"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			d := start(t, config(planOf(t, time.Minute, nil, tc.bound)))
			d.tick(0, good)
			for len(d.judgments()) < tc.goodN {
				d.tick(5*time.Second, good)
			}
			d.until(5*time.Second, time.Minute, tc.bad)
			if d.m.Phase() != PhaseRolledBack {
				t.Fatalf("phase %s, events %v", d.m.Phase(), d.kinds())
			}
			js := d.judgments()
			j := js[len(js)-1]
			if j.Verdict != VerdictFail || j.Step != tc.step || !matches(j.Reason, tc.reason) {
				t.Errorf("last judgment %+v, want a failure at step %d: %q", j, tc.step, tc.reason)
			}
			st := d.m.State()
			if st.Reason != j.Reason || st.EndedAt != d.now {
				t.Errorf("state ends with %q at %s", st.Reason, st.EndedAt)
			}
			last := d.events[len(d.events)-1]
			if last.Kind != EventRolledBack || last.Message != "rolled back to hello-00001: "+j.Reason || last.Step != tc.step {
				t.Errorf("last event %+v", last)
			}
			r := d.routes[len(d.routes)-1]
			if r.NewWeight != 0 || r.PreviousWeight != AllRequests {
				t.Errorf("route after the rollback %+v", r)
			}
			// It rolled back in the tick that judged: the failing revision
			// got its share of one window, no more.
			if got := len(js); got != tc.goodN+1 {
				t.Errorf("%d judgments, want %d", got, tc.goodN+1)
			}
		})
	}
}

// Too few requests to judge: the step waits, and the next judgment
// counts the requests of both windows.
func TestTooFewRequestsWait(t *testing.T) {
	d := start(t, config(planOf(t, 0, []int{10, 50}, spec.LatencyBound{})))
	d.tick(0, good)
	quiet := Input{New: meas(8, 0, 0), Previous: meas(80, 0, 0), NewReady: true}
	for len(d.judgments()) < 3 {
		d.tick(15*time.Second, quiet)
	}
	js := d.judgments()
	if js[0].Verdict != VerdictWait || js[1].Verdict != VerdictWait || js[2].Verdict != VerdictPass {
		t.Fatalf("verdicts %s %s %s", js[0].Verdict, js[1].Verdict, js[2].Verdict)
	}
	if js[0].New.Requests != 8 || js[1].New.Requests != 16 || js[2].New.Requests != 24 || js[2].Previous.Requests != 240 {
		t.Errorf("judged on %d, %d, %d requests", js[0].New.Requests, js[1].New.Requests, js[2].New.Requests)
	}
	if js[0].Reason != "too few requests to judge: 8 < min_requests 20 at step 10%" {
		t.Errorf("wait says %q", js[0].Reason)
	}
	if st := d.m.State(); st.Step != 1 || st.Quiet != 0 || st.Window.New.Requests != 0 {
		t.Errorf("after the pass: step index %d, quiet %d, window %d", st.Step, st.Quiet, st.Window.New.Requests)
	}
}

// A service too quiet to judge still ends its rollout: each step passes
// unjudged after its quiet limit, within MaxJudgments.
func TestQuietRolloutEnds(t *testing.T) {
	p := planOf(t, 0, []int{1, 50}, spec.LatencyBound{})
	d := start(t, config(p))
	d.tick(0, Input{NewReady: true})
	d.until(15*time.Second, time.Hour, Input{New: meas(1, 0, 0), NewReady: true})
	if d.m.Phase() != PhaseCompleted {
		t.Fatalf("phase %s", d.m.Phase())
	}
	js := d.judgments()
	if len(js) != p.MaxJudgments() || len(js) != 2*DefaultQuietLimit {
		t.Errorf("%d judgments, want %d", len(js), p.MaxJudgments())
	}
	if j := js[DefaultQuietLimit-1]; j.Verdict != VerdictUnjudged || j.Reason != "too few requests to judge for 10 intervals (10 < min_requests 20): passed unjudged at step 1%" {
		t.Errorf("tenth judgment %+v", j)
	}
	for _, e := range d.events {
		if e.Kind == EventStepStarted && e.Step == 2 && !strings.HasSuffix(e.Message, "after step 1 (1%) passed unjudged") {
			t.Errorf("step 2 starts with %q", e.Message)
		}
	}
}

// A revision at zero is woken before its first step, and the first step
// waits for its capacity, at most the wake timeout.
func TestWakeBeforeFirstStep(t *testing.T) {
	asleep := Input{Previous: meas(500, 0, 20*time.Millisecond)}
	t.Run("woken", func(t *testing.T) {
		d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{})))
		o := d.tick(0, asleep)
		if o.Wake != "hello-00002" || o.Route.NewWeight != 0 || o.Route.PreviousWeight != AllRequests {
			t.Fatalf("first output %+v", o)
		}
		if len(o.Events) != 1 || o.Events[0].Kind != EventWaking ||
			o.Events[0].Message != "waking hello-00002: it has no ready instance, and step 1 (1%) starts once it has one (at most 1m0s)" {
			t.Errorf("events %+v", o.Events)
		}
		// Asked again at every tick (idempotent), said once.
		o = d.tick(2*time.Second, asleep)
		if o.Wake != "hello-00002" || len(o.Events) != 0 {
			t.Errorf("second output %+v", o)
		}
		o = d.tick(2*time.Second, Input{New: meas(40, 40, time.Second), Previous: meas(500, 0, 20*time.Millisecond), NewReady: true})
		if o.Wake != "" || o.Route.NewWeight != 100 || len(o.Events) != 1 || o.Events[0].Kind != EventStepStarted {
			t.Fatalf("once ready %+v", o)
		}
		if st := d.m.State(); !st.StepStartedAt.Equal(t0.Add(4*time.Second)) || st.Window.New.Requests != 0 {
			t.Errorf("the first step started at %s with %d requests counted; what came before it is not its own", st.StepStartedAt, st.Window.New.Requests)
		}
		d.until(5*time.Second, 5*time.Minute, good)
		if d.m.Phase() != PhaseCompleted {
			t.Errorf("phase %s", d.m.Phase())
		}
	})
	t.Run("never ready", func(t *testing.T) {
		d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{})))
		d.until(10*time.Second, 10*time.Minute, asleep)
		if d.m.Phase() != PhaseRolledBack || !d.now.Equal(t0.Add(time.Minute)) {
			t.Fatalf("phase %s at %s", d.m.Phase(), d.now)
		}
		want := "revision hello-00002 had no ready instance 1m0s after the rollout asked for it, before step 1 (1%)"
		if st := d.m.State(); st.Reason != want {
			t.Errorf("reason %q, want %q", st.Reason, want)
		}
		last := d.events[len(d.events)-1]
		if last.Kind != EventRolledBack || last.Step != 0 || last.Message != "rolled back to hello-00001: "+want {
			t.Errorf("last event %+v", last)
		}
		if len(d.wakes) != 5 {
			t.Errorf("wake asked %d times, want at each of the 5 ticks before the deadline (10s to 50s)", len(d.wakes))
		}
	})
}

// A person who sets traffic or deploys wins: the machine stops, says so,
// and leaves the route alone from then on.
func TestPersonTakesOver(t *testing.T) {
	by := "traffic set by a person (nomad-serverless traffic)"
	t.Run("during a step", func(t *testing.T) {
		d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{})))
		d.tick(0, good)
		for len(d.judgments()) < 1 {
			d.tick(5*time.Second, good)
		}
		o := d.keep(d.m.Interrupt(d.now, by))
		if o.Route != nil || d.m.Phase() != PhaseStopped || len(o.Events) != 1 {
			t.Fatalf("interrupt: %+v", o)
		}
		if e := o.Events[0]; e.Kind != EventStopped || e.Step != 2 || e.Message != "stopped at step 25%: "+by+"; the route stays as they set it" {
			t.Errorf("event %+v", e)
		}
		n := len(d.events)
		if o := d.tick(time.Minute, good); o.Route != nil || len(d.events) != n {
			t.Errorf("a tick after the person: %+v", o)
		}
		if o := d.m.Resume(d.now); o.Route != nil || len(o.Events) != 0 {
			t.Errorf("a resume after the person: %+v", o)
		}
		if o := d.m.Interrupt(d.now, "again"); len(o.Events) != 0 || d.m.State().Reason != "stopped at step 25%: "+by+"; the route stays as they set it" {
			t.Errorf("a second interrupt: %+v", o)
		}
	})
	t.Run("while waking", func(t *testing.T) {
		d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{})))
		d.tick(0, Input{})
		o := d.m.Interrupt(d.now, "a deploy by a person")
		if o.Wake != "" || o.Route != nil || o.Events[0].Message != "stopped before step 1: a deploy by a person; the route stays as they set it" || o.Events[0].Step != 0 {
			t.Errorf("interrupt while waking: %+v", o)
		}
	})
	t.Run("after it ended", func(t *testing.T) {
		d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{})))
		d.tick(0, good)
		d.until(5*time.Second, 5*time.Minute, good)
		if o := d.m.Interrupt(d.now, by); d.m.Phase() != PhaseCompleted || len(o.Events) != 0 || o.Route.NewWeight != AllRequests {
			t.Errorf("interrupt after completion: phase %s, %+v", d.m.Phase(), o)
		}
	})
}

// A leader killed at any tick: the next loads the stored state a
// takeover later and completes the rollout, skipping no step, never
// moving the route back, and later than the uninterrupted run by at most
// the takeover and one interval.
func TestResumeAfterFailover(t *testing.T) {
	const gap, takeover = 5 * time.Second, 3 * time.Second
	plan := planOf(t, 2*time.Minute, []int{1, 10, 50}, spec.LatencyBound{Factor: 2})
	base := start(t, config(plan))
	base.tick(0, good)
	base.until(gap, time.Hour, good)
	ticks := int(base.now.Sub(t0) / gap)
	if base.m.Phase() != PhaseCompleted || plan.IntervalsPerStep != 2 {
		t.Fatalf("uninterrupted run: %s, %d intervals per step", base.m.Phase(), plan.IntervalsPerStep)
	}
	for kill := 1; kill < ticks; kill++ {
		d := start(t, config(plan))
		var stored []byte
		persist := func(o Output) {
			if len(o.Events) > 0 || stored == nil {
				b, err := json.Marshal(d.m.State())
				if err != nil {
					t.Fatal(err)
				}
				stored = b
			}
		}
		persist(d.tick(0, good))
		for range kill - 1 {
			persist(d.tick(gap, good))
		}
		// kill -9: what the leader had not stored is gone.
		var st State
		if err := json.Unmarshal(stored, &st); err != nil {
			t.Fatal(err)
		}
		m, err := Load(st)
		if err != nil {
			t.Fatalf("kill at tick %d: %v", kill, err)
		}
		d.m = m
		d.now = d.now.Add(takeover)
		o := d.keep(m.Resume(d.now))
		if len(o.Events) != 1 || o.Events[0].Kind != EventResumed {
			t.Fatalf("kill at tick %d: resume said %+v", kill, o.Events)
		}
		d.until(gap, time.Hour, good)
		if d.m.Phase() != PhaseCompleted {
			t.Fatalf("kill at tick %d: phase %s", kill, d.m.Phase())
		}
		if late := d.now.Sub(base.now); late > takeover+plan.Interval {
			t.Errorf("kill at tick %d: completed %s after the uninterrupted run, more than the takeover and one interval", kill, late)
		}
		passes := map[int]int{}
		for _, j := range d.judgments() {
			if j.Verdict == VerdictPass {
				passes[j.Step]++
			}
		}
		for s := 1; s <= len(plan.Steps); s++ {
			if passes[s] < plan.IntervalsPerStep {
				t.Errorf("kill at tick %d: step %d passed %d judgments, want %d", kill, s, passes[s], plan.IntervalsPerStep)
			}
		}
		prev := Weight(-1)
		for _, r := range d.routes {
			if r.NewWeight < prev {
				t.Fatalf("kill at tick %d: the route went back from %d to %d", kill, prev, r.NewWeight)
			}
			prev = r.NewWeight
		}
	}
}

// What a waiting window had counted survives a failover, and so does the
// count of waits.
func TestResumeKeepsAWaitingWindow(t *testing.T) {
	d := start(t, config(planOf(t, 0, []int{10}, spec.LatencyBound{})))
	d.tick(0, good)
	ten := Input{New: meas(10, 0, 0), NewReady: true}
	d.tick(15*time.Second, ten) // judged: 10 < 20, wait
	b, err := json.Marshal(d.m.State())
	if err != nil {
		t.Fatal(err)
	}
	var st State
	if err := json.Unmarshal(b, &st); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(st, d.m.State()) {
		t.Fatalf("the state does not survive JSON:\n%+v\n%+v", st, d.m.State())
	}
	d.m, err = Load(st)
	if err != nil {
		t.Fatal(err)
	}
	d.now = d.now.Add(4 * time.Second)
	d.keep(d.m.Resume(d.now))
	d.tick(10*time.Second, ten) // not due yet: the interval restarted at the resume
	if n := len(d.judgments()); n != 1 {
		t.Fatalf("%d judgments before the restarted interval ended", n)
	}
	d.tick(5*time.Second, Input{NewReady: true})
	js := d.judgments()
	if len(js) != 2 || js[1].Verdict != VerdictPass || js[1].New.Requests != 20 {
		t.Fatalf("judgments after the resume: %+v", js)
	}
}

// A latest share below 100 % is split exactly, in hundredths of a percent.
func TestLatestShareSplit(t *testing.T) {
	c := config(planOf(t, 0, []int{1, 50}, spec.LatencyBound{}))
	c.LatestPercent = 10
	d := start(t, c)
	d.tick(0, good)
	d.until(5*time.Second, time.Hour, good)
	if got, want := d.newWeights(), []Weight{10, 500, 1000}; !reflect.DeepEqual(got, want) {
		t.Errorf("weights %v, want %v", got, want)
	}
	for _, r := range d.routes {
		if r.NewWeight+r.PreviousWeight != 1000 {
			t.Errorf("route %+v does not add up to the latest share", r)
		}
	}
	if !strings.Contains(d.events[0].Message, "gets 1% of the latest share (0.1% of all requests)") {
		t.Errorf("first step says %q", d.events[0].Message)
	}
}

func TestNewRefuses(t *testing.T) {
	p := planOf(t, time.Minute, nil, spec.LatencyBound{})
	cases := []struct {
		name   string
		change func(c *Config)
		want   string
	}{
		{"no service", func(c *Config) { c.Service = "" }, "no service"},
		{"no previous", func(c *Config) { c.Previous = "" }, "must both be named"},
		{"same revision", func(c *Config) { c.Previous = c.New }, "both hello-00002"},
		{"no latest share", func(c *Config) { c.LatestPercent = 0 }, "latest share is 0%"},
		{"bad plan", func(c *Config) { c.Plan.Steps = nil }, "plan: the plan has no steps"},
		{"no quiet limit", func(c *Config) { c.Plan.QuietLimit = 0 }, "quiet limit is 0"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := config(p)
			c.Plan.Steps = append([]int(nil), p.Steps...)
			tc.change(&c)
			_, err := New(c, t0)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "starting the rollout of ") {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A state from Consul that the machine could not run is refused, named.
func TestLoadRefuses(t *testing.T) {
	d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{})))
	d.tick(0, good)
	cases := []struct {
		name   string
		change func(s *State)
		want   string
	}{
		{"unknown phase", func(s *State) { s.Phase = "paused" }, `unknown phase "paused"`},
		{"step past the plan", func(s *State) { s.Step = 4 }, "step index 4 outside the plan's 4 steps"},
		{"passes past the step", func(s *State) { s.Passed = 1 }, "1 passed judgments for a step that needs 1"},
		{"waits past the limit", func(s *State) { s.Quiet = 10 }, "10 quiet judgments"},
		{"no judgment time", func(s *State) { s.JudgeAt = time.Time{} }, "without a judgment time"},
		{"waking without deadline", func(s *State) { s.Phase, s.WakeDeadline = PhaseWaking, time.Time{} }, "without a wake deadline"},
		{"impossible window", func(s *State) { s.Window.New = Measurement{Requests: 1, Errors: 2} }, "window of hello-00002: 2 errors out of 1 requests"},
		{"no start", func(s *State) { s.StartedAt = time.Time{} }, "no start time"},
		{"bad plan", func(s *State) { s.Plan.Interval = 0 }, "interval is 0s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st := d.m.State()
			if _, err := Load(st); err != nil {
				t.Fatalf("the unchanged state: %v", err)
			}
			tc.change(&st)
			_, err := Load(st)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "loading the rollout of hello: ") {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}

// A measurement no gateway could make is refused and changes nothing.
func TestTickRefusesImpossibleMeasurements(t *testing.T) {
	d := start(t, config(planOf(t, time.Minute, nil, spec.LatencyBound{})))
	d.tick(0, good)
	before := d.m.State()
	for _, in := range []Input{
		{New: Measurement{Requests: 1, Errors: 2}},
		{Previous: meas(1, 0, time.Millisecond), New: Measurement{Requests: 0, Latency: meas(3, 0, time.Millisecond).Latency}},
	} {
		if _, err := d.m.Tick(t0.Add(time.Hour), in); err == nil || !strings.Contains(err.Error(), "rollout of hello: measurement of hello-00002") {
			t.Errorf("error %v", err)
		}
	}
	if !reflect.DeepEqual(before, d.m.State()) {
		t.Error("a refused measurement changed the state")
	}
	// The state returned shares nothing with the machine.
	st := d.m.State()
	st.Plan.Steps[0] = 99
	if d.m.State().Plan.Steps[0] != 1 {
		t.Error("State shares its steps with the machine")
	}
}
