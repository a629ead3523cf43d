package main

import (
	"context"
	"fmt"
)

func runRender(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless render: not built yet")
	return exitError
}
