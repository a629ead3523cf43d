// Command grpcapp is test/grpcapp as a process: a gRPC server speaking only
// h2c on $PORT, for component and e2e tests (built by testbin.Program,
// never shipped). SIGTERM or SIGINT stops it gracefully.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/nomad-serverless/nomad-serverless/test/grpcapp"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	if err := grpcapp.Run(ctx, os.Getenv, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
