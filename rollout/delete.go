package rollout

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// RouteRemover is what Delete needs of Consul (consulroute.Client).
type RouteRemover interface {
	Delete(ctx context.Context, namespace, service string) error
}

// Delete removes a service: its route (Consul config entries and KV record)
// first, so nothing routes to it, then every revision job, purged from
// Nomad. Each step done is said on out. A route it could not remove keeps
// every job (purging them under a live route would leave traffic pointing
// at nothing); a job it could not purge is said on diag, the others are
// purged, and it returns ErrFailed.
func Delete(ctx context.Context, nomad RevisionStore, consul RouteRemover, namespace, service string, out, diag io.Writer) error {
	revs, err := nomad.Revisions(ctx, namespace, service)
	if err != nil {
		return err
	}
	routeErr := consul.Delete(ctx, namespace, service)
	switch {
	case routeErr == nil:
		fmt.Fprintf(out, "%s: route removed from Consul\n", service)
	case errors.Is(routeErr, consulroute.ErrNotFound):
		if len(revs) == 0 {
			return fmt.Errorf("service %q not found in namespace %s (nothing in Nomad or Consul)", service, namespace)
		}
	default:
		return fmt.Errorf("%w\nNo revision was purged; run delete again", routeErr)
	}
	failed := false
	for _, r := range revs {
		if err := nomad.Purge(ctx, r.Name); err != nil && !errors.Is(err, nomadjob.ErrNotFound) {
			fmt.Fprintf(diag, "nomad-serverless delete: %v\n", err)
			failed = true
			continue
		}
		fmt.Fprintf(out, "%s: purged from Nomad\n", r.Name)
	}
	if failed {
		fmt.Fprintln(diag, "Some revisions were not purged; run delete again.")
		return ErrFailed
	}
	return nil
}
