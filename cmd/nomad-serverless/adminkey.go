package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/install"
)

func runAdminKey(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "admin-key", `Usage: nomad-serverless admin-key rotate [options]

Rotates the key control-plane replicas sign their admin API writes to each
other with, in Consul KV at `+consulroute.AdminKeysKey+`.
Every replica accepts the new key as soon as it reads it (they watch the key,
so within a round trip) and signs with it after -grace, so no replica refuses
another meanwhile. Earlier keys stay accepted until later rotations push them
out (three are kept). Needs a CONSUL_HTTP_TOKEN with the control-plane policy.

`)
	grace := fs.Duration("grace", 30*time.Second, "how long replicas keep signing with the current key")
	rest, err := parseFlagsAnywhere(fs, args)
	if err != nil {
		return exitUsage
	}
	if len(rest) != 1 || rest[0] != "rotate" {
		fs.Usage()
		return exitUsage
	}
	if *grace < 0 {
		fmt.Fprintln(e.stderr, "nomad-serverless admin-key: -grace must not be negative")
		return exitUsage
	}
	consul, err := newConsul(install.PolicyControlPlane)
	if err != nil {
		return errorLine(e, "admin-key", err)
	}
	key, err := consul.RotateAdminKeys(ctx, *grace)
	if err != nil {
		return errorLine(e, "admin-key", err)
	}
	fmt.Fprintf(e.stdout, "New admin API key %s: accepted now, signing from %s.\n", key.ID, key.NotBefore.Local().Format(time.RFC3339))
	return exitOK
}
