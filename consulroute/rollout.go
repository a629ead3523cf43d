package consulroute

import (
	"context"
	"fmt"
	"time"

	"github.com/hashicorp/consul/api"
)

// RolloutKVPrefix is where the control plane's leader keeps the state of
// every rollout (canary.State and its history), one key per service:
// RolloutKVPrefix + <namespace>/<service>. It is under
// ControlPlaneKVPrefix, so the deploy policy cannot write it: people see a
// rollout through the record's RolloutRoute, which the leader keeps in
// step with it.
const RolloutKVPrefix = ControlPlaneKVPrefix + "rollouts/"

// RolloutKey is the KV key of a service's rollout state.
func RolloutKey(namespace, service string) string {
	return RolloutKVPrefix + namespaceOrDefault(namespace) + "/" + service
}

// Rollout phases as the record carries them. Pending is deploy's (the
// leader has not taken the rollout up yet); the others are canary's.
const (
	RolloutPending    = "pending"
	RolloutWaking     = "waking"
	RolloutStepping   = "stepping"
	RolloutCompleted  = "completed"
	RolloutRolledBack = "rolled_back"
	RolloutStopped    = "stopped"
)

// RolloutRoute is a service's latest rollout as its record carries it:
// while one is in progress the route gives New NewPercent of the service's
// requests and Previous the rest of the latest targets' share; once it
// ended the record's Latest says where the latest share goes (New when it
// completed, Previous when it rolled back).
//
// deploy writes it (phase pending) when the service has an active rollout
// block and a new revision; the leader then writes every step, judgment
// and end here and in RolloutKey. A person's traffic, deploy or rollback
// changes its ID or ends its phase, which is how the leader learns that a
// person took the route over.
type RolloutRoute struct {
	// ID tells one rollout from the next of the same revision: the new
	// revision and when deploy started it.
	ID       string `json:"id"`
	New      string `json:"new"`
	Previous string `json:"previous"`
	Phase    string `json:"phase"`
	// NewPercent is New's share of all the service's requests while the
	// rollout is in progress (whole percents: the route's unit).
	NewPercent int `json:"new_percent"`
	// Step is the step held (from 1; 0 before the first) of Steps.
	Step      int       `json:"step,omitempty"`
	Steps     int       `json:"steps,omitempty"`
	StepPct   int       `json:"step_percent,omitempty"`
	StartedAt time.Time `json:"started_at"`
	EndedAt   time.Time `json:"ended_at,omitzero"`
	// Reason says why it ended ("error rate 31% > 2% over 47 requests at
	// step 5%").
	Reason string `json:"reason,omitempty"`
	// History is what happened, oldest first, at most MaxRolloutHistory.
	History []RolloutEvent `json:"history,omitempty"`
}

// RolloutEvent is one line of a rollout's history, for people.
type RolloutEvent struct {
	At      time.Time `json:"at"`
	Kind    string    `json:"kind"`
	Message string    `json:"message"`
}

// MaxRolloutHistory bounds a record's history: a rollout of 99 steps
// judged once each fits, and a record stays small.
const MaxRolloutHistory = 250

// InProgress reports whether the rollout still moves traffic.
func (r *RolloutRoute) InProgress() bool {
	return r != nil && (r.Phase == RolloutPending || r.Phase == RolloutWaking || r.Phase == RolloutStepping)
}

// AddHistory appends events, keeping the newest MaxRolloutHistory.
func (r *RolloutRoute) AddHistory(evs ...RolloutEvent) {
	r.History = append(r.History, evs...)
	if n := len(r.History) - MaxRolloutHistory; n > 0 {
		r.History = append([]RolloutEvent(nil), r.History[n:]...)
	}
}

// applyRollout moves the latest share of route between the rollout's two
// revisions while it is in progress: New keeps NewPercent of the service
// (at most the latest share), Previous gets the rest of that share.
func applyRollout(route Route, ro *RolloutRoute, latest string, latestShare int) Route {
	if !ro.InProgress() || ro.New != latest || latestShare <= 0 {
		return route
	}
	give := latestShare - min(max(ro.NewPercent, 0), latestShare)
	if give == 0 {
		return route
	}
	out := route
	out.Splits = nil
	moved := false
	for _, s := range route.Splits {
		if s.Revision == ro.New && !moved {
			s.Percent -= give
			moved = true
		}
		if s.Percent > 0 {
			out.Splits = append(out.Splits, s)
		}
	}
	if !moved {
		return route
	}
	for i := range out.Splits {
		if out.Splits[i].Revision == ro.Previous {
			out.Splits[i].Percent += give
			return out
		}
	}
	out.Splits = append(out.Splits, Split{Revision: ro.Previous, Percent: give})
	return out
}

// CASKV writes key with check-and-set on index (0: only if absent) and
// reports whether it was written: false means someone else wrote it since
// index was read (a deposed leader learns it that way).
func (c *Client) CASKV(ctx context.Context, key string, value []byte, index uint64) (bool, error) {
	p := &api.KVPair{Key: key, Value: value, ModifyIndex: index, Flags: uint64(time.Now().UnixMilli())}
	ok, _, err := c.api.KV().CAS(p, c.w(ctx))
	if err != nil {
		return false, c.wrap(fmt.Sprintf("write %s (check-and-set on index %d)", key, index), err)
	}
	return ok, nil
}
