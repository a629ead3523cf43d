package main

import (
	"context"
	"fmt"
)

func runTraffic(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless traffic: not built yet")
	return exitError
}
