package autoscaler

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/canary"
)

func measured(requests, errs uint64, lat time.Duration) *canary.Measurement {
	m := &canary.Measurement{Requests: requests, Errors: errs}
	for range requests {
		m.Latency.Observe(lat)
	}
	return m
}

// The leader sums every replica's deltas per revision until the rollout
// driver takes them, then starts again; other replicas sum nothing.
func TestMeasurementsAreSummedUntilTaken(t *testing.T) {
	a, _, _, _, _ := newTestAutoscaler(t, nil)
	if _, err := a.TakeMeasurements(); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("TakeMeasurements before Run: err = %v, want ErrNotLeader", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 5*time.Second, "the autoscaler to lead", a.Leading)

	ctxR := context.Background()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(a.ReportDemand(ctxR, "gw-1", []Demand{{Revision: "hello-00002", Measured: measured(10, 3, 20*time.Millisecond)}}))
	must(a.ReportDemand(ctxR, "gw-2", []Demand{{Revision: "hello-00002", Measured: measured(5, 0, 20*time.Millisecond)},
		{Revision: "hello-00001", InFlight: 2, Measured: measured(90, 0, 10*time.Millisecond)}}))
	// A replica's next report adds its new deltas; it does not replace.
	must(a.ReportDemand(ctxR, "gw-1", []Demand{{Revision: "hello-00002", Measured: measured(1, 1, 20*time.Millisecond)}}))

	got, err := a.TakeMeasurements()
	must(err)
	if n := got["hello-00002"]; n.Requests != 16 || n.Errors != 4 || n.Latency.Count() != 16 {
		t.Errorf("hello-00002: %d requests, %d errors, %d timed; want 16, 4, 16", n.Requests, n.Errors, n.Latency.Count())
	}
	if p := got["hello-00001"]; p.Requests != 90 || p.Errors != 0 {
		t.Errorf("hello-00001: %d requests, %d errors; want 90, 0", p.Requests, p.Errors)
	}
	again, err := a.TakeMeasurements()
	must(err)
	if len(again) != 0 {
		t.Errorf("a second take got %v: the sums must start again", again)
	}
}

func TestReportWithImpossibleMeasurementIsRefused(t *testing.T) {
	a, _, _, _, _ := newTestAutoscaler(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, 5*time.Second, "the autoscaler to lead", a.Leading)
	bad := &canary.Measurement{Requests: 1, Errors: 2}
	if err := a.ReportDemand(context.Background(), "gw-1", []Demand{{Revision: "hello-00002", Measured: bad}}); err == nil {
		t.Fatal("a report with more errors than requests was taken")
	}
	got, _ := a.TakeMeasurements()
	if len(got) != 0 {
		t.Errorf("a refused report was summed: %v", got)
	}
}
