package main

import (
	"context"
	"errors"
	"time"

	"github.com/nomad-serverless/nomad-serverless/rollout"
)

func runDelete(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "delete", `Usage: nomad-serverless delete [options] <service>

Removes a service: its route (Consul config entries and KV record) first, so
nothing routes to it, then every revision job (purged from Nomad); then it
waits until Consul lists nothing of the service (its instances leave as their
allocations stop, the activator's stand-ins as the control plane sees the
delete) and says what is left, and who removes it, if -wait runs out.

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	wait := fs.Duration("wait", 30*time.Second, "how long to wait for Consul to list nothing of the service (0: do not wait)")
	service, ok := serviceArg(fs, args)
	if !ok {
		return exitUsage
	}
	nomad, consul, err := newClients()
	if err != nil {
		return errorLine(e, "delete", err)
	}
	switch err := rollout.Delete(ctx, nomad, consul, *namespace, service, *wait, e.stdout, e.stderr); {
	case err == nil:
		return exitOK
	case errors.Is(err, rollout.ErrFailed):
		return exitError // said on stderr
	default:
		return errorLine(e, "delete", err)
	}
}
