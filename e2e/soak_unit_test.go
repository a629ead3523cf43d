package e2e

import (
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestUnitLinearFit(t *testing.T) {
	// y = 3 + 2x exactly: slope 2, no noise.
	xs := []float64{0, 1, 2, 3, 4}
	ys := []float64{3, 5, 7, 9, 11}
	f := LinearFit(xs, ys)
	if math.Abs(f.Slope-2) > 1e-9 || math.Abs(f.Intercept-3) > 1e-9 || f.SE > 1e-9 || f.N != 5 || f.Span != 4 || f.Mean != 7 {
		t.Fatalf("fit of a line: %+v", f)
	}
	if flat, why := f.Flat(0.5); flat {
		t.Errorf("a clean slope of 2 called flat: %s", why)
	}
	if flat, _ := f.Flat(3); !flat {
		t.Errorf("a slope of 2 under a floor of 3 not flat")
	}

	// Noise around a constant: flat, and the slope's standard error
	// bounds it.
	r := rand.New(rand.NewPCG(1, 2))
	xs, ys = nil, nil
	for i := range 360 {
		xs = append(xs, float64(i)/360)
		ys = append(ys, 50+r.NormFloat64())
	}
	f = LinearFit(xs, ys)
	if flat, why := f.Flat(0); !flat {
		t.Errorf("noise called a slope: %+v: %s", f, why)
	}
	if f.ResidSD < 0.8 || f.ResidSD > 1.2 {
		t.Errorf("residual SD of unit noise: %g", f.ResidSD)
	}

	// A leak under the noise: 10 an hour against noise of SD 1 is found.
	for i := range ys {
		ys[i] += 10 * xs[i]
	}
	f = LinearFit(xs, ys)
	if flat, why := f.Flat(1); flat {
		t.Errorf("a leak of 10/h under unit noise called flat: %+v: %s", f, why)
	}
	if math.Abs(f.Slope-10) > 3*f.SE+0.5 {
		t.Errorf("leak slope %g ± %g, want 10", f.Slope, f.SE)
	}

	if f := LinearFit([]float64{1, 2}, []float64{1, 2}); f.N != 2 || f.Slope != 0 {
		t.Errorf("two points fit: %+v", f)
	}
	if flat, _ := LinearFit(nil, nil).Flat(0); !flat {
		t.Errorf("no samples must not fail as a slope")
	}
}

// A replica that leads for a while has more of everything then: a step,
// not a trend. Without the step a flat series that led in its second half
// looks like a leak; with it the slope is nothing.
func TestUnitFitTrendLeaderStep(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	var xs, ys []float64
	var lead []bool
	for i := range 360 {
		x := float64(i) / 360
		l := i >= 180
		y := 100 + r.NormFloat64()*2
		if l {
			y += 100
		}
		xs, ys, lead = append(xs, x), append(ys, y), append(lead, l)
	}
	if f := LinearFit(xs, ys); func() bool { ok, _ := f.Flat(5); return ok }() {
		t.Errorf("without the step the leadership looks flat: %+v", f)
	}
	f := FitTrend(xs, ys, lead)
	if !f.HasStep || math.Abs(f.Step-100) > 1 {
		t.Errorf("step %g (has %v), want 100", f.Step, f.HasStep)
	}
	if ok, why := f.Flat(5); !ok {
		t.Errorf("with the step the series is flat: %+v: %s", f, why)
	}
	// One sample in a role is no step to fit.
	lead = make([]bool, len(xs))
	lead[7] = true
	if f := FitTrend(xs, ys, lead); f.HasStep {
		t.Errorf("a step from one sample: %+v", f)
	}
}

// Slow wobble (an AR(1) process of 0.9, as a GC cycle or a burst lasts
// several samples) is autocorrelated: the widened standard error keeps it
// from passing for a trend, while a real trend well above it stands out.
func TestUnitFitTrendAutocorrelation(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	var xs, ys []float64
	w := 0.0
	for i := range 360 {
		w = 0.9*w + r.NormFloat64()
		xs, ys = append(xs, float64(i)/360), append(ys, 50+w)
	}
	f := FitTrend(xs, ys, nil)
	if f.R1 < 0.5 {
		t.Errorf("lag-1 correlation of an AR(1) of 0.9: %g", f.R1)
	}
	if ok, why := f.Flat(0); !ok {
		t.Errorf("wobble called a trend: %+v: %s", f, why)
	}
	for i := range ys {
		ys[i] += 30 * xs[i]
	}
	if ok, why := FitTrend(xs, ys, nil).Flat(1); ok {
		t.Errorf("a trend of 30/h over the wobble called flat: %s", why)
	}
}

func TestUnitClassify(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 23, 0, 0, 0, time.UTC)
	at := func(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }
	faults := []Fault{
		{Kind: CauseReplicaKill, Replica: "b", From: at(100), To: at(100.1)},
		{Kind: CauseNomadRestart, From: at(200), To: at(230)},
		{Kind: CauseConsulRestart, From: at(300), To: at(320)},
		{Kind: CauseBadDeploy, Service: "s1", From: at(400), To: at(420)},
	}
	req := func(svc, replica string, from, to float64) SoakRequest {
		return SoakRequest{Service: svc, Replica: replica, Outcome: Outcome{Start: at(from), End: at(to)}}
	}
	for _, tc := range []struct {
		r    SoakRequest
		want string
	}{
		{req("s1", "b", 99.9, 100.05), CauseReplicaKill},
		{req("s1", "a", 99.9, 100.05), CauseOther}, // another replica: the kill does not explain it
		{req("s1", "b", 100.2, 100.3), CauseOther}, // sent after the kill (the victim was out of the rotation)
		{req("s1", "a", 199, 201), CauseNomadRestart},
		{req("s1", "a", 310, 311), CauseConsulRestart},
		{req("s1", "a", 410, 411), CauseBadDeploy},
		{req("s2", "a", 410, 411), CauseOther}, // another service's deploy
		{req("s1", "a", 500, 501), CauseOther},
	} {
		if got := Classify(tc.r, faults); got != tc.want {
			t.Errorf("request %s via %s %s..%s: %q, want %q", tc.r.Service, tc.r.Replica, tc.r.Start.Sub(t0), tc.r.End.Sub(t0), got, tc.want)
		}
	}
	if !Excused(CauseReplicaKill) || Excused(CauseNomadRestart) || Excused(CauseOther) {
		t.Errorf("only kills excuse failures")
	}
}

