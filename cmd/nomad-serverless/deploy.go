package main

import (
	"context"
	"fmt"
)

func runDeploy(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless deploy: not built yet")
	return exitError
}
