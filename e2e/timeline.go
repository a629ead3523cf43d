package e2e

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// TimelineTolerance is how far a wake's timeline total (the gateway's held
// request to its first byte back) may be from the first byte the client
// measured, or a tenth of that first byte if more: the two differ by the
// loopback hops between client and gateway, and the clocks are one
// machine's, but on a loaded machine each hop waits for a core (90 ms
// apart of a 1.6 s wake at a load average of 16 on two cores).
const TimelineTolerance = 10 * time.Millisecond

// CheckWakeTimeline lists what is wrong with the timeline of a wake the
// client measured (the first byte clientFirstByte after it sent the
// request): a step missing, a step before its cause (one machine's clocks:
// no slack), or a total further from the client's than TimelineTolerance
// allows.
// Timings are not judged: they go into the table.
func CheckWakeTimeline(tl spec.WakeTimeline, clientFirstByte time.Duration) []string {
	var bad []string
	if len(tl.Missing) > 0 {
		var names []string
		for _, s := range tl.Missing {
			names = append(names, string(s))
		}
		bad = append(bad, "steps missing: "+strings.Join(names, ", "))
	}
	for _, o := range tl.OutOfOrder(0) {
		bad = append(bad, "out of order: "+o)
	}
	if total, ok := tl.FirstByte(); ok {
		tolerance := max(TimelineTolerance, clientFirstByte/10)
		if d := total - clientFirstByte; d > tolerance || d < -tolerance {
			bad = append(bad, fmt.Sprintf("total %s, the client measured %s: %s apart, more than %s",
				FormatDuration(total), FormatDuration(clientFirstByte), FormatDuration(d.Abs()), FormatDuration(tolerance)))
		}
	}
	return bad
}

// ColdStartOf is the cold start the client measured, with Nomad's and the
// app's stages read from the wake's timeline.
func ColdStartOf(tl spec.WakeTimeline, requestIn, firstByte time.Time) ColdStart {
	at := func(s spec.WakeStep) time.Time { t, _ := tl.At(s); return t }
	return ColdStart{RequestIn: requestIn, FirstByte: firstByte,
		ScaleCall: at(spec.WakeScaleWritten), AllocRunning: at(spec.WakeAppTask), FirstProbe: at(spec.WakeAppReady)}
}

// TimelineTable collects the wake timelines of the cold-start scenarios, by
// driver, for the table the suite prints at its end. Safe for concurrent
// use.
type TimelineTable struct {
	mu    sync.Mutex
	wakes map[string][]timedWake // by driver
	order []string
}

type timedWake struct {
	tl     spec.WakeTimeline
	client time.Duration // the client's first byte
	load   string
}

// Add records one wake of driver.
func (t *TimelineTable) Add(driver string, tl spec.WakeTimeline, clientFirstByte time.Duration, load string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.wakes == nil {
		t.wakes = map[string][]timedWake{}
	}
	if _, ok := t.wakes[driver]; !ok {
		t.order = append(t.order, driver)
	}
	t.wakes[driver] = append(t.wakes[driver], timedWake{tl, clientFirstByte, load})
}

// Format renders one table per driver: every step in the order of its
// median time since the request, with that median, the median of its time
// since the step before it (in each wake's own order), its range and
// whose it is; then the client's first byte and our share.
func (t *TimelineTable) Format() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var b strings.Builder
	for _, driver := range t.order {
		wakes := t.wakes[driver]
		since := map[spec.WakeStep][]time.Duration{}
		delta := map[spec.WakeStep][]time.Duration{}
		var client, ours, total []time.Duration
		var loads []string
		for _, w := range wakes {
			for _, st := range w.tl.Steps {
				since[st.Step] = append(since[st.Step], st.Since)
				delta[st.Step] = append(delta[st.Step], st.Delta)
			}
			client = append(client, w.client)
			if d, ok := w.tl.OurShare(); ok {
				ours = append(ours, d)
			}
			if d, ok := w.tl.FirstByte(); ok {
				total = append(total, d)
			}
			loads = append(loads, w.load)
		}
		steps := make([]spec.WakeStep, 0, len(since))
		for s := range since {
			steps = append(steps, s)
		}
		sort.Slice(steps, func(i, j int) bool {
			return cmp.Or(cmp.Compare(Median(since[steps[i]]), Median(since[steps[j]])),
				cmp.Compare(slices.Index(spec.WakeSteps, steps[i]), slices.Index(spec.WakeSteps, steps[j]))) < 0
		})
		fmt.Fprintf(&b, "\ncold-start timeline, %s: %d wakes (1-minute load average at each: %s)\n", driver, len(wakes), strings.Join(loads, " "))
		rows := [][]string{{"step", "whose", "since request", "delta", "since: min", "max", "n"}}
		for _, s := range steps {
			rows = append(rows, []string{s.Describe() + " (" + string(s) + ")", string(s.Whose()),
				FormatDuration(Median(since[s])), "+" + FormatDuration(Median(delta[s])),
				FormatDuration(slices.Min(since[s])), FormatDuration(slices.Max(since[s])), fmt.Sprint(len(since[s]))})
		}
		for _, r := range []struct {
			name string
			v    []time.Duration
		}{
			{"first byte, timeline total (held -> first byte at the gateway)", total},
			{"first byte, measured by the client", client},
			{"our share (app ready -> first byte)", ours},
		} {
			if len(r.v) > 0 {
				rows = append(rows, []string{r.name, "", FormatDuration(Median(r.v)), "", FormatDuration(slices.Min(r.v)), FormatDuration(slices.Max(r.v)), fmt.Sprint(len(r.v))})
			}
		}
		b.WriteString(alignRows(rows))
	}
	return b.String()
}

// alignRows pads columns: text left, durations right.
func alignRows(rows [][]string) string {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len(c))
		}
	}
	var b strings.Builder
	for _, r := range rows {
		var line strings.Builder
		for i, c := range r {
			if i < 2 {
				fmt.Fprintf(&line, "%-*s  ", widths[i], c)
			} else {
				fmt.Fprintf(&line, "%*s  ", widths[i], c)
			}
		}
		b.WriteString(strings.TrimRight(line.String(), " ") + "\n")
	}
	return b.String()
}

// ColdStartTarget is the median first byte of a wake the cold-start
// scenarios aim at on this machine (issue 46, with the queue-proxy started
// beside the app rather than before it): docker 400 ms, raw_exec 150 ms.
// Reported beside the numbers, never asserted.
func ColdStartTarget(driver string) time.Duration {
	if driver == "docker" {
		return 400 * time.Millisecond
	}
	return 150 * time.Millisecond
}
