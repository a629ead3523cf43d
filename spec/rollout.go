package spec

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Rollout is a service's `rollout {}` block: how the traffic of its
// latest target moves from the previous revision to a new one, step by
// step, and the thresholds a step is judged against (package canary
// runs it). It is a route setting, like Traffic: it is not part of the
// Template, so changing it never makes a new revision.
//
// A rollout is active when it has a Duration or Steps; an inactive one
// (no block, or duration 0 and no steps) moves all of the latest share at
// once, as before rollouts existed.
type Rollout struct {
	// Duration is how long the rollout takes when every step passes at
	// its first judgment. Without Steps it also decides them: Knative's
	// rollout-duration, 1 % first, then equal steps, one per interval
	// (see canary.PlanFor). With Steps it spreads them: each is held
	// Duration/len(Steps), rounded down to whole intervals.
	Duration time.Duration `json:"duration,omitempty"`
	// Steps are the new revision's shares of the latest target's traffic,
	// in percent, strictly increasing, each 1 to 100. A last step of 100
	// is held and judged like the others before the rollout completes;
	// without it the rollout completes when the last step passes.
	Steps []int `json:"steps,omitempty"`
	// Analysis is what a step is judged on.
	Analysis Analysis `json:"analysis"`
}

// Analysis holds the thresholds a rollout step is judged against, from
// what the gateway measured of the new and the previous revision.
type Analysis struct {
	// Interval is how often a step is judged, on the requests of the
	// interval just ended.
	Interval time.Duration `json:"interval"`
	// MinRequests is the fewest requests of the new revision a judgment
	// needs; with fewer the step waits and the next judgment counts the
	// requests of both intervals.
	MinRequests int `json:"min_requests"`
	// MaxErrorRate is the highest share of the new revision's requests,
	// in percent, that may fail: the app's 5xx answers and the gateway's
	// 502, 503 and 504 for it.
	MaxErrorRate float64 `json:"max_error_rate"`
	// MaxLatency bounds the new revision's p99 latency; zero bounds none.
	MaxLatency LatencyBound `json:"max_latency,omitzero"`
}

// LatencyBound is `max_latency`: a bound on the new revision's p99
// latency relative to the previous revision's ("1.5x"), an absolute one
// ("300ms"), or both (["1.5x", "300ms"]). A step fails when the p99 is
// over any bound set.
type LatencyBound struct {
	// Factor, when above 0, fails a step whose p99 is more than Factor
	// times the previous revision's.
	Factor float64 `json:"factor,omitempty"`
	// Absolute, when above 0, fails a step whose p99 is above it.
	Absolute time.Duration `json:"absolute,omitempty"`
}

// IsZero reports whether b bounds nothing.
func (b LatencyBound) IsZero() bool { return b.Factor == 0 && b.Absolute == 0 }

// String writes b as the file does: "1.5x", "300ms" or "1.5x, 300ms".
func (b LatencyBound) String() string {
	var parts []string
	if b.Factor != 0 {
		parts = append(parts, strconv.FormatFloat(b.Factor, 'f', -1, 64)+"x")
	}
	if b.Absolute != 0 {
		parts = append(parts, b.Absolute.String())
	}
	return strings.Join(parts, ", ")
}

// Defaults of a rollout block's analysis. The latency bound is off by
// default: the p99 of a few dozen requests is nearly their slowest, and a
// default that rolled back good revisions on one slow request would teach
// people to turn rollouts off.
const (
	DefaultRolloutInterval = 15 * time.Second
	DefaultMinRequests     = 20
	DefaultMaxErrorRate    = 1.0 // percent
)

// DefaultAnalysis returns the analysis a rollout block starts from.
func DefaultAnalysis() Analysis {
	return Analysis{Interval: DefaultRolloutInterval, MinRequests: DefaultMinRequests, MaxErrorRate: DefaultMaxErrorRate}
}

