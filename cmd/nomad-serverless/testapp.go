package main

import (
	"context"
	"fmt"
)

func runTestapp(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless testapp: not built yet")
	return exitError
}
