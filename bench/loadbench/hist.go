package main

import (
	"math/bits"
	"time"
)

// histSub is the number of sub-buckets per power of two (as bits): 2^7 = 128
// values per octave, about 0.8 % relative precision.
const histSub = 7

// histBuckets covers latencies up to 2^40 ns (about 18 minutes).
const histBuckets = (40-histSub+1)*(1<<(histSub-1)) + (1 << histSub)

// Histogram records latencies in log-linear buckets (HDR-style): fixed size,
// no allocation per record, mergeable. It is not safe for concurrent use; each
// load connection has its own and they are merged at the end.
type Histogram struct {
	counts [histBuckets]uint32
	n      int64
	sum    time.Duration
	max    time.Duration
}

func histIndex(v uint64) int {
	if v < 1<<histSub {
		return int(v)
	}
	shift := bits.Len64(v) - histSub
	i := shift*(1<<(histSub-1)) + int(v>>shift)
	if i >= histBuckets {
		return histBuckets - 1
	}
	return i
}

// histValue is the middle of bucket i.
func histValue(i int) time.Duration {
	if i < 1<<histSub {
		return time.Duration(i)
	}
	shift := i/(1<<(histSub-1)) - 1
	m := i - shift*(1<<(histSub-1))
	return time.Duration(uint64(m)<<shift + (uint64(1)<<shift)/2)
}

// Record adds one latency.
func (h *Histogram) Record(d time.Duration) {
	if d < 0 {
		d = 0
	}
	h.counts[histIndex(uint64(d))]++
	h.n++
	h.sum += d
	if d > h.max {
		h.max = d
	}
}

// Merge adds o's records to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.max = max(h.max, o.max)
}

// Count is the number of records.
func (h *Histogram) Count() int64 { return h.n }

// Mean is the average latency.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return h.sum / time.Duration(h.n)
}

// Max is the largest latency recorded.
func (h *Histogram) Max() time.Duration { return h.max }

// Quantile returns the latency at quantile q (0..1), within the bucket
// precision.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := int64(q*float64(h.n) + 0.5)
	rank = max(1, min(rank, h.n))
	var seen int64
	for i, c := range h.counts {
		seen += int64(c)
		if seen >= rank {
			return min(histValue(i), h.max)
		}
	}
	return h.max
}
