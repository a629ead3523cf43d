package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nomad-serverless/nomad-serverless/dev"
	"github.com/nomad-serverless/nomad-serverless/install"
)

const devUsage = `Usage: nomad-serverless dev [options]

Start a local Consul dev agent, a Nomad dev agent (raw_exec enabled) and the
control plane (serve), print their URLs, and stop everything on Ctrl-C.
-deploy FILE also deploys the file's services onto them, sends a request,
waits for the revision to scale to zero and wakes it with another.
Needs consul and nomad on PATH; -demo runs a demonstration without them, and
-or-demo runs that demonstration when they are missing (make demo does).
-nodes N runs a cluster instead: one Nomad server and N client nodes, each
with its own loopback address (127.0.0.2, ...) and Consul agent (Linux, as
root: the addresses are added to lo and removed at the end).

Options:
`

func runDev(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "dev", devUsage)
	c := dev.Config{ReadyTimeout: 90 * time.Second, StopGrace: 30 * time.Second, Poll: 200 * time.Millisecond}
	var demo bool
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "gateway address")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:8081", "admin API address (health, metrics, autoscaler state)")
	fs.StringVar(&c.InternalListen, "internal-listen", "127.0.0.1:8082", "the gateway's internal listener, where internal services (visibility = \"internal\") answer too (\"\": none)")
	fs.StringVar(&c.Domain, "domain", "localhost", "domain of service hosts: <service>.<namespace>.<domain>")
	fs.IntVar(&c.ConsulHTTPPort, "consul-port", 8500, "HTTP port of the Consul dev agent")
	fs.IntVar(&c.NomadHTTPPort, "nomad-port", 4646, "HTTP port of the Nomad dev agent")
	fs.StringVar(&c.DataDir, "data-dir", "", "directory for the agents' configuration, data and logs (default: a temporary directory, removed at exit)")
	fs.StringVar(&c.Deploy, "deploy", "", "once everything runs, deploy this service `file` (with -sidecar-command and -var binary set to this binary), send a request, wait for it to scale to zero and wake it")
	fs.BoolVar(&c.OrDemo, "or-demo", false, "when consul or nomad is not on PATH, say what is missing and run the -demo demonstration instead of failing")
	fs.IntVar(&c.Nodes, "nodes", 0, "run a cluster instead of one dev agent: a Nomad server and `N` client nodes, each with its own loopback address (127.0.0.2, ...) and Consul agent (Linux, as root)")
	fs.BoolVar(&demo, "demo", false, "without Nomad and Consul: run the gateway, activator, autoscaler and real sidecar+app processes locally and narrate a wake from zero, a burst and the way back to zero")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if c.Nodes < 0 {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: -nodes %d: want 0 (one dev agent) or more\n", c.Nodes)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: unexpected argument %q (dev takes only options; a file to deploy goes after -deploy)\n", fs.Arg(0))
		return exitUsage
	}
	if c.Deploy != "" {
		if _, err := os.Stat(c.Deploy); err != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless dev: -deploy: %v\n", err)
			return exitUsage
		}
	}
	de := dev.Env{Stdout: e.stdout, Stderr: e.stderr, Getenv: e.getenv}
	if demo {
		return devExit(dev.RunDemo(ctx, de, c))
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: cannot find this binary to run serve: %v\n", err)
		return exitError
	}
	c.Executable = exe
	// -deploy runs the deploy command in this process, once dev has
	// pointed the process's environment at the agents.
	c.RunDeploy = func(ctx context.Context, de dev.Env, args []string) int {
		return runDeploy(ctx, &env{stdout: de.Stdout, stderr: de.Stderr, getenv: de.Getenv}, args)
	}
	c.Revisions = func() (dev.RevisionSource, error) { return newNomad(install.PolicyDeploy) }
	return devExit(dev.Run(ctx, de, c))
}

// devExit is dev's exit code: dev has said on stderr what went wrong.
func devExit(err error) int {
	if err != nil {
		return exitError
	}
	return exitOK
}
