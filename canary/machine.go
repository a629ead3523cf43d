package canary

import (
	"errors"
	"fmt"
	"strconv"
	"time"
)

// Weight is a share of a service's requests in hundredths of a percent:
// AllRequests (10000) is all of them. It is the resolution of Consul's
// service-splitter (0.01 %), so a step of 1 % of a latest share of 10 %
// (0.1 % of the service, Weight 10) is exact.
type Weight int

// AllRequests is the Weight of every request of the service.
const AllRequests Weight = 10000

// Split is how the route must divide the latest targets' share now: the
// weights add up to that share. Pinned targets and tags are not the
// machine's; the caller keeps them as the service declares them.
type Split struct {
	New            string `json:"new"`
	NewWeight      Weight `json:"new_weight"`
	Previous       string `json:"previous"`
	PreviousWeight Weight `json:"previous_weight"`
}

// Phase is where a rollout is.
type Phase string

const (
	// PhaseWaking: before the first step, until the new revision has a
	// ready instance (at most Plan.WakeTimeout).
	PhaseWaking Phase = "waking"
	// PhaseStepping: a step is held and judged.
	PhaseStepping Phase = "stepping"
	// The three ends.
	PhaseCompleted  Phase = "completed"
	PhaseRolledBack Phase = "rolled_back"
	PhaseStopped    Phase = "stopped"
)

// Ended reports whether p is one of the ends, after which the machine
// changes nothing.
func (p Phase) Ended() bool {
	return p == PhaseCompleted || p == PhaseRolledBack || p == PhaseStopped
}

// Config is what a rollout is asked to do.
type Config struct {
	Service string `json:"service"`
	// New is the revision rolled out; Previous the one that held the
	// latest share before it.
	New      string `json:"new"`
	Previous string `json:"previous"`
	// LatestPercent is the latest targets' share of the service's
	// requests, in percent (spec.Service.LatestPercent).
	LatestPercent int  `json:"latest_percent"`
	Plan          Plan `json:"plan"`
}

func (c Config) validate() error {
	switch {
	case c.Service == "":
		return errors.New("no service")
	case c.New == "" || c.Previous == "":
		return fmt.Errorf("new revision %q and previous revision %q must both be named", c.New, c.Previous)
	case c.New == c.Previous:
		return fmt.Errorf("new and previous revision are both %s", c.New)
	case c.LatestPercent < 1 || c.LatestPercent > 100:
		return fmt.Errorf("the latest share is %d%%, not 1 to 100", c.LatestPercent)
	}
	if err := c.Plan.validate(); err != nil {
		return fmt.Errorf("plan: %w", err)
	}
	return nil
}

// Window is what was measured of both revisions since the step's last
// judgment that did not wait.
type Window struct {
	New      Measurement `json:"new"`
	Previous Measurement `json:"previous"`
}

// State is everything a rollout is, as a plain JSON value: the leader
// stores it in Consul KV, and a new leader that loads it continues where
// the old one stopped.
//
// The timestamps are absolute (replicas keep NTP time) and say when
// something is due, not how long is left, so a value read later means the
// same: JudgeAt is when the current window is judged, WakeDeadline when a
// wake that has not given a ready instance fails the rollout.
type State struct {
	Config
	Phase     Phase     `json:"phase"`
	StartedAt time.Time `json:"started_at"`
	// WakeDeadline bounds PhaseWaking; WakeRequested says the wake was
	// asked for (and EventWaking sent).
	WakeDeadline  time.Time `json:"wake_deadline"`
	WakeRequested bool      `json:"wake_requested,omitempty"`
	// Step is the index in Plan.Steps of the step held; Passed and Quiet
	// count its judgments that passed and that waited for requests.
	Step          int       `json:"step"`
	StepStartedAt time.Time `json:"step_started_at,omitzero"`
	Passed        int       `json:"passed"`
	Quiet         int       `json:"quiet"`
	// WindowStartedAt and JudgeAt bound the window being measured.
	WindowStartedAt time.Time `json:"window_started_at,omitzero"`
	JudgeAt         time.Time `json:"judge_at,omitzero"`
	Window          Window    `json:"window"`
	// Baseline is the previous revision's latency over the whole rollout,
	// for the relative bound when a window has too few of its requests.
	Baseline Histogram `json:"baseline"`
	// Last is the latest judgment, for status.
	Last *Judgment `json:"last,omitempty"`
	// EndedAt and Reason say when and why the rollout ended.
	EndedAt time.Time `json:"ended_at,omitzero"`
	Reason  string    `json:"reason,omitempty"`
}

