package controlplane

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/canary"
)

// rolloutMetrics are the rollout driver's nomad_serverless_rollout_*
// series, labelled by service (a handful per service, not per revision
// or per step). Its methods do nothing on a nil receiver, for tests that
// need no registry.
type rolloutMetrics struct {
	active    *prometheus.GaugeVec
	percent   *prometheus.GaugeVec
	startedN  *prometheus.CounterVec
	judgments *prometheus.CounterVec
	ends      *prometheus.CounterVec
}

func newRolloutMetrics(reg prometheus.Registerer) (*rolloutMetrics, error) {
	m := &rolloutMetrics{
		active: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nomad_serverless_rollout_active",
			Help: "1 while a rollout of the service is driven by this replica (the leader), else 0.",
		}, []string{"service"}),
		percent: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "nomad_serverless_rollout_step_percent",
			Help: "The step the service's rollout holds: the new revision's percentage of the latest targets' share (0 before the first step or after a rollback, 100 once completed).",
		}, []string{"service"}),
		startedN: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nomad_serverless_rollout_started_total",
			Help: "Rollouts this replica started as leader.",
		}, []string{"service"}),
		judgments: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nomad_serverless_rollout_judgments_total",
			Help: "Judgments of rollout steps, by verdict: pass, fail, wait (too few requests) or unjudged (passed after the quiet limit).",
		}, []string{"service", "verdict"}),
		ends: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "nomad_serverless_rollout_ends_total",
			Help: "Rollouts that ended, by how: completed, rolled_back (a step failed or the wake timed out) or stopped (a person took the route over).",
		}, []string{"service", "end"}),
	}
	for _, c := range []prometheus.Collector{m.active, m.percent, m.startedN, m.judgments, m.ends} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *rolloutMetrics) started(service string) {
	if m == nil {
		return
	}
	m.startedN.WithLabelValues(service).Inc()
	m.active.WithLabelValues(service).Set(1)
	m.percent.WithLabelValues(service).Set(0)
}

// observe counts an event of the service's rollout in state st.
func (m *rolloutMetrics) observe(service string, st canary.State, ev canary.Event) {
	if m == nil {
		return
	}
	switch ev.Kind {
	case canary.EventStepStarted, canary.EventResumed:
		m.active.WithLabelValues(service).Set(1)
		m.percent.WithLabelValues(service).Set(float64(ev.Percent))
	case canary.EventJudged:
		m.judgments.WithLabelValues(service, string(ev.Judgment.Verdict)).Inc()
	case canary.EventCompleted:
		m.end(service, "completed", 100)
	case canary.EventRolledBack:
		m.end(service, "rolled_back", 0)
	case canary.EventStopped:
		m.active.WithLabelValues(service).Set(0)
		m.ends.WithLabelValues(service, "stopped").Inc()
	}
}

func (m *rolloutMetrics) end(service, how string, percent float64) {
	m.active.WithLabelValues(service).Set(0)
	m.percent.WithLabelValues(service).Set(percent)
	m.ends.WithLabelValues(service, how).Inc()
}
