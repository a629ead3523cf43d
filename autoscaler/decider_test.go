package autoscaler

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 0, 0, time.UTC)

// step is one decision at t0+at. Only the fields a step sets are checked
// (wantRule always is).
type step struct {
	at   time.Duration
	in   Inputs // Scaling is filled from the case
	want int
	rule Rule

	panicMode *bool
	ebc       *float64
}

func seen(stable, panic float64) Observation {
	return Observation{Stable: stable, Panic: panic, Data: true}
}

func yes() *bool           { b := true; return &b }
func no() *bool            { b := false; return &b }
func f(v float64) *float64 { return &v }
func sec(n float64) time.Duration {
	return time.Duration(n * float64(time.Second))
}

// running is n ready instances with count n.
func running(n int, o Observation) Inputs {
	return Inputs{Ready: n, Count: n, Observed: o, ActivatorInPath: true}
}

func TestDecider(t *testing.T) {
	cases := []struct {
		name    string
		scaling func(*spec.Scaling)
		steps   []step
	}{
		{
			name: "stable: desired is ceil(stable / (target x utilization))",
			steps: []step{
				// target 100 x 70% = 70 per instance.
				{at: 0, in: running(1, seen(12, 12)), want: 1, rule: RuleStable},
				{at: sec(2), in: running(1, seen(140, 70)), want: 2, rule: RuleStable},
				{at: sec(4), in: running(2, seen(141, 141)), want: 3, rule: RuleStable, panicMode: no()},
				{at: sec(6), in: running(3, seen(210, 210)), want: 3, rule: RuleStable},
			},
		},
		{
			name: "no data: no change, never to zero on missing metrics",
			steps: []step{
				{at: 0, in: running(3, Observation{}), want: 3, rule: RuleNoData},
				{at: sec(600), in: Inputs{Ready: 1, Count: 1, ActivatorInPath: true}, want: 1, rule: RuleNoData},
				{at: sec(1200), in: Inputs{Ready: 0, Count: 2, ActivatorInPath: true}, want: 2, rule: RuleNoData},
			},
		},
		{
			name: "no data: min and max still hold",
			scaling: func(s *spec.Scaling) {
				s.Min, s.Max = 2, 4
			},
			steps: []step{
				{at: 0, in: running(1, Observation{}), want: 2, rule: RuleMin},
				{at: sec(2), in: running(6, Observation{}), want: 4, rule: RuleMax},
			},
		},
		{
			name: "panic: entered when the panic-window demand reaches the threshold of current capacity",
			steps: []step{
				// 2 ready: 200% of capacity is 4 instances' worth (4 x 70 = 280).
				{at: 0, in: running(1, seen(1, 1)), want: 1, rule: RuleStable, panicMode: no()},
				{at: sec(2), in: running(2, seen(100, 210)), want: 2, rule: RuleStable, panicMode: no()},
				{at: sec(4), in: running(2, seen(100, 280)), want: 4, rule: RulePanic, panicMode: yes()},
				{at: sec(6), in: running(4, seen(100, 281)), want: 5, rule: RulePanic, panicMode: yes()},
			},
		},
		{
			name: "panic: never scales down while panicking, and keeps scaling up",
			steps: []step{
				{at: 0, in: running(1, seen(1, 1)), want: 1, rule: RuleStable},
				{at: sec(2), in: running(1, seen(50, 500)), want: 8, rule: RulePanic, panicMode: yes()},
				{at: sec(4), in: running(8, seen(50, 70)), want: 8, rule: RulePanic, panicMode: yes()},
				{at: sec(6), in: running(8, seen(60, 1400)), want: 20, rule: RulePanic, panicMode: yes()},
				{at: sec(8), in: running(20, seen(60, 0)), want: 20, rule: RulePanic, panicMode: yes()},
			},
		},
		{
			name: "panic: held for a stable window after the last tick over the threshold",
			steps: []step{
				{at: 0, in: running(1, seen(1, 1)), want: 1, rule: RuleStable},
				{at: sec(10), in: running(1, seen(50, 500)), want: 8, rule: RulePanic, panicMode: yes()},
				{at: sec(40), in: running(8, seen(70, 70)), want: 8, rule: RulePanic, panicMode: yes()},
				{at: sec(70), in: running(8, seen(70, 70)), want: 8, rule: RulePanic, panicMode: yes()},
				// 60s after the last tick over the threshold: stable again.
				{at: sec(70.5), in: running(8, seen(70, 70)), want: 4, rule: RuleStable, panicMode: no()},
			},
		},
		{
			name: "panic: a new decider starts panicking when more than one instance is ready",
			steps: []step{
				{at: 0, in: running(4, seen(0, 0)), want: 4, rule: RulePanic, panicMode: yes()},
				{at: sec(30), in: running(4, seen(0, 0)), want: 4, rule: RulePanic, panicMode: yes()},
				{at: sec(62), in: running(4, seen(0, 0)), want: 2, rule: RuleStable, panicMode: no()},
			},
		},
		{
			name:    "max scale-up rate: one step grows at most rate x ready",
			scaling: func(s *spec.Scaling) { s.MaxScaleUpRate = 2 },
			steps: []step{
				{at: -sec(2), in: running(1, seen(1, 1)), want: 1},
				{at: 0, in: running(2, seen(1000, 100)), want: 4, rule: RuleStable},
				{at: sec(2), in: running(4, seen(1000, 100)), want: 8, rule: RuleStable},
			},
		},
		{
			name:    "max scale-up rate: at least one more instance even with a timid rate",
			scaling: func(s *spec.Scaling) { s.MaxScaleUpRate = 1.1 },
			steps: []step{
				{at: -sec(2), in: running(1, seen(1, 1)), want: 1},
				{at: 0, in: running(2, seen(1000, 100)), want: 3, rule: RuleStable},
			},
		},
		{
			name: "max scale-down rate: one step shrinks at most to ready / rate",
			steps: []step{
				{at: 0, in: running(1, seen(1, 1)), want: 1},
				{at: sec(2), in: running(10, seen(1, 1)), want: 5, rule: RuleStable},
				{at: sec(4), in: running(5, seen(1, 1)), want: 2, rule: RuleStable},
				{at: sec(6), in: running(2, seen(1, 1)), want: 1, rule: RuleStable},
			},
		},
		{
			name:    "min: the count never goes below min, not even to zero",
			scaling: func(s *spec.Scaling) { s.Min = 2; s.ScaleToZeroGrace = 0 },
			steps: []step{
				{at: -sec(2), in: running(1, seen(0, 0)), want: 2, rule: RuleMin},
				{at: 0, in: running(2, seen(0, 0)), want: 2, rule: RuleMin},
				{at: sec(100), in: running(2, seen(0, 0)), want: 2, rule: RuleMin},
			},
		},
		{
			name:    "max: the count never goes above max",
			scaling: func(s *spec.Scaling) { s.Max = 5 },
			steps: []step{
				{at: 0, in: running(1, seen(1, 1)), want: 1},
				{at: sec(2), in: running(4, seen(2000, 200)), want: 5, rule: RuleMax},
			},
		},
		{
			name:    "initial: a new revision is held at initial until that many were ready",
			scaling: func(s *spec.Scaling) { s.Initial = 3 },
			steps: []step{
				{at: 0, in: Inputs{Ready: 0, Count: 3, Observed: seen(0, 0), ActivatorInPath: true}, want: 3, rule: RuleInitial},
				{at: sec(20), in: Inputs{Ready: 2, Count: 3, Observed: seen(0, 0)}, want: 3, rule: RuleInitial},
				// Reached: from now on demand rules (3 ready, rate 2: down to 1).
				{at: sec(40), in: running(3, seen(0, 0)), want: 1, rule: RuleStable},
			},
		},
		{
			name:    "initial: the grace of an idle revision starts when it reached its initial scale (starting is not idling)",
			scaling: func(s *spec.Scaling) { s.Initial = 1; s.ScaleToZeroGrace = sec(2) },
			steps: []step{
				{at: 0, in: Inputs{Ready: 0, Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, want: 1, rule: RuleInitial},
				{at: sec(4), in: Inputs{Ready: 0, Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, want: 1, rule: RuleInitial},
				// Ready after 6 s of a quiet start: kept for the grace.
				{at: sec(6), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(7), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(8), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name:    "initial: not applied to a revision already at zero (a new leader)",
			scaling: func(s *spec.Scaling) { s.Initial = 2 },
			steps: []step{
				{at: 0, in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
			},
		},
		{
			name:    "initial: ended when the count is taken to zero from outside",
			scaling: func(s *spec.Scaling) { s.Initial = 2; s.ScaleToZeroGrace = 0 },
			steps: []step{
				{at: 0, in: Inputs{Count: 2, Observed: seen(0, 0), ActivatorInPath: true}, want: 2, rule: RuleInitial},
				// deploy gave up on the revision and scaled it to zero.
				{at: sec(30), in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
				{at: sec(32), in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
			},
		},
		{
			name:    "initial: given up after the progress deadline",
			scaling: func(s *spec.Scaling) { s.Initial = 2; s.ScaleToZeroGrace = 0 },
			steps: []step{
				{at: 0, in: Inputs{Count: 2, Observed: seen(0, 0), ActivatorInPath: true}, want: 2, rule: RuleInitial},
				{at: 10 * time.Minute, in: Inputs{Count: 2, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
			},
		},
		{
			name:    "activation scale: the first scale from zero goes to at least activation_scale",
			scaling: func(s *spec.Scaling) { s.ActivationScale = 3 },
			steps: []step{
				{at: 0, in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
				{at: sec(2), in: Inputs{Count: 0, Queued: 1, Observed: seen(0.03, 0.3), ActivatorInPath: true}, want: 3, rule: RuleWake},
			},
		},
		{
			name:    "activation scale: any traffic keeps at least activation_scale",
			scaling: func(s *spec.Scaling) { s.ActivationScale = 3; s.MaxScaleDownRate = 100 },
			steps: []step{
				{at: 0, in: running(1, seen(1, 1)), want: 3, rule: RuleActivation},
				{at: sec(2), in: running(3, seen(0.5, 0.5)), want: 3, rule: RuleActivation},
			},
		},
		{
			name: "wake: requests waiting at the activator ask for capacity at zero",
			steps: []step{
				// No capacity: 0 - 211 - panic.
				{at: 0, in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero, ebc: f(-211)},
				{at: sec(1), in: Inputs{Count: 0, Queued: 5, Observed: seen(5.0/30, 5.0/3), ActivatorInPath: true}, want: 1, rule: RuleWake, ebc: f(-213)},
			},
		},
		{
			name:    "zero: what the windows still hold of earlier traffic does not wake a revision at zero",
			scaling: func(s *spec.Scaling) { s.ScaleToZeroGrace = 0 },
			steps: []step{
				// Idle and in the path: to zero.
				{at: 0, in: Inputs{Count: 1, Ready: 1, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
				// At zero, a late sample leaves 0.04 in the stable window
				// and 0.4 in the panic window, nothing held: stays.
				{at: sec(2), in: Inputs{Count: 0, Observed: seen(0.04, 0.4), ActivatorInPath: true}, want: 0, rule: RuleZero},
				{at: sec(4), in: Inputs{Count: 0, Observed: seen(5, 5), ActivatorInPath: true}, want: 0, rule: RuleZero},
				// A held request wakes it.
				{at: sec(6), in: Inputs{Count: 0, Queued: 1, Observed: seen(0.04, 0.4), ActivatorInPath: true}, want: 1, rule: RuleWake},
			},
		},
		{
			name:    "zero: a count taken to zero from outside stays there while a scale-down delay holds",
			scaling: func(s *spec.Scaling) { s.ScaleDownDelay = time.Minute; s.ScaleToZeroGrace = 0 },
			steps: []step{
				// A fresh decider holds what it finds (panic mode).
				{at: 0, in: running(2, seen(20, 20)), want: 2, rule: RulePanic},
				// An operator scaled it to zero; panic and the delay would
				// hold 2.
				{at: sec(2), in: Inputs{Count: 0, Observed: seen(10, 10), ActivatorInPath: true}, want: 0, rule: RuleZero},
			},
		},
		{
			name:    "zero: min still holds at zero",
			scaling: func(s *spec.Scaling) { s.Min = 1 },
			steps: []step{
				{at: 0, in: Inputs{Count: 0, Observed: seen(0.04, 0.04), ActivatorInPath: true}, want: 1, rule: RuleMin},
			},
		},
		{
			name:    "scale down delay: the count drops only after demand stayed low for that long",
			scaling: func(s *spec.Scaling) { s.ScaleDownDelay = 30 * time.Second; s.MaxScaleDownRate = 100 },
			steps: []step{
				{at: 0, in: running(1, seen(1, 1)), want: 1},
				{at: sec(2), in: running(1, seen(350, 70)), want: 5, rule: RuleStable},
				{at: sec(4), in: running(5, seen(70, 70)), want: 5, rule: RuleScaleDownDelay},
				{at: sec(31), in: running(5, seen(70, 70)), want: 5, rule: RuleScaleDownDelay},
				{at: sec(32), in: running(5, seen(70, 70)), want: 1, rule: RuleStable},
			},
		},
		{
			name:    "scale down delay: higher demand within the delay restarts it",
			scaling: func(s *spec.Scaling) { s.ScaleDownDelay = 10 * time.Second; s.MaxScaleDownRate = 100 },
			steps: []step{
				{at: 0, in: running(1, seen(210, 70)), want: 3},
				{at: sec(8), in: running(3, seen(140, 70)), want: 3, rule: RuleScaleDownDelay},
				{at: sec(11), in: running(3, seen(70, 70)), want: 2, rule: RuleScaleDownDelay},
				{at: sec(17), in: running(3, seen(70, 70)), want: 2, rule: RuleScaleDownDelay},
				{at: sec(18), in: running(3, seen(70, 70)), want: 1, rule: RuleStable},
			},
		},
		{
			name: "scale to zero: only after scale_to_zero_grace of no traffic",
			steps: []step{
				{at: 0, in: running(1, seen(0, 0)), want: 1, rule: RuleIdle, ebc: f(-111)},
				{at: sec(29), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(30), in: running(1, seen(0, 0)), want: 0, rule: RuleZero, ebc: f(-111)},
				{at: sec(32), in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
			},
		},
		{
			name: "scale to zero: a revision at zero stays there while its last instance stops, even if its scrape fails",
			steps: []step{
				{at: 0, in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(30), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
				// Nomad already says 0; Consul still lists the instance, and
				// its sidecar no longer answers.
				{at: sec(32), in: Inputs{Ready: 1, Count: 0, Observed: Observation{Data: true, Gap: true}, ActivatorInPath: true}, want: 0, rule: RuleZero},
				{at: sec(34), in: Inputs{Ready: 0, Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
			},
		},
		{
			name: "scale to zero: traffic restarts the grace period",
			steps: []step{
				{at: 0, in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(20), in: Inputs{Ready: 1, Count: 1, InFlight: 1, Observed: seen(0, 0), ActivatorInPath: true}, want: 1, rule: RuleIdle},
				{at: sec(22), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(51), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(52), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name: "scale to zero: a failed scrape is not quiet and restarts the grace period",
			steps: []step{
				{at: 0, in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(20), in: running(1, Observation{Data: true, Gap: true}), want: 1, rule: RuleIdle},
				{at: sec(30), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(60), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name: "scale to zero: only when the activator is in the path, grace counted from then",
			steps: []step{
				{at: 0, in: Inputs{Ready: 1, Count: 1, Observed: seen(0, 0)}, want: 1, rule: RuleIdle},
				{at: sec(100), in: Inputs{Ready: 1, Count: 1, Observed: seen(0, 0)}, want: 1, rule: RuleIdle},
				{at: sec(102), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(131), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(132), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name:    "scale to zero: a grace of 0 goes to zero at the first quiet decision",
			scaling: func(s *spec.Scaling) { s.ScaleToZeroGrace = 0 },
			steps: []step{
				{at: 0, in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name: "excess burst capacity: total capacity minus burst capacity minus panic demand",
			steps: []step{
				// 3 x 100 - 211 - 50 = 39: the activator may leave the path.
				{at: 0, in: running(3, seen(50, 50)), want: 3, ebc: f(39), rule: RulePanic},
				// 3 x 100 - 211 - 100 = -11: it must stay.
				{at: sec(2), in: running(3, seen(100, 100)), want: 3, ebc: f(-11), rule: RulePanic},
			},
		},
		{
			name:    "excess burst capacity: burst capacity 0 keeps the activator out except at zero",
			scaling: func(s *spec.Scaling) { s.BurstCapacity = 0 },
			steps: []step{
				{at: 0, in: running(1, seen(50, 50)), want: 1, ebc: f(0)},
				{at: sec(2), in: Inputs{Ready: 0, Count: 1, Observed: seen(50, 50)}, want: 1, ebc: f(-1)},
			},
		},
		{
			name:    "excess burst capacity: heading to zero puts the activator in the path",
			scaling: func(s *spec.Scaling) { s.BurstCapacity = 0 },
			steps: []step{
				{at: 0, in: Inputs{Ready: 1, Count: 1, Observed: seen(0, 0)}, want: 1, rule: RuleIdle, ebc: f(-1)},
			},
		},
		{
			name:    "excess burst capacity: unlimited keeps the activator in the path",
			scaling: func(s *spec.Scaling) { s.BurstCapacity = spec.Unlimited },
			steps: []step{
				{at: 0, in: running(1, seen(1, 1)), want: 1, ebc: f(-1)},
				{at: sec(2), in: running(1, seen(1, 1)), want: 1, ebc: f(-1)},
			},
		},
		{
			name: "target: a lower concurrency hard limit caps the per-instance capacity",
			steps: []step{
				// limit 10 -> target 10 x 70% = 7.
				{at: 0, in: Inputs{Concurrency: 10, Ready: 1, Count: 1, Observed: seen(14, 7)}, want: 2, rule: RuleStable},
			},
		},
		{
			name:    "target: rps metric",
			scaling: func(s *spec.Scaling) { s.Metric = spec.MetricRPS; s.Target = 200 },
			steps: []step{
				// 200 x 70% = 140 requests/s per instance; a hard limit does not apply.
				{at: 0, in: Inputs{Concurrency: 1, Ready: 1, Count: 1, Observed: seen(300, 100)}, want: 3, rule: RuleStable},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := spec.DefaultScaling()
			if tc.scaling != nil {
				tc.scaling(&s)
			}
			checkValid(t, s)
			var d Decider
			for i, st := range tc.steps {
				in := st.in
				in.Scaling = s
				dec := d.Decide(in, t0.Add(st.at))
				where := fmt.Sprintf("step %d (t=%s)", i, st.at)
				if dec.Desired != st.want {
					t.Errorf("%s: desired %d, want %d (rule %s: %s)", where, dec.Desired, st.want, dec.Rule, dec.Reason())
				}
				if st.rule != 0 && dec.Rule != st.rule {
					t.Errorf("%s: rule %s, want %s (%s)", where, dec.Rule, st.rule, dec.Reason())
				}
				if st.panicMode != nil && dec.PanicMode != *st.panicMode {
					t.Errorf("%s: panic mode %v, want %v", where, dec.PanicMode, *st.panicMode)
				}
				if st.ebc != nil && dec.ExcessBurstCapacity != *st.ebc {
					t.Errorf("%s: excess burst capacity %v, want %v", where, dec.ExcessBurstCapacity, *st.ebc)
				}
			}
		})
	}
}

// checkValid fails the test when s is not a valid scaling block: the table
// tests must exercise settings a user can write.
func checkValid(t *testing.T, s spec.Scaling) {
	t.Helper()
	svc := spec.NewService("hello")
	svc.Scaling = s
	for _, p := range svc.Validate() {
		if strings.HasPrefix(p.Path, "scaling.") {
			t.Fatalf("test scaling is invalid: %v", p)
		}
	}
}

func TestDecisionReason(t *testing.T) {
	s := spec.DefaultScaling()
	cases := []struct {
		name string
		dec  Decision
		want string
	}{
		{"panic", func() Decision {
			s := s
			s.Target = 1
			var d Decider
			return d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(1, 3.4)}, t0)
		}(), "panic: 3.4 concurrent per instance over 0.7 target"},
		{"stable", func() Decision {
			var d Decider
			return d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(12, 12)}, t0)
		}(), "stable: 12.0 concurrent over 70.0 target per instance"},
		{"zero", func() Decision {
			var d Decider
			d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, t0)
			return d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, t0.Add(30*time.Second))
		}(), "no traffic for 30s"},
		{"idle", func() Decision {
			var d Decider
			d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, t0)
			return d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, t0.Add(12*time.Second))
		}(), "no traffic for 12s: keeping 1 until 30s (scale-to-zero grace)"},
		{"wake", Decision{Rule: RuleWake, Queued: 3, Desired: 1}, "wake: 3 requests waiting at the activator"},
		{"rps", Decision{Rule: RuleStable, Metric: spec.MetricRPS, Stable: 300, Target: 140}, "stable: 300.0 requests/s over 140.0 target per instance"},
		{"max", Decision{Rule: RuleMax, Desired: 5, Wanted: 9, Data: true}, "max: 5 (demand wants 9)"},
		{"min", Decision{Rule: RuleMin, Desired: 2, Wanted: 0, Data: true}, "min: 2 (demand wants 0)"},
		{"min without data", Decision{Rule: RuleMin, Desired: 2}, "min: 2 (no metrics yet)"},
		{"no data", Decision{Rule: RuleNoData, Desired: 3}, "no metrics: keeping 3"},
		{"initial", Decision{Rule: RuleInitial, Desired: 3}, "initial scale: 3 until 3 instances have been ready"},
		{"delay", Decision{Rule: RuleScaleDownDelay, Desired: 5, Wanted: 1, Hold: time.Minute}, "scale-down delay: keeping 5, the most wanted in the last 1m0s (now 1)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.dec.Reason(); got != tc.want {
				t.Errorf("reason %q, want %q", got, tc.want)
			}
		})
	}
}

func TestDecisionMeta(t *testing.T) {
	d := Decision{Rule: RulePanic, Metric: spec.MetricConcurrency, Stable: 12, Panic: 3.4, PanicMode: true, Target: 0.7, Ready: 2}
	m := d.Meta()
	for k, want := range map[string]string{"rule": "panic", "stable": "12.00", "panic": "3.40", "panic_mode": "true", "target": "0.70", "ready": "2"} {
		if m[k] != want {
			t.Errorf("meta[%s] = %q, want %q", k, m[k], want)
		}
	}
}

func TestDeciderHalfFilledScalingUsesDefaults(t *testing.T) {
	var d Decider
	dec := d.Decide(Inputs{Ready: 1, Count: 1, Observed: seen(140, 140)}, t0)
	if dec.Desired != 2 || dec.Target != 70 || math.IsNaN(dec.ExcessBurstCapacity) {
		t.Fatalf("zero Scaling: desired %d target %v ebc %v, want 2, 70 and a number", dec.Desired, dec.Target, dec.ExcessBurstCapacity)
	}
}

func TestDecideAllocatesNothing(t *testing.T) {
	s := spec.DefaultScaling()
	s.ScaleDownDelay = 10 * time.Second
	var d Decider
	now := t0
	d.Decide(Inputs{Scaling: s, Ready: 3, Count: 3, Observed: seen(100, 100)}, now)
	allocs := testing.AllocsPerRun(100, func() {
		now = now.Add(2 * time.Second)
		d.Decide(Inputs{Scaling: s, Ready: 3, Count: 3, Observed: seen(100, 100)}, now)
	})
	if allocs != 0 {
		t.Fatalf("Decide allocates %v times per call, want 0", allocs)
	}
}