// validate checks that a state loaded from outside can be run.
func (s State) validate() error {
	if err := s.Config.validate(); err != nil {
		return err
	}
	if s.StartedAt.IsZero() {
		return errors.New("no start time")
	}
	p := s.Plan
	switch s.Phase {
	case PhaseWaking:
		if s.WakeDeadline.IsZero() {
			return errors.New("waking without a wake deadline")
		}
	case PhaseStepping:
		switch {
		case s.Step < 0 || s.Step >= len(p.Steps):
			return fmt.Errorf("step index %d outside the plan's %d steps", s.Step, len(p.Steps))
		case s.Passed < 0 || s.Passed >= p.IntervalsPerStep:
			return fmt.Errorf("%d passed judgments for a step that needs %d", s.Passed, p.IntervalsPerStep)
		case s.Quiet < 0 || s.Quiet >= p.QuietLimit:
			return fmt.Errorf("%d quiet judgments for a quiet limit of %d", s.Quiet, p.QuietLimit)
		case s.JudgeAt.IsZero():
			return errors.New("stepping without a judgment time")
		}
	case PhaseCompleted, PhaseRolledBack, PhaseStopped:
	default:
		return fmt.Errorf("unknown phase %q", s.Phase)
	}
	if err := s.Window.New.validate(); err != nil {
		return fmt.Errorf("window of %s: %w", s.New, err)
	}
	if err := s.Window.Previous.validate(); err != nil {
		return fmt.Errorf("window of %s: %w", s.Previous, err)
	}
	return nil
}

// clone copies s so that no slice or pointer is shared.
func (s State) clone() State {
	s.Plan.Steps = append([]int(nil), s.Plan.Steps...)
	if s.Last != nil {
		j := *s.Last
		s.Last = &j
	}
	return s
}

// Input is what the caller saw since its previous Tick.
type Input struct {
	// New and Previous are the revisions' measurements since the
	// previous Tick (see Measurement).
	New      Measurement
	Previous Measurement
	// NewReady says the new revision has a ready instance (capacity).
	// Only the wake before the first step reads it.
	NewReady bool
}

// Output is what the caller carries out, after persisting State.
type Output struct {
	// Route is the split of the latest share the route must hold now
	// (the caller writes it only when it differs from what it holds);
	// nil once a person took the route over.
	Route *Split
	// Wake names a revision to raise to its activation scale now. The
	// raise is idempotent ("at least n"), and asked for at every Tick
	// until the revision is ready, so a raise lost in a failover is asked
	// for again.
	Wake string
	// Events happened in this call, oldest first.
	Events []Event
}

// Machine runs one rollout. It is not safe for concurrent use; the leader
// runs each rollout from one goroutine.
type Machine struct {
	st State
}

// New starts a rollout at now, before its first step: the first Tick sees
// whether the new revision has capacity, and wakes it if not.
func New(c Config, now time.Time) (*Machine, error) {
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("starting the rollout of %s: %w", c.Service, err)
	}
	st := State{Config: c, Phase: PhaseWaking, StartedAt: now, WakeDeadline: now.Add(c.Plan.WakeTimeout)}
	return &Machine{st: st.clone()}, nil
}

// Load continues a rollout from a stored state. Call Resume next, before
// any Tick: the state does not say how much time passed since it was
// stored.
func Load(st State) (*Machine, error) {
	if err := st.validate(); err != nil {
		return nil, fmt.Errorf("loading the rollout of %s: %w", st.Service, err)
	}
	return &Machine{st: st.clone()}, nil
}

// State is the rollout's state to store; it shares nothing with m.
func (m *Machine) State() State { return m.st.clone() }

// Phase is where the rollout is.
func (m *Machine) Phase() Phase { return m.st.Phase }

