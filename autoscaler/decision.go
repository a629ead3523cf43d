package autoscaler

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Rule names the rule that settled a decision's count; Decision.Reason turns
// it and the numbers behind it into a sentence.
type Rule uint8

const (
	// RuleNoData: no sample in the stable window; the count is left alone.
	// (The zero Rule means "not decided yet".)
	RuleNoData Rule = iota + 1
	// RuleStable: the stable-window average over the target.
	RuleStable
	// RulePanic: panic mode (the panic-window demand reached the panic
	// threshold of current capacity); counts only go up.
	RulePanic
	// RuleActivation: any demand keeps at least activation_scale instances.
	RuleActivation
	// RuleWake: requests wait at the activator for a revision at zero.
	RuleWake
	// RuleScaleDownDelay: a higher count wanted within scale_down_delay.
	RuleScaleDownDelay
	// RuleInitial: a new revision is held at its initial scale until that
	// many instances have been ready.
	RuleInitial
	// RuleIdle: no traffic, but one instance stays until the scale-to-zero
	// grace has passed with the activator in the path.
	RuleIdle
	// RuleZero: no traffic for the grace period: zero instances.
	RuleZero
	// RuleMin and RuleMax: the count was raised to min or lowered to max.
	RuleMin
	RuleMax
	// RuleMissingStats: a revision scaled on cpu or memory would scale
	// down, but the usage of some of its instances could not be read this
	// tick; the count is kept.
	RuleMissingStats
)

var ruleNames = [...]string{
	0:                  "undecided",
	RuleNoData:         "no-data",
	RuleStable:         "stable",
	RulePanic:          "panic",
	RuleActivation:     "activation-scale",
	RuleWake:           "wake",
	RuleScaleDownDelay: "scale-down-delay",
	RuleInitial:        "initial-scale",
	RuleIdle:           "idle",
	RuleZero:           "zero",
	RuleMin:            "min",
	RuleMax:            "max",
	RuleMissingStats:   "missing-stats",
}

func (r Rule) String() string {
	if int(r) < len(ruleNames) {
		return ruleNames[r]
	}
	return "rule(" + strconv.Itoa(int(r)) + ")"
}

// MarshalText makes a Rule read as its name in JSON.
func (r Rule) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads a Rule's name (what `status` does with the admin
// API's answer).
func (r *Rule) UnmarshalText(b []byte) error {
	for i, n := range ruleNames {
		if n == string(b) {
			*r = Rule(i)
			return nil
		}
	}
	return fmt.Errorf("unknown scaling rule %q", b)
}

// Decision is what the decider returns: the count to ask for and why. It is
// a plain value with no strings inside, so deciding allocates nothing; the
// sentence is formatted only when someone reads it (a scale call, status).
type Decision struct {
	// Desired is the instance count the revision should have.
	Desired int
	// Rule settled Desired.
	Rule Rule
	// Wanted is the count the demand alone asked for, before the
	// scale-down delay, min and max.
	Wanted int

	Metric spec.Metric
	// Target is the per-instance value aimed for (target x utilization;
	// for cpu and memory the target percentage itself).
	Target float64
	// Stable and Panic are the observed window averages (revision totals;
	// for cpu and memory the instances' percentages summed).
	Stable float64
	Panic  float64
	Data   bool
	// PanicMode is true while the decider panics.
	PanicMode bool

	Ready  int
	Count  int
	Queued int

	// ExcessBurstCapacity is spare capacity beyond the target burst
	// capacity; negative keeps the activator in the request path.
	ExcessBurstCapacity float64

	// Hold is how long the revision has been idle (RuleIdle, RuleZero) or
	// the scale-down delay (RuleScaleDownDelay); Grace the scale-to-zero
	// grace (RuleIdle); AwaitingActivator is true when RuleIdle waits for
	// the activator to take the path.
	Hold              time.Duration
	Grace             time.Duration
	AwaitingActivator bool
}

// resourceLoad says how a revision scaled on cpu or memory uses its
// reservation against the target, per instance on average: "cpu 85% of
// reserved > target 70%". total is a window's revision total. The sign
// compares the numbers as printed, so it never reads "70% > target 70%".
func (d Decision) resourceLoad(total float64) string {
	v := math.Round(d.perInstance(total))
	target := strconv.FormatFloat(d.Target, 'f', -1, 64)
	sign := "="
	switch t, _ := strconv.ParseFloat(target, 64); {
	case v > t:
		sign = ">"
	case v < t:
		sign = "<"
	}
	return fmt.Sprintf("%s %.0f%% of reserved %s target %s%%", d.Metric, v, sign, target)
}

