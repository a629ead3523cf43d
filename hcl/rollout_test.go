package hcl

import (
	"reflect"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Every spelling of the rollout block decodes to the spec.Rollout it
// means, with the analysis defaults where the file says nothing.
func TestRolloutParse(t *testing.T) {
	def := spec.DefaultAnalysis()
	withAnalysis := func(f func(a *spec.Analysis)) spec.Analysis { a := def; f(&a); return a }
	cases := []struct {
		name, body string
		want       *spec.Rollout
	}{
		{"none", "", nil},
		{"empty block: all at once", "  rollout {}", &spec.Rollout{Analysis: def}},
		{"duration", "  rollout {\n    duration = \"5m\"\n  }", &spec.Rollout{Duration: 5 * time.Minute, Analysis: def}},
		{"steps", "  rollout {\n    steps = [1, 5, 25, 50]\n  }", &spec.Rollout{Steps: []int{1, 5, 25, 50}, Analysis: def}},
		{"steps to 100 spread over a duration", "  rollout {\n    duration = \"10m\"\n    steps = [10, 50, 100]\n  }",
			&spec.Rollout{Duration: 10 * time.Minute, Steps: []int{10, 50, 100}, Analysis: def}},
		{"full analysis", "  rollout {\n    duration = \"5m\"\n    analysis {\n      interval = \"30s\"\n      min_requests = 50\n      max_error_rate = \"0.5%\"\n      max_latency = \"1.5x\"\n    }\n  }",
			&spec.Rollout{Duration: 5 * time.Minute, Analysis: spec.Analysis{Interval: 30 * time.Second, MinRequests: 50, MaxErrorRate: 0.5,
				MaxLatency: spec.LatencyBound{Factor: 1.5}}}},
		{"absolute latency", "  rollout {\n    duration = \"5m\"\n    analysis {\n      max_latency = \"300ms\"\n    }\n  }",
			&spec.Rollout{Duration: 5 * time.Minute, Analysis: withAnalysis(func(a *spec.Analysis) { a.MaxLatency.Absolute = 300 * time.Millisecond })}},
		{"both latency bounds", "  rollout {\n    duration = \"5m\"\n    analysis {\n      max_latency = [\"250ms\", \"2x\"]\n      max_error_rate = \"2 %\"\n    }\n  }",
			&spec.Rollout{Duration: 5 * time.Minute, Analysis: withAnalysis(func(a *spec.Analysis) {
				a.MaxLatency = spec.LatencyBound{Factor: 2, Absolute: 250 * time.Millisecond}
				a.MaxErrorRate = 2
			})}},
		{"null keeps the default", "  rollout {\n    duration = \"1m\"\n    analysis {\n      interval = null\n    }\n  }",
			&spec.Rollout{Duration: time.Minute, Analysis: def}},
		// An inactive rollout moves nothing, so pinned traffic is no conflict.
		{"inactive beside pinned traffic", "  rollout {\n    duration = \"0s\"\n  }\n  traffic {\n    revision = \"hello-00001\"\n    percent = 100\n  }",
			&spec.Rollout{Analysis: def}},
		{"latest share beside a pinned one", "  rollout {\n    steps = [10, 50]\n  }\n  traffic {\n    revision = \"hello-00001\"\n    percent = 90\n  }\n  traffic {\n    latest = true\n    percent = 10\n  }",
			&spec.Rollout{Steps: []int{10, 50}, Analysis: def}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f := parseRollout(t, docker(tc.body))
			if got := f.Services[0].Rollout; !reflect.DeepEqual(got, tc.want) {
				t.Errorf("rollout %+v, want %+v", got, tc.want)
			}
		})
	}
}

