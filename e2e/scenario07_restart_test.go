package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// Scenario 7: restarting `serve` under load: requests continue, or fail only
// while it is down (and then only as refused connections, which a client
// retries); no scale to zero on missing data; scaling resumes from state
// rebuilt from Nomad and Consul.
func TestE2E7RestartServeUnderLoad(t *testing.T) {
	h := newHarness(t, "7 restart serve")
	const svc = "e2e-restart"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-7a", "", "")
	h.deploy(h.writeServices("restart.hcl", testService(svc)))

	client := NewClient(64)
	load := StartLoad(context.Background(), g.request(svc, "", "/?sleep=20ms", client), 4, 0, 4*time.Minute)
	defer load.Stop()
	time.Sleep(3 * time.Second)
	countBefore, err := h.groupCount(rev)
	if err != nil || countBefore < 1 {
		t.Fatalf("before the restart: count %d, %v", countBefore, err)
	}

	down := time.Now()
	g.stop(t)
	stopped := time.Now()
	h.timing("serve SIGTERM -> exited (drain)", stopped.Sub(down))
	time.Sleep(2 * time.Second)
	g2 := h.startServe("e2e-7b", g.listen, g.admin)
	up := time.Now()
	h.timing("serve down (stop begun -> new one healthy)", up.Sub(down))
	// A second after the new serve is healthy, every request succeeds again.
	settle := up.Add(time.Second)
	time.Sleep(5 * time.Second)

	// Scaling resumes: more load raises the count, decided by the new serve.
	heavy := StartLoad(context.Background(), g2.request(svc, "", "/?sleep=200ms", client), 20, 0, 3*time.Minute)
	defer heavy.Stop()
	took := eventually(t, 90*time.Second, "the restarted serve scales "+rev+" up", func() (bool, string) {
		for _, e := range h.scalingEvents(rev) {
			if !e.Error && e.Count != nil && *e.Count > e.PreviousCount && e.PreviousCount >= 1 && time.Unix(0, int64(e.Time)).After(up) {
				return true, ""
			}
		}
		n, _ := h.groupCount(rev)
		return false, fmt.Sprintf("count %d, no scale-up event since the restart", n)
	})
	h.timing("restarted serve: heavy load -> scale-up event", took)
	heavy.Stop()
	res := load.Stop()
	t.Logf("load: %s", res.Summary())

	// Failures only while serve was down, and only refused connections.
	for _, o := range res.Failed() {
		if o.Start.Before(down) || o.Start.After(settle) {
			t.Errorf("request at %s failed outside the restart window [%s, %s]: %s",
				o.Start.Format("15:04:05.000"), down.Format("15:04:05.000"), settle.Format("15:04:05.000"), o.Describe())
		}
	}
	// Requests caught on a keep-alive connection as the old serve closed it
	// may end in EOF rather than a refused connection; they are inside the
	// window above, so they are reported, not failed.
	if lost := res.Lost(); len(lost) > 0 {
		t.Logf("failures across the restart other than refused connections: %s", lost.Summary())
	}
	// But no answer is wrong: the new serve takes requests only once its
	// catalog is loaded, so it never says a running service does not
	// exist (it answered 404 before it waited).
	var answered Result
	for _, o := range res.Lost() {
		if o.Err == nil {
			answered = append(answered, o)
		}
	}
	if len(answered) > 0 {
		t.Errorf("answered wrongly across the restart, from %s: %s", answered[0].Start.Format("15:04:05.000"), answered.Summary())
	}

	// Nobody scaled the revision to zero for lack of data.
	for _, e := range h.scalingEvents(rev) {
		at := time.Unix(0, int64(e.Time))
		if e.Count != nil && *e.Count == 0 && at.After(down) && at.Before(up.Add(10*time.Second)) {
			t.Errorf("scaled to 0 at %s across the restart: %q", at.Format("15:04:05.000"), e.Message)
		}
	}

	// The new serve's state names the revision, rebuilt from Nomad and
	// Consul, not remembered: the gateway routes to the instances Nomad
	// runs, and the autoscaler (the new serve leads) counts them.
	// (Scale-down may be under way: the views converge.)
	eventually(t, 15*time.Second, "the restarted gateway routes "+rev+" to the allocations Nomad runs", func() (bool, string) {
		live := map[string]bool{}
		for _, a := range h.liveAllocs(rev) {
			live[a.ID] = true
		}
		view := g2.gatewayView(t)[rev]
		routed := 0
		for _, in := range view.Instances {
			if !live[in.Alloc] {
				return false, fmt.Sprintf("routes to %s (allocation %s), which Nomad does not run", in.Address, in.Alloc)
			}
			routed++
		}
		return routed > 0 && routed == len(live), fmt.Sprintf("%d routed, %d running", routed, len(live))
	})
	eventually(t, 15*time.Second, "the restarted autoscaler counts "+rev+"'s instances", func() (bool, string) {
		auto, err := g2.autoscalerView(svc)
		if err != nil {
			return false, "admin /v1/autoscaler/revisions: " + err.Error()
		}
		return auto[rev].Count >= 1, fmt.Sprintf("admin /v1/autoscaler/revisions: %+v", auto)
	})
}
