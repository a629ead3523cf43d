package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nomad-serverless/nomad-serverless/rollout"
)

func runRollback(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "rollback", `Usage: nomad-serverless rollback [options] <service>

Sends the whole latest share of a service's traffic back at once: to the
revision its latest rollout started from, or with -to to the revision named.
A rollout in progress stops (a person wins over it); the revision rolled back
from stays deployed at 0 % and is marked failed, and the next deploy of the
same spec says so before it rolls it out again.

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	to := fs.String("to", "", "the `revision` to send the latest share to")
	rest, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(rest) != 1 {
		fs.Usage()
		return exitUsage
	}
	service := rest[0]
	nomad, consul, err := newClients()
	if err != nil {
		return errorLine(e, "rollback", err)
	}
	rec, err := rollout.Rollback(ctx, nomad, consul, *namespace, service, *to, time.Now())
	if err != nil {
		return errorLine(e, "rollback", err)
	}
	fmt.Fprintf(e.stdout, "%s: rolled back to %s (%s)\n", service, rec.Latest, rollout.DescribeTraffic(rec))
	return exitOK
}
