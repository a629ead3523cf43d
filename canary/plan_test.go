package canary

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

func rolloutOf(d time.Duration, steps []int, interval time.Duration) *spec.Rollout {
	a := spec.DefaultAnalysis()
	a.Interval = interval
	return &spec.Rollout{Duration: d, Steps: steps, Analysis: a}
}

// Steps from a duration are Knative's (1 %, then equal steps), from
// explicit steps as written; either way within the duration.
func TestPlanFor(t *testing.T) {
	const s15 = 15 * time.Second
	cases := []struct {
		name     string
		r        *spec.Rollout
		steps    []int // nil: check only the count
		count    int
		perStep  int
		duration time.Duration
	}{
		{"one interval: 1% then all", rolloutOf(s15, nil, s15), []int{1}, 1, 1, s15},
		{"four intervals", rolloutOf(time.Minute, nil, s15), []int{1, 25, 50, 75}, 4, 1, time.Minute},
		{"a duration between intervals rounds down", rolloutOf(70*time.Second, nil, s15), []int{1, 25, 50, 75}, 4, 1, time.Minute},
		{"five minutes of 15s", rolloutOf(5*time.Minute, nil, s15),
			[]int{1, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50, 55, 60, 65, 70, 75, 80, 85, 90, 95}, 20, 1, 5 * time.Minute},
		{"99 intervals: every percent", rolloutOf(99*s15, nil, s15), nil, 99, 1, 99 * s15},
		{"100 intervals: two per step", rolloutOf(100*s15, nil, s15), nil, 50, 2, 100 * s15},
		{"an hour of 15s", rolloutOf(time.Hour, nil, s15), nil, 80, 3, time.Hour},
		{"explicit steps, one interval each", rolloutOf(0, []int{1, 5, 25, 50}, s15), []int{1, 5, 25, 50}, 4, 1, time.Minute},
		{"explicit steps spread over a duration", rolloutOf(10*time.Minute, []int{10, 50, 100}, time.Minute), []int{10, 50, 100}, 3, 3, 9 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, err := PlanFor(tc.r, time.Minute)
			if err != nil {
				t.Fatal(err)
			}
			if tc.steps != nil && !slices.Equal(p.Steps, tc.steps) {
				t.Errorf("steps %v, want %v", p.Steps, tc.steps)
			}
			if len(p.Steps) != tc.count || p.IntervalsPerStep != tc.perStep || p.Duration() != tc.duration {
				t.Errorf("%d steps of %d intervals (%s), want %d of %d (%s)", len(p.Steps), p.IntervalsPerStep, p.Duration(), tc.count, tc.perStep, tc.duration)
			}
			if p.QuietLimit != DefaultQuietLimit || p.WakeTimeout != time.Minute || p.MinRequests != spec.DefaultMinRequests || p.Interval != tc.r.Analysis.Interval {
				t.Errorf("plan thresholds %+v", p)
			}
		})
	}
}

// For every duration up to a long one, the derived plan starts at 1 %,
// grows, stays below 100 and fits in the duration, using most of it.
func TestPlanForEveryDuration(t *testing.T) {
	const interval = 10 * time.Second
	for d := interval; d <= 3*time.Hour; d += 7 * time.Second {
		p, err := PlanFor(rolloutOf(d, nil, interval), time.Minute)
		if err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		if p.Steps[0] != 1 || p.Steps[len(p.Steps)-1] >= 100 || len(p.Steps) > 99 {
			t.Fatalf("%s: steps %v", d, p.Steps)
		}
		if err := p.validate(); err != nil {
			t.Fatalf("%s: %v", d, err)
		}
		// Rounding to whole intervals per step loses less than one step.
		if p.Duration() > d || p.Duration() <= d-time.Duration(p.IntervalsPerStep+1)*interval {
			t.Fatalf("%s: plan takes %s (%d steps of %d intervals)", d, p.Duration(), len(p.Steps), p.IntervalsPerStep)
		}
	}
}

func TestPlanForRefuses(t *testing.T) {
	cases := []struct {
		name string
		r    *spec.Rollout
		wake time.Duration
		want string
	}{
		{"no rollout", nil, time.Minute, "neither duration nor steps"},
		{"inactive", rolloutOf(0, nil, time.Second), time.Minute, "neither duration nor steps"},
		{"no interval", rolloutOf(time.Minute, nil, 0), time.Minute, "interval is 0s"},
		{"steps that do not grow", rolloutOf(0, []int{5, 5}, time.Second), time.Minute, "step 2 (5%) does not increase"},
		{"step over 100", rolloutOf(0, []int{5, 101}, time.Second), time.Minute, "step 2 is 101%"},
		{"no wake timeout", rolloutOf(time.Minute, nil, time.Second), 0, "wake timeout is 0s"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := PlanFor(tc.r, tc.wake)
			if err == nil || !strings.Contains(err.Error(), tc.want) || !strings.HasPrefix(err.Error(), "making a rollout plan: ") {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
