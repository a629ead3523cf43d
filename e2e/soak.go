package e2e

import (
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// The soak (scenario 32, make soak) runs an hour of traffic and faults and
// then asks two questions of what it saw: did any request fail that a fault
// does not excuse, and does any replica grow. This file holds the answers'
// arithmetic, which needs no agents and has unit tests of its own.

// Fit is a least-squares trend y = Intercept + Slope*x (+ Step while a
// replica leads) over N points.
type Fit struct {
	N                int
	Slope, Intercept float64
	// Step is how much higher y is while the replica leads (the
	// autoscaler's scrapers and its Consul watches are goroutines, open
	// connections and memory of the leader alone); HasStep says whether
	// the fit had both roles to tell apart.
	Step    float64
	HasStep bool
	// SE is the slope's standard error, widened for the residuals'
	// autocorrelation (R1, their lag-1 correlation); ResidSD the
	// residuals' standard deviation (the samples' noise around the fit).
	SE, ResidSD, R1 float64
	// Mean is the mean of y; Span the range of x.
	Mean, Span float64
}

// LinearFit fits a line to the points; fewer than 3 points, or all at one
// x, fit nothing (N set, the rest zero).
func LinearFit(xs, ys []float64) Fit { return FitTrend(xs, ys, nil) }

// FitTrend fits y = a + b*x + c*lead by least squares, lead being a 0/1
// column (nil, or one value throughout, or fewer than 2 samples in either
// role: no step). The slope's standard error is widened by
// sqrt((1+r1)/(1-r1)), r1 the lag-1 autocorrelation of the residuals when
// positive: ten-second samples of a Go process are not independent (a GC
// cycle, the scavenger and a burst of requests each last several
// samples), and the plain standard error would call a wobble a trend.
func FitTrend(xs, ys []float64, lead []bool) Fit {
	f := Fit{N: min(len(xs), len(ys))}
	if f.N < 3 {
		return f
	}
	xs, ys = xs[:f.N], ys[:f.N]
	n := float64(f.N)
	f.Span = slices.Max(xs) - slices.Min(xs)
	for _, y := range ys {
		f.Mean += y / n
	}
	if f.Span == 0 {
		return f
	}
	leaders := 0
	if len(lead) >= f.N {
		for _, l := range lead[:f.N] {
			if l {
				leaders++
			}
		}
	}
	f.HasStep = leaders >= 2 && f.N-leaders >= 2
	k := 2
	if f.HasStep {
		k = 3
	}
	if f.N <= k {
		return Fit{N: f.N, Mean: f.Mean, Span: f.Span}
	}
	row := func(i int) []float64 {
		r := []float64{1, xs[i]}
		if f.HasStep {
			l := 0.0
			if lead[i] {
				l = 1
			}
			r = append(r, l)
		}
		return r
	}
	// Normal equations X'X b = X'y, with X'X inverted for the standard
	// error.
	xtx := make([][]float64, k)
	xty := make([]float64, k)
	for j := range k {
		xtx[j] = make([]float64, k)
	}
	for i := range f.N {
		r := row(i)
		for a := range k {
			xty[a] += r[a] * ys[i]
			for b := range k {
				xtx[a][b] += r[a] * r[b]
			}
		}
	}
	inv, ok := invert(xtx)
	if !ok {
		return Fit{N: f.N, Mean: f.Mean, Span: f.Span}
	}
	beta := make([]float64, k)
	for a := range k {
		for b := range k {
			beta[a] += inv[a][b] * xty[b]
		}
	}
	f.Intercept, f.Slope = beta[0], beta[1]
	if f.HasStep {
		f.Step = beta[2]
	}
	resid := make([]float64, f.N)
	var ss float64
	for i := range f.N {
		r := row(i)
		fit := 0.0
		for a := range k {
			fit += r[a] * beta[a]
		}
		resid[i] = ys[i] - fit
		ss += resid[i] * resid[i]
	}
	sigma2 := ss / float64(f.N-k)
	f.ResidSD = math.Sqrt(sigma2)
	f.SE = math.Sqrt(max(sigma2*inv[1][1], 0))
	if ss > 0 {
		var lag float64
		for i := 1; i < f.N; i++ {
			lag += resid[i] * resid[i-1]
		}
		f.R1 = lag / ss
		if r1 := min(f.R1, 0.95); r1 > 0 {
			f.SE *= math.Sqrt((1 + r1) / (1 - r1))
		}
	}
	return f
}

// invert inverts a small matrix by Gauss-Jordan elimination; false when
// it is singular.
func invert(m [][]float64) ([][]float64, bool) {
	k := len(m)
	a := make([][]float64, k)
	for i := range k {
		a[i] = make([]float64, 2*k)
		copy(a[i], m[i])
		a[i][k+i] = 1
	}
	for c := range k {
		p := c
		for r := c + 1; r < k; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[p][c]) {
				p = r
			}
		}
		if math.Abs(a[p][c]) < 1e-12 {
			return nil, false
		}
		a[c], a[p] = a[p], a[c]
		d := a[c][c]
		for j := range 2 * k {
			a[c][j] /= d
		}
		for r := range k {
			if r == c || a[r][c] == 0 {
				continue
			}
			f := a[r][c]
			for j := range 2 * k {
				a[r][j] -= f * a[c][j]
			}
		}
	}
	out := make([][]float64, k)
	for i := range k {
		out[i] = a[i][k:]
	}
	return out, true
}

