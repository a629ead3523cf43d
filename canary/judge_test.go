package canary

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// meas is n requests, errs of them failed, each taking lat (none timed
// when lat is 0).
func meas(n, errs int, lat time.Duration) Measurement {
	m := Measurement{Requests: uint64(n), Errors: uint64(errs)}
	if lat > 0 {
		for range n {
			m.Latency.Observe(lat)
		}
	}
	return m
}

func testPlan(bound spec.LatencyBound) Plan {
	return Plan{Steps: []int{5}, IntervalsPerStep: 1, Interval: 15 * time.Second, MinRequests: 20, MaxErrorRate: 2,
		MaxLatency: bound, QuietLimit: DefaultQuietLimit, WakeTimeout: time.Minute}
}

// near reports whether got is within one histogram bucket of want.
func near(got, want time.Duration) bool {
	r := float64(got) / float64(want)
	return r >= 1/1.19 && r <= 1.19
}

// Each verdict, with the figures and the sentence people read.
func TestJudge(t *testing.T) {
	rel := spec.LatencyBound{Factor: 1.5}
	abs := spec.LatencyBound{Absolute: 300 * time.Millisecond}
	both := spec.LatencyBound{Factor: 1.5, Absolute: 300 * time.Millisecond}
	var slowBaseline Histogram
	for range 200 {
		slowBaseline.Observe(200 * time.Millisecond)
	}
	cases := []struct {
		name      string
		bound     spec.LatencyBound
		maxErr    float64
		newW      Measurement
		prevW     Measurement
		baseline  Histogram
		verdict   Verdict
		reason    string // see matches
		baseP99   time.Duration
		newP99    time.Duration
		errorRate float64
	}{
		{name: "too few requests", newW: meas(19, 19, time.Second), prevW: meas(1000, 0, time.Millisecond), maxErr: 2,
			verdict: VerdictWait, reason: "too few requests to judge: 19 < min_requests 20 at step 5%", errorRate: 100},
		{name: "errors", newW: meas(100, 31, 10*time.Millisecond), prevW: meas(1900, 1, 10*time.Millisecond), maxErr: 2,
			verdict: VerdictFail, reason: "error rate 31% > 2% over 100 requests at step 5%", errorRate: 31},
		{name: "errors at the bound pass", newW: meas(100, 2, 10*time.Millisecond), prevW: meas(1900, 0, 10*time.Millisecond), maxErr: 2,
			verdict: VerdictPass, reason: "error rate 2% <= 2% over 100 requests at step 5%", errorRate: 2},
		{name: "no error allowed", newW: meas(300, 1, 0), maxErr: 0,
			verdict: VerdictFail, reason: "error rate 0.3% > 0% over 300 requests at step 5%"},
		{name: "absolute latency", bound: abs, newW: meas(100, 0, 400*time.Millisecond), prevW: meas(1900, 0, 50*time.Millisecond), maxErr: 2,
			verdict: VerdictFail, reason: "p99 latency …> 300ms over 100 requests at step 5%", newP99: 400 * time.Millisecond, baseP99: 50 * time.Millisecond},
		{name: "absolute latency holds", bound: abs, newW: meas(100, 0, 250*time.Millisecond), maxErr: 2,
			verdict: VerdictPass, reason: "error rate 0% <= 2%, p99 latency …<= 300ms over 100 requests at step 5%", newP99: 250 * time.Millisecond},
		{name: "three times slower", bound: rel, newW: meas(100, 0, 300*time.Millisecond), prevW: meas(1900, 0, 100*time.Millisecond), maxErr: 2,
			verdict: VerdictFail, reason: "p99 latency …> 1.5x the previous revision's …over 100 requests at step 5%",
			newP99: 300 * time.Millisecond, baseP99: 100 * time.Millisecond},
		{name: "a little slower passes", bound: rel, newW: meas(100, 0, 120*time.Millisecond), prevW: meas(1900, 0, 100*time.Millisecond), maxErr: 2,
			verdict: VerdictPass, reason: "error rate 0% <= 2%, p99 latency …<= 1.5x the previous revision's …over 100 requests at step 5%",
			newP99: 120 * time.Millisecond, baseP99: 100 * time.Millisecond},
		// The previous revision had too few requests in the window (late
		// steps): the rollout's baseline stands in.
		{name: "baseline stands in for a quiet previous", bound: rel, newW: meas(100, 0, 450*time.Millisecond), prevW: meas(3, 0, 10*time.Millisecond),
			baseline: slowBaseline, maxErr: 2,
			verdict: VerdictFail, reason: "p99 latency …> 1.5x the previous revision's …", newP99: 450 * time.Millisecond, baseP99: 200 * time.Millisecond},
		{name: "relative not judged without a baseline", bound: rel, newW: meas(100, 0, 900*time.Millisecond), prevW: meas(3, 0, 10*time.Millisecond), maxErr: 2,
			verdict: VerdictPass, reason: "error rate 0% <= 2%, relative latency not judged (the previous revision had too few timed requests) over 100 requests at step 5%",
			newP99: 900 * time.Millisecond},
		{name: "both bounds: absolute crossed first", bound: both, newW: meas(100, 0, 350*time.Millisecond), prevW: meas(1900, 0, 300*time.Millisecond), maxErr: 2,
			verdict: VerdictFail, reason: "p99 latency …> 300ms over 100 requests at step 5%", newP99: 350 * time.Millisecond, baseP99: 300 * time.Millisecond},
		{name: "errors are judged before latency", bound: both, newW: meas(100, 50, 900*time.Millisecond), prevW: meas(1900, 0, 300*time.Millisecond), maxErr: 2,
			verdict: VerdictFail, reason: "error rate 50% > 2% over 100 requests at step 5%", errorRate: 50},
		{name: "untimed requests judge errors only", bound: both, newW: meas(100, 1, 0), prevW: meas(1900, 0, 300*time.Millisecond), maxErr: 2,
			verdict: VerdictPass, reason: "error rate 1% <= 2%, latency not judged (none of the new revision's requests was timed) over 100 requests at step 5%", errorRate: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p := testPlan(tc.bound)
			p.MaxErrorRate = tc.maxErr
			baseline := tc.baseline
			baseline.Add(tc.prevW.Latency)
			j := judge(p, 1, 5, tc.newW, tc.prevW, baseline)
			if j.Verdict != tc.verdict {
				t.Errorf("verdict %s, want %s (%s)", j.Verdict, tc.verdict, j.Reason)
			}
			if !matches(j.Reason, tc.reason) {
				t.Errorf("reason %q, want %q", j.Reason, tc.reason)
			}
			if j.Step != 1 || j.Percent != 5 || j.New.Requests != tc.newW.Requests || j.Previous.Requests != tc.prevW.Requests {
				t.Errorf("judgment %+v", j)
			}
			if tc.errorRate != 0 && j.New.ErrorRate != tc.errorRate {
				t.Errorf("error rate %g, want %g", j.New.ErrorRate, tc.errorRate)
			}
			if tc.newP99 != 0 && !near(j.New.P99, tc.newP99) {
				t.Errorf("p99 %s, want about %s", j.New.P99, tc.newP99)
			}
			if tc.baseP99 != 0 && !near(j.Baseline, tc.baseP99) {
				t.Errorf("baseline %s, want about %s", j.Baseline, tc.baseP99)
			}
			if tc.baseP99 == 0 && j.Baseline != 0 && tc.verdict != VerdictWait && tc.bound.Factor > 0 && tc.prevW.Requests < 20 {
				t.Errorf("baseline %s from too few requests", j.Baseline)
			}
		})
	}
}

