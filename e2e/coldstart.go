package e2e

import (
	"slices"
	"time"

	nomad "github.com/hashicorp/nomad/api"
)

// ColdStart is one wake from zero as the clocks of one machine saw it: the
// request leaving the client, the autoscaler's scale call as Nomad recorded
// it, the new allocation's app task running, the app's first readiness
// answer that passed (the sidecar's probe), and the first response byte at
// the client. A zero time is a stage that could not be measured.
type ColdStart struct {
	RequestIn, ScaleCall, AllocRunning, FirstProbe, FirstByte time.Time
}

// Stage is one step of a cold start, measured from the request.
type Stage struct {
	Name  string
	Since time.Duration // since RequestIn
	Known bool
}

// Stage names, in order.
const (
	StageScaleCall    = "request in -> scale call"
	StageAllocRunning = "request in -> allocation running"
	StageFirstProbe   = "request in -> first probe passing"
	StageFirstByte    = "request in -> first byte"
	// StageOurShare is not from the request: the app's first passing
	// readiness answer to the first byte at the client.
	StageOurShare = "first probe passing -> first byte (ours)"
)

// Split returns every stage's time since the request.
func (c ColdStart) Split() []Stage {
	stage := func(name string, at time.Time) Stage {
		if at.IsZero() || c.RequestIn.IsZero() {
			return Stage{Name: name}
		}
		return Stage{Name: name, Since: at.Sub(c.RequestIn), Known: true}
	}
	return []Stage{
		stage(StageScaleCall, c.ScaleCall),
		stage(StageAllocRunning, c.AllocRunning),
		stage(StageFirstProbe, c.FirstProbe),
		stage(StageFirstByte, c.FirstByte),
	}
}

// ScaleUpsFromZero returns the times of the scaling events at or after
// since that took the group from 0 to more (successful ones only), oldest
// first.
func ScaleUpsFromZero(events []nomad.ScalingEvent, since time.Time) []time.Time {
	var out []time.Time
	for _, e := range events {
		at := time.Unix(0, int64(e.Time))
		if e.Error || e.Count == nil || at.Before(since) {
			continue
		}
		if e.PreviousCount == 0 && *e.Count > 0 {
			out = append(out, at)
		}
	}
	// Nomad keeps the newest first; do not rely on it.
	slices.SortFunc(out, func(a, b time.Time) int { return a.Compare(b) })
	return out
}

// TaskStarted is when a task of the allocation started running (zero if it
// has not).
func TaskStarted(a *nomad.Allocation, task string) time.Time {
	if a == nil {
		return time.Time{}
	}
	ts := a.TaskStates[task]
	if ts == nil {
		return time.Time{}
	}
	if !ts.StartedAt.IsZero() {
		return ts.StartedAt
	}
	for _, e := range ts.Events {
		if e.Type == nomad.TaskStarted {
			return time.Unix(0, e.Time)
		}
	}
	return time.Time{}
}
