package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// fakeResources answers Utilization from a table: allocation ID -> percent
// or error, and counts the calls.
type fakeResources struct {
	mu      sync.Mutex
	percent map[string]float64
	errs    map[string]error
	calls   []string // "revision/alloc/metric"
}

func newFakeResources() *fakeResources {
	return &fakeResources{percent: map[string]float64{}, errs: map[string]error{}}
}

func (f *fakeResources) Utilization(_ context.Context, revision, allocID string, m spec.Metric) (float64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, revision+"/"+allocID+"/"+string(m))
	if err := f.errs[allocID]; err != nil {
		return 0, err
	}
	v, ok := f.percent[allocID]
	if !ok {
		return 0, errors.New("fake resources: unknown allocation " + allocID)
	}
	return v, nil
}

func (f *fakeResources) set(allocID string, percent float64) {
	f.mu.Lock()
	f.percent[allocID] = percent
	delete(f.errs, allocID)
	f.mu.Unlock()
}

func (f *fakeResources) fail(allocID string, err error) {
	f.mu.Lock()
	f.errs[allocID] = err
	f.mu.Unlock()
}

func (f *fakeResources) takeCalls() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls
	f.calls = nil
	return c
}

// nomadInstances returns n instances of rev with the Consul service IDs
// Nomad gives them, and their allocation IDs.
func nomadInstances(rev string, n int) ([]consulroute.Instance, []string) {
	insts := make([]consulroute.Instance, n)
	ids := make([]string, n)
	for i := range insts {
		ids[i] = fmt.Sprintf("%08d-1111-2222-3333-444455556666", i)
		insts[i] = consulroute.Instance{
			ID:       "_nomad-task-" + ids[i] + "-group-app-" + rev + "-http",
			Revision: rev, Address: "127.0.0.1", Port: 20000 + i, AdminPort: 30000 + i,
		}
	}
	return insts, ids
}

// TestAutoscalerScalesOnCPU runs the loop for a revision scaled on cpu:
// its instances' usage comes from the resource reader (not the sidecars),
// feeds the same windows, scales up with the reason a user reads in
// Nomad's scaling events, holds on missing stats and goes down to min,
// never zero. A concurrency revision beside it never reaches the reader.
func TestAutoscalerScalesOnCPU(t *testing.T) {
	res := newFakeResources()
	a, cat, scr, sc, clk := newTestAutoscaler(t, func(c *Config) { c.Resources = res })
	const rev, other = "burn-00001", "hello-00001"
	cat.SetRevision(testRevision(rev, 1, func(s *spec.Scaling) {
		s.Metric, s.Target, s.Min, s.Max, s.Window = spec.MetricCPU, 50, 1, 4, 6*time.Second
	}))
	insts, ids := nomadInstances(rev, 4)
	cat.SetReady(rev, insts[:1])
	cat.SetRevision(testRevision(other, 1, nil))
	cat.SetReady(other, instances(other, 1))
	scr.set(other+"-i0", 1)
	res.set(ids[0], 120)

	l := startLoop(t, a)
	ctx := context.Background()
	tickN(ctx, l, clk, 1, 2*time.Second)
	calls := sc.Calls()
	if len(calls) != 1 || calls[0].Revision != rev || calls[0].Count != 3 {
		t.Fatalf("calls %+v, want one scale of %s to 3 (120%% of reserved over a 50%% target)", calls, rev)
	}
	if want := "panic: cpu 120% of reserved > target 50%"; calls[0].Reason != want {
		t.Errorf("reason %q, want %q", calls[0].Reason, want)
	}
	if m := calls[0].Meta; m["metric"] != "cpu" || m["stable"] != "120.00" {
		t.Errorf("meta %v, want metric cpu and stable 120.00", m)
	}
	if got := res.takeCalls(); len(got) != 1 || got[0] != rev+"/"+ids[0]+"/cpu" {
		t.Errorf("resource reads %v, want one for %s's allocation (none for the concurrency revision)", got, rev)
	}
	if scr.seen[insts[0].ID] != 0 {
		t.Errorf("the cpu revision's sidecar was scraped %d times, want 0", scr.seen[insts[0].ID])
	}
	st, _ := a.State(rev)
	if st.Metric != spec.MetricCPU || st.Target != 50 || st.Stable != 120 {
		t.Errorf("state %+v, want metric cpu, target 50, stable 120", st)
	}

	// Three instances ready, one of them unread: the idle two say 10%,
	// which would scale down; missing stats hold the count.
	cat.SetReady(rev, insts[:3])
	res.set(ids[0], 10)
	res.set(ids[1], 10)
	res.fail(ids[2], errors.New("Nomad unreachable"))
	// Let panic mode (a stable window past its last tick over the
	// threshold) end first.
	tickN(ctx, l, clk, 5, 2*time.Second)
	n := len(sc.Calls())
	tickN(ctx, l, clk, 1, 2*time.Second)
	if st, _ := a.State(rev); st.Rule != RuleMissingStats || st.Desired != 3 || len(sc.Calls()) != n {
		t.Fatalf("state %+v after calls %+v; want missing-stats holding 3 and no call", st, sc.Calls())
	}
	if st, _ := a.State(rev); st.ScrapeFailures == 0 {
		t.Errorf("scrape failures 0 with an allocation's stats failing")
	}

	// All read again, all idle: down to min 1, never 0.
	res.set(ids[2], 0)
	res.set(ids[0], 0)
	res.set(ids[1], 0)
	tickN(ctx, l, clk, 10, 2*time.Second)
	calls = sc.Calls()
	last := calls[len(calls)-1]
	if last.Revision != rev || last.Count != 1 {
		t.Fatalf("last call %+v, want %s scaled to 1", last, rev)
	}
	if !strings.Contains(last.Reason, "cpu") || !strings.Contains(last.Reason, "< target 50%") {
		t.Errorf("scale-down reason %q does not say cpu below target 50%%", last.Reason)
	}
	for _, c := range calls {
		if c.Count == 0 {
			t.Fatalf("a cpu revision was scaled to zero: %+v", c)
		}
	}
}

