package main

import (
	"context"
	"fmt"
)

func runInstall(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless install: not built yet")
	return exitError
}
