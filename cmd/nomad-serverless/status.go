package main

import (
	"context"
	"fmt"
)

func runStatus(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless status: not built yet")
	return exitError
}