// The rollout is a route setting: adding, changing or removing it leaves
// the template, and so the revision, as it was, and it travels in the
// service (the KV record the leader reads).
func TestRolloutIsARouteSetting(t *testing.T) {
	base := "  concurrency = 10\n  traffic {\n    latest = true\n    percent = 100\n  }\n"
	variants := []string{
		"",
		"  rollout {\n    duration = \"5m\"\n  }\n",
		"  rollout {\n    steps = [1, 10, 50]\n    analysis {\n      interval = \"1m\"\n      max_error_rate = \"5%\"\n      max_latency = [\"2x\", \"1s\"]\n    }\n  }\n",
	}
	var hashes []string
	var rollouts []*spec.Rollout
	for _, v := range variants {
		f := parseRollout(t, docker(base+v))
		s := f.Services[0]
		hashes = append(hashes, spec.NewRevision(&s, 1).SpecHash)
		rollouts = append(rollouts, s.Rollout)
	}
	for i := 1; i < len(hashes); i++ {
		if hashes[i] != hashes[0] {
			t.Errorf("variant %d makes revision hash %s, want %s: a rollout must not make a new revision", i, hashes[i], hashes[0])
		}
	}
	if rollouts[0] != nil || !rollouts[1].Active() || rollouts[2].Analysis.MaxLatency.Factor != 2 {
		t.Fatalf("rollouts decoded as %+v %+v %+v", rollouts[0], rollouts[1], rollouts[2])
	}
	if reflect.DeepEqual(rollouts[1], rollouts[2]) {
		t.Fatal("the variants decode to the same rollout; the test would prove nothing")
	}
}