// Active reports whether r moves traffic step by step; nil and a rollout
// without duration and steps move it at once.
func (r *Rollout) Active() bool { return r != nil && (r.Duration > 0 || len(r.Steps) > 0) }

// LatestPercent is the share of the service's requests, in percent, that
// its latest targets hold: what a rollout moves to a new revision.
func (s *Service) LatestPercent() int {
	n := 0
	for _, t := range s.EffectiveTraffic() {
		if t.Latest {
			n += t.Percent
		}
	}
	return n
}

// validate returns the rollout's problems for a service whose traffic
// list is traffic; a nil rollout has none.
func (r *Rollout) validate(s *Service) []Problem {
	if r == nil {
		return nil
	}
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{path, summary, detail}) }
	a := r.Analysis

	if r.Duration < 0 {
		add("rollout.duration", fmt.Sprintf("rollout duration is %s.", r.Duration),
			"Use a positive duration such as \"5m\", or 0 (or no duration) to move all traffic at once.")
	}
	if a.Interval <= 0 {
		add("rollout.analysis.interval", fmt.Sprintf("analysis interval is %s.", a.Interval),
			"Use a positive duration such as \"15s\": a step is judged once every interval.")
	}
	if a.MinRequests < 1 {
		add("rollout.analysis.min_requests", fmt.Sprintf("min_requests is %d.", a.MinRequests),
			"Use 1 or more: a step is judged only on at least that many requests of the new revision.")
	}
	if a.MaxErrorRate < 0 || a.MaxErrorRate > 100 {
		add("rollout.analysis.max_error_rate", fmt.Sprintf("max_error_rate is %s%%.", strconv.FormatFloat(a.MaxErrorRate, 'f', -1, 64)),
			"Use a percentage from 0% to 100%, such as \"2%\": the share of the new revision's requests that may fail.")
	}
	if b := a.MaxLatency; b.Factor != 0 && b.Factor <= 1 {
		add("rollout.analysis.max_latency", fmt.Sprintf("max_latency %gx is not above 1x.", b.Factor),
			"A relative bound is how many times the previous revision's p99 the new one may take, such as \"1.5x\"; at 1x or less a revision as fast as the previous one would fail.")
	}
	if b := a.MaxLatency; b.Absolute < 0 {
		add("rollout.analysis.max_latency", fmt.Sprintf("max_latency is %s.", b.Absolute), "Use a positive duration such as \"300ms\".")
	}

	last := 0
	for i, st := range r.Steps {
		p := fmt.Sprintf("rollout.steps[%d]", i)
		switch {
		case st < 1 || st > 100:
			add(p, fmt.Sprintf("rollout step is %d%%.", st),
				"Steps are the new revision's percentages of the latest target's traffic: use 1 to 100, such as steps = [1, 5, 25, 50].")
		case i > 0 && st <= last:
			add(p, fmt.Sprintf("rollout step %d%% does not increase on the step before it (%d%%).", st, last),
				"Steps only grow, such as steps = [1, 5, 25, 50]; remove or reorder this one.")
		}
		last = max(last, st)
	}
	if r.Duration > 0 && a.Interval > 0 {
		n := max(1, len(r.Steps))
		if r.Duration < time.Duration(n)*a.Interval {
			what := "its first step (1%)"
			if len(r.Steps) > 0 {
				what = fmt.Sprintf("%d steps", len(r.Steps))
			}
			add("rollout.duration", fmt.Sprintf("rollout duration %s is too short to judge %s every %s.", r.Duration, what, a.Interval),
				fmt.Sprintf("Each step is held at least one analysis interval: use a duration of at least %s, fewer steps, or a shorter interval.", time.Duration(n)*a.Interval))
		}
	}
	if r.Active() && s.LatestPercent() == 0 {
		add("rollout", "rollout has no latest target to move.",
			"Every traffic target pins a revision or gives latest = true no percent, so a new revision would get no traffic to roll out. "+
				"Add traffic { latest = true percent = 10 } (the rollout moves that share), or remove the rollout block.")
	}
	return ps
}
