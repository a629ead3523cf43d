package activator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Metric names: nomad_serverless_gateway_* for routing and proxying,
// nomad_serverless_activator_* for the queue and the probes.
const (
	gwNS  = "nomad_serverless_gateway"
	actNS = "nomad_serverless_activator"
)

// Code classes of the requests_total metric. "error" is a request that got
// no response from an instance and no answer of ours either (client gone).
var codeClasses = [...]string{"error", "1xx", "2xx", "3xx", "4xx", "5xx"}

// metrics are the gateway's Prometheus collectors, registered once in New.
type metrics struct {
	requests    *prometheus.CounterVec
	duration    *prometheus.HistogramVec
	retries     *prometheus.CounterVec
	notRetried  *prometheus.CounterVec
	ejections   *prometheus.CounterVec
	rejected    *prometheus.CounterVec
	queueWait   *prometheus.HistogramVec
	wakes       *prometheus.CounterVec
	probes      *prometheus.CounterVec
	probeReady  prometheus.Histogram
	unknownHost prometheus.Counter
	// loadingRefused: requests refused because the catalog had not loaded.
	loadingRefused prometheus.Counter
	redirects      prometheus.Counter
	panics         prometheus.Counter
	rebuilds       prometheus.Counter
	rebuildTime    prometheus.Histogram
	reports        *prometheus.CounterVec
	wakeSteps      *prometheus.HistogramVec
}

// revisionMetrics are one revision's children, resolved once so a request
// never hashes label values.
type revisionMetrics struct {
	codes           [len(codeClasses)]prometheus.Counter
	duration        prometheus.Observer
	retries         prometheus.Counter
	budgetDenied    prometheus.Counter
	triesExhausted  prometheus.Counter
	ejections       prometheus.Counter
	rejectedFull    prometheus.Counter
	rejectedTimeout prometheus.Counter
	queueWait       prometheus.Observer
	wakes           prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, g *Gateway) (*metrics, error) {
	lbl := []string{"service", "revision"}
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: gwNS, Name: "requests_total",
			Help: "Requests routed to a revision, by response code class (error: no response was written).",
		}, append(lbl, "code")),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: gwNS, Name: "request_duration_seconds",
			Help:    "Time from a request's arrival to the end of its response, queue wait included.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
		}, lbl),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: gwNS, Name: "retries_total",
			Help: "Requests sent to another instance because the one tried could not serve them and provably never ran them (connection refused or broken before a byte was sent, or the sidecar said its app is unreachable).",
		}, lbl),
		notRetried: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: gwNS, Name: "retries_denied_total",
			Help: "Retryable failures answered instead of retried: reason budget (the revision's retry budget was spent) or tries (the request's retries were used up).",
		}, append(lbl, "reason")),
		ejections: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: gwNS, Name: "ejections_total",
			Help: "Instances taken out of balancing until their probe passes, after a failure that proves they cannot serve.",
		}, lbl),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: actNS, Name: "rejected_total",
			Help: "Requests answered 503 by the activator: reason queue_full or queue_timeout.",
		}, append(lbl, "reason")),
		queueWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: actNS, Name: "queue_wait_seconds",
			Help:    "Time requests waited in the activator's queue for a free instance.",
			Buckets: []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, lbl),
		wakes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: actNS, Name: "wakes_total",
			Help: "Immediate decisions asked of the autoscaler for revisions with waiting requests.",
		}, lbl),
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: actNS, Name: "probes_total",
			Help: "Direct probes of sidecars, of new allocations and of instances taken out of balancing, by result (ready, not_ready, error).",
		}, []string{"revision", "result"}),
		probeReady: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: actNS, Name: "probe_ready_seconds",
			Help:    "Time from an allocation being seen Running to its first successful probe.",
			Buckets: []float64{.01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}),
		unknownHost: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: gwNS, Name: "unknown_host_total",
			Help: "Requests answered 404 because no service answers on their Host.",
		}),
		loadingRefused: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: gwNS, Name: "catalog_loading_refused_total",
			Help: "Requests answered 503 with Retry-After because the gateway could not route them and its catalog had not loaded within the hold (a starting replica with Nomad or Consul slow to answer).",
		}),
		redirects: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: gwNS, Name: "https_redirects_total",
			Help: "Plain HTTP requests answered 308 to HTTPS (services with https { redirect = true }, for names with a certificate).",
		}),
		panics: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: gwNS, Name: "panics_total",
			Help: "Panics recovered while serving a request (each is a bug; the process keeps serving).",
		}),
		rebuilds: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: gwNS, Name: "routing_table_rebuilds_total",
			Help: "Routing tables built from the catalog.",
		}),
		// How a rebuild's cost grows with the revision count (issue 45):
		// the scale run reads it.
		rebuildTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: gwNS, Name: "routing_table_rebuild_seconds",
			Help:    "Time to build one routing table from the catalog.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: actNS, Name: "demand_reports_total",
			Help: "Demand reports sent to the autoscaler, by result (ok, error).",
		}, []string{"result"}),
		// By service, not revision: a wake is rare per revision, and a
		// dashboard asks where a service's cold starts go.
		wakeSteps: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: actNS, Name: "wake_step_seconds",
			Help:    "Steps of the wakes from zero this replica held a request for: each step's time since the step before it in the wake's timeline (step: held, scale_written, evaluation_created, allocation_placed, allocation_seen, client_received, sidecar_task_started, app_task_started, sidecar_started, app_accepted, app_ready, probe_ready, request_sent, first_byte, consul_passing).",
			Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
		}, []string{"service", "step"}),
	}
	for _, c := range []prometheus.Collector{
		m.requests, m.duration, m.retries, m.notRetried, m.ejections, m.rejected, m.queueWait, m.wakes,
		m.probes, m.probeReady, m.unknownHost, m.loadingRefused, m.redirects, m.panics, m.rebuilds, m.rebuildTime, m.reports, m.wakeSteps,
		&stateCollector{g: g},
	} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) forRevision(service, revision string) *revisionMetrics {
	rm := &revisionMetrics{
		duration:        m.duration.WithLabelValues(service, revision),
		retries:         m.retries.WithLabelValues(service, revision),
		budgetDenied:    m.notRetried.WithLabelValues(service, revision, "budget"),
		triesExhausted:  m.notRetried.WithLabelValues(service, revision, "tries"),
		ejections:       m.ejections.WithLabelValues(service, revision),
		rejectedFull:    m.rejected.WithLabelValues(service, revision, "queue_full"),
		rejectedTimeout: m.rejected.WithLabelValues(service, revision, "queue_timeout"),
		queueWait:       m.queueWait.WithLabelValues(service, revision),
		wakes:           m.wakes.WithLabelValues(service, revision),
	}
	for i, c := range codeClasses {
		rm.codes[i] = m.requests.WithLabelValues(service, revision, c)
	}
	return rm
}

