package e2e

import (
	"math"
	"testing"
)

func TestUnitParseHistogram(t *testing.T) {
	scrape := `# HELP x_seconds Time.
# TYPE x_seconds histogram
x_seconds_bucket{le="0.01"} 2
x_seconds_bucket{le="0.1"} 9
x_seconds_bucket{le="+Inf"} 10
x_seconds_sum 1.5
x_seconds_count 10
x_seconds_other 3
y_seconds_sum 7
`
	h, err := ParseHistogram(scrape, "x_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if h.Count != 10 || h.Sum != 1.5 || h.Mean() != 0.15 {
		t.Errorf("count %v sum %v mean %v, want 10, 1.5, 0.15", h.Count, h.Sum, h.Mean())
	}
	if q := h.Quantile(0.5); q != 0.1 {
		t.Errorf("median bound %v, want 0.1", q)
	}
	if q := h.Quantile(1); !math.IsInf(q, 1) {
		t.Errorf("max bound %v, want +Inf", q)
	}
	d := h.Since(Histogram{Buckets: map[float64]float64{0.01: 2, 0.1: 2, math.Inf(1): 2}, Sum: 0.02, Count: 2})
	if d.Count != 8 || d.Quantile(0.5) != 0.1 || d.Quantile(0.01) != 0.1 {
		t.Errorf("since: %+v, want 8 observations, all in (0.01, 0.1]", d)
	}
	if _, err := ParseHistogram(scrape, "z_seconds"); err == nil {
		t.Error("a histogram not in the scrape: want an error")
	}
}
