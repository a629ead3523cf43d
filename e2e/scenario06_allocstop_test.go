package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	nomad "github.com/hashicorp/nomad/api"
)

// Scenario 6: `nomad alloc stop` of one instance under load loses no request
// a client could not retry; Nomad replaces it and Consul follows.
func TestE2E6AllocStopUnderLoad(t *testing.T) {
	h := newHarness(t, "6 alloc stop")
	const svc = "e2e-allocstop"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-6", "", "")
	s := testService(svc)
	s.Scaling.Min, s.Scaling.Initial = 2, 2
	h.deploy(h.writeServices("allocstop.hcl", s))
	eventually(t, 60*time.Second, "two instances passing", func() (bool, string) {
		n := len(h.passing(rev))
		return n == 2, fmt.Sprintf("%d passing", n)
	})

	load := StartLoad(context.Background(), g.request(svc, "", "/?sleep=50ms", NewClient(32)), 6, 0, 3*time.Minute)
	defer load.Stop()
	time.Sleep(3 * time.Second)

	// Consul's two passing instances may be ahead of Nomad's list.
	victim := h.waitRunning(rev, 2, 30*time.Second)[0]
	full, _, err := h.nomad.Allocations().Info(victim.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	stopAt := time.Now()
	if _, err := h.nomad.Allocations().Stop(full, nil); err != nil {
		t.Fatalf("stop allocation %s (nomad alloc stop): %v", victim.ID, err)
	}

	// Consul drops the stopped instance (service IDs name the allocation),
	// Nomad places a replacement, and two instances pass again.
	took := eventually(t, 90*time.Second, "a replacement instance passes", func() (bool, string) {
		var ids []string
		stale := false
		for _, e := range h.passing(rev) {
			ids = append(ids, e.Service.ID)
			stale = stale || strings.Contains(e.Service.ID, victim.ID)
		}
		live := h.liveAllocs(rev)
		replaced := len(live) == 2 && !slices.ContainsFunc(live, func(a *nomad.AllocationListStub) bool { return a.ID == victim.ID })
		return replaced && len(ids) == 2 && !stale, fmt.Sprintf("%d running allocations, Consul instances %v", len(live), ids)
	})
	h.timing("alloc stop -> replacement passing", took)
	stopped, _, err := h.nomad.Allocations().Info(victim.ID, nil)
	if err != nil {
		t.Errorf("read the stopped allocation: %v", err)
	} else if stopped.DesiredStatus != nomad.AllocDesiredStatusStop {
		t.Errorf("stopped allocation: desired status %q, want stop", stopped.DesiredStatus)
	}
	time.Sleep(3 * time.Second)
	res := load.Stop()
	t.Logf("load: %s (stop at %s)", res.Summary(), stopAt.Format("15:04:05.000"))
	if lost := res.Lost(); len(lost) > 0 {
		t.Errorf("requests lost that a client could not retry: %s", lost.Summary())
	}
}
