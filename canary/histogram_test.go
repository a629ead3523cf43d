package canary

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// Every latency lands in the first bucket whose bound is not below it,
// bounds grow by a quarter octave, and the last bucket takes the rest.
func TestHistogramBuckets(t *testing.T) {
	for i := 1; i < NumBuckets-1; i++ {
		r := float64(BucketBound(i)) / float64(BucketBound(i-1))
		if r < 1.18 || r > 1.20 {
			t.Fatalf("bound %d / bound %d = %.4f, want 2^(1/4)", i, i-1, r)
		}
	}
	for i := range NumBuckets - 1 {
		b := BucketBound(i)
		if got := bucketOf(b); got != i {
			t.Errorf("bound of bucket %d (%s) falls in %d", i, b, got)
		}
		if got := bucketOf(b + 1); got != i+1 {
			t.Errorf("just above bound %d (%s) falls in %d", i, b, got)
		}
	}
	if bucketOf(0) != 0 || bucketOf(-time.Second) != 0 || bucketOf(time.Hour) != NumBuckets-1 {
		t.Errorf("extremes fall in %d, %d, %d", bucketOf(0), bucketOf(-time.Second), bucketOf(time.Hour))
	}
	if BucketBound(NumBuckets-2) < 100*time.Second {
		t.Errorf("the last bounded bucket ends at %s, want at least 100s", BucketBound(NumBuckets-2))
	}
}

// The p99 read from the histogram is within one bucket of the exact
// nearest-rank p99, for several shapes of latency.
func TestHistogramQuantile(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	// A slice, not a map: the shapes draw from one generator in a fixed
	// order, so every run tests the same samples.
	shapes := []struct {
		name string
		draw func() time.Duration
	}{
		{"uniform 10-50ms", func() time.Duration {
			return 10*time.Millisecond + time.Duration(rng.Int64N(int64(40*time.Millisecond)))
		}},
		{"fast with a slow tail", func() time.Duration {
			if rng.IntN(100) < 3 {
				return 2*time.Second + time.Duration(rng.Int64N(int64(time.Second)))
			}
			return 300*time.Microsecond + time.Duration(rng.Int64N(int64(200*time.Microsecond)))
		}},
		{"exponential around 80ms", func() time.Duration { return time.Duration(rng.ExpFloat64() * float64(80*time.Millisecond)) }},
	}
	for _, shape := range shapes {
		draw := shape.draw
		t.Run(shape.name, func(t *testing.T) {
			for _, n := range []int{20, 100, 5000} {
				var h Histogram
				samples := make([]time.Duration, n)
				for i := range samples {
					samples[i] = draw()
					h.Observe(samples[i])
				}
				slices.Sort(samples)
				for _, q := range []float64{0.5, 0.99} {
					rank := int(float64(n)*q+0.999999) - 1
					exact := samples[max(0, rank)]
					got := h.Quantile(q)
					if exact < bucketBase {
						if got > bucketBase {
							t.Errorf("n=%d q=%g: %s for an exact %s", n, q, got, exact)
						}
						continue
					}
					if r := float64(got) / float64(exact); r < 1/1.19 || r > 1.19 {
						t.Errorf("n=%d q=%g: %s for an exact %s (ratio %.3f)", n, q, got, exact, r)
					}
				}
			}
		})
	}
}

// Histograms add bucket by bucket, so the p99 of two intervals summed is
// the p99 of all their requests; empty reads 0, the overflow its floor.
func TestHistogramAddAndEdges(t *testing.T) {
	var a, b, all Histogram
	for i := range 100 {
		d := time.Duration(i+1) * time.Millisecond
		if i%2 == 0 {
			a.Observe(d)
		} else {
			b.Observe(d)
		}
		all.Observe(d)
	}
	a.Add(b)
	if a != all || a.Count() != 100 {
		t.Fatalf("sum of halves differs from the whole: %d requests", a.Count())
	}
	// The exact p99 is 99ms; the estimate is within its bucket.
	if q := a.Quantile(0.99); float64(q) < 99e6/1.19 || float64(q) > 99e6*1.19 {
		t.Errorf("p99 of 1..100ms is %s", q)
	}
	var empty Histogram
	if empty.Quantile(0.99) != 0 || empty.Count() != 0 {
		t.Errorf("empty histogram: p99 %s", empty.Quantile(0.99))
	}
	var slow Histogram
	slow.Observe(time.Hour)
	if got := slow.Quantile(0.99); got != BucketBound(NumBuckets-2) {
		t.Errorf("p99 of an hour-long request is %s, want the overflow's floor %s", got, BucketBound(NumBuckets-2))
	}
}
