package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Scenario 14b: `delete` is clean at once with a replica dead for good
// (issue 45, part 4). Two serve replicas, a revision at zero with a
// stand-in from each; kill -9 of the leader, which stays down: the other
// leads and removes the dead replica's stand-ins and activator
// registration through the agent that holds them, so `delete` finds
// nothing of the dead replica left and returns within seconds, with
// nothing of the service in Nomad or Consul. Before, the delete waited its
// full 30 s and the stand-in stayed until Consul reaped it, 1-2 minutes
// later.
func TestE2E14bDeleteWithADeadReplica(t *testing.T) {
	h := newHarness(t, "14b delete with a replica dead for good")
	const svc = "e2e-deadreplica"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	lock := h.watchLock(t)
	leader := standby{gateway: h.startServe("e2e-14x", "", ""), replica: "e2e-14x"}
	h.deploy(h.writeServices("deadreplica.hcl", testService(svc)))
	follower := h.startStandby(t, "e2e-14y", rev)
	h.waitZero(rev, 90*time.Second)
	h.waitSessions(t, 2)
	standIns := func() []string {
		entries, _, err := h.consul.Health().Service(rev, spec.TagActivator, false, nil)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, e := range entries {
			ids = append(ids, e.Service.ID+" ("+e.Checks.AggregatedStatus()+")")
		}
		return ids
	}
	eventually(t, 30*time.Second, "a stand-in of "+rev+" from each replica", func() (bool, string) {
		ids := standIns()
		return len(ids) == 2, fmt.Sprintf("%v", ids)
	})

	killed := time.Now()
	if err := syscall.Kill(leader.proc.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	lock.waitHolder(t, follower.replica, 30*time.Second)
	activatorID := spec.ActivatorServiceName + "-" + leader.replica
	eventually(t, 30*time.Second, "the dead replica's registrations removed by the new leader", func() (bool, string) {
		entries, _, err := h.consul.Health().Service(spec.ActivatorServiceName, "", false, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, e := range entries {
			if e.Service.ID == activatorID {
				return false, activatorID + " still registered (" + e.Checks.AggregatedStatus() + "); stand-ins " + strings.Join(standIns(), ", ")
			}
		}
		return len(standIns()) == 1, "stand-ins " + strings.Join(standIns(), ", ")
	})
	h.timing("kill -9 of a replica -> its stand-ins and registration removed by the leader", time.Since(killed))

	start := time.Now()
	out, errOut, code := h.cli("delete", svc)
	took := time.Since(start)
	h.timing("delete of a service at zero with a replica dead for good", took)
	if code != 0 || strings.Contains(errOut, "still in Consul") {
		t.Errorf("delete: exit %d, or something left in Consul:\n%s%s", code, out, errOut)
	}
	if took > 10*time.Second {
		t.Errorf("delete took %s with a replica dead for good, want a few seconds", took)
	}
	found, checked := h.leftovers(svc, []string{rev})
	t.Logf("after delete:\n  %s", strings.Join(checked, "\n  "))
	if len(found) > 0 {
		t.Errorf("delete left: %v", found)
	}
	h.s.Timings.Note(h.scenario, "kill -9 of a replica -> its stand-ins and registration removed by the leader",
		"target: a few seconds (check interval 2 s, then 3 s of grace)")
	h.s.Timings.Note(h.scenario, "delete of a service at zero with a replica dead for good", "target: under 10 s")
}
