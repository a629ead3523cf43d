package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/controlplane"
)

// serveOptions are `serve`'s flags.
type serveOptions struct {
	listen, adminListen string
	advertise           string
	domain              string
	replica             string
	tick                time.Duration
	logJSON             bool
}

func runServe(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "serve", `Usage: nomad-serverless serve [options]

Runs the control plane: the gateway and activator on -listen, the admin API
(/healthz, /metrics, autoscaler state) on -admin-listen, and, on the replica that
holds the Consul lock, the autoscaler. Reads NOMAD_ADDR, CONSUL_HTTP_ADDR and tokens
from the environment. Run several replicas behind a load balancer for high availability.

`)
	host, _ := os.Hostname()
	var o serveOptions
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "`address` of the gateway (user traffic)")
	fs.StringVar(&o.adminListen, "admin-listen", "127.0.0.1:8081", "`address` of the admin API (health, metrics, autoscaler state)")
	fs.StringVar(&o.advertise, "advertise", "", "`IP` other nodes reach this replica at (registered in Consul); default: the -listen host, or the Consul agent's address when that is a wildcard")
	fs.StringVar(&o.domain, "domain", activator.DefaultDomain, "services answer at <service>.<namespace>.`domain`")
	fs.StringVar(&o.replica, "replica", host, "this replica's `name` (unique among serve replicas)")
	fs.DurationVar(&o.tick, "tick", 2*time.Second, "the autoscaler's decision period")
	fs.BoolVar(&o.logJSON, "log-json", false, "log JSON lines instead of text")
	if _, err := parseFlagsAnywhere(fs, args); err != nil {
		return exitUsage
	}
	if o.replica == "" {
		fmt.Fprintln(e.stderr, "nomad-serverless serve: -replica is empty and the host name is unknown; name this replica")
		return exitUsage
	}
	var handler slog.Handler = slog.NewTextHandler(e.stderr, nil)
	if o.logJSON {
		handler = slog.NewJSONHandler(e.stderr, nil)
	}
	log := slog.New(handler).With("replica", o.replica)
	if err := serve(ctx, o, log); err != nil {
		return errorLine(e, "serve", err)
	}
	return exitOK
}

// serve builds the Nomad and Consul clients and runs the control plane
// until ctx ends.
func serve(ctx context.Context, o serveOptions, log *slog.Logger) error {
	nomad, err := newNomad()
	if err != nil {
		return err
	}
	nomad.SetLogger(log)
	consul, err := newConsul(consulroute.WithReplica(o.replica), consulroute.WithLogger(log))
	if err != nil {
		return err
	}
	return controlplane.Run(ctx, controlplane.Config{
		Listen: o.listen, AdminListen: o.adminListen, Advertise: o.advertise,
		Domain: o.domain, Replica: o.replica, Tick: o.tick,
		Nomad: nomad, Consul: consul, Logger: log,
	})
}