// TestAutoscalerCPUWithoutReader: a serve built without a resource reader
// (or whose reads all fail) has no data for cpu revisions: they stay put.
func TestAutoscalerCPUWithoutReader(t *testing.T) {
	a, cat, _, sc, clk := newTestAutoscaler(t, nil)
	const rev = "burn-00001"
	cat.SetRevision(testRevision(rev, 2, func(s *spec.Scaling) { s.Metric, s.Target, s.Min = spec.MetricCPU, 70, 1 }))
	insts, _ := nomadInstances(rev, 2)
	cat.SetReady(rev, insts)
	l := startLoop(t, a)
	tickN(context.Background(), l, clk, 60, 2*time.Second)
	if calls := sc.Calls(); len(calls) != 0 {
		t.Fatalf("calls %+v, want none without usage data", calls)
	}
	st, _ := a.State(rev)
	if st.Rule != RuleNoData || st.Desired != 2 || st.ScrapeFailures != 120 {
		t.Fatalf("state %+v, want no-data keeping 2 and 120 failed reads", st)
	}
}

// Scaling changes in place: a revision moved from concurrency to cpu drops
// its concurrency samples (another unit) rather than averaging them with
// percentages, and holds its count until cpu samples arrive.
func TestAutoscalerMetricChangeEmptiesTheWindow(t *testing.T) {
	res := newFakeResources()
	a, cat, scr, sc, clk := newTestAutoscaler(t, func(c *Config) { c.Resources = res })
	const rev = "burn-00001"
	insts, ids := nomadInstances(rev, 2)
	cat.SetRevision(testRevision(rev, 2, nil))
	cat.SetReady(rev, insts)
	for _, in := range insts {
		scr.set(in.ID, 60)
	}
	l := startLoop(t, a)
	ctx := context.Background()
	tickN(ctx, l, clk, 3, 2*time.Second)
	if st, _ := a.State(rev); st.Stable != 120 || st.Metric != spec.MetricConcurrency {
		t.Fatalf("state %+v, want 120 concurrent", st)
	}
	calls := len(sc.Calls())

	cat.SetRevision(testRevision(rev, 2, func(s *spec.Scaling) { s.Metric, s.Target, s.Min = spec.MetricCPU, 50, 1 }))
	for _, id := range ids {
		res.fail(id, errors.New("not measured yet"))
	}
	tickN(ctx, l, clk, 1, 2*time.Second)
	if st, _ := a.State(rev); st.Rule != RuleNoData || st.Desired != 2 || st.Metric != spec.MetricCPU {
		t.Fatalf("state %+v, want cpu with no data, keeping 2", st)
	}
	res.set(ids[0], 30)
	res.set(ids[1], 40)
	tickN(ctx, l, clk, 1, 2*time.Second)
	if st, _ := a.State(rev); st.Stable != 70 {
		t.Fatalf("stable %v, want 70 (cpu samples only)", st.Stable)
	}
	if got := sc.Calls()[calls:]; len(got) > 0 && got[0].Count < 2 {
		t.Errorf("scaled down to %d on the change of metric", got[0].Count)
	}
}
