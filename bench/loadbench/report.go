package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"
)

// Series collects the runs of one target across alternating rounds, so a
// comparison uses every round of both sides: noise from other work on the
// machine lands on both.
type Series struct {
	Name string
	Runs []*Result
	// CPU is CPU time used during the runs by the process under test (the
	// proxy; the app for direct runs), if known.
	CPU time.Duration
	// AppCPU is CPU time used during the runs by the test app, whatever
	// is in front of it. The app's cost per request depends on how the
	// proxy hands it the requests (issue 16: behind our sidecar it paid
	// 50 us a request, behind HAProxy 32), so it is measured, not assumed.
	AppCPU time.Duration
	// Idle of MachineCPU is the machine's CPU time (all CPUs) that was
	// idle during the runs (measureIdle).
	Idle, MachineCPU time.Duration
}

// Add appends one run.
func (s *Series) Add(r *Result) { s.Runs = append(s.Runs, r) }

// Merged sums every run.
func (s *Series) Merged() *Result {
	m := &Result{Target: s.Name}
	for _, r := range s.Runs {
		m.Conns = r.Conns
		m.Elapsed += r.Elapsed
		m.Requests += r.Requests
		m.Errors += r.Errors
		for i := range r.ByClass {
			m.ByClass[i] += r.ByClass[i]
		}
		m.Latency.Merge(&r.Latency)
	}
	return m
}

// PrintRun prints one run on one line.
func PrintRun(w io.Writer, round int, r *Result) {
	fmt.Fprintf(w, "  round %d  %-24s %9.0f req/s  p50 %8s  p99 %8s  errors %d  non-2xx %d\n",
		round, r.Target, r.RPS(), fmtDur(r.Latency.Quantile(.5)), fmtDur(r.Latency.Quantile(.99)),
		r.Errors, r.Requests-r.ByClass[2])
}

// PrintComparison prints each series against base: throughput, p50, p99,
// and the throughput ratio (series / base).
func PrintComparison(w io.Writer, title string, base *Series, others ...*Series) {
	fmt.Fprintf(w, "\n%s\n", title)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "target\treq/s\tp50\tp99\tmean\terrors\tnon-2xx\tthroughput ratio\tCPU/req\t")
	b := base.Merged()
	row := func(s *Series, m *Result) {
		ratio := "-"
		if s != base && b.RPS() > 0 {
			ratio = fmt.Sprintf("%.3f", m.RPS()/b.RPS())
		}
		cpu := "-"
		if s.CPU > 0 && m.Requests > 0 {
			cpu = fmtDur(s.CPU / time.Duration(m.Requests))
		}
		fmt.Fprintf(tw, "%s\t%.0f\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t\n", s.Name, m.RPS(),
			fmtDur(m.Latency.Quantile(.5)), fmtDur(m.Latency.Quantile(.99)), fmtDur(m.Latency.Mean()),
			m.Errors, m.Requests-m.ByClass[2], ratio, cpu)
	}
	row(base, b)
	for _, s := range others {
		row(s, s.Merged())
	}
	tw.Flush()
}

// AddedLatency is the per-request latency a proxy adds on one connection:
// the difference of medians (and of means) of proxied and direct runs.
func AddedLatency(direct, proxied *Series) (p50, mean time.Duration) {
	d, p := direct.Merged(), proxied.Merged()
	return p.Latency.Quantile(.5) - d.Latency.Quantile(.5), p.Latency.Mean() - d.Latency.Mean()
}

func fmtDur(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDur(-d)
	case d < time.Millisecond:
		return fmt.Sprintf("%.0fus", float64(d)/1e3)
	case d < time.Second:
		return fmt.Sprintf("%.2fms", float64(d)/1e6)
	default:
		return fmt.Sprintf("%.2fs", d.Seconds())
	}
}

func fmtMiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