// Flat says whether the slope (per unit of x: the soak's x is hours) is
// zero within noise, and why (not). A slope is flat when any bound holds:
//   - statistically: |slope| <= 3 standard errors (widened for
//     autocorrelation, see FitTrend);
//   - against the noise: what the slope adds over the whole series
//     (slope * span) is within 2 residual standard deviations, so the
//     drift is smaller than the samples' own wobble;
//   - practically: |slope| is below floor, the smallest change per hour
//     that matters for the measure (a MiB of RSS, a few goroutines).
func (f Fit) Flat(floor float64) (bool, string) {
	if f.N < 3 || f.Span == 0 || (f.SE == 0 && f.ResidSD == 0 && f.Slope == 0) {
		return true, "nothing to fit"
	}
	abs := math.Abs(f.Slope)
	switch {
	case abs <= 3*f.SE:
		return true, fmt.Sprintf("within 3 SE (%.3g)", 3*f.SE)
	case abs*f.Span <= 2*f.ResidSD:
		return true, fmt.Sprintf("its drift over the series (%.3g) within 2 residual SD (%.3g)", abs*f.Span, 2*f.ResidSD)
	case abs <= floor:
		return true, fmt.Sprintf("below the floor %.3g", floor)
	}
	return false, fmt.Sprintf("NOT FLAT: |%.3g| > 3 SE (%.3g), its drift %.3g > 2 residual SD (%.3g), and above the floor %.3g", f.Slope, 3*f.SE, abs*f.Span, 2*f.ResidSD, floor)
}

// Fault is one fault of the soak: when it was in effect and what it hit.
type Fault struct {
	// Kind is one of the Cause* constants.
	Kind string
	// Replica is the serve replica a replica kill hit; Service the service
	// a bad deploy was of.
	Replica, Service string
	From, To         time.Time
}

// The causes a failed request is put down to, in the order they are
// tried: a request in flight through a replica when it was killed, then
// during a Nomad client restart, a Consul agent restart, a bad deploy of
// its service, else "other".
const (
	CauseReplicaKill   = "in flight at a serve replica's kill -9"
	CauseNomadRestart  = "during the Nomad client's restart"
	CauseConsulRestart = "during the Consul agent's restart"
	CauseBadDeploy     = "during a bad deploy of its service"
	CauseOther         = "other (no fault explains it)"
)

// Excused says whether failures of a cause are allowed: only the requests
// in flight at a kill are (issue 45: "no request fails except the
// requests in flight at a kill"). A restart of an agent or a deploy that
// fails its readiness must cost no request.
func Excused(cause string) bool { return cause == CauseReplicaKill }

// SoakRequest is one request of the soak.
type SoakRequest struct {
	Service, Replica string
	// Wake is set for a request to a service that goes to zero between
	// its bursts.
	Wake bool
	Outcome
}

// Classify puts a failed request down to the first fault that explains
// it (see the Cause constants). A request is in flight at a fault when it
// was under way at some moment of the fault's window.
func Classify(r SoakRequest, faults []Fault) string {
	for _, kind := range []string{CauseReplicaKill, CauseNomadRestart, CauseConsulRestart, CauseBadDeploy} {
		for _, f := range faults {
			if f.Kind != kind || !r.InFlightDuring(f.From, f.To) {
				continue
			}
			if kind == CauseReplicaKill && f.Replica != r.Replica {
				continue
			}
			if kind == CauseBadDeploy && f.Service != r.Service {
				continue
			}
			return kind
		}
	}
	return CauseOther
}

// Series is one measure of one replica's process over its life, sampled
// every few seconds.
type Series struct {
	// Name is the replica and which life of it ("e2e-32a", "e2e-32b#2").
	Name string
	At   []time.Time
	V    []float64
	// Lead is whether the replica led the autoscaler at each sample.
	Lead []bool
}

// Add appends a sample.
func (s *Series) Add(at time.Time, v float64, lead bool) {
	s.At = append(s.At, at)
	s.V = append(s.V, v)
	s.Lead = append(s.Lead, lead)
}

// FitPerHour fits the series after its first warm (start-up: the heap and
// the routing table grow to their size), with x in hours from the first
// sample kept and a step while the replica led (FitTrend).
func (s *Series) FitPerHour(warm time.Duration) Fit {
	var xs, ys []float64
	var lead []bool
	if len(s.At) == 0 {
		return Fit{}
	}
	from := s.At[0].Add(warm)
	for i, at := range s.At {
		if at.Before(from) {
			continue
		}
		xs = append(xs, at.Sub(from).Hours())
		ys = append(ys, s.V[i])
		lead = append(lead, i < len(s.Lead) && s.Lead[i])
	}
	return FitTrend(xs, ys, lead)
}

