package main

import (
	"context"
	"fmt"
	"io"

	"github.com/nomad-serverless/nomad-serverless/rollout"
)

// writeNotReady prints the explanations under status's table.
func writeNotReady(w io.Writer, nrs []rollout.NotReady) {
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
	rollout.ServiceView
	NotReady []rollout.NotReady `json:"not_ready,omitempty"`
}

// explainStatus is the one call status makes: it explains v's revisions
// that are not ready and writes them as text after the table, or returns
// them with the view for -json.
func explainStatus(ctx context.Context, in *rollout.Inspector, v rollout.ServiceView, w io.Writer) explainedView {
	nrs := rollout.ExplainNotReady(ctx, in, v)
	if w != nil {
		writeNotReady(w, nrs)
	}
	return explainedView{ServiceView: v, NotReady: nrs}
}
