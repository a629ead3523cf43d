package autoscaler

import (
	"fmt"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// resourceScaling is a valid cpu (or memory) scaling block: min 1, the
// target a percentage of the reservation.
func resourceScaling(m spec.Metric, target float64) func(*spec.Scaling) {
	return func(s *spec.Scaling) {
		s.Metric, s.Target, s.Min = m, target, spec.MinResourceScale
	}
}

// gap is an observation whose latest sample is missing or partial.
func gap(stable, panic float64) Observation {
	return Observation{Stable: stable, Panic: panic, Data: true, Gap: true}
}

// TestDeciderResource holds the decider to Knative's HPA arithmetic for cpu
// and memory: desired = ceil(sum of per-instance percent / target), with
// the windows, rates, bounds and delay of the concurrency metric, a floor
// of one, and no scale-down on missing stats. Observations are revision
// totals (three instances at 50% read 150).
func TestDeciderResource(t *testing.T) {
	cpu := func(target float64, more ...func(*spec.Scaling)) func(*spec.Scaling) {
		return func(s *spec.Scaling) {
			resourceScaling(spec.MetricCPU, target)(s)
			for _, m := range more {
				m(s)
			}
		}
	}
	cases := []struct {
		name    string
		scaling func(*spec.Scaling)
		steps   []step
	}{
		{
			name: "scale up: ceil(total percent / target), utilization does not apply",
			scaling: cpu(70, func(s *spec.Scaling) {
				s.Utilization = 50
				s.PanicThresholdPercentage = 1000 // the stable window's rule alone
			}),
			steps: []step{
				{at: 0, in: running(1, seen(60, 60)), want: 1, rule: RuleStable},
				{at: sec(2), in: running(1, seen(85, 85)), want: 2, rule: RuleStable},
				// 3 x 50% = 150 over 70 per instance: 3.
				{at: sec(4), in: running(2, seen(150, 130)), want: 3, rule: RuleStable, panicMode: no()},
				{at: sec(6), in: running(3, seen(210, 210)), want: 3, rule: RuleStable},
			},
		},
		{
			name:    "panic: one instance over its target wants two, 200% of its capacity: panic mode",
			scaling: cpu(70),
			steps: []step{
				{at: 0, in: running(1, seen(85, 85)), want: 2, rule: RulePanic, panicMode: yes()},
			},
		},
		{
			name:    "memory works the same way",
			scaling: resourceScaling(spec.MetricMemory, 80),
			steps: []step{
				{at: 0, in: running(2, seen(170, 170)), want: 3, rule: RuleStable},
				{at: sec(2), in: running(3, seen(150, 150)), want: 2, rule: RuleStable},
			},
		},
		{
			name:    "panic: entered at 200% of current capacity in the panic window, never scales down while it lasts",
			scaling: cpu(50, func(s *spec.Scaling) { s.Window = 20 * time.Second }),
			steps: []step{
				// 1 ready, 1 x 50 capacity; panic total 110 wants 3 >= 2 x 1.
				{at: 0, in: running(1, seen(40, 110)), want: 3, rule: RulePanic, panicMode: yes()},
				// The stable window alone would want 1; panic keeps 3.
				{at: sec(10), in: running(3, seen(45, 45)), want: 3, rule: RulePanic, panicMode: yes()},
				// A stable window after the last tick over the threshold.
				{at: sec(21), in: running(3, seen(45, 45)), want: 1, rule: RuleStable, panicMode: no()},
			},
		},
		{
			name:    "scale down: at most max_scale_down_rate per step",
			scaling: cpu(70),
			steps: []step{
				// 8 ready at 5% each wants 1; rate 2 allows 4.
				{at: 0, in: running(8, seen(40, 40)), want: 4, rule: RuleStable},
				{at: sec(2), in: running(4, seen(20, 20)), want: 2, rule: RuleStable},
				{at: sec(4), in: running(2, seen(10, 10)), want: 1, rule: RuleStable},
			},
		},
		{
			name: "scale up: at most max_scale_up_rate per step",
			scaling: cpu(50, func(s *spec.Scaling) {
				s.MaxScaleUpRate = 2
				s.PanicThresholdPercentage = 1000 // keep panic out of it
			}),
			steps: []step{
				// 1 ready at 400% (raw_exec has no hard limit) wants 8; rate 2 allows 2.
				{at: 0, in: running(1, seen(400, 400)), want: 2, rule: RuleStable},
			},
		},
		{
			name: "bounds: max caps, min holds",
			scaling: cpu(50, func(s *spec.Scaling) {
				s.Min, s.Max = 2, 4
				s.PanicThresholdPercentage = 1000
			}),
			steps: []step{
				{at: 0, in: running(2, seen(500, 500)), want: 4, rule: RuleMax},
				{at: sec(2), in: running(3, seen(20, 20)), want: 2, rule: RuleMin},
			},
		},
		{
			name:    "floor 1: an idle revision keeps one instance, never zero",
			scaling: cpu(70),
			steps: []step{
				{at: 0, in: running(1, seen(0, 0)), want: 1, rule: RuleMin},
				// Long past the scale-to-zero grace, with the activator in the path.
				{at: sec(600), in: running(1, seen(0, 0)), want: 1, rule: RuleMin},
			},
		},
		{
			name:    "missing data: no sample holds the count",
			scaling: cpu(70),
			steps: []step{
				{at: 0, in: running(3, Observation{}), want: 3, rule: RuleNoData},
				{at: sec(600), in: Inputs{Ready: 0, Count: 2}, want: 2, rule: RuleNoData},
			},
		},
		{
			name:    "missing data: a tick with some instances unread never scales down",
			scaling: cpu(70),
			steps: []step{
				{at: 0, in: running(3, gap(30, 30)), want: 3, rule: RuleMissingStats},
				// Up is still allowed on what was read.
				{at: sec(2), in: running(3, gap(300, 300)), want: 5, rule: RuleStable},
				// The same numbers read in full scale down.
				{at: sec(4), in: running(3, seen(30, 30)), want: 1, rule: RuleStable},
			},
		},
		{
			name: "scale_down_delay holds the highest count wanted within it",
			scaling: cpu(50, func(s *spec.Scaling) {
				s.ScaleDownDelay = 10 * time.Second
				s.PanicThresholdPercentage = 1000
			}),
			steps: []step{
				{at: 0, in: running(1, seen(140, 90)), want: 3, rule: RuleStable},
				{at: sec(4), in: running(3, seen(40, 40)), want: 3, rule: RuleScaleDownDelay},
				{at: sec(12), in: running(3, seen(40, 40)), want: 1, rule: RuleStable},
			},
		},
		{
			name:    "activator: out of the path while an instance is ready, whatever burst_capacity says",
			scaling: cpu(70, func(s *spec.Scaling) { s.BurstCapacity = 500 }),
			steps: []step{
				{at: 0, in: running(1, seen(10, 10)), want: 1, rule: RuleStable, ebc: f(0)},
				{at: sec(2), in: Inputs{Ready: 0, Count: 1, Observed: seen(10, 10)}, want: 1, ebc: f(-1)},
			},
		},
		{
			name:    "activator: burst_capacity -1 keeps it in the path",
			scaling: cpu(70, func(s *spec.Scaling) { s.BurstCapacity = spec.Unlimited }),
			steps: []step{
				{at: 0, in: running(2, seen(10, 10)), want: 1, rule: RuleStable, ebc: f(-1)},
			},
		},
		{
			name:    "wake: a revision found at zero with requests waiting goes to min at least",
			scaling: cpu(70),
			steps: []step{
				{at: 0, in: Inputs{Count: 0, Queued: 3, ActivatorInPath: true}, want: 1, rule: RuleMin},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := spec.DefaultScaling()
			tc.scaling(&s)
			checkValid(t, s)
			runSteps(t, s, tc.steps)
		})
	}
}

// warm is a Decider that has been deciding s for an hour, at one idle
// instance: past a new leader's hold of the count it finds (which would
// keep any count above one for a window, in panic mode).
func warm(s spec.Scaling) *Decider {
	var d Decider
	d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(0, 0)}, t0.Add(-time.Hour))
	return &d
}

