package e2e

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// registrations lists every catalog instance of a revision (stand-ins
// too) as "ID (tags)".
func (h *harness) registrations(rev string) []string {
	h.t.Helper()
	inst, _, err := h.consul.Catalog().Service(rev, "", nil)
	if err != nil {
		h.t.Fatalf("catalog instances of %s: %v", rev, err)
	}
	var out []string
	for _, s := range inst {
		out = append(out, s.ServiceID+" ("+strings.Join(s.ServiceTags, ",")+")")
	}
	return out
}

// waitStandIn waits until Consul lists a passing stand-in of rev
// registered by replica.
func (h *harness) waitStandIn(rev, replica string, timeout time.Duration) {
	h.t.Helper()
	eventually(h.t, timeout, "a passing stand-in of "+rev+" from "+replica, func() (bool, string) {
		for _, e := range h.standIns(rev) {
			if e.Service.Meta["replica"] == replica && e.Checks.AggregatedStatus() == "passing" {
				return true, ""
			}
		}
		return false, fmt.Sprintf("registrations %v", h.registrations(rev))
	})
}

// Scenario 19: a revision purged by hand (`nomad job stop -purge`, not
// `delete`) leaves nothing of itself in Consul: serve hears of the purge
// only through Nomad's JobDeregistered evaluation, and removes its
// stand-in. And a revision purged while the replica holding its stand-in
// is down (kill -9) loses the stand-in as soon as that replica starts
// again: it takes back the stand-ins of its earlier run and removes those
// of revisions Nomad no longer has.
func TestE2E19PurgedByHand(t *testing.T) {
	h := newHarness(t, "19 purge by hand")
	const svcA, svcB = "e2e-purge-a", "e2e-purge-b"
	revA, revB := revision(svcA, 1), revision(svcB, 1)
	h.cleanupService(svcA)
	h.cleanupService(svcB)

	const replica = "e2e-19"
	g := h.startServe(replica, "", "")
	h.deploy(h.writeServices("purge.hcl", testService(svcA), testService(svcB)))
	h.waitZero(revA, 90*time.Second)
	h.waitZero(revB, 90*time.Second)
	h.waitStandIn(revA, replica, 30*time.Second)
	h.waitStandIn(revB, replica, 30*time.Second)

	// 1. Purged by hand while serve runs.
	start := time.Now()
	if _, _, err := h.nomad.Jobs().Deregister(revA, true, nil); err != nil {
		t.Fatalf("purge %s: %v", revA, err)
	}
	eventually(t, 30*time.Second, "nothing of "+revA+" left in Consul's catalog after a purge by hand", func() (bool, string) {
		regs := h.registrations(revA)
		return len(regs) == 0, fmt.Sprintf("registrations %v", regs)
	})
	h.timing("purge by hand -> no stand-in in Consul", time.Since(start))
	eventually(t, 30*time.Second, "the gateway forgets "+revA, func() (bool, string) {
		_, ok := g.gatewayView(t)[revA]
		return !ok, "the gateway's view still lists " + revA
	})

	// 2. Purged while the replica holding the stand-in is down.
	if err := g.proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 serve: %v", err)
	}
	if _, err := g.proc.Wait(10 * time.Second); err != nil {
		t.Fatalf("serve did not die: %v", err)
	}
	if _, _, err := h.nomad.Jobs().Deregister(revB, true, nil); err != nil {
		t.Fatalf("purge %s: %v", revB, err)
	}
	// The dead replica's stand-in outlives it (it has no check; with no
	// other replica to reap it), so the restart has something to clean.
	if regs := h.registrations(revB); len(regs) == 0 {
		t.Fatalf("the killed replica's stand-in of %s is already gone; the restart has nothing to clean", revB)
	}
	start = time.Now()
	p := h.startFollower(replica)
	eventually(t, 30*time.Second, "the restarted replica removes its earlier run's stand-in of "+revB, func() (bool, string) {
		select {
		case <-p.Done():
			t.Fatalf("serve exited:\n%s", p.Output())
		default:
		}
		regs := h.registrations(revB)
		return len(regs) == 0, fmt.Sprintf("registrations %v", regs)
	})
	h.timing("replica restart -> stand-in of a revision purged while it was down removed", time.Since(start))
}

// startFollower runs `serve` as replica and waits only until its admin API
// answers: unlike startServe it does not wait to lead (a replica killed
// with -9 leaves its lock session to expire first).
func (h *harness) startFollower(replica string) *testbin.Proc {
	h.t.Helper()
	listen := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(h.t))
	admin := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(h.t))
	p := testbin.Start(h.t, h.bin, []string{"serve", "-listen", listen, "-admin-listen", admin, "-domain", "localhost", "-replica", replica}, h.env)
	client := NewClient(1)
	eventually(h.t, 30*time.Second, "serve "+replica+" answers /healthz on "+admin, func() (bool, string) {
		select {
		case <-p.Done():
			h.t.Fatalf("serve exited:\n%s", p.Output())
		default:
		}
		status, _, err := getBody(client, "http://"+admin+"/healthz")
		if err != nil {
			return false, err.Error()
		}
		return status == http.StatusOK, fmt.Sprintf("status %d", status)
	})
	return p
}
