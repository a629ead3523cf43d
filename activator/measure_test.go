package activator

import (
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
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

// Requests through the gateway reach the leader as measurements on the
// demand reports: the app's 5xx counted as errors, then nothing more once
// the growth was sent.
func TestGatewayReportsMeasurements(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fail") != "" {
			w.WriteHeader(http.StatusInternalServerError)
		}
		io.WriteString(w, "ok")
	})
	cat.SetAllocation(sc.allocation("hello-00001", "a1", true))
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	as := &fakeAutoscaler{}
	tg := startGateway(t, cat, as, nil)
	for i := range 10 {
		path := "/"
		if i < 3 {
			path = "/?fail=1"
		}
		tg.get(t, "hello.default.localhost", path, nil)
	}
	sum := func() (req, errs, timed uint64) {
		as.mu.Lock()
		defer as.mu.Unlock()
		for _, r := range as.reports {
			for _, d := range r {
				if d.Revision == "hello-00001" && d.Measured != nil {
					req, errs, timed = req+d.Measured.Requests, errs+d.Measured.Errors, timed+d.Measured.Latency.Count()
				}
			}
		}
		return
	}
	waitFor(t, "the measurements in a demand report", func() bool { r, _, _ := sum(); return r >= 10 })
	// Two more report periods: the growth was sent once, not again.
	time.Sleep(2*demandInterval + 200*time.Millisecond)
	if req, errs, timed := sum(); req != 10 || errs != 3 || timed != 10 {
		t.Errorf("reports summed to %d requests, %d errors, %d timed; want 10, 3, 10", req, errs, timed)
	}
}
