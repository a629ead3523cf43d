package activator

import (
	"sync"
	"testing"
	"time"
)

func TestMeasureSendsGrowthSinceTheLastReportThatArrived(t *testing.T) {
	var m measure
	for _, st := range []int{200, 200, 500, 502, 503, 504, 404, 0} {
		m.observe(st, 3*time.Millisecond)
	}
	d, sent := m.delta()
	if d == nil || d.Requests != 7 || d.Errors != 4 || d.Latency.Count() != 7 {
		t.Fatalf("delta = %+v: want 7 requests (the one without an answer is not counted), 4 errors (500 and the gateway's 502/503/504), 7 timed", d)
	}
	// The report did not reach the leader: the next delta still holds it.
	m.observe(200, time.Millisecond)
	d, sent = m.delta()
	if d.Requests != 8 || d.Errors != 4 {
		t.Fatalf("after a lost report: delta = %d requests %d errors, want 8 and 4", d.Requests, d.Errors)
	}
	m.sent = sent
	if d, _ := m.delta(); d != nil {
		t.Fatalf("nothing ended since the report arrived, yet delta = %+v", d)
	}
	m.observe(500, time.Second)
	d, _ = m.delta()
	if d.Requests != 1 || d.Errors != 1 || d.Latency.Quantile(0.99) < 800*time.Millisecond {
		t.Fatalf("delta = %d requests %d errors p99 %s, want 1, 1, about 1s", d.Requests, d.Errors, d.Latency.Quantile(0.99))
	}
}

// Deltas taken while requests end never hold more errors or latencies
// than requests, and add up to every request once.
func TestMeasureDeltasStayValidUnderConcurrency(t *testing.T) {
	var m measure
	var wg sync.WaitGroup
	const workers, each = 4, 2000
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				st := 200
				if (i+w)%3 == 0 {
					st = 500
				}
				m.observe(st, time.Duration(i)*time.Microsecond)
			}
		}()
	}
	var reqs, errs, timed uint64
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	take := func() {
		d, sent := m.delta()
		if d == nil {
			return
		}
		if d.Errors > d.Requests || d.Latency.Count() > d.Requests {
			t.Fatalf("invalid delta: %d requests, %d errors, %d timed", d.Requests, d.Errors, d.Latency.Count())
		}
		reqs, errs, timed = reqs+d.Requests, errs+d.Errors, timed+d.Latency.Count()
		m.sent = sent
	}
	for loop := true; loop; {
		select {
		case <-done:
			loop = false
		default:
			take()
		}
	}
	take()
	take()
	if reqs != workers*each || timed != workers*each {
		t.Errorf("deltas add up to %d requests, %d timed; want %d", reqs, timed, workers*each)
	}
	if want := m.errors.Load(); errs != want {
		t.Errorf("deltas add up to %d errors, want %d", errs, want)
	}
}
