package spec

import (
	"cmp"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// A wake's timeline: when each step of a wake from zero happened, from the
// activator holding the request to the first byte of its answer, and the
// check that Consul passed after. The gateway of the replica that held the
// request assembles it from its own clock, from Nomad's event stream (the
// scale write, the evaluation, the placement, the client's task events),
// from the sidecar's answer to the gateway's probe (InstanceTimesHeader)
// and from Consul's health; it is stored with one Nomad scaling event per
// wake (ScalingMeta), where `nomad job scaling-events` and `status` read it.
//
// Every time is taken by the clock of the machine that saw the step: the
// gateway's, the Nomad servers' (scale, evaluation, placement), the Nomad
// client's (task events) and the instance's node (the sidecar's own
// times). On one machine they agree; across machines, their skew is in the
// deltas between them.

// WakeStep names one step of a wake.
type WakeStep string

// The steps, in the order a wake usually meets them.
const (
	// WakeHeld: the activator holds the request (ours).
	WakeHeld WakeStep = "held"
	// WakeScaleWritten: Nomad wrote the scale-up from zero (the job's
	// submit time, Nomad's clock): the autoscaler's or a replica's
	// decision, and Nomad's write.
	WakeScaleWritten WakeStep = "scale_written"
	// WakeEvaluation: Nomad created the evaluation of the scale-up.
	WakeEvaluation WakeStep = "evaluation_created"
	// WakePlaced: Nomad's scheduler placed the allocation (its create
	// time).
	WakePlaced WakeStep = "allocation_placed"
	// WakeSeen: serve learned of the placement from Nomad's event
	// stream, and the gateway started probing it.
	WakeSeen WakeStep = "allocation_seen"
	// WakeReceived: the Nomad client received the allocation (its first
	// task event).
	WakeReceived WakeStep = "client_received"
	// WakeInitDone: the app's init steps (its prestart tasks that run to
	// completion, such as a migration) finished, by the last one's exit
	// (the client's clock). Only revisions with init steps have it.
	WakeInitDone WakeStep = "init_tasks_done"
	// WakeSidecarTask and WakeAppTask: the Nomad client started the
	// sidecar's and the app's task (the driver returned).
	WakeSidecarTask WakeStep = "sidecar_task_started"
	WakeAppTask     WakeStep = "app_task_started"
	// WakeSidecarUp: the sidecar's process began (its own clock).
	WakeSidecarUp WakeStep = "sidecar_started"
	// WakeAppAccepted: the app first accepted a connection from the
	// sidecar's readiness probe.
	WakeAppAccepted WakeStep = "app_accepted"
	// WakeAppReady: the app first answered its readiness probe ready.
	WakeAppReady WakeStep = "app_ready"
	// WakeProbeReady: the gateway's probe of the instance came back
	// ready.
	WakeProbeReady WakeStep = "probe_ready"
	// WakeSent: the gateway sent the held request to the instance.
	WakeSent WakeStep = "request_sent"
	// WakeFirstByte: the first byte of the answer came back to the
	// gateway.
	WakeFirstByte WakeStep = "first_byte"
	// WakeConsulPassing: the instance's check passed in Consul, as serve's
	// watch of Consul's health delivered it. Consul keeps no time of a
	// check's change, so this is when serve learned of it. Nothing waits
	// for it: the gateway probes the instance itself.
	WakeConsulPassing WakeStep = "consul_passing"
)

// WakeSteps lists every step, in the usual order.
var WakeSteps = []WakeStep{
	WakeHeld, WakeScaleWritten, WakeEvaluation, WakePlaced, WakeSeen, WakeReceived,
	WakeInitDone, WakeSidecarTask, WakeAppTask, WakeSidecarUp, WakeAppAccepted, WakeAppReady,
	WakeProbeReady, WakeSent, WakeFirstByte, WakeConsulPassing,
}

// Whose is who a step's time is spent by.
type Whose string

const (
	WhoseOurs   Whose = "ours"
	WhoseNomad  Whose = "nomad"
	WhoseApp    Whose = "app"
	WhoseConsul Whose = "consul"
)

// wakeStepInfo says what each step is, for people.
var wakeStepInfo = map[WakeStep]struct {
	whose Whose
	what  string
	// after is the step it cannot precede (its cause), "" for the first.
	after WakeStep
}{
	WakeHeld:          {WhoseOurs, "the activator holds the request", ""},
	WakeScaleWritten:  {WhoseOurs, "scale-up from zero written to Nomad", WakeHeld},
	WakeEvaluation:    {WhoseNomad, "Nomad's evaluation created", WakeScaleWritten},
	WakePlaced:        {WhoseNomad, "allocation placed", WakeEvaluation},
	WakeSeen:          {WhoseNomad, "serve sees the placement (event stream)", WakePlaced},
	WakeReceived:      {WhoseNomad, "Nomad client received the allocation", WakePlaced},
	WakeInitDone:      {WhoseApp, "the app's init tasks finished (prestart)", WakeReceived},
	WakeSidecarTask:   {WhoseNomad, "sidecar task started (Nomad)", WakeReceived},
	WakeAppTask:       {WhoseNomad, "app task started (Nomad)", WakeReceived},
	WakeSidecarUp:     {WhoseOurs, "sidecar process started", WakeReceived},
	WakeAppAccepted:   {WhoseApp, "app first accepts a connection", WakeSidecarUp},
	WakeAppReady:      {WhoseApp, "app first answers readiness", WakeAppAccepted},
	WakeProbeReady:    {WhoseOurs, "gateway's probe answered ready", WakeAppReady},
	WakeSent:          {WhoseOurs, "request sent to the instance", WakeProbeReady},
	WakeFirstByte:     {WhoseApp, "first byte of the answer back", WakeSent},
	WakeConsulPassing: {WhoseConsul, "check passes in Consul (serve sees the instance)", WakeAppReady},
}

// Whose says who a step is spent by.
func (s WakeStep) Whose() Whose { return wakeStepInfo[s].whose }

// Describe is the step in words.
func (s WakeStep) Describe() string {
	if i, ok := wakeStepInfo[s]; ok {
		return i.what
	}
	return string(s)
}

// After is the step that causes s: s cannot happen before it (on one
// clock). "" for WakeHeld. WakeSeen and WakeReceived both follow the
// placement; the task starts follow the client's receipt, and the
// sidecar's own start follows it too (the driver may report a task
// started after its process did). WakeConsulPassing follows the app's
// readiness, not the first byte: nothing waits for Consul.
func (s WakeStep) After() WakeStep { return wakeStepInfo[s].after }

func (s WakeStep) rank() int { return slices.Index(WakeSteps, s) }

// StepTime is one step of a timeline.
type StepTime struct {
	Step WakeStep
	At   time.Time
	// Since is from the held request; Delta from the step before it in
	// the timeline (0 for the first).
	Since, Delta time.Duration
}

// stepJSON is StepTime as JSON: the durations in milliseconds, for people
// and scripts alike.
type stepJSON struct {
	Step    WakeStep  `json:"step"`
	What    string    `json:"what"`
	Whose   Whose     `json:"whose"`
	At      time.Time `json:"at"`
	SinceMS float64   `json:"since_ms"`
	DeltaMS float64   `json:"delta_ms"`
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// MarshalJSON writes the step with its description and owner.
func (s StepTime) MarshalJSON() ([]byte, error) {
	return json.Marshal(stepJSON{Step: s.Step, What: s.Step.Describe(), Whose: s.Step.Whose(), At: s.At, SinceMS: ms(s.Since), DeltaMS: ms(s.Delta)})
}

// UnmarshalJSON reads what MarshalJSON wrote.
func (s *StepTime) UnmarshalJSON(b []byte) error {
	var j stepJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	*s = StepTime{Step: j.Step, At: j.At,
		Since: time.Duration(j.SinceMS * float64(time.Millisecond)), Delta: time.Duration(j.DeltaMS * float64(time.Millisecond))}
	return nil
}

// WakeTimeline is one wake from zero.
type WakeTimeline struct {
	Service  string `json:"service"`
	Revision string `json:"revision"`
	// Replica is the control-plane replica that held the request; Alloc
	// the allocation that answered it.
	Replica string `json:"replica,omitempty"`
	Alloc   string `json:"alloc,omitempty"`
	// Steps are the steps known, in the order they happened (ties in
	// WakeSteps' order).
	Steps []StepTime `json:"steps"`
	// Missing are the steps nobody reported (a sidecar too old to send
	// its times, an exec readiness probe that accepts no connection, an
	// event Nomad did not send in time).
	Missing []WakeStep `json:"missing,omitempty"`
}

// NewWakeTimeline orders the known times (zero times are missing steps)
// and computes each step's time since the held request and since the step
// before it.
func NewWakeTimeline(service, revision, replica, alloc string, at map[WakeStep]time.Time) WakeTimeline {
	t := WakeTimeline{Service: service, Revision: revision, Replica: replica, Alloc: alloc}
	for _, s := range WakeSteps {
		if v := at[s]; !v.IsZero() {
			t.Steps = append(t.Steps, StepTime{Step: s, At: v})
		} else if s != WakeInitDone { // only a revision with init steps has it
			t.Missing = append(t.Missing, s)
		}
	}
	slices.SortStableFunc(t.Steps, func(a, b StepTime) int {
		return cmp.Or(a.At.Compare(b.At), cmp.Compare(a.Step.rank(), b.Step.rank()))
	})
	held := at[WakeHeld]
	for i := range t.Steps {
		if !held.IsZero() {
			t.Steps[i].Since = t.Steps[i].At.Sub(held)
		}
		if i > 0 {
			t.Steps[i].Delta = t.Steps[i].At.Sub(t.Steps[i-1].At)
		}
	}
	return t
}

// At is when a step happened (false: missing).
func (t WakeTimeline) At(s WakeStep) (time.Time, bool) {
	for _, st := range t.Steps {
		if st.Step == s {
			return st.At, true
		}
	}
	return time.Time{}, false
}

// Held is when the activator held the request.
func (t WakeTimeline) Held() time.Time {
	at, _ := t.At(WakeHeld)
	return at
}

// Between is the time from step a to step b (false if either is
// missing).
func (t WakeTimeline) Between(a, b WakeStep) (time.Duration, bool) {
	ta, oka := t.At(a)
	tb, okb := t.At(b)
	if !oka || !okb {
		return 0, false
	}
	return tb.Sub(ta), true
}

// FirstByte is the wake's total: from the held request to the first byte
// of its answer.
func (t WakeTimeline) FirstByte() (time.Duration, bool) { return t.Between(WakeHeld, WakeFirstByte) }

// OurShare is what the wake spent after the app first answered its
// readiness probe (the app's boot and its own readiness answer left out):
// the sidecar and the gateway learning of it, the request's way to the
// app, and the answer's first byte back.
func (t WakeTimeline) OurShare() (time.Duration, bool) { return t.Between(WakeAppReady, WakeFirstByte) }

// OutOfOrder lists the steps that happened before the step that causes
// them (After), beyond slack (the clocks of the machines involved). On one
// machine a correct timeline has none.
func (t WakeTimeline) OutOfOrder(slack time.Duration) []string {
	var out []string
	for _, st := range t.Steps {
		cause := st.Step.After()
		if cause == "" {
			continue
		}
		at, ok := t.At(cause)
		if ok && st.At.Add(slack).Before(at) {
			out = append(out, fmt.Sprintf("%s %s before %s", st.Step, at.Sub(st.At), cause))
		}
	}
	return out
}

// Summary is the timeline in one sentence: the scaling event's message.
func (t WakeTimeline) Summary() string {
	total, ok := t.FirstByte()
	if !ok {
		return fmt.Sprintf("wake timeline: no first byte (missing %s)", joinSteps(t.Missing))
	}
	s := "wake timeline: first byte " + FormatMillis(total) + " after the request"
	if ours, ok := t.OurShare(); ok {
		s += ", " + FormatMillis(ours) + " of it after the app was ready"
	}
	if len(t.Missing) > 0 {
		s += " (not known: " + joinSteps(t.Missing) + ")"
	}
	return s
}

func joinSteps(ss []WakeStep) string {
	names := make([]string, len(ss))
	for i, s := range ss {
		names[i] = string(s)
	}
	return strings.Join(names, ", ")
}

// FormatMillis prints a duration in milliseconds with one decimal.
func FormatMillis(d time.Duration) string {
	return strconv.FormatFloat(ms(d), 'f', 1, 64) + " ms"
}

// Scaling event meta keys of a wake's timeline. The event has no count
// (Nomad records it without scaling anything); MetaKeyWakeTimeline holds
// every known step as "<step>=<unix nanoseconds>" separated by spaces.
const (
	MetaKeyRule          = "rule"
	MetaRuleWakeTimeline = "wake-timeline"
	MetaKeyWakeTimeline  = "wake_timeline"
	MetaKeyReplica       = "replica"
	MetaKeyAlloc         = "alloc"
	MetaKeyService       = "service"
)

// ScalingMeta is the timeline as the meta of a Nomad scaling event.
func (t WakeTimeline) ScalingMeta() map[string]string {
	var b strings.Builder
	for i, st := range t.Steps {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(string(st.Step))
		b.WriteByte('=')
		b.WriteString(strconv.FormatInt(st.At.UnixNano(), 10))
	}
	return map[string]string{
		MetaKeyRule: MetaRuleWakeTimeline, MetaKeyWakeTimeline: b.String(),
		MetaKeyReplica: t.Replica, MetaKeyAlloc: t.Alloc, MetaKeyService: t.Service,
	}
}

// WakeTimelineFromMeta reads a timeline back from a scaling event's meta
// (false: the event is not a wake's timeline). Unknown steps are skipped,
// so a newer writer's steps do not break an older reader.
func WakeTimelineFromMeta(revision string, meta map[string]string) (WakeTimeline, bool) {
	if meta[MetaKeyRule] != MetaRuleWakeTimeline {
		return WakeTimeline{}, false
	}
	enc := meta[MetaKeyWakeTimeline]
	at := map[WakeStep]time.Time{}
	for f := range strings.FieldsSeq(enc) {
		k, v, ok := strings.Cut(f, "=")
		n, err := strconv.ParseInt(v, 10, 64)
		if !ok || err != nil || WakeStep(k).rank() < 0 {
			continue
		}
		at[WakeStep(k)] = time.Unix(0, n)
	}
	if len(at) == 0 {
		return WakeTimeline{}, false
	}
	return NewWakeTimeline(meta[MetaKeyService], revision, meta[MetaKeyReplica], meta[MetaKeyAlloc], at), true
}

// InstanceTimesHeader is the sidecar's answer to a probe that asked to wait
// (ProbeWaitHeader: the gateway's): when its process started, when its app
// first accepted a connection and when the app first answered its
// readiness probe ready, each as "<name>=<unix nanoseconds>" (a time not
// known yet is left out). The gateway adds them to the wake's timeline, so
// it learns of them with no request of its own.
const InstanceTimesHeader = "X-Serverless-Instance-Times"

// InstanceTimes are the sidecar's times in InstanceTimesHeader.
type InstanceTimes struct {
	Started, AppAccepted, AppReady time.Time
}

// Header renders t for InstanceTimesHeader ("" when nothing is known).
func (t InstanceTimes) Header() string {
	var parts []string
	for _, f := range []struct {
		name string
		at   time.Time
	}{{"started", t.Started}, {"app-accepted", t.AppAccepted}, {"app-ready", t.AppReady}} {
		if !f.at.IsZero() {
			parts = append(parts, f.name+"="+strconv.FormatInt(f.at.UnixNano(), 10))
		}
	}
	return strings.Join(parts, ", ")
}

// ParseInstanceTimes reads InstanceTimesHeader; what does not parse is
// left zero.
func ParseInstanceTimes(v string) InstanceTimes {
	var t InstanceTimes
	for f := range strings.SplitSeq(v, ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(f), "=")
		n, err := strconv.ParseInt(val, 10, 64)
		if !ok || err != nil || n <= 0 {
			continue
		}
		switch k {
		case "started":
			t.Started = time.Unix(0, n)
		case "app-accepted":
			t.AppAccepted = time.Unix(0, n)
		case "app-ready":
			t.AppReady = time.Unix(0, n)
		}
	}
	return t
}
