package autoscaler

import (
	"math"
	"time"
)

// window averages one revision's samples (the revision's total concurrency
// or RPS, one sample per scrape) over the stable window and, from the newest
// buckets of the same ring, over the panic window — Knative's timed float
// buckets, with two differences that matter here:
//
//   - a bucket that received no sample (every scrape failed, or the tick was
//     late) is left out of the average instead of counting as zero, so
//     missing metrics never look like an idle revision;
//   - several samples landing in one bucket (a wake's extra decision between
//     ticks) are averaged, not added, so an extra scrape does not inflate
//     demand.
//
// One ring serves both windows, so an idle revision costs one small slice;
// record and average allocate nothing. Not safe for concurrent use: the
// autoscaler's loop owns every window.
type window struct {
	buckets     []bucket
	granularity int64 // nanoseconds per bucket
	// newest is the absolute index (unix nanoseconds / granularity) of the
	// newest bucket the ring holds; buckets older than newest-len(buckets)
	// have been overwritten. valid is false until the first sample.
	newest int64
	valid  bool
}

// bucket holds the mean of the samples that fell into it (so the window
// needs no division per bucket when averaging) and how many there were.
type bucket struct {
	mean float64
	n    uint32
}

// newWindow returns a window of span split into buckets of granularity (the
// autoscaler's tick). Both must be positive.
func newWindow(span, granularity time.Duration) window {
	return window{
		buckets:     make([]bucket, bucketsFor(span, granularity)),
		granularity: int64(granularity),
	}
}

// bucketsFor is how many buckets of granularity cover span (at least one).
func bucketsFor(span, granularity time.Duration) int {
	n := int((span + granularity - 1) / granularity)
	return max(n, 1)
}

func (w *window) index(t time.Time) int64 {
	return floorDiv(t.UnixNano(), w.granularity)
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func (w *window) slot(idx int64) *bucket {
	n := int64(len(w.buckets))
	return &w.buckets[((idx%n)+n)%n]
}

// record adds a sample taken at t. Samples older than the ring are dropped.
func (w *window) record(t time.Time, v float64) {
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		return
	}
	idx := w.index(t)
	n := int64(len(w.buckets))
	switch {
	case !w.valid:
		clear(w.buckets)
		w.newest, w.valid = idx, true
	case idx > w.newest:
		// Clear the buckets between the newest and this one: they belong
		// to an older lap of the ring.
		for i := w.newest + 1; i <= idx && i <= w.newest+n; i++ {
			*w.slot(i) = bucket{}
		}
		w.newest = idx
	case idx <= w.newest-n:
		return
	}
	b := w.slot(idx)
	b.n++
	b.mean += (v - b.mean) / float64(b.n)
}

// average is the mean of the samples in the last span buckets ending at now's
// bucket; ok is false when none of those buckets holds a sample. Each
// bucket weighs as one sample (its mean).
func (w *window) average(now time.Time, span int) (avg float64, ok bool) {
	if !w.valid {
		return 0, false
	}
	n := int64(len(w.buckets))
	nowIdx := w.index(now)
	hi := min(nowIdx, w.newest)
	lo := max(nowIdx-int64(span)+1, w.newest-n+1)
	if lo > hi {
		return 0, false
	}
	// Walk the ring from lo's slot without a modulo per bucket.
	pos := int(((lo % n) + n) % n)
	var sum float64
	cnt := 0
	for i := lo; i <= hi; i++ {
		if b := &w.buckets[pos]; b.n > 0 {
			sum += b.mean
			cnt++
		}
		if pos++; pos == len(w.buckets) {
			pos = 0
		}
	}
	if cnt == 0 {
		return 0, false
	}
	return sum / float64(cnt), true
}

// len is the number of buckets of the stable window.
func (w *window) len() int { return len(w.buckets) }

// resize changes the window to span buckets, keeping the newest samples (the
// scaling settings of a revision change in place).
func (w *window) resize(span int) {
	span = max(span, 1)
	if span == len(w.buckets) {
		return
	}
	nb := make([]bucket, span)
	if w.valid {
		n := int64(len(w.buckets))
		for i := max(w.newest-n+1, w.newest-int64(span)+1); i <= w.newest; i++ {
			nb[((i%int64(span))+int64(span))%int64(span)] = *w.slot(i)
		}
	}
	w.buckets = nb
}
