package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// tracingShutdownBound bounds the export of the last spans when a process
// stops: a collector that is gone must not hold up a drain that Nomad's
// kill_timeout already bounds.
const tracingShutdownBound = 5 * time.Second

// shutdownTracing exports what spans are left, within
// tracingShutdownBound.
func shutdownTracing(tp *tracing.Provider, log *slog.Logger) {
	ctx, cancel := context.WithTimeout(context.Background(), tracingShutdownBound)
	defer cancel()
	if err := tp.Shutdown(ctx); err != nil {
		log.Warn("the last spans were not all exported", "err", err)
	}
}
