package main

import (
	"context"
	"fmt"
)

func runRevisions(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless revisions: not built yet")
	return exitError
}
