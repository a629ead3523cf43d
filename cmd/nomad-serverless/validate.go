package main

import (
	"context"
	"fmt"
)

func runValidate(_ context.Context, e *env, _ []string) int {
	fmt.Fprintln(e.stderr, "nomad-serverless validate: not built yet")
	return exitError
}
