package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// notReady says why a revision has fewer ready instances than Nomad was
// asked for, in the words deploy uses when it gives up waiting: Nomad's
// allocation events (failedAllocation, allocSummary) and the output of the
// failing readiness checks (checkOutputs).
type notReady struct {
	Revision string `json:"revision"`
	Desired  int    `json:"desired"`
	Ready    int    `json:"ready"`
	// Reason is what Nomad reports: a failed allocation and why, else the
	// allocations by status.
	Reason string `json:"reason"`
	// Checks are the failing checks' output, the app's own words.
	Checks []string `json:"checks,omitempty"`
}

// instanceReader is what explaining reads: a revision's allocations from
// Nomad and its instances' health from Consul.
type instanceReader interface {
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	Health(ctx context.Context, revision string) ([]consulroute.InstanceHealth, error)
}

// inspectorReader reads through an inspector's two clients.
type inspectorReader struct{ in *inspector }

func (r inspectorReader) Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error) {
	return r.in.nomad.Allocations(ctx, revision)
}

func (r inspectorReader) Health(ctx context.Context, revision string) ([]consulroute.InstanceHealth, error) {
	return r.in.consul.Health(ctx, revision)
}

// explainNotReady explains every revision of v that Nomad runs (not
// stopped) with fewer ready instances than its group count. A revision
// scaling up is among them for the seconds its new instances take to
// start; the reason then says they are pending or running.
func explainNotReady(ctx context.Context, r instanceReader, v serviceView) []notReady {
	var out []notReady
	for _, row := range v.Revisions {
		if row.Stopped || row.Desired == 0 || row.Ready >= row.Desired {
			continue
		}
		nr := notReady{Revision: row.Revision, Desired: row.Desired, Ready: row.Ready}
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

// writeNotReady prints the explanations under status's table.
func writeNotReady(w io.Writer, nrs []notReady) {
	if len(nrs) == 0 {
		return
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Not ready:")
	for _, nr := range nrs {
		fmt.Fprintf(w, "  %s: %d of %d ready; %s\n", nr.Revision, nr.Ready, nr.Desired, nr.Reason)
		for _, c := range nr.Checks {
			fmt.Fprintf(w, "    %s\n", c)
		}
	}
}

// explainedView is status's JSON: the view with the explanations.
type explainedView struct {
	serviceView
	NotReady []notReady `json:"not_ready,omitempty"`
}

// explainStatus is the one call status makes: it explains v's revisions
// that are not ready and writes them as text after the table, or returns
// them with the view for -json.
func explainStatus(ctx context.Context, in *inspector, v serviceView, w io.Writer) explainedView {
	nrs := explainNotReady(ctx, inspectorReader{in}, v)
	if w != nil {
		writeNotReady(w, nrs)
	}
	return explainedView{serviceView: v, NotReady: nrs}
}
