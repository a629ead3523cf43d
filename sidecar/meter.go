package sidecar

import (
	"sync"
	"sync/atomic"
	"time"
)

// The meter's word packs the number of requests in flight with a running
// sum of microsecond timestamps (mod 2^meterSumBits).
const (
	meterSumBits  = 44
	meterSumMask  = 1<<meterSumBits - 1
	meterMaxCount = 1<<(64-meterSumBits) - 1 // 1,048,575 requests in flight
)

// meter counts requests and integrates concurrency over time, exactly and
// without a lock on the request path.
//
// The time integral of concurrency up to t is I(t) = n·t + L, where n is
// the number of requests in flight and L = Σ(−start) over every request
// that began plus Σ(end) over every one that finished. So each request
// changes (n, L) twice: (+1, −start) when it begins, (−1, +end) when it
// ends. The pair must be read consistently — n with a stale L is off by a
// whole timestamp — so both live in one 64-bit word updated by
// compare-and-swap: n in the top 20 bits, L modulo 2^44 µs in the rest.
// Modular arithmetic is enough because a scrape only needs the increase of I
// since the previous scrape, which is exact as long as it stays below
// 2^44 µs of request-time per interval (an average concurrency of 200 over a
// whole day between scrapes). Requests beyond 2^20−1 in flight are counted
// but left out of the integral.
//
// The scrape side (report) takes a mutex: it runs every couple of seconds,
// never on the request path.
type meter struct {
	origin   time.Time
	word     atomic.Uint64
	arrivals atomic.Uint64

	mu           sync.Mutex // guards the fields below (scrape side only)
	lastAt       time.Time
	lastIntegral uint64
	lastArrivals uint64
}

func newMeter(now time.Time) *meter {
	return &meter{origin: now, lastAt: now}
}

// micros is t in µs since origin, modulo 2^44; t.Sub uses the monotonic
// clock.
func (m *meter) micros(t time.Time) uint64 {
	return uint64(t.Sub(m.origin)/time.Microsecond) & meterSumMask
}

// begin records a request arriving at now. It returns false when the
// request is not part of the integral (too many in flight); end must then
// not be called for it.
func (m *meter) begin(now time.Time) bool {
	m.arrivals.Add(1)
	s := m.micros(now)
	for {
		old := m.word.Load()
		n := old >> meterSumBits
		if n == meterMaxCount {
			return false
		}
		w := (n+1)<<meterSumBits | (old-s)&meterSumMask
		if m.word.CompareAndSwap(old, w) {
			return true
		}
	}
}

// end records a request begun with begin finishing at now.
func (m *meter) end(now time.Time) {
	e := m.micros(now)
	for {
		old := m.word.Load()
		n := old >> meterSumBits
		w := (n-1)<<meterSumBits | (old+e)&meterSumMask
		if m.word.CompareAndSwap(old, w) {
			return
		}
	}
}

// inFlight is the number of requests begun and not ended.
func (m *meter) inFlight() int { return int(m.word.Load() >> meterSumBits) }

// requests is the number of requests ever begun.
func (m *meter) requests() uint64 { return m.arrivals.Load() }

// window is what happened between two reports.
type window struct {
	Interval           time.Duration
	AverageConcurrency float64
	Requests           uint64
	InFlight           int
}

// report returns the window since the previous report (or since the meter
// was made) and starts a new one at now.
func (m *meter) report(now time.Time) window {
	m.mu.Lock()
	defer m.mu.Unlock()
	w := m.word.Load()
	n := w >> meterSumBits
	integral := (n*m.micros(now) + w) & meterSumMask
	arrivals := m.arrivals.Load()

	out := window{
		Interval: now.Sub(m.lastAt),
		Requests: arrivals - m.lastArrivals,
		InFlight: int(n),
	}
	delta := (integral - m.lastIntegral) & meterSumMask
	if delta >= 1<<(meterSumBits-1) {
		// Negative: a request stamped a moment after now, with (almost)
		// nothing else in the window. Report 0 and keep the old base, so
		// the next window's increase is exact.
		delta = 0
	} else {
		m.lastIntegral = integral
	}
	if us := out.Interval.Microseconds(); us > 0 {
		out.AverageConcurrency = float64(delta) / float64(us)
	}
	m.lastAt, m.lastArrivals = now, arrivals
	return out
}