func TestUnitSoakSeriesAndLatencies(t *testing.T) {
	t0 := time.Now()
	var s Series
	for i := range 60 {
		v := 100.0
		if i < 12 {
			v = float64(50 + 4*i) // the warm-up climbs
		}
		s.Add(t0.Add(time.Duration(i)*10*time.Second), v, false)
	}
	if f := s.FitPerHour(2 * time.Minute); math.Abs(f.Slope) > 1e-6 || f.N != 48 {
		t.Errorf("after the warm-up the series is flat: %+v", f)
	}
	if f := s.FitPerHour(0); f.Slope <= 0 {
		t.Errorf("with the warm-up the series climbs: %+v", f)
	}
	l := Latencies{Start: t0, Width: 10 * time.Second}
	for i := range 100 {
		l.Add(t0.Add(15*time.Second), float64(i+1)/1000)
	}
	l.Add(t0.Add(-time.Second), 9) // before the start: dropped
	if len(l.Buckets) != 2 || len(l.Buckets[0]) != 0 {
		t.Fatalf("buckets %d", len(l.Buckets))
	}
	if q, ok := Quantile(l.Buckets[1], 0.99); !ok || q != 0.099 {
		t.Errorf("p99 of 1..100 ms: %g", q)
	}
	if _, ok := Quantile(nil, 0.99); ok {
		t.Errorf("p99 of nothing")
	}
}

func TestUnitSoakPlot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "soak.png")
	panels := []PlotPanel{
		{Title: "RSS", YLabel: "MiB", Lines: []PlotSeries{{Name: "a#1", X: []float64{0, 1, 2}, Y: []float64{40, 41, 40}}, {Name: "b#2", X: []float64{1, 2}, Y: []float64{30, math.NaN()}}}},
		{Title: "p99", YLabel: "s", Lines: []PlotSeries{{Name: "steady", X: []float64{0, 1}, Y: []float64{0.01, 0.02}}}},
	}
	if err := WriteSoakPlot(path, panels, map[string][]float64{CauseReplicaKill: {1.5}}); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
		t.Fatalf("not a PNG: %d bytes, %v", len(b), err)
	}
	if err := WriteSoakPlot(path, nil, nil); err == nil {
		t.Errorf("no panels drew something")
	}
}
