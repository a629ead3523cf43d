package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// roundStats are a series' medians over its runs, each measure on its own:
// a round slowed by other work on the shared machine moves a median little,
// where it would pull a merged histogram or a mean.
type roundStats struct {
	Runs           int
	RPS            float64
	P50, P99, P999 time.Duration
	// Errors and Non2xx are sums: any is a failure, not noise.
	Errors, Non2xx int64
	// CPUPerReq is the series' CPU over all its requests, 0 if unknown.
	CPUPerReq time.Duration
	// AppCPUPerReq is the app's CPU over all the series' requests, 0 if
	// unknown.
	AppCPUPerReq time.Duration
	// Idle is the share of the machine's CPU idle during the runs, 0 if
	// unknown.
	Idle float64
}

// medianStats computes s's roundStats.
func medianStats(s *Series) roundStats {
	st := roundStats{Runs: len(s.Runs), Idle: s.idleShare()}
	if len(s.Runs) == 0 {
		return st
	}
	var rps []float64
	var p50, p99, p999 []time.Duration
	var reqs int64
	for _, r := range s.Runs {
		rps = append(rps, r.RPS())
		p50 = append(p50, r.Latency.Quantile(.5))
		p99 = append(p99, r.Latency.Quantile(.99))
		p999 = append(p999, r.Latency.Quantile(.999))
		st.Errors += r.Errors
		st.Non2xx += r.Requests - r.ByClass[2]
		reqs += r.Requests
	}
	st.RPS = median(rps)
	st.P50, st.P99, st.P999 = median(p50), median(p99), median(p999)
	if s.CPU > 0 && reqs > 0 {
		st.CPUPerReq = s.CPU / time.Duration(reqs)
	}
	if s.AppCPU > 0 && reqs > 0 {
		st.AppCPUPerReq = s.AppCPU / time.Duration(reqs)
	}
	return st
}

// median is the middle value (the mean of the two middle ones for an even
// count); 0 for none.
func median[T ~int64 | ~float64](v []T) T {
	if len(v) == 0 {
		return 0
	}
	v = slices.Clone(v)
	slices.Sort(v)
	n := len(v)
	if n%2 == 1 {
		return v[n/2]
	}
	return (v[n/2-1] + v[n/2]) / 2
}

// benchRole is what a row of the peer comparison stands for.
type benchRole int

const (
	roleBaseline benchRole = iota // a reference (the app alone, one hop alone): no ratio
	roleOurs                      // a path through our proxies: gets ratios
	rolePeer                      // a path through a peer: the yardstick
)

// peerRow is one target of the peer comparison.
type peerRow struct {
	Series *Series
	Role   benchRole
}

// peerRatio is ours against peer from the same run: throughput as ours /
// peer (above 1: ours is faster), latencies as ours / peer (above 1: ours
// is slower).
type peerRatio struct {
	Ours, Peer          string
	RPS, P50, P99, P999 float64
}

// peerRatios is every ours-against-peer pair of rows, ours in row order.
func peerRatios(rows []peerRow) []peerRatio {
	var out []peerRatio
	for _, o := range rows {
		if o.Role != roleOurs {
			continue
		}
		st := medianStats(o.Series)
		for _, p := range rows {
			if p.Role != rolePeer {
				continue
			}
			ps := medianStats(p.Series)
			out = append(out, peerRatio{Ours: o.Series.Name, Peer: p.Series.Name,
				RPS: div(st.RPS, ps.RPS), P50: divDur(st.P50, ps.P50), P99: divDur(st.P99, ps.P99), P999: divDur(st.P999, ps.P999)})
		}
	}
	return out
}

func div(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}

func divDur(a, b time.Duration) float64 { return div(float64(a), float64(b)) }

// PrintPeerComparison prints every row's medians (req/s, p50, p99, p99.9),
// a throughput-ratio column against each peer for our rows, then one line
// per ours-against-peer pair with every ratio.
func PrintPeerComparison(w io.Writer, title string, rows []peerRow) error {
	var peers []string
	for _, r := range rows {
		if r.Role == rolePeer {
			peers = append(peers, r.Series.Name)
		}
	}
	fmt.Fprintf(w, "\n%s\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprint(tw, "target\truns\treq/s\tp50\tp99\tp99.9\terrors\tnon-2xx\tCPU/req\tapp CPU/req\tidle\t")
	for _, p := range peers {
		fmt.Fprintf(tw, "vs %s\t", p)
	}
	fmt.Fprintln(tw)
	for _, r := range rows {
		st := medianStats(r.Series)
		fmt.Fprintf(tw, "%s\t%d\t%.0f\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t", r.Series.Name, st.Runs, st.RPS,
			fmtDur(st.P50), fmtDur(st.P99), fmtDur(st.P999), st.Errors, st.Non2xx, fmtCPU(st.CPUPerReq), fmtCPU(st.AppCPUPerReq), fmtShare(st.Idle))
		for _, p := range rows {
			if p.Role != rolePeer {
				continue
			}
			if r.Role != roleOurs {
				fmt.Fprint(tw, "-\t")
				continue
			}
			fmt.Fprintf(tw, "%.3f\t", div(st.RPS, medianStats(p.Series).RPS))
		}
		fmt.Fprintln(tw)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(peers) == 0 {
		fmt.Fprintln(w, "no peer ran: nothing to compare with")
		return nil
	}
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, r := range peerRatios(rows) {
		fmt.Fprintf(tw, "%s / %s:\treq/s %.3f\tp50 %.2fx\tp99 %.2fx\tp99.9 %.2fx\n", r.Ours, r.Peer, r.RPS, r.P50, r.P99, r.P999)
	}
	return tw.Flush()
}

// fmtShare prints a share as a percentage, "-" when unknown.
func fmtShare(f float64) string {
	if f <= 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}

// fmtCPU prints a CPU time per request, "-" when unknown.
func fmtCPU(d time.Duration) string {
	if d <= 0 {
		return "-"
	}
	return fmtDur(d)
}

// peerRows lists the rows of a peer comparison: baselines, ours, peers.
func peerRows(base, ours, peers []*Series) []peerRow {
	var rows []peerRow
	for _, g := range []struct {
		ss   []*Series
		role benchRole
	}{{base, roleBaseline}, {ours, roleOurs}, {peers, rolePeer}} {
		for _, s := range g.ss {
			rows = append(rows, peerRow{Series: s, Role: g.role})
		}
	}
	return rows
}

// seriesOf is one empty series per target, named after it.
func seriesOf(ts []Target) []*Series {
	var out []*Series
	for _, t := range ts {
		out = append(out, &Series{Name: t.Name})
	}
	return out
}

// peerLetters names the peer targets of the gateway mode in a title:
// " (e) (f)" for two.
func peerLetters(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, " (%c)", 'e'+i)
	}
	return b.String()
}