func (d Decision) unit() string {
	if d.Metric == spec.MetricRPS {
		return "requests/s"
	}
	return "concurrent"
}

// perInstance is a total over the ready instances (at least one).
func (d Decision) perInstance(v float64) float64 {
	return v / float64(max(d.Ready, 1))
}

// Reason is the decision as a sentence for people: the reason of a scale
// call in `nomad job scaling-events`, and the status output.
func (d Decision) Reason() string {
	if d.Metric.Resource() {
		if r, ok := d.resourceReason(); ok {
			return r
		}
	}
	switch d.Rule {
	case RuleNoData:
		return fmt.Sprintf("no metrics: keeping %d", d.Desired)
	case RuleStable:
		return fmt.Sprintf("stable: %.1f %s over %.1f target per instance", d.Stable, d.unit(), d.Target)
	case RulePanic:
		return fmt.Sprintf("panic: %.1f %s per instance over %.1f target", d.perInstance(d.Panic), d.unit(), d.Target)
	case RuleActivation:
		return fmt.Sprintf("activation scale: at least %d while there is traffic (%.1f %s)", d.Desired, d.Stable, d.unit())
	case RuleWake:
		return fmt.Sprintf("wake: %d %s waiting at the activator", d.Queued, plural(d.Queued, "request", "requests"))
	case RuleScaleDownDelay:
		return fmt.Sprintf("scale-down delay: keeping %d, the most wanted in the last %s (now %d)", d.Desired, d.Hold, d.Wanted)
	case RuleInitial:
		return fmt.Sprintf("initial scale: %d until %d %s been ready", d.Desired, d.Desired, plural(d.Desired, "instance has", "instances have"))
	case RuleIdle:
		if d.AwaitingActivator {
			return fmt.Sprintf("no traffic for %s: keeping 1 until the activator is in the path", round(d.Hold))
		}
		return fmt.Sprintf("no traffic for %s: keeping 1 until %s (scale-to-zero grace)", round(d.Hold), d.Grace)
	case RuleZero:
		return fmt.Sprintf("no traffic for %s", round(d.Hold))
	case RuleMin, RuleMax:
		name := "min"
		if d.Rule == RuleMax {
			name = "max"
		}
		if !d.Data {
			return fmt.Sprintf("%s: %d (no metrics yet)", name, d.Desired)
		}
		return fmt.Sprintf("%s: %d (demand wants %d)", name, d.Desired, d.Wanted)
	}
	return d.Rule.String()
}

// resourceReason is Reason for the rules whose sentence names the metric,
// when it is cpu or memory; false for the others (their sentence is the
// same for every metric).
func (d Decision) resourceReason() (string, bool) {
	switch d.Rule {
	case RuleStable:
		return d.resourceLoad(d.Stable), true
	case RulePanic:
		return "panic: " + d.resourceLoad(d.Panic), true
	case RuleActivation:
		return fmt.Sprintf("activation scale: at least %d (%s)", d.Desired, d.resourceLoad(d.Stable)), true
	case RuleMissingStats:
		return fmt.Sprintf("%s use of some instances unknown: not scaling down from %d (%s over the rest)", d.Metric, d.Desired, d.resourceLoad(d.Stable)), true
	case RuleMin, RuleMax:
		if !d.Data {
			return "", false
		}
		load := d.resourceLoad(d.Stable)
		if d.PanicMode && d.Panic > d.Stable {
			load = "panic: " + d.resourceLoad(d.Panic)
		}
		name := "min"
		if d.Rule == RuleMax {
			name = "max"
		}
		return fmt.Sprintf("%s: %d (%s wants %d)", name, d.Desired, load, d.Wanted), true
	}
	return "", false
}

// Meta is the numbers behind the decision, attached to the Nomad scaling
// event.
func (d Decision) Meta() map[string]string {
	return map[string]string{
		"rule":       d.Rule.String(),
		"metric":     string(d.Metric),
		"stable":     strconv.FormatFloat(d.Stable, 'f', 2, 64),
		"panic":      strconv.FormatFloat(d.Panic, 'f', 2, 64),
		"panic_mode": strconv.FormatBool(d.PanicMode),
		"target":     strconv.FormatFloat(d.Target, 'f', 2, 64),
		"ready":      strconv.Itoa(d.Ready),
		"queued":     strconv.Itoa(d.Queued),
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

func round(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Second)
	}
	return d.Round(time.Millisecond)
}
