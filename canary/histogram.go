package canary

import (
	"math"
	"time"
)

// Histogram is the latency summary a judgment reads: request counts in
// fixed buckets a quarter of an octave wide (each bound 2^(1/4), about
// 1.19, times the one before), from 100µs to about 105s, and one for
// everything slower. Fixed buckets add up: the gateway replicas'
// histograms of one interval sum to the interval's, and a step that waits
// for requests sums its intervals, which percentiles (a p99 per replica or
// per interval) could not. It is a plain array, so it serialises with the
// rest of the state. A p99 read from it is within one bucket, under 19 %,
// of the true one, and the same for both revisions compared.
type Histogram struct {
	Counts [NumBuckets]uint64 `json:"counts"`
}

// NumBuckets is the histogram's bucket count; the last one is unbounded.
const NumBuckets = 82

// bucketBase is the upper bound of bucket 0; bucket i's upper bound is
// bucketBase * 2^(i/4).
const bucketBase = 100 * time.Microsecond

// BucketBound is bucket i's upper bound (inclusive); the last bucket has
// none and reports the largest time.Duration.
func BucketBound(i int) time.Duration {
	if i >= NumBuckets-1 {
		return time.Duration(math.MaxInt64)
	}
	return bucketBounds[i]
}

// bucketBounds are the bounded buckets' upper bounds, computed once: the
// gateway finds every request's bucket (bucketOf) on its request path, and
// a search of a table costs a few comparisons where the formula cost a
// logarithm and two powers per request. It is never written after init.
var bucketBounds = func() (b [NumBuckets - 1]time.Duration) {
	for i := range b {
		b[i] = time.Duration(float64(bucketBase) * math.Exp2(float64(i)/4))
	}
	return b
}()

// bucketOf is the bucket d falls in: the first whose bound is not below it.
func bucketOf(d time.Duration) int {
	// sort.Search's binary search, written out: no closure on the
	// request path.
	lo, hi := 0, len(bucketBounds)
	for lo < hi {
		mid := int(uint(lo+hi) >> 1)
		if bucketBounds[mid] < d {
			lo = mid + 1
		} else {
			hi = mid
		}
	}
	return lo
}

// Observe counts one request that took d.
func (h *Histogram) Observe(d time.Duration) { h.Counts[bucketOf(d)]++ }

// BucketOf is the bucket Observe counts d in, for a caller that keeps its
// own counters (the gateway's, atomic on the request path) and builds a
// Histogram from them.
func BucketOf(d time.Duration) int { return bucketOf(d) }

// Add counts o's requests in h too.
func (h *Histogram) Add(o Histogram) {
	for i, c := range o.Counts {
		h.Counts[i] += c
	}
}

// Count is how many requests h holds.
func (h Histogram) Count() uint64 {
	var n uint64
	for _, c := range h.Counts {
		n += c
	}
	return n
}

// Quantile estimates the latency below which a share q (0 < q <= 1) of
// the requests fell: the nearest-rank request's bucket, interpolated
// linearly within it. It is 0 for an empty histogram. In the unbounded
// last bucket it reports that bucket's lower bound (the figure is "at
// least" that).
func (h Histogram) Quantile(q float64) time.Duration {
	total := h.Count()
	if total == 0 {
		return 0
	}
	rank := uint64(math.Ceil(q * float64(total)))
	rank = max(1, min(rank, total))
	var seen uint64
	for i, c := range h.Counts {
		if c == 0 || seen+c < rank {
			seen += c
			continue
		}
		lower := time.Duration(0)
		if i > 0 {
			lower = BucketBound(i - 1)
		}
		if i == NumBuckets-1 {
			return lower
		}
		upper := BucketBound(i)
		return lower + time.Duration(float64(upper-lower)*float64(rank-seen)/float64(c))
	}
	return 0 // unreachable: rank <= total
}
