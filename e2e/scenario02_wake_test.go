package e2e

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Scenario 2: scale to zero after the grace period, wake on a request (5
// times, with the cold start split), then a burst of 100 concurrent requests
// at zero: all succeed, one wake.
func TestE2E2ScaleToZeroAndWake(t *testing.T) {
	h := newHarness(t, "2 wake from zero")
	const svc = "e2e-wake"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-2", "", "")
	s := testService(svc)
	h.deploy(h.writeServices("wake.hcl", s))

	// With no traffic the revision goes to zero: Nomad's count, its
	// allocations and Consul's instances, and a scaling event says why.
	idleSince := time.Now()
	took := h.waitZero(rev, 90*time.Second)
	h.timing("deploy idle -> zero (window 6s, grace 2s)", took)
	var toZero nomad.ScalingEvent
	eventually(t, 15*time.Second, "Nomad records a scaling event of "+rev+" to 0 with a reason", func() (bool, string) {
		events := h.scalingEvents(rev)
		for _, e := range events {
			if e.Count != nil && *e.Count == 0 && time.Unix(0, int64(e.Time)).After(idleSince) && e.Message != "" {
				toZero = e
				return true, ""
			}
		}
		return false, fmt.Sprintf("events since %s: %+v", idleSince.Format("15:04:05.000"), events)
	})
	t.Logf("scaled to zero: %q", toZero.Message)

	// At zero, serve stands in for the revision in its Consul service
	// (tagged activator, pointing at the gateway) for catalog-driven
	// proxies; a real instance passing takes it out again.
	_, gwPort, _ := strings.Cut(g.listen, ":")
	eventually(t, 30*time.Second, "serve registers a stand-in for "+rev+" at zero", func() (bool, string) {
		var seen []string
		for _, e := range h.standIns(rev) {
			seen = append(seen, fmt.Sprintf("%s %s:%d %v", e.Service.ID, e.Service.Address, e.Service.Port, e.Service.Meta))
			if e.Service.Meta[consulroute.MetaReplica] == "e2e-2" && strconv.Itoa(e.Service.Port) == gwPort {
				return true, ""
			}
		}
		return false, fmt.Sprintf("stand-ins %v", seen)
	})

	client := NewClient(128)
	const wakes = 5
	for i := 1; i <= wakes; i++ {
		if i > 1 {
			h.waitZero(rev, 90*time.Second)
		}
		cs := h.wake(g, svc, rev)
		for _, st := range cs.Split() {
			if st.Known {
				h.timing(st.Name, st.Since)
			}
		}
		if !cs.ScaleCall.IsZero() && !cs.FirstByte.IsZero() {
			// Comparable with the reference: scale call to a new
			// allocation's sidecar answering ~0.83 s on a Nomad 1.6 dev
			// agent with a Python app.
			h.timing("scale call -> first byte", cs.FirstByte.Sub(cs.ScaleCall))
		}
		if !cs.FirstProbe.IsZero() && !cs.FirstByte.IsZero() {
			// Our share: everything after the app first answered its
			// readiness probe (learning of the allocation, the sidecar's
			// and the gateway's probes, the forward).
			h.timing(StageOurShare, cs.FirstByte.Sub(cs.FirstProbe))
		}
		t.Logf("wake %d: %v", i, cs.Split())
		if i == 1 {
			eventually(t, 30*time.Second, "the stand-in for "+rev+" goes once an instance passes", func() (bool, string) {
				n := len(h.standIns(rev))
				return n == 0, fmt.Sprintf("%d stand-ins, %d passing", n, len(h.passing(rev)))
			})
		}
	}
	rows := h.s.Timings.Rows()
	for _, r := range rows {
		if r.Scenario == h.scenario && r.Measure == StageFirstByte {
			verdict := "met"
			if Median(r.Values) > time.Second {
				verdict = "MISSED"
			}
			h.s.Timings.Note(h.scenario, StageFirstByte, fmt.Sprintf("target <= 1.0s median of %d: %s", len(r.Values), verdict))
		}
	}

	// A burst of 100 concurrent requests at zero: every one succeeds, and
	// Nomad saw exactly one scale-up from zero.
	h.waitZero(rev, 90*time.Second)
	burstStart := time.Now()
	res := Burst(context.Background(), g.request(svc, "", "/?sleep=100ms", client), 100)
	h.timing("burst of 100 at zero: all answered", time.Since(burstStart))
	if res.OK() != 100 {
		t.Errorf("burst at zero: %s", res.Summary())
	}
	var slowest time.Duration
	for _, o := range res {
		slowest = max(slowest, o.End.Sub(o.Start))
	}
	h.timing("burst of 100 at zero: slowest request", slowest)
	// Give the autoscaler's follow-up decisions a moment to be recorded.
	time.Sleep(2 * time.Second)
	if ups := ScaleUpsFromZero(h.scalingEvents(rev), burstStart); len(ups) != 1 {
		t.Errorf("burst woke the revision %d times (scale-ups from 0 since the burst), want 1: %+v", len(ups), h.scalingEvents(rev))
	}
	// The app never saw more than the revision's concurrency per instance:
	// the sidecar's breaker held the rest.
	for _, a := range h.liveAllocs(rev) {
		if st := h.appStats(a.ID); st.MaxConcurrency > int64(s.Concurrency) {
			t.Errorf("allocation %s: the app saw %d requests at once, above concurrency %d", a.ID, st.MaxConcurrency, s.Concurrency)
		}
	}
}

// wake sends one request to a revision at zero and measures its cold start
// from what the client, Nomad and the app report.
func (h *harness) wake(g *gateway, svc, rev string) ColdStart {
	h.t.Helper()
	o := g.request(svc, "", "/", NewClient(1)).Do(context.Background())
	if !o.OK() {
		h.t.Fatalf("request at zero: %s", o.Describe())
	}
	cs := ColdStart{RequestIn: o.Start, FirstByte: o.FirstByte}
	// What Nomad reports of the wake (the scale call, the allocation and
	// its task's start) may reach its servers after the answer did: wait
	// for it.
	eventually(h.t, 10*time.Second, "Nomad records a scale-up of "+rev+" from zero after the request", func() (bool, string) {
		events := h.scalingEvents(rev)
		if ups := ScaleUpsFromZero(events, o.Start); len(ups) > 0 {
			cs.ScaleCall = ups[0]
			return true, ""
		}
		return false, fmt.Sprintf("events %+v", events)
	})
	// The allocation created for this wake: the earliest created after
	// the request.
	var a *nomad.Allocation
	eventually(h.t, 10*time.Second, "Nomad reports the "+spec.UserTaskName+" task of the allocation woken for "+rev+" started", func() (bool, string) {
		allocs, _, err := h.nomad.Jobs().Allocations(rev, false, nil)
		if err != nil {
			return false, err.Error()
		}
		allocs = slices.DeleteFunc(allocs, func(a *nomad.AllocationListStub) bool { return time.Unix(0, a.CreateTime).Before(o.Start) })
		if len(allocs) == 0 {
			return false, "no allocation created after the request"
		}
		first := slices.MinFunc(allocs, func(a, b *nomad.AllocationListStub) int { return cmp.Compare(a.CreateTime, b.CreateTime) })
		if a, _, err = h.nomad.Allocations().Info(first.ID, nil); err != nil {
			return false, err.Error()
		}
		cs.AllocRunning = TaskStarted(a, spec.UserTaskName)
		states := map[string]string{}
		for name, ts := range a.TaskStates {
			if ts != nil {
				states[name] = ts.State
			}
		}
		return !cs.AllocRunning.IsZero(), fmt.Sprintf("allocation %s: client status %s, task states %v", a.ID, a.ClientStatus, states)
	})
	if st := h.appStats(a.ID); st.FirstReadyUnixNano > 0 {
		cs.FirstProbe = time.Unix(0, st.FirstReadyUnixNano)
	}
	return cs
}
