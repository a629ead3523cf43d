package autoscaler

import (
	"math"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Inputs is everything one decision reads. The autoscaler's loop fills it
// from the catalog, the windows and the activators' reports; tests write it
// by hand.
type Inputs struct {
	// Scaling is the revision's scaling settings. Fields left at zero that
	// must be positive (target, utilization, window, rates, ...) take the
	// defaults of DESIGN.md, so a half-filled value never divides by zero.
	Scaling spec.Scaling
	// Concurrency is the revision's per-instance hard limit (0 = none).
	// With the concurrency metric a limit below Scaling.Target becomes the
	// per-instance capacity, as in Knative.
	Concurrency int
	// Ready is how many instances pass their checks now.
	Ready int
	// Count is the job's group count in Nomad now.
	Count int
	// Observed is what the windows say.
	Observed Observation
	// Queued is the requests the activators hold for this revision because
	// it has no capacity; InFlight the requests they proxy to it now.
	Queued   int
	InFlight int
	// ActivatorInPath tells whether requests for the revision go through the
	// activator (which holds them while there is no instance), the condition
	// for scaling to zero.
	ActivatorInPath bool
}

// Observation is the metric as the windows hold it: the revision's total
// (sum over instances, plus the activator's queued requests), averaged.
type Observation struct {
	Stable float64
	Panic  float64
	// Data is false when the stable window holds no sample at all (a new
	// leader, or every scrape failed for a whole window).
	Data bool
	// Gap is true when the latest sample is missing or partial (a scrape
	// failed): such a tick does not count as "no traffic".
	Gap bool
}

// Knative's progress deadline: a revision that never reaches its initial
// scale stops being held at it.
const initialScaleDeadline = 10 * time.Minute

// Decider is one revision's autoscaler (Knative's KPA), a state machine with
// no I/O: the caller passes Inputs and now, and carries out the Decision it
// returns. Its state is the panic mode, the scale-down delay, whether the
// initial scale was reached, and how long the revision has been idle. The
// zero value is ready; the first Decide initialises it from what it sees.
//
// A new leader starts with fresh Deciders and empty windows, and these
// rules keep it from acting on what it does not know (TestDeciderNewLeader):
//   - it holds a count above one that it finds (panic mode, a stable
//     window; the scale-down delay then holds it that much longer), so a
//     busy revision is not scaled down;
//   - no sample, no change: never a count from missing metrics, least of
//     all zero;
//   - an idle revision's scale-to-zero grace starts anew at its first
//     quiet decision (and the activator must be in the path for all of
//     it): nothing tells how long it was idle before (the sidecars report
//     averages since the last scrape, Nomad's scaling events when the
//     count last changed, neither the last request), so it may stay at one
//     instance up to one grace longer, never shorter;
//   - a revision at zero stays there (no initial scale), and a wake takes
//     it to its activation scale.
//
// Not safe for concurrent use.
type Decider struct {
	started     bool
	initialized bool // the initial scale was reached, or does not apply
	firstSeen   time.Time
	panicTime   time.Time // last time over the panic threshold; zero = not panicking
	maxPanic    int       // highest count asked for in this panic
	idleSince   time.Time // since when every sample showed no traffic; zero = not idle
	inPathSince time.Time // since when the activator is in the path; zero = not
	delay       maxWindow
}

// Decide applies every rule to in at now, in Knative's order: window averages
// to counts, rate limits, activation scale, panic mode, scale-down delay,
// initial scale, scale to zero, then min and max.
func (d *Decider) Decide(in Inputs, now time.Time) Decision {
	s := effectiveScaling(in.Scaling)
	total, target := capacity(s, in.Concurrency)
	obs := in.Observed
	dec := Decision{
		Metric: s.Metric,
		Target: target,
		Ready:  in.Ready,
		Count:  in.Count,
		Queued: in.Queued,
		Stable: obs.Stable,
		Panic:  obs.Panic,
		Data:   obs.Data,
	}

	if !d.started {
		d.started = true
		d.firstSeen = now
		if hold := in.Count; hold > 1 && (in.Ready > 1 || hold > s.Initial) {
			// A fresh decider has no history (a new leader, a restarted
			// replica): hold the scale it finds, in panic mode (which
			// never scales down), until the windows fill, as Knative
			// does. The count, not the ready instances as in Knative:
			// the count is what the previous leader decided, and the
			// ready instances lag it while a scale-up is under way or
			// while this replica's catalog is still filling from Consul
			// (holding those would scale down), or lead it while a
			// scale-down is (holding those would undo it). A revision
			// starting at its initial scale, none ready yet, is the
			// initial-scale rule's.
			d.panicTime, d.maxPanic = now, hold
		}
	}
	// The initial scale is reached (or does not apply) once that many are
	// ready. A count at zero ends it too, whether a new leader finds the
	// revision there or someone else took it there (deploy stopping a
	// revision that failed to start, an operator): the autoscaler must not
	// bring back what was put to sleep on purpose.
	reachedInitial := false
	if !d.initialized && (in.Ready >= s.Initial || in.Count == 0 || now.Sub(d.firstSeen) >= initialScaleDeadline) {
		d.initialized = true
		reachedInitial = in.Count > 0 && in.Ready >= s.Initial
	}
	if in.ActivatorInPath {
		if d.inPathSince.IsZero() {
			d.inPathSince = now
		}
	} else {
		d.inPathSince = time.Time{}
	}
	quiet := obs.Data && !obs.Gap && obs.Stable == 0 && obs.Panic == 0 && in.Queued == 0 && in.InFlight == 0
	if quiet {
		if d.idleSince.IsZero() {
			d.idleSince = now
		}
	} else {
		d.idleSince = time.Time{}
	}
	if reachedInitial && quiet {
		// Starting is not idling: the grace of an idle revision starts
		// when it reached its initial scale. Counted from before, a
		// revision that took longer than the grace to start went to zero
		// the moment it was first ready, before `deploy -wait` (which
		// polls for it) or anyone else could see it ready.
		d.idleSince = now
	}

	if !obs.Data {
		// No data, no change: never scale (least of all to zero) on
		// missing metrics. Bounds still hold.
		dec.Desired, dec.Rule = in.Count, RuleNoData
		dec.PanicMode = !d.panicTime.IsZero()
		d.bound(&dec, s)
		dec.ExcessBurstCapacity = excessBurstCapacity(s, in.Ready, total, obs.Panic, false)
		return dec
	}

	readyF := math.Max(1, float64(in.Ready))
	// At least one more instance per step even with a timid rate (Knative).
	maxUp := math.Ceil(s.MaxScaleUpRate * readyF)
	maxDown := math.Floor(readyF / s.MaxScaleDownRate)

	dspc := math.Ceil(obs.Stable / target)
	dppc := math.Ceil(obs.Panic / target)
	stableCount := int(math.Min(math.Max(dspc, maxDown), maxUp))
	panicCount := int(math.Min(math.Max(dppc, maxDown), maxUp))
	activated := false
	if s.ActivationScale > 1 {
		if dspc > 0 && s.ActivationScale > stableCount {
			stableCount, activated = s.ActivationScale, true
		}
		if dppc > 0 && s.ActivationScale > panicCount {
			panicCount = s.ActivationScale
		}
	}

	over := dppc/readyF >= s.PanicThresholdPercentage/100
	switch {
	case over:
		// Enter panic, or extend it: it lasts a stable window past the
		// last tick over the threshold.
		d.panicTime = now
	case !d.panicTime.IsZero() && d.panicTime.Add(s.Window).Before(now):
		d.panicTime, d.maxPanic = time.Time{}, 0
	}

	desired, rule := stableCount, RuleStable
	if activated {
		rule = RuleActivation
	}
	if !d.panicTime.IsZero() {
		dec.PanicMode = true
		desired = max(desired, panicCount)
		// Panic mode never scales down.
		d.maxPanic = max(d.maxPanic, desired)
		desired, rule = d.maxPanic, RulePanic
	}
	if in.Count == 0 && in.Queued > 0 && desired > 0 {
		rule = RuleWake
	}
	dec.Wanted = desired

	if s.ScaleDownDelay > 0 {
		d.delay.record(now, desired, s.ScaleDownDelay)
		if held := d.delay.max(); held > desired {
			desired, rule = held, RuleScaleDownDelay
			dec.Hold = s.ScaleDownDelay
		}
	} else {
		d.delay.reset()
	}

	if s.Metric.Resource() && obs.Gap && desired < in.Count {
		// Some instances' usage could not be read this tick. The
		// windows then average what was read, which for CPU or memory
		// says nothing of the instances that were not: they may be the
		// busy ones (a saturated node answers late). Missing stats
		// never scale a resource-metric revision down; up is safe.
		desired, rule = in.Count, RuleMissingStats
	}

	if !d.initialized && desired < s.Initial {
		desired, rule = s.Initial, RuleInitial
	}

	if in.Count == 0 && in.Queued == 0 && in.InFlight == 0 {
		// At zero only requests wake a revision: every request to it is
		// held by an activator (Queued) until it has an instance. What the
		// windows still hold of the traffic it served before it went to
		// zero, or of requests whose clients gave up while held, is no
		// reason to start one: a small average left in the window (0.04
		// rounds up to an instance) brought revisions back from zero
		// seconds after they got there during a burst of 100 wakes
		// (issue 45), and a count an operator set to zero must stay there.
		desired = 0
	}

	zeroPending := false
	if desired == 0 && s.Min == 0 {
		switch {
		case in.Count == 0:
			// Already at zero (its last instances may still be listed
			// while they stop): nothing to hold, and a failed scrape of
			// a stopping instance must not bring one back.
			rule = RuleZero
			dec.Hold = d.idleFor(now)
		case !d.idleSince.IsZero() && !d.inPathSince.IsZero() &&
			now.Sub(later(d.idleSince, d.inPathSince)) >= s.ScaleToZeroGrace:
			rule = RuleZero
			dec.Hold = d.idleFor(now)
		default:
			// Knative: keep one instance for the rest of the grace period
			// (or until the activator is in the path).
			desired, rule = 1, RuleIdle
			dec.Hold = d.idleFor(now)
			dec.Grace = s.ScaleToZeroGrace
			dec.AwaitingActivator = d.inPathSince.IsZero()
			zeroPending = true
		}
	}

	dec.Desired, dec.Rule = desired, rule
	d.bound(&dec, s)
	// While the count heads for zero the activator must take the traffic.
	dec.ExcessBurstCapacity = excessBurstCapacity(s, in.Ready, total, obs.Panic, zeroPending || dec.Desired == 0)
	return dec
}

// bound applies min and max (min first: validation keeps min <= max).
func (d *Decider) bound(dec *Decision, s spec.Scaling) {
	if dec.Desired < s.Min {
		if dec.Rule != RuleNoData {
			dec.Wanted = dec.Desired
		}
		dec.Desired, dec.Rule = s.Min, RuleMin
	}
	if s.Max > 0 && dec.Desired > s.Max {
		if dec.Rule != RuleNoData {
			dec.Wanted = dec.Desired
		}
		dec.Desired, dec.Rule = s.Max, RuleMax
	}
}

func (d *Decider) idleFor(now time.Time) time.Duration {
	if d.idleSince.IsZero() {
		return 0
	}
	return now.Sub(d.idleSince)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// excessBurstCapacity is Knative's EBC: total capacity minus the target burst
// capacity minus the panic-window demand. Negative means the activator must
// stay in the request path. BurstCapacity 0 keeps it out except at zero,
// Unlimited keeps it in always; at zero ready instances, or when the
// revision is heading to zero, it is in the path whatever the setting.
//
// A revision scaled on cpu or memory has no request capacity to measure
// the burst against: as with Knative's HPA class (its SKS always in serve
// mode) the activator is in its path only at zero instances, unless
// burst_capacity is -1, whatever burst_capacity says otherwise.
func excessBurstCapacity(s spec.Scaling, ready int, total, panic float64, towardZero bool) float64 {
	var ebc float64
	switch {
	case s.BurstCapacity == 0, s.Metric.Resource() && s.BurstCapacity != spec.Unlimited:
		ebc = 0
	case s.BurstCapacity > 0:
		ebc = math.Floor(float64(ready)*total - s.BurstCapacity - panic)
	default:
		ebc = -1
	}
	if (ready == 0 || towardZero) && ebc >= 0 {
		ebc = -1
	}
	return ebc
}

// capacity returns one instance's full capacity (Knative's TotalValue) and
// the target the decider aims for (TargetValue = total x utilization).
//
// With cpu or memory the target is already a share of the serving task's
// reservation (Knative's HPA class takes it as is): utilization does not
// apply, and one instance's full capacity is the target itself.
func capacity(s spec.Scaling, concurrency int) (total, target float64) {
	total = s.Target
	if s.Metric.Resource() {
		return total, math.Max(0.01, total)
	}
	if s.Metric == spec.MetricConcurrency && concurrency > 0 && float64(concurrency) < total {
		total = float64(concurrency)
	}
	// Knative's floor, so a tiny target never divides into infinity.
	return total, math.Max(0.01, total*s.Utilization/100)
}

// effectiveScaling fills the fields that must be positive with the defaults.
// Validated services never need it; hand-built catalog entries might.
func effectiveScaling(s spec.Scaling) spec.Scaling {
	def := spec.DefaultScaling()
	switch s.Metric {
	case spec.MetricRPS, spec.MetricCPU, spec.MetricMemory:
	default:
		s.Metric = spec.MetricConcurrency
	}
	if s.Target <= 0 {
		s.Target = spec.DefaultTarget(s.Metric)
	}
	if s.Utilization <= 0 || s.Utilization > 100 {
		s.Utilization = def.Utilization
	}
	if s.Window <= 0 {
		s.Window = def.Window
	}
	if s.PanicWindowPercentage <= 0 || s.PanicWindowPercentage > 100 {
		s.PanicWindowPercentage = def.PanicWindowPercentage
	}
	if s.PanicThresholdPercentage <= 100 {
		s.PanicThresholdPercentage = def.PanicThresholdPercentage
	}
	if s.MaxScaleUpRate <= 1 {
		s.MaxScaleUpRate = def.MaxScaleUpRate
	}
	if s.MaxScaleDownRate <= 1 {
		s.MaxScaleDownRate = def.MaxScaleDownRate
	}
	if s.ActivationScale < 1 {
		s.ActivationScale = 1
	}
	s.Min, s.Max, s.Initial = max(s.Min, 0), max(s.Max, 0), max(s.Initial, 0)
	if s.Metric.Resource() {
		// Validation refuses less; a hand-built entry must not reach
		// zero either: at zero there is nothing to measure.
		s.Min = max(s.Min, spec.MinResourceScale)
		if s.Max > 0 && s.Max < s.Min {
			s.Max = s.Min
		}
	}
	if s.ScaleToZeroGrace < 0 {
		s.ScaleToZeroGrace = 0
	}
	if s.ScaleDownDelay < 0 {
		s.ScaleDownDelay = 0
	}
	return s
}
