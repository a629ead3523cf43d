package main

import (
	"context"
	"fmt"
)

func runDelete(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless delete: not built yet")
	return exitError
}
