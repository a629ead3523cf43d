package canary

import (
	"errors"
	"fmt"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Plan is a rollout's steps and thresholds, fixed when it starts and kept
// in its State, so a rollout finishes as it began even if the service's
// rollout block changes meanwhile (a deploy by a person stops it instead).
//
// A step holds the new revision at Steps[i] percent of the latest share
// until IntervalsPerStep judgments, one every Interval, have passed. A
// judgment on fewer than MinRequests requests of the new revision waits
// (its requests count in the next one); after QuietLimit such waits in a
// step the step passes unjudged, so a rollout of a quiet service ends.
type Plan struct {
	// Steps are the new revision's percentages of the latest share,
	// strictly increasing, each 1 to 100.
	Steps []int `json:"steps"`
	// IntervalsPerStep is how many judgments a step must pass.
	IntervalsPerStep int           `json:"intervals_per_step"`
	Interval         time.Duration `json:"interval"`
	MinRequests      int           `json:"min_requests"`
	// MaxErrorRate is in percent, 0 to 100.
	MaxErrorRate float64           `json:"max_error_rate"`
	MaxLatency   spec.LatencyBound `json:"max_latency,omitzero"`
	// QuietLimit is how many judgments of a step may wait for requests
	// before the step passes unjudged.
	QuietLimit int `json:"quiet_limit"`
	// WakeTimeout bounds the wait for the new revision's first ready
	// instance before the first step; past it the rollout rolls back.
	WakeTimeout time.Duration `json:"wake_timeout"`
}

// DefaultQuietLimit is the waits a step gets before it passes unjudged:
// ten intervals of too few requests is a service too quiet for its
// min_requests, where holding the rollout forever would keep the previous
// revision forever and rolling back would blame a revision nobody saw
// fail. Its exposure meanwhile is bounded by that same lack of traffic.
const DefaultQuietLimit = 10

// maxDerivedSteps is the most steps a duration makes: 1 % first, then
// whole percents, as Knative's rollout-duration moves at least 1 % a step.
const maxDerivedSteps = 99

// PlanFor makes the plan of a rollout block. Without steps, the duration
// makes Knative's: 1 % first, then equal steps, each held one interval (or,
// past 99 intervals, as many whole intervals as keep the total within the
// duration). With steps, each is held one interval, or with a duration the
// whole intervals duration/len(steps) holds. wakeTimeout bounds the wake of
// a revision at zero before the first step.
func PlanFor(r *spec.Rollout, wakeTimeout time.Duration) (Plan, error) {
	if !r.Active() {
		return Plan{}, errors.New("making a rollout plan: the rollout has neither duration nor steps, so traffic moves at once")
	}
	a := r.Analysis
	if a.Interval <= 0 {
		return Plan{}, fmt.Errorf("making a rollout plan: analysis interval is %s", a.Interval)
	}
	p := Plan{
		Interval: a.Interval, MinRequests: a.MinRequests, MaxErrorRate: a.MaxErrorRate, MaxLatency: a.MaxLatency,
		QuietLimit: DefaultQuietLimit, WakeTimeout: wakeTimeout, IntervalsPerStep: 1,
	}
	intervals := int(r.Duration / a.Interval)
	if len(r.Steps) > 0 {
		p.Steps = append([]int(nil), r.Steps...)
		if r.Duration > 0 {
			p.IntervalsPerStep = max(1, intervals/len(r.Steps))
		}
	} else {
		k := intervals
		if intervals > maxDerivedSteps {
			p.IntervalsPerStep = (intervals + maxDerivedSteps - 1) / maxDerivedSteps
			k = intervals / p.IntervalsPerStep
		}
		k = max(1, k)
		for i := range k {
			// 1, then 99/k apart, rounded down: strictly increasing for
			// k <= 99, and below 100, which completion reaches.
			p.Steps = append(p.Steps, 1+i*99/k)
		}
	}
	if err := p.validate(); err != nil {
		return Plan{}, fmt.Errorf("making a rollout plan: %w", err)
	}
	return p, nil
}

// validate checks what the machine relies on; a plan loaded from Consul
// goes through it too.
func (p Plan) validate() error {
	if len(p.Steps) == 0 {
		return errors.New("the plan has no steps")
	}
	for i, s := range p.Steps {
		if s < 1 || s > 100 {
			return fmt.Errorf("step %d is %d%%, not 1 to 100", i+1, s)
		}
		if i > 0 && s <= p.Steps[i-1] {
			return fmt.Errorf("step %d (%d%%) does not increase on step %d (%d%%)", i+1, s, i, p.Steps[i-1])
		}
	}
	switch {
	case p.IntervalsPerStep < 1:
		return fmt.Errorf("intervals per step is %d, not 1 or more", p.IntervalsPerStep)
	case p.Interval <= 0:
		return fmt.Errorf("interval is %s, not positive", p.Interval)
	case p.MinRequests < 1:
		return fmt.Errorf("min_requests is %d, not 1 or more", p.MinRequests)
	case p.MaxErrorRate < 0 || p.MaxErrorRate > 100:
		return fmt.Errorf("max_error_rate is %g%%, not 0 to 100", p.MaxErrorRate)
	case p.MaxLatency.Factor != 0 && p.MaxLatency.Factor <= 1:
		return fmt.Errorf("max_latency factor is %gx, not above 1", p.MaxLatency.Factor)
	case p.MaxLatency.Absolute < 0:
		return fmt.Errorf("max_latency is %s, not positive", p.MaxLatency.Absolute)
	case p.QuietLimit < 1:
		return fmt.Errorf("quiet limit is %d, not 1 or more", p.QuietLimit)
	case p.WakeTimeout <= 0:
		return fmt.Errorf("wake timeout is %s, not positive", p.WakeTimeout)
	}
	return nil
}

// MaxJudgments is the most judgments the plan makes before it completes:
// per step, one short of its passes and one short of its waits, then the
// one that ends it. With the wake timeout it bounds a rollout's length.
func (p Plan) MaxJudgments() int {
	return len(p.Steps) * (p.IntervalsPerStep + p.QuietLimit - 1)
}

// Duration is how long the plan takes when every judgment passes at once
// and the new revision is ready when it starts.
func (p Plan) Duration() time.Duration {
	return time.Duration(len(p.Steps)*p.IntervalsPerStep) * p.Interval
}
