package main

import (
	"context"
	"fmt"
)

func runSidecar(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless sidecar: not built yet")
	return exitError
}
