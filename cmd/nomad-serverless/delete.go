package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

func runDelete(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "delete", `Usage: nomad-serverless delete [options] <service>

Removes a service: its route (Consul config entries and KV record) first, so
nothing routes to it, then every revision job (purged from Nomad).

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	service, ok := serviceArg(fs, args)
	if !ok {
		return exitUsage
	}
	nomad, err := newNomad()
	if err != nil {
		return errorLine(e, "delete", err)
	}
	consul, err := newConsul()
	if err != nil {
		return errorLine(e, "delete", err)
	}
	revs, err := nomad.Revisions(ctx, *namespace, service)
	if err != nil {
		return errorLine(e, "delete", err)
	}
	routeErr := consul.Delete(ctx, *namespace, service)
	switch {
	case routeErr == nil:
		fmt.Fprintf(e.stdout, "%s: route removed from Consul\n", service)
	case errors.Is(routeErr, consulroute.ErrNotFound):
		if len(revs) == 0 {
			fmt.Fprintf(e.stderr, "nomad-serverless delete: service %q not found in namespace %s (nothing in Nomad or Consul)\n", service, *namespace)
			return exitError
		}
	default:
		// Keep the jobs: purging them under a live route would leave
		// traffic pointing at nothing.
		return errorLine(e, "delete", fmt.Errorf("%w\nNo revision was purged; run delete again", routeErr))
	}
	failed := false
	for _, r := range revs {
		if err := nomad.Purge(ctx, r.Name); err != nil && !errors.Is(err, nomadjob.ErrNotFound) {
			fmt.Fprintf(e.stderr, "nomad-serverless delete: %v\n", err)
			failed = true
			continue
		}
		fmt.Fprintf(e.stdout, "%s: purged from Nomad\n", r.Name)
	}
	if failed {
		fmt.Fprintln(e.stderr, "Some revisions were not purged; run delete again.")
		return exitError
	}
	return exitOK
}
