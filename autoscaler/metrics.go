package autoscaler

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// metricsCollector exports the published per-revision state as Prometheus
// metrics, built at scrape time from what the loop already keeps. A GaugeVec
// child per revision and gauge would cost hundreds of bytes each and blow the
// memory budget of 10,000 idle revisions; const metrics cost nothing between
// scrapes.
type metricsCollector struct {
	a *Autoscaler

	desired, actual, count              *prometheus.Desc
	stableConc, panicConc               *prometheus.Desc
	stableRPS, panicRPS                 *prometheus.Desc
	stableCPU, panicCPU                 *prometheus.Desc
	stableMemory, panicMemory           *prometheus.Desc
	target, panicMode, ebc              *prometheus.Desc
	scaleCalls, scaleFails, scrapeFails *prometheus.Desc
	leader                              *prometheus.Desc
}

func newMetricsCollector(a *Autoscaler) *metricsCollector {
	labels := []string{"service", "revision"}
	d := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc("nomad_serverless_autoscaler_"+name, help, labels, nil)
	}
	return &metricsCollector{
		a:            a,
		desired:      d("desired_instances", "Instances the autoscaler wants for the revision."),
		actual:       d("actual_instances", "Ready instances of the revision."),
		count:        d("nomad_count_instances", "The revision job's group count in Nomad."),
		stableConc:   d("stable_concurrency", "Requests in flight over the stable window (revision total), for revisions scaled on concurrency."),
		panicConc:    d("panic_concurrency", "Requests in flight over the panic window (revision total), for revisions scaled on concurrency."),
		stableRPS:    d("stable_rps", "Requests per second over the stable window (revision total), for revisions scaled on RPS."),
		panicRPS:     d("panic_rps", "Requests per second over the panic window (revision total), for revisions scaled on RPS."),
		stableCPU:    d("stable_cpu_percent", "CPU use of the serving task as a percentage of its reservation over the stable window, summed over the ready instances (two at 60% read 120), for revisions scaled on cpu."),
		panicCPU:     d("panic_cpu_percent", "CPU use of the serving task as a percentage of its reservation over the panic window, summed over the ready instances, for revisions scaled on cpu."),
		stableMemory: d("stable_memory_percent", "Memory use of the serving task as a percentage of its reservation over the stable window, summed over the ready instances, for revisions scaled on memory."),
		panicMemory:  d("panic_memory_percent", "Memory use of the serving task as a percentage of its reservation over the panic window, summed over the ready instances, for revisions scaled on memory."),
		target:       d("target_per_instance", "Per-instance target: target x utilization, or for cpu and memory the target percentage itself."),
		panicMode:    d("panic_mode", "1 while the revision's decider is in panic mode."),
		ebc:          d("excess_burst_capacity", "Spare capacity beyond the target burst capacity; negative keeps the activator in the path."),
		scaleCalls:   d("scale_calls_total", "Scale calls made for the revision by this leader."),
		scaleFails:   d("scale_failures_total", "Scale calls for the revision that failed."),
		scrapeFails:  d("scrape_failures_total", "Sidecar stats scrapes for the revision that failed (instance unknown for a tick)."),
		leader:       prometheus.NewDesc("nomad_serverless_autoscaler_leader", "1 when this replica runs the autoscaler.", nil, nil),
	}
}

// Describe implements prometheus.Collector.
func (m *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.desired, m.actual, m.count, m.stableConc, m.panicConc, m.stableRPS, m.panicRPS,
		m.stableCPU, m.panicCPU, m.stableMemory, m.panicMemory, m.target, m.panicMode, m.ebc, m.scaleCalls, m.scaleFails, m.scrapeFails, m.leader} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (m *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	leading := 0.0
	if m.a.Leading() {
		leading = 1
	}
	ch <- prometheus.MustNewConstMetric(m.leader, prometheus.GaugeValue, leading)
	pub := m.a.published.Load()
	if pub == nil {
		return
	}
	for _, sh := range *pub {
		sh.mu.Lock()
		d, decided := sh.dec, !sh.decided.IsZero()
		svc, rev := sh.service, sh.revision
		calls, fails, scrapes := sh.scaleCalls, sh.scaleFailures, sh.scrapeFailures
		sh.mu.Unlock()
		if !decided {
			continue
		}
		g := func(desc *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, svc, rev)
		}
		c := func(desc *prometheus.Desc, v uint64) {
			ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, float64(v), svc, rev)
		}
		g(m.count, float64(d.Count))
		if atRest(d) {
			// A revision at rest at zero has only its count, which the
			// at-zero recording rule reads: its other ten series say
			// nothing (all zero, or the target), and at 10,000
			// revisions they were 100,000 series, 465 ms of the
			// leader's CPU per scrape (BenchmarkScaleScrape, issue 45).
			continue
		}
		g(m.desired, float64(d.Desired))
		g(m.actual, float64(d.Ready))
		switch d.Metric {
		case spec.MetricRPS:
			g(m.stableRPS, d.Stable)
			g(m.panicRPS, d.Panic)
		case spec.MetricCPU:
			g(m.stableCPU, d.Stable)
			g(m.panicCPU, d.Panic)
		case spec.MetricMemory:
			g(m.stableMemory, d.Stable)
			g(m.panicMemory, d.Panic)
		default:
			g(m.stableConc, d.Stable)
			g(m.panicConc, d.Panic)
		}
		g(m.target, d.Target)
		pm := 0.0
		if d.PanicMode {
			pm = 1
		}
		g(m.panicMode, pm)
		g(m.ebc, d.ExcessBurstCapacity)
		c(m.scaleCalls, calls)
		c(m.scaleFails, fails)
		c(m.scrapeFails, scrapes)
	}
}

// atRest reports whether a decision is that of a revision at rest at zero:
// nothing running, wanted, held or measured.
func atRest(d Decision) bool {
	return d.Count == 0 && d.Desired == 0 && d.Ready == 0 && d.Queued == 0 &&
		d.Stable == 0 && d.Panic == 0 && !d.PanicMode
}
