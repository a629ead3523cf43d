package canary

import (
	"fmt"
	"time"
)

// Measurement is what the gateways measured of one revision over a span
// of time: the caller sums every replica's counts for the span since its
// previous Tick (deltas, not running totals: a replica that restarts
// resets its counters, and only the caller can tell).
type Measurement struct {
	// Requests is how many requests for the revision ended.
	Requests uint64 `json:"requests"`
	// Errors is how many of them failed: a 5xx answer of the app, or the
	// gateway's own 502, 503 or 504 for the revision (no instance reached,
	// none ready in time, the response did not start in time).
	Errors uint64 `json:"errors"`
	// Latency is how long they took, first byte of the request to last of
	// the response, at the gateway.
	Latency Histogram `json:"latency"`
}

// Add counts o in m too.
func (m *Measurement) Add(o Measurement) {
	m.Requests += o.Requests
	m.Errors += o.Errors
	m.Latency.Add(o.Latency)
}

// validate refuses a measurement no gateway could make.
func (m Measurement) validate() error {
	if m.Errors > m.Requests {
		return fmt.Errorf("%d errors out of %d requests", m.Errors, m.Requests)
	}
	if n := m.Latency.Count(); n > m.Requests {
		return fmt.Errorf("%d latencies for %d requests", n, m.Requests)
	}
	return nil
}

// Figures are a measurement as people read it.
type Figures struct {
	Requests uint64 `json:"requests"`
	Errors   uint64 `json:"errors"`
	// ErrorRate is Errors per Requests, in percent (0 without requests).
	ErrorRate float64 `json:"error_rate"`
	// P99 is the 99th percentile latency; 0 when nothing was timed.
	P99 time.Duration `json:"p99"`
}

// figures summarises m.
func (m Measurement) figures() Figures {
	f := Figures{Requests: m.Requests, Errors: m.Errors, P99: m.Latency.Quantile(0.99)}
	if m.Requests > 0 {
		f.ErrorRate = 100 * float64(m.Errors) / float64(m.Requests)
	}
	return f
}
