package autoscaler

import (
	"context"

	"github.com/nomad-serverless/nomad-serverless/canary"
)

// Demand is one activator replica's view of one revision: requests it holds
// waiting for capacity and requests it is proxying now.
type Demand struct {
	Revision string `json:"revision"`
	Queued   int    `json:"queued"`
	InFlight int    `json:"in_flight"`
	// Measured is what the replica measured of the revision's requests
	// since its previous report that reached the leader (deltas: see
	// measured.go); nil when nothing ended. The rollout driver judges
	// rollouts on it.
	Measured *canary.Measurement `json:"measured,omitempty"`
}

// DemandSink is what the activator needs from the autoscaler (DESIGN.md:
// activator depends on autoscaler for this signal only). The leader's
// autoscaler implements it in process; other replicas reach the leader
// through its admin API (RemoteSink), and every replica's Waker in front of
// that raises a revision at zero itself when the leader does not.
type DemandSink interface {
	// ReportDemand replaces replica's last report; the activator calls it
	// every second with every revision it holds or proxies for.
	ReportDemand(ctx context.Context, replica string, demand []Demand) error
	// Wake asks for an immediate decision for a revision that has requests
	// waiting and no capacity, instead of waiting for the next tick. The
	// activator calls it when a request starts waiting, at most once a
	// second per revision.
	Wake(ctx context.Context, replica string, d Demand) error
}
