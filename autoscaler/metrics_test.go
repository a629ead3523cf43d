package autoscaler

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// gather renders the registry's nomad_serverless_autoscaler_* series as
// sorted "name{revision} value" lines.
func gather(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			continue // the tick's time (TestTickTimeObserved)
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, lp := range m.GetLabel() {
				labels = append(labels, lp.GetName()+"="+lp.GetValue())
			}
			v := m.GetGauge().GetValue()
			if m.GetCounter() != nil {
				v = m.GetCounter().GetValue()
			}
			out = append(out, fmt.Sprintf("%s{%s} %g", strings.TrimPrefix(mf.GetName(), "nomad_serverless_autoscaler_"), strings.Join(labels, ","), v))
		}
	}
	sort.Strings(out)
	return out
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	res := newFakeResources()
	a, cat, scr, _, clk := newTestAutoscaler(t, func(c *Config) { c.Registerer, c.Resources = reg, res })
	cat.SetRevision(testRevision("hello-00001", 1, nil))
	cat.SetReady("hello-00001", instances("hello-00001", 1))
	scr.set("hello-00001-i0", 150)
	cat.SetRevision(testRevision("api-00003", 0, func(s *spec.Scaling) { s.Metric = spec.MetricRPS; s.Target = 200 }))
	cat.SetRevision(testRevision("burn-00001", 1, func(s *spec.Scaling) { s.Metric, s.Target, s.Min = spec.MetricCPU, 50, 1 }))
	burn, allocs := nomadInstances("burn-00001", 1)
	cat.SetReady("burn-00001", burn)
	res.set(allocs[0], 40)

	if got := gather(t, reg); strings.Join(got, "\n") != "leader{} 0" {
		t.Fatalf("before leading: %q, want only leader 0", got)
	}

	l := startLoop(t, a)
	tickN(context.Background(), l, clk, 1, 2*time.Second)
	// api-00003 is at rest at zero: only its count (issue 45).
	want := []string{
		"actual_instances{revision=burn-00001,service=burn} 1",
		"actual_instances{revision=hello-00001,service=hello} 1",
		"desired_instances{revision=burn-00001,service=burn} 1",
		"desired_instances{revision=hello-00001,service=hello} 3",
		"excess_burst_capacity{revision=burn-00001,service=burn} 0",
		"excess_burst_capacity{revision=hello-00001,service=hello} -261",
		"leader{} 1",
		"nomad_count_instances{revision=api-00003,service=api} 0",
		"nomad_count_instances{revision=burn-00001,service=burn} 1",
		"nomad_count_instances{revision=hello-00001,service=hello} 1",
		"panic_concurrency{revision=hello-00001,service=hello} 150",
		"panic_cpu_percent{revision=burn-00001,service=burn} 40",
		"panic_mode{revision=burn-00001,service=burn} 0",
		"panic_mode{revision=hello-00001,service=hello} 1",
		"scale_calls_total{revision=burn-00001,service=burn} 0",
		"scale_calls_total{revision=hello-00001,service=hello} 1",
		"scale_failures_total{revision=burn-00001,service=burn} 0",
		"scale_failures_total{revision=hello-00001,service=hello} 0",
		"scrape_failures_total{revision=burn-00001,service=burn} 0",
		"scrape_failures_total{revision=hello-00001,service=hello} 0",
		"stable_concurrency{revision=hello-00001,service=hello} 150",
		"stable_cpu_percent{revision=burn-00001,service=burn} 40",
		"target_per_instance{revision=burn-00001,service=burn} 50",
		"target_per_instance{revision=hello-00001,service=hello} 70",
	}
	if got := gather(t, reg); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("metrics:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	// A second autoscaler on the same registry is refused with a clear error.
	if _, err := New(Config{Revisions: cat, Scaler: &recordingScaler{}, Registerer: reg}); err == nil || !strings.Contains(err.Error(), "register metrics") {
		t.Errorf("second registration: %v", err)
	}
}

// Each periodic tick's time is observed (issue 45: the scale run reads
// it on the leader).
func TestTickTimeObserved(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, cat, _, _, _ := newTestAutoscaler(t, func(c *Config) { c.Registerer, c.Tick = reg, 5*time.Millisecond })
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "nomad_serverless_autoscaler_tick_seconds" && mf.GetMetric()[0].GetHistogram().GetSampleCount() >= 2 {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("no two ticks observed in nomad_serverless_autoscaler_tick_seconds within 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