// forget drops a removed revision's series.
func (m *metrics) forget(service, revision string) {
	l := prometheus.Labels{"service": service, "revision": revision}
	m.requests.DeletePartialMatch(l)
	m.duration.DeletePartialMatch(l)
	m.retries.DeletePartialMatch(l)
	m.notRetried.DeletePartialMatch(l)
	m.ejections.DeletePartialMatch(l)
	m.rejected.DeletePartialMatch(l)
	m.queueWait.DeletePartialMatch(l)
	m.wakes.DeletePartialMatch(l)
	m.probes.DeletePartialMatch(prometheus.Labels{"revision": revision})
}

// observeWake adds a wake's steps to the histogram: each step's time since
// the one before it (the first step has none).
func (m *metrics) observeWake(t spec.WakeTimeline) {
	for i, st := range t.Steps {
		if i > 0 {
			m.wakeSteps.WithLabelValues(t.Service, string(st.Step)).Observe(st.Delta.Seconds())
		}
	}
}

// codeIndex maps a status code to its class in codeClasses.
func codeIndex(status int) int {
	if status < 100 || status > 599 {
		return 0
	}
	return status / 100
}

// stateCollector reports the per-revision gauges straight from the current
// table's atomics at scrape time, so requests never update a gauge. A
// revision at rest (no instance, nothing queued or in flight) has none.
type stateCollector struct{ g *Gateway }

var (
	descQueued = prometheus.NewDesc(actNS+"_queued",
		"Requests waiting in the activator's queue for a free instance.", []string{"service", "revision"}, nil)
	descInFlight = prometheus.NewDesc(actNS+"_in_flight",
		"Requests being proxied to the revision's instances by this replica.", []string{"service", "revision"}, nil)
	descInPath = prometheus.NewDesc(actNS+"_in_path",
		"1 while the activator is in the revision's request path (no instance, or spare capacity below the burst capacity).", []string{"service", "revision"}, nil)
	descRoutable = prometheus.NewDesc(gwNS+"_routable_instances",
		"Instances of the revision the gateway sends requests to.", []string{"service", "revision"}, nil)
)

func (c *stateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descQueued
	ch <- descInFlight
	ch <- descInPath
	ch <- descRoutable
}

func (c *stateCollector) Collect(ch chan<- prometheus.Metric) {
	t := c.g.table.Load()
	if t == nil {
		return
	}
	for _, r := range t.revisions {
		p := r.pool.Load()
		queued, inflight := max(r.queued.Load(), 0), r.inflight.Load()
		if queued == 0 && inflight == 0 && len(p.backends) == 0 {
			// At rest at zero: four series that say nothing. At 10,000
			// revisions they were 40,000 series per replica on every
			// scrape (issue 45); the autoscaler's count series says a
			// revision is at zero.
			continue
		}
		inPath := 0.0
		if r.inPath(p) {
			inPath = 1
		}
		ch <- prometheus.MustNewConstMetric(descQueued, prometheus.GaugeValue, float64(queued), r.service, r.name)
		ch <- prometheus.MustNewConstMetric(descInFlight, prometheus.GaugeValue, float64(inflight), r.service, r.name)
		ch <- prometheus.MustNewConstMetric(descInPath, prometheus.GaugeValue, inPath, r.service, r.name)
		ch <- prometheus.MustNewConstMetric(descRoutable, prometheus.GaugeValue, float64(len(p.backends)), r.service, r.name)
	}
}
