package certs

import (
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	orders  *prometheus.CounterVec
	refused prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	mt := &metrics{
		orders: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nomad_serverless_tls_acme_orders_total",
			Help: "ACME orders this replica finished, by kind (obtain: a name's first certificate; renew) and result (ok, error). An error is retried with backoff; a certificate still valid keeps being served.",
		}, []string{"kind", "result"}),
		refused: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "nomad_serverless_tls_handshakes_refused_total",
			Help: "TLS handshakes refused (alert unrecognized_name) because no certificate covers the server name asked for: a name not routed, or routed and without a certificate yet.",
		}),
	}
	names := namesCollector{m: m,
		names: prometheus.NewDesc("nomad_serverless_tls_names",
			"Names the gateway routes, by the source of their certificate (file, consul, acme, or none) and its state (valid, expired, not yet valid, ordering, none).",
			[]string{"source", "state"}, nil),
		expiry: prometheus.NewDesc("nomad_serverless_tls_certificate_expiry_timestamp_seconds",
			"The earliest expiry (Unix time) among the certificates served for routed names, by source.",
			[]string{"source"}, nil),
		failing: prometheus.NewDesc("nomad_serverless_tls_acme_failing_names",
			"Routed names whose last ACME order or renewal on this replica failed (and has not succeeded since).",
			nil, nil),
	}
	for _, c := range []prometheus.Collector{mt.orders, mt.refused, names} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	// Both results exist from the start, so a rate over them is defined
	// before the first order.
	for _, kind := range []string{"obtain", "renew"} {
		for _, result := range []string{"ok", "error"} {
			mt.orders.WithLabelValues(kind, result)
		}
	}
	return mt, nil
}

// namesCollector reports the names' states at each scrape, from Status.
type namesCollector struct {
	m                      *Manager
	names, expiry, failing *prometheus.Desc
}

func (c namesCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.names
	ch <- c.expiry
	ch <- c.failing
}

func (c namesCollector) Collect(ch chan<- prometheus.Metric) {
	type key struct{ source, state string }
	counts := map[key]int{}
	expiry := map[Source]float64{}
	failing := 0
	for _, s := range c.m.Status() {
		src := string(s.Source)
		if src == "" {
			src = "none"
		}
		counts[key{src, s.State}]++
		if !s.NotAfter.IsZero() {
			t := float64(s.NotAfter.Unix())
			if e, ok := expiry[s.Source]; !ok || t < e {
				expiry[s.Source] = t
			}
		}
		if s.LastError != "" {
			failing++
		}
	}
	for k, n := range counts {
		ch <- prometheus.MustNewConstMetric(c.names, prometheus.GaugeValue, float64(n), k.source, k.state)
	}
	for src, t := range expiry {
		ch <- prometheus.MustNewConstMetric(c.expiry, prometheus.GaugeValue, t, string(src))
	}
	ch <- prometheus.MustNewConstMetric(c.failing, prometheus.GaugeValue, float64(failing))
}
