package rollout

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// NotReady says why a revision has fewer ready instances than Nomad was
// asked for, in the words deploy uses when it gives up waiting: Nomad's
// allocation events (failedAllocation, allocSummary) and the output of the
// failing readiness checks (checkOutputs).
type NotReady struct {
	Revision string `json:"revision"`
	Desired  int    `json:"desired"`
	Ready    int    `json:"ready"`
	// Reason is what Nomad reports: a failed allocation and why, else the
	// allocations by status.
	Reason string `json:"reason"`
	// Checks are the failing checks' output, the app's own words.
	Checks []string `json:"checks,omitempty"`
}

// InstanceReader is what explaining reads: a revision's allocations from
// Nomad and its instances' health from Consul.
type InstanceReader interface {
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	Health(ctx context.Context, revision string) ([]consulroute.InstanceHealth, error)
}

// ExplainNotReady explains every revision of v that Nomad runs (not
// stopped) with fewer ready instances than its group count. A revision
// scaling up is among them for the seconds its new instances take to
// start; the reason then says they are pending or running.
func ExplainNotReady(ctx context.Context, r InstanceReader, v ServiceView) []NotReady {
	var out []NotReady
	for _, row := range v.Revisions {
		if row.Stopped || row.Desired == 0 || row.Ready >= row.Desired {
			continue
		}
		nr := NotReady{Revision: row.Revision, Desired: row.Desired, Ready: row.Ready}
		allocs, aerr := r.Allocations(ctx, row.Revision)
		switch {
		case aerr != nil:
			nr.Reason = "Nomad: " + nomadjob.Describe(aerr)
		case failedAllocation(allocs) != "":
			nr.Reason = failedAllocation(allocs)
		default:
			nr.Reason = allocSummary(allocs)
			for _, a := range allocs {
				// A task restarting in a running allocation, or one
				// Nomad cannot start, has failure events before the
				// allocation fails.
				if !a.Stopped() && a.Failure != "" {
					nr.Reason += fmt.Sprintf("; allocation %s: %s", shortID(a.ID), a.Failure)
					break
				}
			}
			if len(allocs) == 0 {
				nr.Reason += fmt.Sprintf(" (Nomad has not placed any: see `nomad job status %s` for placement failures)", row.Revision)
			}
		}
		if health, herr := r.Health(ctx, row.Revision); herr != nil {
			nr.Checks = append(nr.Checks, "Consul: "+herr.Error())
		} else {
			for _, line := range strings.Split(checkOutputs(health), "\n") {
				if line = strings.TrimSpace(line); line != "" {
					nr.Checks = append(nr.Checks, line)
				}
			}
		}
		out = append(out, nr)
	}
	return out
}

// allocSummary counts allocations by client status: "2 running, 1 pending".
func allocSummary(allocs []nomadjob.Allocation) string {
	if len(allocs) == 0 {
		return "no allocations yet"
	}
	counts := map[string]int{}
	var order []string
	for _, a := range allocs {
		if a.DesiredStatus != "run" {
			continue
		}
		if counts[a.ClientStatus] == 0 {
			order = append(order, a.ClientStatus)
		}
		counts[a.ClientStatus]++
	}
	slices.Sort(order)
	parts := make([]string, 0, len(order))
	for _, s := range order {
		parts = append(parts, fmt.Sprintf("%d %s", counts[s], s))
	}
	if len(parts) == 0 {
		return "no allocations meant to run"
	}
	return "allocations " + strings.Join(parts, ", ")
}

// failedAllocation says why an allocation that was meant to run failed, or "".
func failedAllocation(allocs []nomadjob.Allocation) string {
	for _, a := range allocs {
		if a.ClientStatus == "failed" && a.DesiredStatus == "run" || a.ClientStatus == "failed" && a.Failure != "" {
			why := a.Failure
			if why == "" {
				why = "the allocation failed"
			}
			return fmt.Sprintf("allocation %s: %s", shortID(a.ID), why)
		}
	}
	return ""
}

// checkOutputs lists the output of failing readiness checks, the app's own
// words about why it is not ready.
func checkOutputs(health []consulroute.InstanceHealth) string {
	var b strings.Builder
	for _, h := range health {
		if !h.Passing && strings.TrimSpace(h.Output) != "" {
			fmt.Fprintf(&b, "\n  check on %s: %s", h.ID, firstLine(h.Output))
		}
	}
	return b.String()
}

func shortID(id string) string {
	if len(id) > 8 {
		return id[:8]
	}
	return id
}

func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
