package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"runtime/debug"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tasklog"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// sidecarGCPercent is the sidecar's GOGC unless the environment sets one.
const sidecarGCPercent = 50

// runSidecar runs the queue-proxy beside a user task. Nomad starts it with
// the environment the compiler wrote (see package sidecar for every
// variable); SIGTERM starts the drain and the command exits 0 when it ends.
func runSidecar(ctx context.Context, e *env, args []string) int {
	// The process's start as near as the command sees it: the first step
	// of the instance in a wake's timeline.
	started := time.Now()
	if base := e.getenv(spec.EnvSidecarLogFile); base != "" {
		// First, so that even a usage error is kept: Nomad collects
		// nothing of this task (nomadjob.SidecarLogFile).
		lf, err := tasklog.OpenStderr(base, tasklog.MaxFiles, tasklog.MaxBytes)
		if err != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless sidecar: %v; logging to stderr\n", err)
		} else {
			e = &env{stdout: e.stdout, stderr: lf, getenv: e.getenv}
		}
	}
	fs := flag.NewFlagSet("sidecar", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	accessLog := fs.Bool("access-log", false, "log every request (JSON lines on stderr); same as "+spec.EnvSidecarAccessLog+"=true")
	level := fs.String("log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprintln(e.stderr, "Usage: nomad-serverless sidecar [options]")
		fmt.Fprintln(e.stderr)
		fmt.Fprintln(e.stderr, "Runs the queue-proxy in front of the user task of a revision; Nomad starts it.")
		fmt.Fprintln(e.stderr, "It is configured by the environment the compiled job sets:")
		for _, v := range [][2]string{
			{spec.EnvSidecarPort, "serving port (required)"},
			{spec.EnvSidecarAppHost, "where the app listens (default 127.0.0.1)"},
			{spec.EnvSidecarAppPort, "the app's port on that host (required)"},
			{spec.EnvSidecarAdminPort, "stats, metrics and liveness port (required)"},
			{spec.EnvSidecarService, "service name (required)"},
			{spec.EnvSidecarRevision, "revision name (required)"},
			{spec.EnvSidecarInstance, "instance identity in stats (the allocation ID)"},
			{spec.EnvSidecarConcurrency, "requests in the app at once; 0 = no limit (default)"},
			{spec.EnvSidecarQueueDepth, "requests that may wait for the limit (default 10 x concurrency)"},
			{spec.EnvSidecarTimeout, "whole request (default 300s)"},
			{spec.EnvSidecarRespStart, "wait for the response headers (default 0 = off)"},
			{spec.EnvSidecarIdle, "gap between response body writes (default 0 = off)"},
			{spec.EnvSidecarReadiness, "readiness probe as JSON (default: TCP connect to the app port)"},
			{spec.EnvSidecarLiveness, "liveness probe as JSON (default: none)"},
			{spec.EnvSidecarDrainGrace, "after SIGTERM, serve arriving requests this long (default 3s)"},
			{spec.EnvSidecarDrainLimit, "bound on the whole drain (default 29s)"},
			{spec.EnvSidecarAccessLog, "true: log every request"},
			{spec.EnvSidecarLogFile, "log to files <value>.0, .1, ... (10 of 10 MiB) instead of stderr"},
		} {
			fmt.Fprintf(e.stderr, "  %-34s %s\n", v[0], v[1])
		}
		fmt.Fprintln(e.stderr)
		fmt.Fprintln(e.stderr, "Options:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "nomad-serverless sidecar: unexpected argument %q\n", fs.Arg(0))
		return exitUsage
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(*level)); err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless sidecar: -log-level %q: want debug, info, warn or error\n", *level)
		return exitUsage
	}
	cfg, err := spec.ParseSidecarEnv(e.getenv)
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless sidecar: %v\nThe compiled Nomad job sets these variables; check the job's queue-proxy task.\n", err)
		return exitUsage
	}
	if *accessLog {
		cfg.AccessLog = true
	}
	sidecar.SetRuntimeDefaults(e.getenv)
	if e.getenv("GOGC") == "" {
		// The sidecar's live heap is about 1 MiB; the default GOGC lets
		// the heap grow to Go's 4 MiB minimum before collecting. Halving it
		// saves about 1 MiB of RSS per instance (measured with make
		// bench-sidecar) for a fraction of a percent of CPU.
		debug.SetGCPercent(sidecarGCPercent)
	}
	log := slog.New(slog.NewJSONHandler(e.stderr, &slog.HandlerOptions{Level: lvl}))
	tp, err := tracing.New(ctx, tracing.Options{ServiceName: "nomad-serverless-sidecar", Logger: log,
		Attributes: []attribute.KeyValue{attribute.String("serverless.service", cfg.Service),
			attribute.String("serverless.revision", cfg.Revision), attribute.String("service.instance.id", cfg.Instance)}})
	if err != nil {
		fmt.Fprintln(e.stderr, "nomad-serverless sidecar:", err)
		return exitUsage
	}
	if tp != nil {
		defer shutdownTracing(tp, log)
	}
	sc, err := sidecar.New(cfg, sidecar.Options{Log: log, Started: started, Tracing: tp})
	if err != nil {
		fmt.Fprintln(e.stderr, "nomad-serverless sidecar:", err)
		return exitUsage
	}
	if err := sc.Run(ctx); err != nil {
		log.Error("sidecar stopped", "error", err)
		return exitError
	}
	return exitOK
}
