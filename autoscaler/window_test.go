package autoscaler

import (
	"testing"
	"time"
)

func TestWindow(t *testing.T) {
	const tick = 2 * time.Second
	type rec struct {
		at time.Duration
		v  float64
	}
	type read struct {
		at     time.Duration
		span   int
		want   float64
		wantOK bool
	}
	cases := []struct {
		name  string
		span  time.Duration
		recs  []rec
		reads []read
	}{
		{
			name: "no sample: no data",
			span: 10 * time.Second,
			reads: []read{
				{at: 0, span: 5, wantOK: false},
			},
		},
		{
			name: "average of the samples in the window",
			span: 10 * time.Second, // 5 buckets
			recs: []rec{{0, 10}, {sec(2), 20}, {sec(4), 30}},
			reads: []read{
				{at: sec(4), span: 5, want: 20, wantOK: true},
				// Panic span: the newest bucket only.
				{at: sec(4), span: 1, want: 30, wantOK: true},
				{at: sec(4), span: 2, want: 25, wantOK: true},
			},
		},
		{
			name: "a bucket without a sample is left out, not counted as zero",
			span: 10 * time.Second,
			recs: []rec{{0, 10}, {sec(6), 30}},
			reads: []read{
				{at: sec(6), span: 5, want: 20, wantOK: true},
				{at: sec(4), span: 1, wantOK: false},
			},
		},
		{
			name: "samples older than the window fall out",
			span: 10 * time.Second,
			recs: []rec{{0, 100}, {sec(2), 100}, {sec(10), 10}},
			reads: []read{
				// Window at 10s covers buckets 1..5 (2s..11.99s).
				{at: sec(10), span: 5, want: 55, wantOK: true},
				{at: sec(12), span: 5, want: 10, wantOK: true},
				{at: sec(22), span: 5, wantOK: false},
			},
		},
		{
			name: "several samples in one bucket are averaged",
			span: 10 * time.Second,
			recs: []rec{{0, 10}, {sec(2), 10}, {sec(2.5), 30}},
			reads: []read{
				{at: sec(3), span: 1, want: 20, wantOK: true},
				{at: sec(3), span: 5, want: 15, wantOK: true},
			},
		},
		{
			name: "a long pause clears the whole ring",
			span: 10 * time.Second,
			recs: []rec{{0, 50}, {sec(2), 50}, {sec(1000), 4}},
			reads: []read{
				{at: sec(1000), span: 5, want: 4, wantOK: true},
			},
		},
		{
			name: "a late sample older than the ring is dropped",
			span: 10 * time.Second,
			recs: []rec{{sec(100), 4}, {sec(2), 1000}},
			reads: []read{
				{at: sec(100), span: 5, want: 4, wantOK: true},
			},
		},
		{
			name: "negative and NaN samples are dropped",
			span: 10 * time.Second,
			recs: []rec{{0, -5}},
			reads: []read{
				{at: 0, span: 5, wantOK: false},
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := newWindow(tc.span, tick)
			for _, r := range tc.recs {
				w.record(t0.Add(r.at), r.v)
			}
			for _, r := range tc.reads {
				got, ok := w.average(t0.Add(r.at), r.span)
				if ok != r.wantOK || (ok && got != r.want) {
					t.Errorf("average at %s over %d buckets = %v, %v; want %v, %v", r.at, r.span, got, ok, r.want, r.wantOK)
				}
			}
		})
	}
}

func TestWindowResizeKeepsNewest(t *testing.T) {
	const tick = time.Second
	w := newWindow(10*time.Second, tick)
	for i := range 10 {
		w.record(t0.Add(sec(float64(i))), float64(i))
	}
	w.resize(4)
	if w.len() != 4 {
		t.Fatalf("len %d after resize, want 4", w.len())
	}
	// Newest four: 6, 7, 8, 9.
	if got, ok := w.average(t0.Add(sec(9)), 4); !ok || got != 7.5 {
		t.Fatalf("average after shrinking = %v, %v; want 7.5", got, ok)
	}
	w.resize(8)
	w.record(t0.Add(sec(10)), 10)
	if got, ok := w.average(t0.Add(sec(10)), 8); !ok || got != 8 {
		t.Fatalf("average after growing = %v, %v; want 8 (6..10)", got, ok)
	}
}

func TestWindowAllocatesNothing(t *testing.T) {
	w := newWindow(time.Minute, 2*time.Second)
	now := t0
	allocs := testing.AllocsPerRun(1000, func() {
		now = now.Add(2 * time.Second)
		w.record(now, 3)
		w.average(now, 30)
		w.average(now, 3)
	})
	if allocs != 0 {
		t.Fatalf("record+average allocate %v times, want 0", allocs)
	}
}

func TestMaxWindow(t *testing.T) {
	var m maxWindow
	span := 10 * time.Second
	steps := []struct {
		at    float64
		count int
		want  int
	}{
		{0, 5, 5},
		{2, 3, 5},
		{4, 4, 5},
		{10, 1, 4}, // the 5 at 0s is 10s old: out; 4 at 4s is the highest left
		{14, 1, 1},
		{15, 6, 6},
		{24, 2, 6},
		{25, 2, 2},
	}
	for _, s := range steps {
		m.record(t0.Add(sec(s.at)), s.count, span)
		if got := m.max(); got != s.want {
			t.Errorf("at %vs after recording %d: max %d, want %d", s.at, s.count, got, s.want)
		}
	}
	if len(m.entries) > 2 {
		t.Errorf("monotonic queue holds %d entries, want at most 2", len(m.entries))
	}
}

func TestSampleSize(t *testing.T) {
	for _, c := range []struct{ n, want int }{
		{0, 0}, {1, 1}, {3, 3}, {4, 4}, {10, 7}, {100, 14}, {1000, 16}, {-1, 0},
	} {
		if got := sampleSize(c.n); got != c.want {
			t.Errorf("sampleSize(%d) = %d, want %d", c.n, got, c.want)
		}
	}
}
