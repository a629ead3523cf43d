package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	nomad "github.com/hashicorp/nomad/api"
)

// Scenario 3: a load step raises the count (Nomad's scaling events say so
// and why), the load stopping lowers it, down to zero.
func TestE2E3LoadStepScalesUpAndDown(t *testing.T) {
	h := newHarness(t, "3 load step")
	const svc = "e2e-load"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-3", "", "")
	h.deploy(h.writeServices("load.hcl", testService(svc)))

	// 20 workers of 200 ms requests keep ~20 in flight: with a target of 5
	// per instance at 70% that wants the max of 5 instances.
	loadStart := time.Now()
	load := StartLoad(context.Background(), g.request(svc, "", "/?sleep=200ms", NewClient(64)), 20, 0, 3*time.Minute)
	defer load.Stop()

	var firstUp time.Time
	took := eventually(t, 90*time.Second, rev+" scales above 2 under load", func() (bool, string) {
		n, err := h.groupCount(rev)
		if err != nil {
			return false, err.Error()
		}
		if n > 1 && firstUp.IsZero() {
			firstUp = time.Now()
		}
		return n >= 3, fmt.Sprintf("count %d", n)
	})
	h.timing("load start -> count > 1 (Nomad)", firstUp.Sub(loadStart))
	h.timing("load start -> count >= 3 (Nomad)", took)
	eventually(t, 60*time.Second, "a second instance passes in Consul", func() (bool, string) {
		n := len(h.passing(rev))
		return n >= 2, fmt.Sprintf("%d passing", n)
	})
	h.timing("load start -> 2 instances passing (Consul)", time.Since(loadStart))
	time.Sleep(5 * time.Second)
	res := load.Stop()
	loadStop := time.Now()
	if lost := res.Lost(); len(lost) > 0 {
		t.Errorf("requests lost while scaling up: %s", res.Summary())
	}
	t.Logf("load: %s", res.Summary())

	h.timing("load stop -> zero", h.waitZero(rev, 2*time.Minute))

	// Nomad's record: a rise from a running count, a fall, and the last
	// word 0, each with a reason (waited for, like all Nomad reports).
	var events []nomad.ScalingEvent
	eventually(t, 15*time.Second, "Nomad's scaling events of "+rev+" since the load: a rise from a running count, a fall after it stopped, the newest to 0", func() (bool, string) {
		events = h.scalingEvents(rev)
		rose, fell, newest := scalingRecord(events, loadStart, loadStop)
		return rose && fell && newest == 0, fmt.Sprintf("rose from a running count %v, fell after the load stopped %v, newest count %d", rose, fell, newest)
	})
	for _, e := range events {
		at := time.Unix(0, int64(e.Time))
		if e.Error || e.Count == nil || at.Before(loadStart) {
			continue
		}
		if e.Message == "" {
			t.Errorf("scaling event without a reason: %+v", e)
		}
		t.Logf("scaling event %s: %d -> %d %q", at.Format("15:04:05.000"), e.PreviousCount, *e.Count, e.Message)
	}
}

// scalingRecord reads successful scaling events: whether one since
// loadStart rose from a running count, whether one after loadStop fell, and
// the newest event's count (-1 without events).
func scalingRecord(events []nomad.ScalingEvent, loadStart, loadStop time.Time) (rose, fell bool, newest int64) {
	newest = -1
	var newestTime uint64
	for _, e := range events {
		if e.Error || e.Count == nil {
			continue
		}
		if newest == -1 || e.Time > newestTime {
			newest, newestTime = *e.Count, e.Time
		}
		at := time.Unix(0, int64(e.Time))
		if at.Before(loadStart) {
			continue
		}
		switch c := *e.Count; {
		case c > e.PreviousCount && e.PreviousCount >= 1:
			rose = true
		case c < e.PreviousCount && at.After(loadStop):
			fell = true
		}
	}
	return rose, fell, newest
}
