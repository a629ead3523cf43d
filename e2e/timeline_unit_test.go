package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A whole, ordered timeline whose total is the client's passes; a missing
// step, a step before its cause and a total far from the client's are
// each named. The table lists each driver's steps by median time.
func TestUnitWakeTimelineCheckAndTable(t *testing.T) {
	held := time.Unix(1_800_000_000, 0)
	ms := func(n float64) time.Time { return held.Add(time.Duration(n * float64(time.Millisecond))) }
	all := map[spec.WakeStep]time.Time{}
	for i, s := range spec.WakeSteps {
		all[s] = ms(float64(i * 10))
	}
	whole := spec.NewWakeTimeline("s", "s-00001", "r", "a", all)
	fb, _ := whole.FirstByte()
	if bad := CheckWakeTimeline(whole, fb+2*time.Millisecond); len(bad) != 0 {
		t.Errorf("a whole timeline: %v", bad)
	}
	bad := CheckWakeTimeline(whole, fb+20*time.Millisecond)
	if len(bad) != 1 || !strings.Contains(bad[0], "apart") {
		t.Errorf("a total 20ms off: %v", bad)
	}
	// A loaded machine's long wake: a tenth of the client's first byte.
	slow := map[spec.WakeStep]time.Time{}
	for s, at := range all {
		slow[s] = at.Add(time.Duration(slices.Index(spec.WakeSteps, s)) * 100 * time.Millisecond)
	}
	slowTL := spec.NewWakeTimeline("s", "s-00001", "r", "a", slow)
	sfb, _ := slowTL.FirstByte()
	if bad := CheckWakeTimeline(slowTL, sfb+sfb/12); len(bad) != 0 {
		t.Errorf("a %s wake %s off (under a tenth): %v", sfb, sfb/12, bad)
	}
	if bad := CheckWakeTimeline(slowTL, sfb+sfb/5); len(bad) != 1 || !strings.Contains(bad[0], "apart") {
		t.Errorf("a %s wake %s off: %v", sfb, sfb/5, bad)
	}
	broken := map[spec.WakeStep]time.Time{}
	for s, at := range all {
		broken[s] = at
	}
	delete(broken, spec.WakeConsulPassing)
	broken[spec.WakeAppReady] = ms(1) // before the app accepted
	bad = CheckWakeTimeline(spec.NewWakeTimeline("s", "s-00001", "r", "a", broken), fb)
	if len(bad) != 2 || !strings.Contains(bad[0], "consul_passing") || !strings.Contains(bad[1], "app_ready") {
		t.Errorf("a broken timeline: %v", bad)
	}

	var tt TimelineTable
	tt.Add("docker", whole, fb, "1.00")
	tt.Add("docker", whole, fb, "2.00")
	out := tt.Format()
	for _, want := range []string{"cold-start timeline, docker: 2 wakes (1-minute load average at each: 1.00 2.00)", "the activator holds the request (held)", "our share (app ready -> first byte)"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Index(out, "(held)") > strings.Index(out, "(first_byte)") {
		t.Errorf("steps not in time order:\n%s", out)
	}
}
