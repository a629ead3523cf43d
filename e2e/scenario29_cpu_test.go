package e2e

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	nomad "github.com/hashicorp/nomad/api"
)

// cpuReason is what a scale-up of scenario 29 must say, somewhere in its
// reason ("cpu 4800% of reserved > target 50%", maybe after "panic: " or
// inside "max: 4 (...)").
var cpuReason = regexp.MustCompile(`cpu \d+% of reserved > target 50%`)

// Scenario 29: a CPU-bound service scales on cpu, Knative's HPA class. Its
// instances' use of their reserved cpu comes from Nomad's allocation stats:
// a bounded CPU-burning load raises the count, Nomad's scaling events say
// why ("cpu N% of reserved > target 50%"), and when the load stops the
// count goes down to min, 1, never to zero.
func TestE2E29CPUScalesUpAndDownToMin(t *testing.T) {
	h := newHarness(t, "29 cpu scaling")
	const svc = "e2e-cpu"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-29", "", "")
	service := Service{
		Name: svc,
		Env:  map[string]string{"TESTAPP_NAME": "v1"},
		// 100 MHz: an idle testapp uses a few MHz, one request
		// burning 50 ms of a core many times its share.
		CPU:     100,
		Scaling: Scaling{Metric: "cpu", Target: 50, Min: 1, Max: 4, Initial: 1, Window: 6 * time.Second},
	}
	h.deploy(h.writeServices("cpu.hcl", service))

	// Idle, the autoscaler reads the instance's use and keeps one.
	eventually(t, 60*time.Second, "the autoscaler reads "+rev+"'s cpu use from Nomad", func() (bool, string) {
		view, err := g.autoscalerView(svc)
		if err != nil {
			return false, err.Error()
		}
		r := view[rev]
		return strings.Contains(r.Reason, "cpu ") && strings.Contains(r.Reason, "of reserved"), fmt.Sprintf("%+v", r)
	})
	if n, err := h.groupCount(rev); err != nil || n != 1 {
		t.Fatalf("idle count %d (%v), want 1", n, err)
	}

	// Two workers, each burning 50 ms of cpu per request with 100 ms
	// between: at most two thirds of a core, bounded to 3 minutes.
	loadStart := time.Now()
	load := StartLoad(context.Background(), g.request(svc, "", "/?cpu=50ms", NewClient(4)), 2, 100*time.Millisecond, 3*time.Minute)
	defer load.Stop()
	var firstUp time.Time
	eventually(t, 90*time.Second, rev+" scales above 1 on cpu", func() (bool, string) {
		n, err := h.groupCount(rev)
		if err != nil {
			return false, err.Error()
		}
		if n > 1 && firstUp.IsZero() {
			firstUp = time.Now()
		}
		return n > 1, fmt.Sprintf("count %d", n)
	})
	h.timing("cpu load start -> count > 1 (Nomad)", firstUp.Sub(loadStart))
	eventually(t, 60*time.Second, "a second instance of "+rev+" passes in Consul", func() (bool, string) {
		n := len(h.passing(rev))
		return n >= 2, fmt.Sprintf("%d passing", n)
	})
	time.Sleep(5 * time.Second)
	res := load.Stop()
	loadStop := time.Now()
	if lost := res.Lost(); len(lost) > 0 {
		t.Errorf("requests lost while scaling on cpu: %s", res.Summary())
	}
	t.Logf("load: %s", res.Summary())

	// Load gone: down to min, 1.
	took := eventually(t, 2*time.Minute, rev+" scales down to 1", func() (bool, string) {
		n, err := h.groupCount(rev)
		if err != nil {
			return false, err.Error()
		}
		return n == 1, fmt.Sprintf("count %d", n)
	})
	h.timing("cpu load stop -> count 1 (Nomad)", took)

	// Nomad's record: a rise whose reason names cpu over the target, a
	// fall after the load stopped, the newest at 1 and none at 0.
	var events []nomad.ScalingEvent
	eventually(t, 15*time.Second, "Nomad's scaling events of "+rev+": a rise saying cpu over target, a fall after the load, the newest to 1", func() (bool, string) {
		events = h.scalingEvents(rev)
		_, fell, newest := scalingRecord(events, loadStart, loadStop)
		said := false
		for _, e := range events {
			if !e.Error && e.Count != nil && *e.Count > e.PreviousCount && cpuReason.MatchString(e.Message) {
				said = true
			}
		}
		return said && fell && newest == 1, fmt.Sprintf("rise saying cpu > target %v, fell after the load %v, newest count %d", said, fell, newest)
	})
	for _, e := range events {
		if e.Error || e.Count == nil {
			continue
		}
		at := time.Unix(0, int64(e.Time))
		if *e.Count == 0 {
			t.Errorf("a revision scaled on cpu went to zero: %+v", e)
		}
		t.Logf("scaling event %s: %d -> %d %q", at.Format("15:04:05.000"), e.PreviousCount, *e.Count, e.Message)
	}

	// status says the same, in the table and in -json.
	out := h.mustCLI("status", svc)
	if !strings.Contains(out, "% cpu") || !strings.Contains(out, "of reserved") {
		t.Errorf("status does not show the cpu use and its reason:\n%s", out)
	}
	js := h.mustCLI("status", "-json", svc)
	if !regexp.MustCompile(`"metric":\s*"cpu"`).MatchString(js) || !strings.Contains(js, "of reserved") {
		t.Errorf("status -json does not show the metric and its reason:\n%s", js)
	}
	t.Logf("status:\n%s", out)
}
