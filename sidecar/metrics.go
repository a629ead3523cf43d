package sidecar

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// Timeout kinds, as metric label values and in 504 bodies.
const (
	timeoutRequest       = "request"
	timeoutResponseStart = "response_start"
	timeoutIdle          = "idle"
)

// metrics are the sidecar's Prometheus metrics, in a registry of its own (no
// global state). Every series the request path touches is resolved here,
// once, so recording is an atomic add: no label lookup, no map, no lock.
type metrics struct {
	reg *prometheus.Registry

	// byClass[i] counts responses with status i xx; 0 holds anything
	// outside 100..599.
	byClass    [6]prometheus.Counter
	latency    prometheus.Histogram
	rejections prometheus.Counter
	timeouts   map[string]prometheus.Counter // read-only after construction
	probes     map[string]map[bool]prometheus.Counter
}

// gauges are read at scrape time from the sidecar's own state.
type gauges struct {
	inFlight, queued          func() float64
	ready, live, draining     func() float64
	concurrencyLimit, maxWait float64
}

func newMetrics(service, revision string, g gauges) *metrics {
	labels := prometheus.Labels{"service": service, "revision": revision}
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "nomad_serverless", Subsystem: "sidecar", Name: name, Help: help, ConstLabels: labels}
	}
	m := &metrics{reg: prometheus.NewRegistry()}

	requests := prometheus.NewCounterVec(prometheus.CounterOpts(opts("requests_total",
		"Requests proxied to the app (or refused by the sidecar), by response status class.")), []string{"status_class"})
	for i, class := range []string{"other", "1xx", "2xx", "3xx", "4xx", "5xx"} {
		m.byClass[i] = requests.WithLabelValues(class)
	}
	m.latency = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: "nomad_serverless", Subsystem: "sidecar", Name: "request_duration_seconds",
		Help:        "Time from a request's arrival at the sidecar to the end of its response, queueing included.",
		ConstLabels: labels,
		Buckets:     []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	})
	m.rejections = prometheus.NewCounter(prometheus.CounterOpts(opts("breaker_rejections_total",
		"Requests refused with 503 because the concurrency limit was reached and the queue was full.")))
	timeouts := prometheus.NewCounterVec(prometheus.CounterOpts(opts("timeouts_total",
		"Requests ended by a timeout, by which timeout.")), []string{"timeout"})
	m.timeouts = map[string]prometheus.Counter{}
	for _, k := range []string{timeoutRequest, timeoutResponseStart, timeoutIdle} {
		m.timeouts[k] = timeouts.WithLabelValues(k)
	}
	probes := prometheus.NewCounterVec(prometheus.CounterOpts(opts("probes_total",
		"Readiness and liveness probes of the app the sidecar ran, by result.")), []string{"probe", "result"})
	m.probes = map[string]map[bool]prometheus.Counter{}
	for _, p := range []string{"readiness", "liveness"} {
		m.probes[p] = map[bool]prometheus.Counter{
			true:  probes.WithLabelValues(p, "success"),
			false: probes.WithLabelValues(p, "failure"),
		}
	}

	m.reg.MustRegister(requests, m.latency, m.rejections, timeouts, probes,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("in_flight_requests",
			"Requests in the sidecar now: in the app or queued.")), g.inFlight),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("queued_requests",
			"Requests waiting for the concurrency limit now.")), g.queued),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("ready",
			"1 when the app passes its readiness probe.")), g.ready),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("live",
			"1 when the app passes its liveness probe (or declares none).")), g.live),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("draining",
			"1 once the sidecar got SIGTERM and is draining.")), g.draining),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("concurrency_limit",
			"The revision's per-instance concurrency limit; 0 means none.")), func() float64 { return g.concurrencyLimit }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts(opts("queue_depth",
			"How many requests may wait for the concurrency limit.")), func() float64 { return g.maxWait }),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// recordResponse counts one finished request.
// sp is the request's span (nil: tracing off), whose trace a sampled
// request's latency keeps as its exemplar.
func (m *metrics) recordResponse(status int, seconds float64, sp trace.Span) {
	class := status / 100
	if class < 1 || class > 5 {
		class = 0
	}
	m.byClass[class].Inc()
	if sp != nil {
		tracing.Observe(m.latency, seconds, sp.SpanContext())
		return
	}
	m.latency.Observe(seconds)
}

func (m *metrics) handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		// OpenMetrics, when the scraper asks for it, carries the latency
		// histogram's exemplars (trace ids); the text format drops them.
		EnableOpenMetrics: true,
	})
}