// runSteps feeds steps to one warm Decider and checks each decision.
func runSteps(t *testing.T, s spec.Scaling, steps []step) {
	t.Helper()
	d := warm(s)
	for i, st := range steps {
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
}

// A scaling block that skipped validation (a job registered by hand with
// min 0) still never takes a cpu revision to zero.
func TestDeciderResourceFloorWithoutValidation(t *testing.T) {
	s := spec.DefaultScaling()
	s.Metric, s.Target, s.Min = spec.MetricCPU, 70, 0
	var d Decider
	for i := range 20 {
		dec := d.Decide(Inputs{Scaling: s, Ready: 1, Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, t0.Add(time.Duration(i)*time.Minute))
		if dec.Desired != 1 {
			t.Fatalf("minute %d: desired %d (%s), want 1", i, dec.Desired, dec.Reason())
		}
	}
}

func TestDecisionReasonResource(t *testing.T) {
	decide := func(m spec.Metric, target float64, in Inputs, mod ...func(*spec.Scaling)) Decision {
		s := spec.DefaultScaling()
		resourceScaling(m, target)(&s)
		for _, f := range mod {
			f(&s)
		}
		in.Scaling = s
		return warm(s).Decide(in, t0)
	}
	noPanic := func(s *spec.Scaling) { s.PanicThresholdPercentage = 1000 }
	cases := []struct {
		name string
		dec  Decision
		want string
	}{
		{"up", decide(spec.MetricCPU, 70, running(1, seen(85, 85)), noPanic), "cpu 85% of reserved > target 70%"},
		{"down, per instance", decide(spec.MetricCPU, 70, running(4, seen(80, 80))), "cpu 20% of reserved < target 70%"},
		{"equal as printed", decide(spec.MetricMemory, 70, running(2, seen(140.4, 140.4))), "memory 70% of reserved = target 70%"},
		{"fractional target", decide(spec.MetricCPU, 62.5, running(1, seen(90, 90)), noPanic), "cpu 90% of reserved > target 62.5%"},
		{"panic", decide(spec.MetricCPU, 50, running(1, seen(40, 110))), "panic: cpu 110% of reserved > target 50%"},
		{"max", decide(spec.MetricCPU, 50, running(2, seen(500, 500)), func(s *spec.Scaling) { s.Max = 4 }), "max: 4 (cpu 250% of reserved > target 50% wants 10)"},
		{"min", decide(spec.MetricCPU, 50, running(1, seen(0, 0))), "min: 1 (cpu 0% of reserved < target 50% wants 0)"},
		{"min without data", decide(spec.MetricCPU, 50, Inputs{Ready: 0, Count: 0}), "min: 1 (no metrics yet)"},
		{"missing stats", decide(spec.MetricCPU, 70, running(3, gap(30, 30))), "cpu use of some instances unknown: not scaling down from 3 (cpu 10% of reserved < target 70% over the rest)"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.dec.Reason(); got != tc.want {
				t.Errorf("reason %q, want %q", got, tc.want)
			}
		})
	}
}
