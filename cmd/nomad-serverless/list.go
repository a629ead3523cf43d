package main

import (
	"context"
	"fmt"
)

func runList(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless list: not built yet")
	return exitError
}
