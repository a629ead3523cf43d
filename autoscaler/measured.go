package autoscaler

import (
	"fmt"

	"github.com/nomad-serverless/nomad-serverless/canary"
)

// The gateways' per-revision measurements (requests ended, errors, a
// latency histogram) ride on the demand reports every replica already
// sends the leader each second, so rollouts need no channel of their own.
// Each report carries the replica's deltas since its previous report that
// reached the leader; the leader adds them up per revision until the
// rollout driver takes them (TakeMeasurements). A replica that restarts
// starts its deltas from zero, and a leader that changes starts its sums
// from zero: the rollout in flight then judges a shorter window, never a
// count twice.

// checkMeasured refuses a measurement no gateway could make.
func checkMeasured(m *canary.Measurement) error {
	if m == nil {
		return nil
	}
	if m.Errors > m.Requests {
		return fmt.Errorf("measured %d errors out of %d requests", m.Errors, m.Requests)
	}
	if n := m.Latency.Count(); n > m.Requests {
		return fmt.Errorf("measured %d latencies for %d requests", n, m.Requests)
	}
	return nil
}

// addMeasured adds a report's measurements to the sums; demandMu is held.
func (a *Autoscaler) addMeasured(demand []Demand) {
	for _, d := range demand {
		if d.Measured == nil || d.Measured.Requests == 0 {
			continue
		}
		m := a.measured[d.Revision]
		m.Add(*d.Measured)
		a.measured[d.Revision] = m
	}
}

// TakeMeasurements returns what the gateways measured of each revision
// since the previous call, and starts the sums again. Only the leader
// sums them (ErrNotLeader elsewhere).
func (a *Autoscaler) TakeMeasurements() (map[string]canary.Measurement, error) {
	if !a.running.Load() {
		return nil, ErrNotLeader
	}
	a.demandMu.Lock()
	defer a.demandMu.Unlock()
	out := a.measured
	a.measured = make(map[string]canary.Measurement, len(out))
	return out, nil
}
