package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// rolloutRecord reads a service's record from Consul KV: the rollout the
// leader writes there (phase, step, history).
func (h *harness) rolloutRecord(svc string) consulroute.Record {
	h.t.Helper()
	p, _, err := h.consul.KV().Get(consulroute.RecordKey("", svc), nil)
	if err != nil || p == nil {
		h.t.Fatalf("record of %s: %v", svc, err)
	}
	var rec consulroute.Record
	if err := json.Unmarshal(p.Value, &rec); err != nil {
		h.t.Fatalf("record of %s: %v", svc, err)
	}
	return rec
}

// splitterWatch polls a service's service-splitter every 50 ms and keeps,
// per revision, when the splitter was first seen without it after it had
// carried traffic: when the splitter stopped sending it anything.
type splitterWatch struct {
	mu      sync.Mutex
	carried map[string]bool
	last    map[string]time.Time // last poll that saw the revision carry traffic
	zeroAt  map[string]time.Time
	polls   int
	errs    []string
	stop    context.CancelFunc
	done    chan struct{}
}

func (h *harness) watchSplitter(svc string) *splitterWatch {
	return startSplitterWatch(func() (map[string]float32, error) {
		e, _, err := h.consul.ConfigEntries().Get(consul.ServiceSplitter, svc, nil)
		if err != nil {
			return nil, err
		}
		sp, ok := e.(*consul.ServiceSplitterConfigEntry)
		if !ok {
			return nil, fmt.Errorf("service-splitter %s is a %T", svc, e)
		}
		weights := map[string]float32{}
		for _, x := range sp.Splits {
			weights[x.Service] += x.Weight
		}
		return weights, nil
	}, 50*time.Millisecond)
}

func startSplitterWatch(get func() (map[string]float32, error), every time.Duration) *splitterWatch {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	w := &splitterWatch{carried: map[string]bool{}, last: map[string]time.Time{}, zeroAt: map[string]time.Time{}, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			weights, err := get()
			now := time.Now()
			w.mu.Lock()
			w.polls++
			if err != nil {
				w.errs = append(w.errs, err.Error())
			} else {
				for rev := range w.carried {
					if weights[rev] == 0 && w.zeroAt[rev].IsZero() {
						w.zeroAt[rev] = now
					}
				}
				for rev, wt := range weights {
					if wt > 0 {
						w.carried[rev] = true
						w.last[rev] = now
						delete(w.zeroAt, rev)
					}
				}
			}
			w.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(every):
			}
		}
	}()
	return w
}

// zero is when the splitter was first seen without rev after it had it.
func (w *splitterWatch) zero(rev string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	z, ok := w.zeroAt[rev]
	return z, ok
}

// String says what the watch saw, for a failure message.
func (w *splitterWatch) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return fmt.Sprintf("%d polls, last carrying traffic %v, errors %v", w.polls, w.last, w.errs)
}

func (w *splitterWatch) Stop() { w.stop(); <-w.done }

// rolloutDeploy runs deploy and returns its output and exit code.
func (h *harness) rolloutDeploy(file string, extra ...string) (string, int) {
	h.t.Helper()
	args := append([]string{"deploy", "-sidecar-command", h.bin, "-wait", "3m"}, extra...)
	out, errOut, code := h.cli(append(args, file)...)
	return out + errOut, code
}

