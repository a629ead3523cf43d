package main

import (
	"context"
	"fmt"
)

func runServe(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless serve: not built yet")
	return exitError
}