func TestTexts(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{percentText(31), "31%"}, {percentText(100.0 * 15 / 47), "31.9%"}, {percentText(0.04), "0.04%"}, {percentText(0), "0%"},
		{durationText(912345678 * time.Nanosecond), "912ms"}, {durationText(1234567 * time.Nanosecond), "1.2ms"},
		{durationText(850400 * time.Nanosecond), "850µs"}, {durationText(2312345678 * time.Nanosecond), "2.31s"},
		{factorText(1.5), "1.5x"}, {weightText(10), "0.1%"}, {weightText(2500), "25%"},
	} {
		if tc.got != tc.want {
			t.Errorf("%q, want %q", tc.got, tc.want)
		}
	}
}

// matches reports whether got reads as pattern, where each "…" in pattern
// stands for any text (a figure read from the histogram).
func matches(got, pattern string) bool {
	parts := strings.Split(pattern, "…")
	if len(parts) == 1 {
		return got == pattern
	}
	if !strings.HasPrefix(got, parts[0]) || !strings.HasSuffix(got, parts[len(parts)-1]) {
		return false
	}
	rest := got[len(parts[0]):]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return len(rest) >= len(parts[len(parts)-1])
}

func TestJudgmentLine(t *testing.T) {
	p := Plan{Steps: []int{5}, IntervalsPerStep: 1, Interval: time.Second, MinRequests: 20, MaxErrorRate: 2, QuietLimit: 10, WakeTimeout: time.Minute}
	var n, prev Measurement
	for i := range 47 {
		n.Requests++
		if i < 15 {
			n.Errors++
		}
		n.Latency.Observe(12 * time.Millisecond)
	}
	prev.Requests = 900
	j := judge(p, 1, 5, n, prev, Histogram{})
	got := j.Line("hello-00002", "hello-00001")
	for _, want := range []string{"5%: hello-00002 47 req 31.9% errors p99 ", "| hello-00001 900 req 0% errors p99 0s |", "fail: error rate 31.9% > 2% over 47 requests at step 5%"} {
		if !strings.Contains(got, want) {
			t.Errorf("Line() = %q, want it to contain %q", got, want)
		}
	}
}