// Scenario 30: safe rollouts (issue 42), under steady load through the
// gateway. A good revision reaches 100 % within duration + one interval
// with no failed request; one answering 500 to 30 % of requests is rolled
// back at its first judged step (and the next deploy of the same spec says
// so); one three times slower is rolled back on latency; `rollback` during
// a rollout wins; kill -9 of the leader mid-rollout, and the next leader
// completes it with every step in Nomad's scaling events.
func TestE2E30Rollouts(t *testing.T) {
	h := newHarness(t, "30 rollouts")
	const svc = "e2e-rollout"
	h.cleanupService(svc)
	leader := h.startServe("e2e-30a", "", "")
	_ = leader

	// v1 answers in about 20 ms. min 1 for every revision: the scenario
	// judges steady capacity, not wakes.
	base := testService(svc)
	base.Scaling.Min = 1
	base.Env = map[string]string{"TESTAPP_NAME": "v1", "TESTAPP_SLEEP": "20ms"}
	h.deploy(h.writeServices("v1.hcl", base))
	rev1 := revision(svc, 1)
	// The load goes through a second replica, which survives the leader's
	// kill below and then leads.
	gw := h.startStandby(t, "e2e-30b", rev1)

	analysis := func(extra string) string {
		return "    analysis {\n      interval       = \"3s\"\n      min_requests   = 10\n      max_error_rate = \"2%\"\n" + extra + "    }"
	}
	with := func(name string, env map[string]string, rollout string) string {
		s := base
		s.Env = map[string]string{"TESTAPP_SLEEP": "20ms"}
		for k, v := range env {
			s.Env[k] = v
		}
		s.Env["TESTAPP_NAME"] = name
		s.Rollout = rollout
		return h.writeServices(name+".hcl", s)
	}

	load := StartLoad(context.Background(), gw.request(svc, "", "/", NewClient(16)), 6, 0, 15*time.Minute)
	defer load.Stop()
	time.Sleep(2 * time.Second)

	// 1. A good revision: steps 10 % and 50 %, 3 s each: 100 % within
	// 6 s + one interval of the rollout's start, no failed request.
	goodStart := time.Now()
	out, code := h.rolloutDeploy(with("v2", nil, "    duration = \"6s\"\n    steps = [10, 50]\n"+analysis("")))
	if code != 0 {
		t.Fatalf("deploy of a good revision exited %d:\n%s", code, out)
	}
	rev2 := revision(svc, 2)
	rec := h.rolloutRecord(svc)
	ro := rec.Rollout
	if ro == nil || ro.Phase != consulroute.RolloutCompleted || ro.New != rev2 {
		t.Fatalf("after the good deploy the record's rollout is %+v", ro)
	}
	took := ro.EndedAt.Sub(ro.StartedAt)
	h.timing("good revision: rollout start -> 100 %", took)
	if took > 9*time.Second {
		t.Errorf("the good rollout took %s, more than its duration 6s plus one interval 3s", took)
	}
	for _, want := range []string{"step 1 of 2", "10%: " + rev2, "| " + rev1, "pass:", "completed"} {
		if !strings.Contains(out, want) {
			t.Errorf("deploy's output lacks %q:\n%s", want, out)
		}
	}
	if s := h.splits(svc); len(s) != 1 || s[rev2] != 100 {
		t.Errorf("after completion the splitter is %v, want %s 100", s, rev2)
	}
	if f := load.Snapshot().Failed(); countWithin(f, goodStart, time.Now()) > 0 {
		t.Errorf("requests failed during the good rollout: %s", load.Snapshot().Summary())
	}
	t.Logf("good rollout: %s from start to 100 %%", took)

	// 2. 30 % errors: rolled back at its first judged step.
	rev3 := revision(svc, 3)
	sw := h.watchSplitter(svc)
	badStart := time.Now()
	badFile := with("v3", map[string]string{"TESTAPP_FAIL_PERCENT": "30"}, "    steps = [10, 50]\n"+analysis(""))
	out, code = h.rolloutDeploy(badFile)
	// The watch goes on until it saw the splitter without the revision,
	// which deploy's answer does not wait for.
	eventually(t, 15*time.Second, "the service-splitter without "+rev3, func() (bool, string) {
		_, ok := sw.zero(rev3)
		return ok, sw.String()
	})
	sw.Stop()
	if code != 1 || !strings.Contains(out, "rolled back to "+rev2) || !strings.Contains(out, "error rate") || !strings.Contains(out, "> 2% over") || !strings.Contains(out, "at step 10%") {
		t.Fatalf("deploy of a revision failing 30 %% exited %d (want 1 with the reason):\n%s", code, out)
	}
	ro = h.rolloutRecord(svc).Rollout
	if ro.Phase != consulroute.RolloutRolledBack || ro.Step != 1 {
		t.Errorf("bad rollout: phase %s at step %d, want rolled_back at step 1", ro.Phase, ro.Step)
	}
	res := load.Snapshot()
	var stepAt time.Time
	for _, ev := range ro.History {
		if ev.Kind == "step_started" {
			stepAt = ev.At
		}
	}
	var reached, failed, during int
	var lastV3 time.Time
	for _, o := range res {
		if !o.Start.Before(stepAt) && !o.Start.After(ro.EndedAt) {
			during++
		}
		if o.App == "v3" && o.Start.After(badStart) {
			reached++
			if o.Status >= 500 {
				failed++
			}
			if o.Start.After(lastV3) {
				lastV3 = o.Start
			}
		}
	}
	t.Logf("failing revision: %d requests reached it (%d failed) of %d sent while its step was held; reason: %s", reached, failed, during, ro.Reason)
	h.s.Timings.Note(h.scenario, "failing revision: requests that reached it", fmt.Sprintf("%d (%d failed) of %d sent during its 10%% step", reached, failed, during))
	// Its exposure is about its step's share: 10 %, with room for the
	// requests between the verdict and the route's change.
	if during > 0 && float64(reached) > 0.2*float64(during) {
		t.Errorf("%d of %d requests reached the failing revision at a 10 %% step", reached, during)
	}
	if !lastV3.IsZero() {
		// Signed: a request routed to it that started before the verdict
		// (its last slot came up before) reads negative.
		h.s.Timings.Note(h.scenario, "failing revision: verdict -> gateway holds 0 %",
			fmt.Sprintf("last request routed to it started %s after the verdict", lastV3.Sub(ro.EndedAt).Round(time.Millisecond)))
	}
	t.Logf("splitter watch: %s; verdict at %s", sw, ro.EndedAt.Format(time.RFC3339Nano))
	if z, ok := sw.zero(rev3); ok {
		h.timing("failing revision: verdict -> service-splitter holds 0 %", max(0, z.Sub(ro.EndedAt)))
	} else {
		t.Errorf("the splitter never went back to 0 for %s (%s)", rev3, sw)
	}
	if s := h.splits(svc); len(s) != 1 || s[rev2] != 100 {
		t.Errorf("after the rollback the splitter is %v, want %s 100", s, rev2)
	}
	// The next deploy of the same spec says so before trying it again.
	out, code = h.rolloutDeploy(badFile)
	if code != 1 || !strings.Contains(out, "revision "+rev3+" of this spec was rolled back") {
		t.Errorf("a second deploy of the failed spec exited %d without saying it failed before:\n%s", code, out)
	}

	// 3. Three times slower: rolled back on latency.
	out, code = h.rolloutDeploy(with("v4", map[string]string{"TESTAPP_SLEEP": "60ms"}, "    steps = [10, 50]\n"+analysis("      max_latency    = \"1.5x\"\n")))
	if code != 1 || !strings.Contains(out, "p99 latency") {
		t.Errorf("deploy of a revision 3x slower exited %d, want 1 on latency:\n%s", code, out)
	}

	// 4. rollback during a rollout: the person wins.
	rev5 := revision(svc, 5)
	out, code = h.rolloutDeploy(with("v5", nil, "    duration = \"60s\"\n    steps = [10, 50]\n"+analysis("")), "-detach")
	if code != 0 {
		t.Fatalf("deploy -detach exited %d:\n%s", code, out)
	}
	eventually(t, 60*time.Second, rev5+" at its first step", func() (bool, string) {
		ro := h.rolloutRecord(svc).Rollout
		return ro != nil && ro.New == rev5 && ro.Step >= 1, fmt.Sprintf("%+v", ro)
	})
	if out := h.mustCLI("rollback", svc); !strings.Contains(out, "rolled back to "+rev2) {
		t.Errorf("rollback printed:\n%s", out)
	}
	eventually(t, 15*time.Second, "the leader stops the rollout of "+rev5, func() (bool, string) {
		for _, e := range h.scalingEvents(rev5) {
			if strings.Contains(e.Message, "stopped") {
				return true, ""
			}
		}
		return false, "no stop in the scaling events"
	})
	if s := h.splits(svc); len(s) != 1 || s[rev2] != 100 {
		t.Errorf("after rollback the splitter is %v, want %s 100", s, rev2)
	}
	status := h.mustCLI("status", svc)
	if !strings.Contains(status, "rolled_back") || !strings.Contains(status, "rolled back by a person to "+rev2) || !strings.Contains(status, "rollout failed") {
		t.Errorf("status does not show the rollback:\n%s", status)
	}

	// 5. kill -9 of the leader mid-rollout: the next leader resumes and
	// completes it, every step in the scaling events.
	rev6 := revision(svc, 6)
	out, code = h.rolloutDeploy(with("v6", nil, "    duration = \"12s\"\n    steps = [10, 50]\n"+analysis("")), "-detach")
	if code != 0 {
		t.Fatalf("deploy -detach exited %d:\n%s", code, out)
	}
	eventually(t, 60*time.Second, rev6+" at its first step", func() (bool, string) {
		ro := h.rolloutRecord(svc).Rollout
		return ro != nil && ro.New == rev6 && ro.Step >= 1, fmt.Sprintf("%+v", ro)
	})
	killed := time.Now()
	if err := syscall.Kill(leader.proc.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	took = eventually(t, 90*time.Second, "the next leader completes the rollout of "+rev6, func() (bool, string) {
		ro := h.rolloutRecord(svc).Rollout
		return ro.New == rev6 && ro.Phase == consulroute.RolloutCompleted, fmt.Sprintf("%s step %d", ro.Phase, ro.Step)
	})
	h.timing("kill -9 of the leader mid-rollout -> completed on the next leader", took)
	var msgs []string
	for _, e := range h.scalingEvents(rev6) {
		msgs = append(msgs, e.Message)
	}
	all := strings.Join(msgs, "\n")
	for _, want := range []string{"step 1 of 2", "resumed", "step 2 of 2", "completed"} {
		if !strings.Contains(all, want) {
			t.Errorf("scaling events of %s lack %q:\n%s", rev6, want, all)
		}
	}
	_ = killed

	res = load.Stop()
	t.Logf("load: %s", res.Summary())
	for _, o := range res.Failed() {
		if o.App != "v3" {
			t.Errorf("a request failed that the failing revision did not answer: %s at %s", o.Describe(), o.Start.Format(time.RFC3339Nano))
			break
		}
	}
}

// countWithin counts outcomes that started in [from, to].
func countWithin(r Result, from, to time.Time) int {
	n := 0
	for _, o := range r {
		if !o.Start.Before(from) && !o.Start.After(to) {
			n++
		}
	}
	return n
}
