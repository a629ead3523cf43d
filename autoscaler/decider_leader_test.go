package autoscaler

import (
	"fmt"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// The rules a new leader lives by, as a table: every case starts from a
// fresh Decider (what a replica that has just taken the lock has) and the
// state the previous leader left in Nomad and Consul.
func TestDeciderNewLeader(t *testing.T) {
	cases := []struct {
		name    string
		scaling func(*spec.Scaling)
		steps   []step
	}{
		{
			name: "busy: the count found is held in panic mode for a stable window",
			steps: []step{
				{at: 0, in: running(4, seen(0, 0)), want: 4, rule: RulePanic, panicMode: yes()},
				{at: sec(30), in: running(4, seen(10, 10)), want: 4, rule: RulePanic, panicMode: yes()},
				// Then the demand rules, at the scale-down rate.
				{at: sec(61), in: running(4, seen(10, 10)), want: 2, rule: RuleStable, panicMode: no()},
			},
		},
		{
			name: "busy, a scale-up under way (count above ready): the count is held, not the ready instances",
			steps: []step{
				{at: 0, in: Inputs{Ready: 3, Count: 6, Observed: seen(70, 70), ActivatorInPath: true}, want: 6, rule: RulePanic, panicMode: yes()},
				{at: sec(2), in: Inputs{Ready: 5, Count: 6, Observed: seen(70, 70), ActivatorInPath: true}, want: 6, rule: RulePanic},
			},
		},
		{
			name: "busy, this replica's catalog still filling (none listed ready yet): the count is held",
			steps: []step{
				{at: 0, in: Inputs{Ready: 0, Count: 3, Observed: seen(0, 0), ActivatorInPath: true}, want: 3, rule: RulePanic, panicMode: yes()},
				{at: sec(2), in: running(3, seen(140, 140)), want: 3, rule: RulePanic},
			},
		},
		{
			name: "a scale-down under way (count below ready): the count stands, it is not brought back up",
			steps: []step{
				{at: 0, in: Inputs{Ready: 4, Count: 2, Observed: seen(0, 0), ActivatorInPath: true}, want: 2, rule: RulePanic},
				{at: sec(2), in: Inputs{Ready: 3, Count: 2, Observed: seen(0, 0), ActivatorInPath: true}, want: 2, rule: RulePanic},
			},
		},
		{
			name: "one instance: no hold, and the demand may raise it at once",
			steps: []step{
				{at: 0, in: running(1, seen(80, 60)), want: 2, rule: RuleStable, panicMode: no()},
			},
		},
		{
			name:    "a new revision at its initial scale, none ready: the initial-scale rule, no hold",
			scaling: func(s *spec.Scaling) { s.Initial = 3 },
			steps: []step{
				{at: 0, in: Inputs{Ready: 0, Count: 3, Observed: seen(0, 0), ActivatorInPath: true}, want: 3, rule: RuleInitial, panicMode: no()},
				{at: sec(20), in: running(3, seen(0, 0)), want: 1, rule: RuleStable},
			},
		},
		{
			name: "no metrics yet: the count is kept, never zero from missing data",
			steps: []step{
				{at: 0, in: Inputs{Ready: 1, Count: 1, ActivatorInPath: true}, want: 1, rule: RuleNoData},
				{at: sec(300), in: Inputs{Ready: 1, Count: 1, ActivatorInPath: true}, want: 1, rule: RuleNoData},
				// A failed scrape is no sample either.
				{at: sec(302), in: Inputs{Ready: 1, Count: 1, Observed: Observation{Gap: true}, ActivatorInPath: true}, want: 1, rule: RuleNoData},
			},
		},
		{
			name: "idle at one instance: the scale-to-zero grace starts anew at the first quiet decision",
			steps: []step{
				// The previous leader may have counted 25 of its 30 s; this
				// one cannot know it, and gives the whole grace.
				{at: 0, in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(29), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(30), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name: "idle, the activator's place unknown at first (no burst capacity published yet): the grace counts from when it is in the path",
			steps: []step{
				{at: 0, in: Inputs{Ready: 1, Count: 1, Observed: seen(0, 0)}, want: 1, rule: RuleIdle},
				{at: sec(2), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(31), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(32), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name: "idle, a failed scrape: not quiet, the grace starts again",
			steps: []step{
				{at: 0, in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(20), in: running(1, Observation{Data: true, Gap: true}), want: 1, rule: RuleIdle},
				{at: sec(22), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(51), in: running(1, seen(0, 0)), want: 1, rule: RuleIdle},
				{at: sec(52), in: running(1, seen(0, 0)), want: 0, rule: RuleZero},
			},
		},
		{
			name:    "at zero: it stays there, the initial scale does not apply",
			scaling: func(s *spec.Scaling) { s.Initial = 2 },
			steps: []step{
				{at: 0, in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
				{at: sec(60), in: Inputs{Count: 0, Observed: seen(0, 0), ActivatorInPath: true}, want: 0, rule: RuleZero},
			},
		},
		{
			name:    "at zero with a request waiting: woken to the activation scale by the first decision",
			scaling: func(s *spec.Scaling) { s.ActivationScale = 3 },
			steps: []step{
				{at: 0, in: Inputs{Count: 0, Queued: 1, Observed: seen(1, 1), ActivatorInPath: true}, want: 3, rule: RuleWake},
			},
		},
		{
			name: "woken by another replica (count 1, none ready, no activator report here yet): kept while it starts",
			steps: []step{
				{at: 0, in: Inputs{Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, want: 1, rule: RuleInitial},
				{at: sec(2), in: Inputs{Count: 1, Queued: 1, Observed: seen(0.5, 1), ActivatorInPath: true}, want: 1},
			},
		},
		{
			name:    "woken by another replica, initial scale 0: kept for a whole grace",
			scaling: func(s *spec.Scaling) { s.Initial = 0 },
			steps: []step{
				{at: 0, in: Inputs{Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, want: 1, rule: RuleIdle},
				{at: sec(29), in: Inputs{Count: 1, Observed: seen(0, 0), ActivatorInPath: true}, want: 1, rule: RuleIdle},
			},
		},
		{
			name:    "scale-down delay: the hold lasts a stable window, then the delay",
			scaling: func(s *spec.Scaling) { s.ScaleDownDelay = 2 * time.Minute },
			steps: []step{
				{at: 0, in: running(4, seen(0, 0)), want: 4, rule: RulePanic},
				{at: sec(60), in: running(4, seen(0, 0)), want: 4, rule: RulePanic},
				{at: sec(61), in: running(4, seen(0, 0)), want: 4, rule: RuleScaleDownDelay},
				{at: sec(179), in: running(4, seen(0, 0)), want: 4, rule: RuleScaleDownDelay},
				{at: sec(181), in: running(4, seen(0, 0)), want: 2, rule: RuleStable},
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
			}
		})
	}
}
