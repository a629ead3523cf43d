// Package otlpsink is an OTLP/HTTP trace receiver for tests and
// benchmarks: it accepts every export and keeps nothing, so a traced
// process pays the whole cost of exporting (encoding, sending) and
// nothing of a real backend's.
package otlpsink

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// Sink is a running receiver.
type Sink struct {
	srv     *httptest.Server
	exports atomic.Int64
}

// Start runs a sink on 127.0.0.1 until the test ends.
func Start(tb testing.TB) *Sink {
	tb.Helper()
	s := &Sink{}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		s.exports.Add(1)
		// An empty ExportTraceServiceResponse: everything accepted.
		w.Header().Set("Content-Type", "application/x-protobuf")
		w.WriteHeader(http.StatusOK)
	}))
	tb.Cleanup(s.srv.Close)
	return s
}

// Endpoint is the sink's OTEL_EXPORTER_OTLP_ENDPOINT.
func (s *Sink) Endpoint() string { return s.srv.URL }

// Exports is how many export requests arrived.
func (s *Sink) Exports() int64 { return s.exports.Load() }

// Env is the environment of a process that exports to the sink with the
// given sampler ratio (parent-based).
func (s *Sink) Env(ratio string) map[string]string {
	return map[string]string{
		"OTEL_EXPORTER_OTLP_ENDPOINT": s.Endpoint(),
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
		"OTEL_TRACES_SAMPLER":         "parentbased_traceidratio",
		"OTEL_TRACES_SAMPLER_ARG":     ratio,
	}
}
