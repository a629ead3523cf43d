package canary

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Verdict is what one judgment of a step decided.
type Verdict string

const (
	// VerdictWait: the new revision had fewer than min_requests requests;
	// the step waits and the next judgment counts them too.
	VerdictWait Verdict = "wait"
	// VerdictPass: every threshold held.
	VerdictPass Verdict = "pass"
	// VerdictFail: a threshold was crossed; the rollout rolls back.
	VerdictFail Verdict = "fail"
	// VerdictUnjudged: the step waited its quiet limit for requests and
	// passes without a judgment (see Plan).
	VerdictUnjudged Verdict = "unjudged"
)

// Judgment is one judgment of a step, with the figures it was made on:
// what `deploy` prints and `status` shows beside the verdict.
type Judgment struct {
	At time.Time `json:"at"`
	// Step is the step's number, from 1; Percent its share of the latest
	// targets' traffic.
	Step    int     `json:"step"`
	Percent int     `json:"percent"`
	Verdict Verdict `json:"verdict"`
	// New and Previous are the revisions' figures over the window judged.
	New      Figures `json:"new"`
	Previous Figures `json:"previous"`
	// Baseline is the previous revision's p99 that the relative latency
	// bound compared against: over the same window when it had
	// min_requests timed there, else over the rollout so far; 0 when
	// neither had (the relative bound was then not applied).
	Baseline time.Duration `json:"baseline,omitempty"`
	// Reason says why, in a sentence without a capital or a full stop:
	// "error rate 31% > 2% over 47 requests at step 5%".
	Reason string `json:"reason"`
}

// judge judges the window of a step. baseline is the previous revision's
// latency over the rollout so far, the window included.
func judge(p Plan, step, percent int, newW, prevW Measurement, baseline Histogram) Judgment {
	j := Judgment{Step: step, Percent: percent, New: newW.figures(), Previous: prevW.figures()}
	at := fmt.Sprintf("at step %d%%", percent)
	over := fmt.Sprintf("over %d requests %s", newW.Requests, at)
	if newW.Requests < uint64(p.MinRequests) {
		j.Verdict = VerdictWait
		j.Reason = fmt.Sprintf("too few requests to judge: %d < min_requests %d %s", newW.Requests, p.MinRequests, at)
		return j
	}
	enough := uint64(p.MinRequests)
	switch {
	case prevW.Latency.Count() >= enough:
		j.Baseline = j.Previous.P99
	case baseline.Count() >= enough:
		j.Baseline = baseline.Quantile(0.99)
	}
	j.Verdict = VerdictFail
	if j.New.ErrorRate > p.MaxErrorRate {
		j.Reason = fmt.Sprintf("error rate %s > %s %s", percentText(j.New.ErrorRate), percentText(p.MaxErrorRate), over)
		return j
	}
	timed := newW.Latency.Count() > 0
	if b := p.MaxLatency.Absolute; b > 0 && timed && j.New.P99 > b {
		j.Reason = fmt.Sprintf("p99 latency %s > %s %s", durationText(j.New.P99), durationText(b), over)
		return j
	}
	f := p.MaxLatency.Factor
	relative := f > 0 && timed && j.Baseline > 0
	if relative && float64(j.New.P99) > f*float64(j.Baseline) {
		j.Reason = fmt.Sprintf("p99 latency %s > %s the previous revision's %s %s", durationText(j.New.P99), factorText(f), durationText(j.Baseline), over)
		return j
	}

	j.Verdict = VerdictPass
	checks := []string{fmt.Sprintf("error rate %s <= %s", percentText(j.New.ErrorRate), percentText(p.MaxErrorRate))}
	if b := p.MaxLatency.Absolute; b > 0 && timed {
		checks = append(checks, fmt.Sprintf("p99 latency %s <= %s", durationText(j.New.P99), durationText(b)))
	}
	switch {
	case !timed && !p.MaxLatency.IsZero():
		checks = append(checks, "latency not judged (none of the new revision's requests was timed)")
	case relative:
		checks = append(checks, fmt.Sprintf("p99 latency %s <= %s the previous revision's %s", durationText(j.New.P99), factorText(f), durationText(j.Baseline)))
	case f > 0:
		// Said, so nobody reads a pass as "as fast as before".
		checks = append(checks, "relative latency not judged (the previous revision had too few timed requests)")
	}
	j.Reason = strings.Join(checks, ", ") + " " + over
	return j
}

// percentText writes a percentage as people read it: "31%", "0.5%".
func percentText(p float64) string {
	r := math.Round(p*10) / 10
	if r == 0 && p > 0 {
		// A rate above zero is never shown as 0 %.
		return strconv.FormatFloat(p, 'g', 2, 64) + "%"
	}
	return strconv.FormatFloat(r, 'f', -1, 64) + "%"
}

// durationText rounds a latency to what a comparison needs: "912ms",
// "1.2ms", "850µs", "2.31s".
func durationText(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(100 * time.Microsecond).String()
	}
	return d.Round(time.Microsecond).String()
}

func factorText(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) + "x" }

// Line is the judgment as `deploy` prints it, the new revision's figures
// beside the previous one's, then the verdict:
// "5%: hello-00002 47 req 31% errors p99 12ms | hello-00001 912 req 0% errors p99 11ms | fail: error rate 31% > 2% ...".
func (j Judgment) Line(newRev, prevRev string) string {
	fig := func(rev string, f Figures) string {
		return fmt.Sprintf("%s %d req %s errors p99 %s", rev, f.Requests, percentText(f.ErrorRate), durationText(f.P99))
	}
	return fmt.Sprintf("%d%%: %s | %s | %s: %s", j.Percent, fig(newRev, j.New), fig(prevRev, j.Previous), j.Verdict, j.Reason)
}
