package main

import (
	"context"
	"errors"

	"github.com/nomad-serverless/nomad-serverless/rollout"
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
	nomad, consul, err := newClients()
	if err != nil {
		return errorLine(e, "delete", err)
	}
	switch err := rollout.Delete(ctx, nomad, consul, *namespace, service, e.stdout, e.stderr); {
	case err == nil:
		return exitOK
	case errors.Is(err, rollout.ErrFailed):
		return exitError // said on stderr
	default:
		return errorLine(e, "delete", err)
	}
}