// Split is the split of the latest share the route must hold now; nil
// once a person took the route over.
func (m *Machine) Split() *Split {
	s := &m.st
	all := Weight(s.LatestPercent) * 100
	var w Weight
	switch s.Phase {
	case PhaseStepping:
		w = Weight(s.LatestPercent * s.Plan.Steps[s.Step])
	case PhaseCompleted:
		w = all
	case PhaseStopped:
		return nil
	}
	return &Split{New: s.New, NewWeight: w, Previous: s.Previous, PreviousWeight: all - w}
}

// Tick advances the rollout to now with what was measured since the
// previous Tick. A measurement no gateway could make (more errors than
// requests) is refused with an error and changes nothing.
func (m *Machine) Tick(now time.Time, in Input) (Output, error) {
	if err := in.New.validate(); err != nil {
		return Output{}, fmt.Errorf("rollout of %s: measurement of %s: %w", m.st.Service, m.st.New, err)
	}
	if err := in.Previous.validate(); err != nil {
		return Output{}, fmt.Errorf("rollout of %s: measurement of %s: %w", m.st.Service, m.st.Previous, err)
	}
	s := &m.st
	var evs []Event
	switch s.Phase {
	case PhaseWaking:
		switch {
		case in.NewReady:
			evs = m.startStep(now, 0, "")
		case !now.Before(s.WakeDeadline):
			evs = m.end(now, PhaseRolledBack, fmt.Sprintf("revision %s had no ready instance %s after the rollout asked for it, before step 1 (%d%%)",
				s.New, s.Plan.WakeTimeout, s.Plan.Steps[0]))
		case !s.WakeRequested:
			s.WakeRequested = true
			evs = []Event{{At: now, Kind: EventWaking, Percent: s.Plan.Steps[0],
				Message: fmt.Sprintf("waking %s: it has no ready instance, and step 1 (%d%%) starts once it has one (at most %s)", s.New, s.Plan.Steps[0], s.Plan.WakeTimeout)}}
		}
	case PhaseStepping:
		s.Window.New.Add(in.New)
		s.Window.Previous.Add(in.Previous)
		s.Baseline.Add(in.Previous.Latency)
		if !now.Before(s.JudgeAt) {
			evs = m.judgeStep(now)
		}
	}
	return m.output(evs), nil
}

// Resume carries on after the state was loaded (Load), at now. Judgments
// made are kept, and so is what the stored window had counted; the
// interval in flight when the previous leader stopped starts again from
// now. A wake is asked for again.
func (m *Machine) Resume(now time.Time) Output {
	s := &m.st
	if s.Phase.Ended() {
		return m.output(nil)
	}
	ev := Event{At: now, Kind: EventResumed}
	switch s.Phase {
	case PhaseWaking:
		ev.Percent = s.Plan.Steps[0]
		ev.Message = fmt.Sprintf("resumed: waiting for %s to have a ready instance before step 1 (%d%%), until %s",
			s.New, s.Plan.Steps[0], s.WakeDeadline.UTC().Format(time.RFC3339))
	case PhaseStepping:
		s.JudgeAt = now.Add(s.Plan.Interval)
		ev.Step, ev.Percent = s.Step+1, s.Plan.Steps[s.Step]
		ev.Message = fmt.Sprintf("resumed at step %d of %d (%d%%) with %d of %d judgments passed; the next is due in %s",
			s.Step+1, len(s.Plan.Steps), s.Plan.Steps[s.Step], s.Passed, s.Plan.IntervalsPerStep, s.Plan.Interval)
	}
	return m.output([]Event{ev})
}

// Interrupt stops the rollout because a person took the route over (a
// traffic or deploy run by hand): the person wins, and the machine never
// touches the route again. by says who or what, for the message. An ended
// rollout stays as it ended.
func (m *Machine) Interrupt(now time.Time, by string) Output {
	s := &m.st
	if s.Phase.Ended() {
		return m.output(nil)
	}
	where := "before step 1"
	if s.Phase == PhaseStepping {
		where = fmt.Sprintf("at step %d%%", s.Plan.Steps[s.Step])
	}
	return m.output(m.end(now, PhaseStopped, fmt.Sprintf("stopped %s: %s; the route stays as they set it", where, by)))
}

func (m *Machine) output(evs []Event) Output {
	o := Output{Route: m.Split(), Events: evs}
	if m.st.Phase == PhaseWaking {
		o.Wake = m.st.New
	}
	return o
}

