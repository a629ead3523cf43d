package sidecar

import (
	"encoding/json"
	"net/http"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// adminHandler serves the admin port. Every route is a read: nothing a
// network caller sends can drain the sidecar, change its limits or flip its
// probes (drain comes only from SIGTERM). The one effect of a read is that
// GET /stats starts a new averaging window: it changes what the next
// scrape averages over, not how the sidecar behaves.
type adminHandler struct {
	s       *Sidecar
	metrics http.Handler
}

func (a *adminHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "the admin port is read-only: use GET", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case spec.StatsPath:
		a.serveStats(w)
	case "/metrics":
		a.metrics.ServeHTTP(w, r)
	case "/liveness":
		serveHealth(w, a.s.state.live.Load(), "live", a.s.state.liveErr.Load())
	case "/readiness":
		if a.s.state.draining.Load() {
			http.Error(w, "draining", http.StatusServiceUnavailable)
			return
		}
		serveHealth(w, a.s.state.ready.Load(), "ready", a.s.state.readyErr.Load())
	case "/":
		w.Header()["Content-Type"] = textPlain
		w.Write([]byte("nomad-serverless sidecar for " + a.s.cfg.Revision + "\n" +
			"GET " + spec.StatsPath + "      autoscaler stats (JSON; each read starts a new window)\n" +
			"GET /metrics    Prometheus metrics\n" +
			"GET /liveness   the app's liveness probe\n" +
			"GET /readiness  the app's readiness probe (and drain)\n"))
	default:
		http.NotFound(w, r)
	}
}

func serveHealth(w http.ResponseWriter, ok bool, what string, lastErr *string) {
	if ok {
		w.Header()["Content-Type"] = textPlain
		w.Write([]byte(what + "\n"))
		return
	}
	msg := "not " + what
	if lastErr != nil {
		msg += ": " + *lastErr
	}
	http.Error(w, msg, http.StatusServiceUnavailable)
}

// serveStats writes spec.Stats as JSON. JSON, not protobuf: one small
// object per instance every two seconds costs nothing worth a binary
// format, the autoscaler already decodes JSON, and an operator can read it
// with curl.
func (a *adminHandler) serveStats(w http.ResponseWriter) {
	s := a.s.Stats(time.Now())
	w.Header()["Content-Type"] = []string{"application/json"}
	w.Header()["Cache-Control"] = []string{"no-store"}
	_ = json.NewEncoder(w).Encode(s)
}
