// Command nomad-serverless is the one binary of nomad-serverless: the CLI
// (validate, render, deploy, revisions, traffic, status, list, delete), the
// control plane (serve), the queue-proxy (sidecar), the local setup (dev) and
// the cluster installer (install).
package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command ran and failed (invalid file, refused deploy, ...)
	exitUsage = 2 // the command line itself is wrong
)

// env is what a command may touch of the outside world, so tests can run
// commands in process.
type env struct {
	stdout, stderr io.Writer
	getenv         func(string) string
}

type command struct {
	synopsis string
	run      func(ctx context.Context, e *env, args []string) int
}

func commands() map[string]command {
	return map[string]command{
		"validate":     {"check service files without touching the cluster", runValidate},
		"render":       {"print the Nomad jobs and Consul route a file compiles to", runRender},
		"deploy":       {"make a revision of each service in a file and route traffic to it", runDeploy},
		"revisions":    {"list a service's revisions", runRevisions},
		"traffic":      {"change how a service's traffic splits over revisions", runTraffic},
		"rollback":     {"send a service's latest share back to the previous revision at once", runRollback},
		"status":       {"show a service's route, revisions and scaling state", runStatus},
		"logs":         {"follow the logs of a service's running instances", runLogs},
		"list":         {"list every service", runList},
		"delete":       {"remove a service: every revision job and its route", runDelete},
		"serve":        {"run the control plane: gateway, activator and autoscaler", runServe},
		"sidecar":      {"run the queue-proxy beside a user task (started by Nomad)", runSidecar},
		"run-task":     {"run a raw_exec task's command, writing its logs where Nomad would (started by Nomad)", runRunTask},
		"keep-sockets": {"hold serve's listening sockets so they outlive a crash of serve (started by Nomad)", runKeepSockets},
		"testapp":      {"run the small HTTP app used by tests and benchmarks", runTestapp},
		"dev":          {"start local Consul and Nomad dev agents and the control plane", runDev},
		"install":      {"render (or -apply) the Nomad job and ACL policies of the control plane", runInstall},
		"admin-key":    {"rotate the key control-plane replicas sign admin API writes with", runAdminKey},
		"version":      {"print the version", runVersion},
	}
}

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func runVersion(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stdout, "nomad-serverless", version)
	return exitOK
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "Usage: nomad-serverless <command> [options] [args]")
	fmt.Fprintln(w)
	cmds := commands()
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-12s %s\n", n, cmds[n].synopsis)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'nomad-serverless <command> -h' for a command's options.")
	fmt.Fprintln(w, "NOMAD_ADDR, NOMAD_TOKEN, NOMAD_NAMESPACE, CONSUL_HTTP_ADDR, CONSUL_HTTP_TOKEN and their TLS")
	fmt.Fprintln(w, "siblings work as they do for the nomad and consul CLIs.")
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(run(ctx, &env{stdout: os.Stdout, stderr: os.Stderr, getenv: os.Getenv}, os.Args[1:]))
}

func run(ctx context.Context, e *env, args []string) (code int) {
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help" {
		usage(e.stderr)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	cmd, ok := commands()[args[0]]
	if !ok {
		fmt.Fprintf(e.stderr, "nomad-serverless: unknown command %q\n\n", args[0])
		usage(e.stderr)
		return exitUsage
	}
	// No Go panic reaches the user as a stack dump: say what happened and
	// where to report it.
	defer func() {
		if r := recover(); r != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless %s: internal error: %v\nThis is a bug; please report it with the command you ran.\n", args[0], r)
			code = exitError
		}
	}()
	return cmd.run(ctx, e, args[1:])
}