// startStep holds step i from now; after is what led to it, for the
// message.
func (m *Machine) startStep(now time.Time, i int, after string) []Event {
	s := &m.st
	s.Phase, s.Step, s.StepStartedAt, s.Passed, s.Quiet = PhaseStepping, i, now, 0, 0
	m.newWindow(now)
	w := m.Split().NewWeight
	msg := fmt.Sprintf("step %d of %d: %s gets %d%% of the latest share (%s of all requests)", i+1, len(s.Plan.Steps), s.New, s.Plan.Steps[i], weightText(w))
	if after != "" {
		msg += ", after " + after
	}
	return []Event{{At: now, Kind: EventStepStarted, Step: i + 1, Percent: s.Plan.Steps[i], Message: msg}}
}

func (m *Machine) newWindow(now time.Time) {
	s := &m.st
	s.Window = Window{}
	s.WindowStartedAt = now
	s.JudgeAt = now.Add(s.Plan.Interval)
}

// judgeStep judges the window due at now and acts on the verdict.
func (m *Machine) judgeStep(now time.Time) []Event {
	s := &m.st
	p := s.Plan
	j := judge(p, s.Step+1, p.Steps[s.Step], s.Window.New, s.Window.Previous, s.Baseline)
	j.At = now
	switch j.Verdict {
	case VerdictWait:
		s.Quiet++
		if s.Quiet >= p.QuietLimit {
			j.Verdict = VerdictUnjudged
			j.Reason = fmt.Sprintf("too few requests to judge for %d intervals (%d < min_requests %d): passed unjudged at step %d%%",
				s.Quiet, j.New.Requests, p.MinRequests, j.Percent)
		}
	case VerdictPass:
		s.Passed++
	}
	last := j
	s.Last = &last
	evs := []Event{{At: now, Kind: EventJudged, Step: j.Step, Percent: j.Percent, Judgment: &j,
		Message: fmt.Sprintf("step %d of %d (%d%%): %s: %s", j.Step, len(p.Steps), j.Percent, j.Verdict, j.Reason)}}
	switch {
	case j.Verdict == VerdictFail:
		return append(evs, m.end(now, PhaseRolledBack, j.Reason)...)
	case j.Verdict == VerdictWait:
		// The window keeps counting; it is judged again an interval on.
		s.JudgeAt = now.Add(p.Interval)
		return evs
	case j.Verdict == VerdictPass && s.Passed < p.IntervalsPerStep:
		m.newWindow(now)
		return evs
	}
	after := fmt.Sprintf("step %d (%d%%) passed", j.Step, j.Percent)
	if j.Verdict == VerdictUnjudged {
		after = fmt.Sprintf("step %d (%d%%) passed unjudged", j.Step, j.Percent)
	}
	if s.Step+1 < len(p.Steps) {
		return append(evs, m.startStep(now, s.Step+1, after)...)
	}
	return append(evs, m.end(now, PhaseCompleted, fmt.Sprintf("%s holds the latest share (%s of all requests) after %d steps; the last: %s",
		s.New, weightText(Weight(s.LatestPercent)*100), len(p.Steps), after))...)
}

// end ends the rollout in phase with reason.
func (m *Machine) end(now time.Time, phase Phase, reason string) []Event {
	s := &m.st
	s.Phase, s.EndedAt, s.Reason = phase, now, reason
	s.Window = Window{}
	ev := Event{At: now, Step: s.Step + 1, Percent: s.Plan.Steps[s.Step], Message: reason}
	switch phase {
	case PhaseCompleted:
		ev.Kind, ev.Message = EventCompleted, "completed: "+reason
	case PhaseRolledBack:
		ev.Kind, ev.Message = EventRolledBack, fmt.Sprintf("rolled back to %s: %s", s.Previous, reason)
	case PhaseStopped:
		ev.Kind = EventStopped
	}
	if s.StepStartedAt.IsZero() {
		ev.Step, ev.Percent = 0, 0 // ended before the first step
	}
	return []Event{ev}
}

// weightText writes a weight as a percentage: "0.1%", "25%".
func weightText(w Weight) string {
	return strconv.FormatFloat(float64(w)/100, 'f', -1, 64) + "%"
}
