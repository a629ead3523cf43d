package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"

	"github.com/nomad-serverless/nomad-serverless/testapp"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// runTestapp runs the small HTTP app that tests and benchmarks put behind the
// sidecar and the gateway; it is configured by environment variables (see
// package testapp).
func runTestapp(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("testapp", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintln(e.stderr, "Usage: nomad-serverless testapp")
		fmt.Fprintln(e.stderr)
		fmt.Fprintln(e.stderr, "Runs the HTTP test app on 127.0.0.1:$PORT. Environment:")
		for _, v := range [][2]string{
			{testapp.EnvPort, "port to listen on (required)"},
			{testapp.EnvHost, "address to listen on (default 127.0.0.1)"},
			{testapp.EnvStartDelay, "wait before listening, e.g. 2s"},
			{testapp.EnvReadyDelay, "/ready answers 503 for this long after listening"},
			{testapp.EnvSleep, "every work request sleeps this long"},
			{testapp.EnvCPU, "every work request burns this much CPU"},
			{testapp.EnvNotReady, "true: /ready fails until POST /ready-ok"},
			{testapp.EnvName, "value of the X-Testapp-Name response header"},
			{testapp.EnvGraceStop, "on SIGTERM, wait this long for requests (default 5s)"},
		} {
			fmt.Fprintf(e.stderr, "  %-22s %s\n", v[0], v[1])
		}
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return exitOK
		}
		return exitUsage
	}
	cfg, err := testapp.ConfigFromEnv(e.getenv)
	if err != nil {
		fmt.Fprintln(e.stderr, "nomad-serverless testapp:", err)
		return exitUsage
	}
	log := slog.New(slog.NewTextHandler(e.stderr, nil))
	if cfg.Tracing, err = tracing.New(ctx, tracing.Options{ServiceName: "testapp", Logger: log}); err != nil {
		fmt.Fprintln(e.stderr, "nomad-serverless testapp:", err)
		return exitUsage
	}
	if cfg.Tracing != nil {
		defer shutdownTracing(cfg.Tracing, log)
	}
	if err := testapp.Run(ctx, cfg, log); err != nil {
		fmt.Fprintln(e.stderr, "nomad-serverless testapp:", err)
		return exitError
	}
	return exitOK
}
