package main

import (
	"context"
	"fmt"
)

func runDev(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless dev: not built yet")
	return exitError
}