// Every bad rollout gets one diagnostic, at the setting, saying the fix.
func TestRolloutDiagnostics(t *testing.T) {
	ro := func(body string) string { return docker("  rollout {\n" + body + "\n  }") }
	an := func(body string) string { return ro("    duration = \"5m\"\n    analysis {\n" + body + "\n    }") }
	pinned := "\n  traffic {\n    revision = \"hello-00001\"\n    percent = 100\n  }"
	cases := []diagCase{
		// Interval.
		{name: "interval zero", src: an(`      interval = »"0s"`), summary: "analysis interval is 0s", detail: `"15s"`},
		{name: "interval negative", src: an(`      interval = »"-15s"`), summary: "analysis interval is -15s"},
		{name: "interval bare number", src: an(`      interval = »15`), summary: "Invalid duration"},

		// Steps.
		{name: "steps decrease", src: ro(`    steps = [1, 25, »5]`), summary: "rollout step 5% does not increase on the step before it (25%)", detail: "only grow"},
		{name: "steps repeat", src: ro(`    steps = [1, »1, 5]`), summary: "rollout step 1% does not increase"},
		{name: "step over 100", src: ro(`    steps = [1, 50, »120]`), summary: "rollout step is 120%", detail: "1 to 100"},
		{name: "step zero", src: ro(`    steps = [»0, 50]`), summary: "rollout step is 0%"},
		{name: "step fractional", src: ro(`    steps = [1, »2.5]`), summary: "Whole number required"},
		{name: "steps of strings", src: ro(`    steps = [»"1%", "5%"]`), summary: "Incorrect attribute value type", detail: "whole numbers"},
		{name: "steps not a list", src: ro(`    steps = »5`), summary: "Incorrect attribute value type", detail: "[1, 5, 25, 50]"},

		// Duration.
		{name: "duration negative", src: ro(`    duration = »"-5m"`), summary: "rollout duration is -5m0s", detail: "all traffic at once"},
		{name: "duration shorter than the interval", src: ro(`    duration = »"10s"`), summary: "rollout duration 10s is too short to judge its first step (1%) every 15s", detail: "at least 15s"},
		{name: "duration too short for the steps", src: ro("    duration = »\"30s\"\n    steps = [1, 10, 50]"), summary: "too short to judge 3 steps every 15s", detail: "at least 45s"},

		// Error rate.
		{name: "error rate over 100", src: an(`      max_error_rate = »"120%"`), summary: "max_error_rate is 120%", detail: "0% to 100%"},
		{name: "error rate negative", src: an(`      max_error_rate = »"-1%"`), summary: "max_error_rate is -1%"},
		{name: "error rate bare number", src: an(`      max_error_rate = »2`), summary: "Invalid percentage", detail: `"2%"`},
		{name: "error rate without sign", src: an(`      max_error_rate = »"0.02"`), summary: "Invalid percentage", detail: "followed by %"},

		// Latency.
		{name: "latency factor 1x", src: an(`      max_latency = »"1x"`), summary: "max_latency 1x is not above 1x", detail: "1.5x"},
		{name: "latency factor 0x", src: an(`      max_latency = »"0x"`), summary: "Invalid latency bound", detail: "above 1"},
		{name: "latency words", src: an(`      max_latency = »"p99 < fast"`), summary: "Invalid latency bound", detail: `"300ms"`},
		{name: "latency negative", src: an(`      max_latency = »"-5ms"`), summary: "max_latency is -5ms"},
		{name: "latency zero", src: an(`      max_latency = [»"0s"]`), summary: "Invalid latency bound"},
		{name: "two relative bounds", src: an(`      max_latency = ["1.5x", »"2x"]`), summary: "Latency bound set twice"},
		{name: "two absolute bounds", src: an(`      max_latency = ["1s", "1.5x", »"2s"]`), summary: "Latency bound set twice"},
		{name: "latency empty list", src: an(`      max_latency = »[]`), summary: "Empty latency bound"},
		{name: "latency number", src: an(`      max_latency = »1.5`), summary: "Incorrect attribute value type", detail: `"1.5x"`},
		{name: "latency list of numbers", src: an(`      max_latency = ["1.5x", »300]`), summary: "Incorrect attribute value type", detail: "element 1 is a number"},

		// Requests.
		{name: "min_requests zero", src: an(`      min_requests = »0`), summary: "min_requests is 0", detail: "1 or more"},

		// Traffic.
		{name: "every target pinned", src: docker("  »rollout {\n    duration = \"5m\"\n  }" + pinned), summary: "rollout has no latest target to move", detail: "latest = true"},
		{name: "latest only tagged", src: docker("  »rollout {\n    steps = [5]\n  }" + pinned + "\n  traffic {\n    latest = true\n    tag = \"next\"\n  }"),
			summary: "rollout has no latest target to move"},

		// The language.
		{name: "duplicate rollout", src: docker("  rollout {\n    duration = \"5m\"\n  }\n  »rollout {\n    duration = \"1m\"\n  }"), summary: "Duplicate rollout block"},
		{name: "duplicate analysis", src: ro("    duration = \"5m\"\n    analysis {}\n    »analysis {}"), summary: "Duplicate analysis block"},
		{name: "unknown analysis setting", src: an(`      »min_request = 5`), summary: "Unsupported argument", detail: `Did you mean "min_requests"?`},
		{name: "unknown rollout setting", src: ro(`    »duraton = "5m"`), summary: "Unsupported argument", detail: `Did you mean "duration"?`},
	}
	runDiagCases(t, cases)
	// One mistake, one diagnostic: a value that fails to decode is not
	// reported again by validation.
	for _, tc := range cases {
		src, _, _ := splitMarker(t, tc.src)
		_, diags := Parse("svc.hcl", []byte(src), tc.opts)
		if n := len(diags.Errs()); n != 1 {
			t.Errorf("%s: %d errors, want 1:%s", tc.name, n, dump(diags))
		}
	}
}

// parseRollout parses a file that must have no diagnostic: a rollout
// block is carried out by the control plane, so it warns of nothing.
func parseRollout(t *testing.T, src string) *File {
	t.Helper()
	f, diags := Parse("svc.hcl", []byte(src), Options{})
	if len(diags) > 0 {
		t.Fatalf("unexpected diagnostics:%s", dump(diags))
	}
	return f
}
