package e2e

import (
	"bufio"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Histogram is one Prometheus histogram (without labels) read from a
// scrape: its cumulative buckets by upper bound, sum and count.
type Histogram struct {
	Buckets map[float64]float64
	Sum     float64
	Count   float64
}

// ParseHistogram reads the histogram name from a scrape in the text format.
// A histogram the scrape does not have is an error.
func ParseHistogram(text, name string) (Histogram, error) {
	h := Histogram{Buckets: map[float64]float64{}}
	found := false
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"_") {
			continue
		}
		key, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return h, fmt.Errorf("read %s: %q: %w", name, line, err)
		}
		switch {
		case key == name+"_sum":
			h.Sum, found = v, true
		case key == name+"_count":
			h.Count, found = v, true
		case strings.HasPrefix(key, name+`_bucket{le="`):
			le := strings.TrimSuffix(strings.TrimPrefix(key, name+`_bucket{le="`), `"}`)
			b, err := strconv.ParseFloat(le, 64)
			if err != nil {
				return h, fmt.Errorf("read %s: bucket %q: %w", name, le, err)
			}
			h.Buckets[b] = v
		}
	}
	if err := sc.Err(); err != nil {
		return h, fmt.Errorf("read %s: %w", name, err)
	}
	if !found {
		return h, fmt.Errorf("read %s: not in the scrape", name)
	}
	return h, nil
}

// Since is what h observed after the earlier scrape prev.
func (h Histogram) Since(prev Histogram) Histogram {
	d := Histogram{Buckets: map[float64]float64{}, Sum: h.Sum - prev.Sum, Count: h.Count - prev.Count}
	for b, v := range h.Buckets {
		d.Buckets[b] = v - prev.Buckets[b]
	}
	return d
}

// Mean is the mean observation in seconds (0 with none).
func (h Histogram) Mean() float64 {
	if h.Count == 0 {
		return 0
	}
	return h.Sum / h.Count
}

// Quantile is the upper bound of the bucket that holds quantile q of the
// observations (+Inf when it is the last; 0 with none): a bound, not an
// estimate.
func (h Histogram) Quantile(q float64) float64 {
	if h.Count == 0 {
		return 0
	}
	bounds := make([]float64, 0, len(h.Buckets))
	for b := range h.Buckets {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	for _, b := range bounds {
		if h.Buckets[b] >= q*h.Count {
			return b
		}
	}
	return math.Inf(1)
}