// Latencies keeps the latencies of the successful requests in buckets of
// Width from Start, for a p99 over time.
type Latencies struct {
	Start   time.Time
	Width   time.Duration
	Buckets [][]float64
}

// Add records a request's latency (seconds) in the bucket of its start.
func (l *Latencies) Add(at time.Time, seconds float64) {
	if at.Before(l.Start) {
		return
	}
	i := int(at.Sub(l.Start) / l.Width)
	for len(l.Buckets) <= i {
		l.Buckets = append(l.Buckets, nil)
	}
	l.Buckets[i] = append(l.Buckets[i], seconds)
}

// Quantile is quantile q of the bucket's latencies (nearest rank); false
// for an empty bucket.
func Quantile(vals []float64, q float64) (float64, bool) {
	if len(vals) == 0 {
		return 0, false
	}
	s := slices.Clone(vals)
	sort.Float64s(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)], true
}

// PlotSeries is one line of a panel.
type PlotSeries struct {
	Name string
	// X is minutes from the soak's start.
	X, Y []float64
}

// PlotPanel is one panel of the soak's plot.
type PlotPanel struct {
	Title, YLabel string
	Lines         []PlotSeries
}

// WriteSoakPlot draws the panels one above the other, with the faults as
// vertical marks (minutes from the start, by kind), into a PNG at path.
func WriteSoakPlot(path string, panels []PlotPanel, faults map[string][]float64) error {
	if len(panels) == 0 {
		return errors.New("plot the soak: no panels")
	}
	palette := []color.Color{
		color.RGBA{0x1f, 0x77, 0xb4, 0xff}, color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff},
		color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff}, color.RGBA{0x8c, 0x56, 0x4b, 0xff},
		color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, color.RGBA{0xbc, 0xbd, 0x22, 0xff},
		color.RGBA{0x17, 0xbe, 0xcf, 0xff},
	}
	faultKinds := make([]string, 0, len(faults))
	for k := range faults {
		faultKinds = append(faultKinds, k)
	}
	sort.Strings(faultKinds)
	rows := make([][]*plot.Plot, len(panels))
	for i, pn := range panels {
		p := plot.New()
		p.Title.Text = pn.Title
		p.X.Label.Text = "minutes from the start"
		p.Y.Label.Text = pn.YLabel
		p.Legend.Top = true
		p.Legend.Left = true
		ymax := 0.0
		for j, s := range pn.Lines {
			pts := make(plotter.XYs, 0, len(s.X))
			for k := range min(len(s.X), len(s.Y)) {
				if math.IsNaN(s.Y[k]) || math.IsInf(s.Y[k], 0) {
					continue
				}
				pts = append(pts, plotter.XY{X: s.X[k], Y: s.Y[k]})
				ymax = max(ymax, s.Y[k])
			}
			if len(pts) == 0 {
				continue
			}
			l, err := plotter.NewLine(pts)
			if err != nil {
				return fmt.Errorf("plot the soak: line %s: %w", s.Name, err)
			}
			l.Color = palette[j%len(palette)]
			l.Width = vg.Points(1)
			p.Add(l)
			p.Legend.Add(s.Name, l)
		}
		// Faults as short ticks along the top of each panel, one row per
		// kind, so a step in a line can be read against what happened.
		for k, kind := range faultKinds {
			var pts plotter.XYs
			for _, x := range faults[kind] {
				pts = append(pts, plotter.XY{X: x, Y: ymax * (1.04 + 0.04*float64(k))})
			}
			if len(pts) == 0 || ymax == 0 {
				continue
			}
			sc, err := plotter.NewScatter(pts)
			if err != nil {
				return fmt.Errorf("plot the soak: faults %s: %w", kind, err)
			}
			sc.GlyphStyle.Shape = draw.PyramidGlyph{}
			sc.GlyphStyle.Radius = vg.Points(3)
			sc.GlyphStyle.Color = palette[(k+5)%len(palette)]
			p.Add(sc)
			if i == 0 {
				p.Legend.Add(kind, sc)
			}
		}
		p.Add(plotter.NewGrid())
		rows[i] = []*plot.Plot{p}
	}
	img := vgimg.New(vg.Points(1000), vg.Points(330*float64(len(panels))))
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadX: vg.Points(6), PadY: vg.Points(12), PadLeft: vg.Points(6), PadRight: vg.Points(12)}
	canvases := plot.Align(rows, tiles, dc)
	for i := range rows {
		rows[i][0].Draw(canvases[i][0])
	}
	return writePNG(path, img)
}

// FormatMarkdownTable renders rows under a header as a Markdown table.
func FormatMarkdownTable(header []string, rows [][]string) string {
	var b strings.Builder
	b.WriteString("| " + strings.Join(header, " | ") + " |\n|")
	for range header {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, r := range rows {
		b.WriteString("| " + strings.Join(r, " | ") + " |\n")
	}
	return b.String()
}

// writePNG writes a drawn canvas to path as a PNG.
func writePNG(path string, img *vgimg.Canvas) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write the soak's plot: %w", err)
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write the soak's plot %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write the soak's plot %s: %w", path, err)
	}
	return nil
}
