package testapp

import (
	"net/http"

	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// traced wraps the app so each request is a span of its own ("testapp",
// a server span under the traceparent the sidecar sent), as an
// instrumented user app's would be: its trace shows the app's own time
// beside the gateway's and the sidecar's.
func traced(tp *tracing.Provider, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, sp := tp.StartServer(r, "testapp")
		rec := &statusRecorder{ResponseWriter: w}
		defer func() { tracing.EndHTTP(sp, rec.status()) }()
		h.ServeHTTP(rec, r.WithContext(ctx))
	})
}

// statusRecorder keeps the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(p []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(p)
}

func (s *statusRecorder) status() int {
	if s.code == 0 {
		return http.StatusOK
	}
	return s.code
}

// Unwrap lets http.ResponseController reach the connection (flushes,
// deadlines).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// Flush passes flushes on, for the streaming endpoints.
func (s *statusRecorder) Flush() { http.NewResponseController(s.ResponseWriter).Flush() }
