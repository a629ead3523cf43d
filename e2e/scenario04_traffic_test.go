package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"
)

// recentApps counts which app answered the last n successful requests that
// started after since.
func recentApps(r Result, since time.Time, n int) (map[string]int, int) {
	var ok Result
	for _, o := range r {
		if o.OK() && o.Start.After(since) {
			ok = append(ok, o)
		}
	}
	if len(ok) > n {
		ok = ok[len(ok)-n:]
	}
	return ok.ByApp(), len(ok)
}

// twoRevisions deploys v1 of svc, then v2 with traffic pinned to v1 (so v2
// exists and is ready but gets nothing yet), both with min 1; min holds
// only while a route reaches the revision, so v2 goes to zero while
// pinned away and wakes once it gets a share.
func (h *harness) twoRevisions(svc string, v2Traffic []Traffic) (rev1, rev2 string) {
	h.t.Helper()
	rev1, rev2 = revision(svc, 1), revision(svc, 2)
	s := testService(svc)
	s.Scaling.Min = 1
	h.deploy(h.writeServices(svc+"-v1.hcl", s))
	s.Env = map[string]string{"TESTAPP_NAME": "v2"}
	s.Traffic = v2Traffic
	start := time.Now()
	out := h.deploy(h.writeServices(svc+"-v2.hcl", s))
	h.timing("deploy of a second revision", time.Since(start))
	if out.Registered[rev2] != 2 || out.Ready[rev2].Passing < 1 {
		h.t.Errorf("deploy of v2 did not report %s registered and ready:\n%s", rev2, out.Text)
	}
	if len(h.passing(rev2)) == 0 {
		h.t.Fatalf("deploy returned before %s had a passing instance", rev2)
	}
	return rev1, rev2
}

// Scenario 4: a new revision, traffic 50/50 then 100 to it, under load: no
// failed request.
func TestE2E4TrafficSplitUnderLoad(t *testing.T) {
	h := newHarness(t, "4 traffic split")
	const svc = "e2e-split"
	h.cleanupService(svc)
	g := h.startServe("e2e-4", "", "")
	rev1 := revision(svc, 1)
	rev1, rev2 := h.twoRevisions(svc, []Traffic{{Revision: rev1, Percent: 100}})
	if s := h.splits(svc); len(s) != 1 || s[rev1] != 100 {
		t.Fatalf("after deploying %s pinned to %s the splitter is %v", rev2, rev1, s)
	}
	// traffic prints the route it published, in deploy's words.
	if out := h.mustCLI("traffic", "-to", rev1+"=100", svc); !strings.Contains(out, svc+": route published ("+rev1+" 100%)") {
		t.Errorf("traffic -to %s=100 printed:\n%s", rev1, out)
	}

	load := StartLoad(context.Background(), g.request(svc, "", "/?sleep=20ms", NewClient(32)), 8, 0, 3*time.Minute)
	defer load.Stop()
	time.Sleep(2 * time.Second)
	if apps, n := recentApps(load.Snapshot(), time.Time{}, 100); apps["v1"] != n || n == 0 {
		t.Fatalf("before the split, answers came from %v", apps)
	}

	// 50/50: Consul's splitter says so, and both revisions answer.
	h.mustCLI("traffic", "-to", rev1+"=50", "-to", rev2+"=50", svc)
	changed := time.Now()
	if s := h.splits(svc); s[rev1] != 50 || s[rev2] != 50 {
		t.Errorf("service-splitter after traffic 50/50: %v", s)
	}
	took := eventually(t, 30*time.Second, "both revisions answer after the 50/50 split", func() (bool, string) {
		apps, n := recentApps(load.Snapshot(), changed, 200)
		return n >= 100 && apps["v1"] >= n/5 && apps["v2"] >= n/5, fmt.Sprintf("%v of %d", apps, n)
	})
	h.timing("traffic 50/50 -> both revisions answering", took)

	// 100 to the new one: the splitter names only it, and only it answers.
	h.mustCLI("traffic", "-to", rev2+"=100", svc)
	changed = time.Now()
	if s := h.splits(svc); len(s) != 1 || s[rev2] != 100 {
		t.Errorf("service-splitter after traffic 100 to %s: %v", rev2, s)
	}
	took = eventually(t, 30*time.Second, "only "+rev2+" answers after traffic 100", func() (bool, string) {
		apps, n := recentApps(load.Snapshot(), changed, 100)
		return n >= 100 && apps["v2"] == n, fmt.Sprintf("%v of %d", apps, n)
	})
	h.timing("traffic 100 -> only the new revision answering", took)

	res := load.Stop()
	t.Logf("load: %s", res.Summary())
	if f := res.Failed(); len(f) > 0 {
		t.Errorf("requests failed during the traffic changes: %s", res.Summary())
	}

	// No route reaches rev1 any more: its min of 1 no longer holds and it
	// goes to zero once idle, as in Knative (the soak found every deploy
	// leaving the previous revision running until garbage collection).
	// rev2, routed, keeps its min.
	took = eventually(t, 60*time.Second, rev1+", left behind, at zero despite its min", func() (bool, string) {
		n, err := h.groupCount(rev1)
		return err == nil && n == 0, fmt.Sprintf("count %d, %v", n, err)
	})
	h.timing("traffic moved away -> the old revision at zero", took)
	if n, err := h.groupCount(rev2); err != nil || n < 1 {
		t.Errorf("%s, routed, has count %d (%v), want at least its min 1", rev2, n, err)
	}
}

// chain reads and summarizes Consul's compiled discovery chain of a service.
func (h *harness) chain(service string) ChainSummary {
	h.t.Helper()
	resp, _, err := h.consul.DiscoveryChain().Get(service, nil, nil)
	if err != nil || resp == nil {
		h.t.Fatalf("discovery chain of %s: %v", service, err)
	}
	return SummarizeChain(resp.Chain)
}
