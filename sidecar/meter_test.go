package sidecar

import (
	"math"
	"sync"
	"testing"
	"time"
)

func TestMeterAverageConcurrency(t *testing.T) {
	t0 := time.Now()
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type ev struct {
		at    int
		begin bool
	}
	for _, c := range []struct {
		name     string
		events   []ev
		reportAt int
		want     float64
		requests uint64
		inFlight int
	}{
		{"idle", nil, 1000, 0, 0, 0},
		{"one request for half the window", []ev{{100, true}, {600, false}}, 1000, 0.5, 1, 0},
		{"two overlapping", []ev{{0, true}, {0, true}, {500, false}, {1000, false}}, 1000, 1.5, 2, 0},
		{"still in flight at the report", []ev{{250, true}}, 1000, 0.75, 1, 1},
		{"short requests back to back", []ev{{0, true}, {100, false}, {100, true}, {200, false}, {200, true}, {300, false}}, 1000, 0.3, 3, 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			m := newMeter(t0)
			for _, e := range c.events {
				if e.begin {
					m.begin(ms(e.at))
				} else {
					m.end(ms(e.at))
				}
			}
			w := m.report(ms(c.reportAt))
			if math.Abs(w.AverageConcurrency-c.want) > 1e-3 || w.Requests != c.requests || w.InFlight != c.inFlight {
				t.Fatalf("got %+v, want avg %.3f requests %d in flight %d", w, c.want, c.requests, c.inFlight)
			}
		})
	}
}

// A request spanning reports is split between their windows.
func TestMeterWindowsSplitLongRequests(t *testing.T) {
	t0 := time.Now()
	m := newMeter(t0)
	m.begin(t0.Add(500 * time.Millisecond))
	w1 := m.report(t0.Add(time.Second))
	w2 := m.report(t0.Add(2 * time.Second))
	m.end(t0.Add(2500 * time.Millisecond))
	w3 := m.report(t0.Add(3 * time.Second))
	for i, c := range []struct {
		w    window
		avg  float64
		reqs uint64
	}{{w1, 0.5, 1}, {w2, 1, 0}, {w3, 0.5, 0}} {
		if math.Abs(c.w.AverageConcurrency-c.avg) > 1e-3 || c.w.Requests != c.reqs {
			t.Fatalf("window %d: %+v, want avg %.1f requests %d", i+1, c.w, c.avg, c.reqs)
		}
	}
}

// The modular sum stays exact across the 2^44 µs wrap (about 203 days of
// timestamps).
func TestMeterWrap(t *testing.T) {
	t0 := time.Now()
	m := newMeter(t0)
	near := t0.Add(time.Duration(meterSumMask-500_000) * time.Microsecond) // 0.5 s before the wrap
	m.report(near)
	m.begin(near.Add(100 * time.Millisecond))
	m.begin(near.Add(100 * time.Millisecond))
	m.end(near.Add(900 * time.Millisecond)) // after the wrap
	w := m.report(near.Add(time.Second))
	// Two requests: one for 0.9 s, one for 0.8 s so far... the first ends
	// at 0.9 s (0.8 s long), the second is still in flight (0.9 s).
	if math.Abs(w.AverageConcurrency-1.7) > 1e-3 || w.InFlight != 1 {
		t.Fatalf("across the wrap: %+v, want avg 1.7, 1 in flight", w)
	}
}

// A request stamped just after the report's now must not turn into a huge
// average.
func TestMeterSkewedStamp(t *testing.T) {
	t0 := time.Now()
	m := newMeter(t0)
	m.report(t0.Add(time.Second))
	m.begin(t0.Add(2*time.Second + time.Millisecond))
	w := m.report(t0.Add(2 * time.Second))
	if w.AverageConcurrency != 0 {
		t.Fatalf("skewed stamp gave average %v", w.AverageConcurrency)
	}
	w = m.report(t0.Add(3 * time.Second))
	if math.Abs(w.AverageConcurrency-0.999) > 1e-3 {
		t.Fatalf("next window: %v, want 0.999", w.AverageConcurrency)
	}
}

// Concurrent begin/end from many goroutines keep the pair consistent.
func TestMeterConcurrent(t *testing.T) {
	t0 := time.Now()
	m := newMeter(t0)
	var wg sync.WaitGroup
	const workers, each = 8, 2000
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				// Every request lasts exactly 1 ms in the meter's clock.
				at := t0.Add(time.Duration(i) * time.Millisecond)
				m.begin(at)
				m.end(at.Add(time.Millisecond))
			}
		}()
	}
	wg.Wait()
	w := m.report(t0.Add(each * time.Millisecond))
	// workers×each requests of 1 ms over each ms: average = workers.
	if math.Abs(w.AverageConcurrency-workers) > 1e-3 || w.Requests != workers*each || w.InFlight != 0 {
		t.Fatalf("got %+v, want average %d", w, workers)
	}
}
