package autoscaler

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// startLoop returns a loop of a as Run would make it, with a marked running
// so the demand methods accept calls; the test drives ticks by hand.
func startLoop(t *testing.T, a *Autoscaler) *loop {
	t.Helper()
	if !a.running.CompareAndSwap(false, true) {
		t.Fatal("autoscaler already running")
	}
	l := newLoop(a)
	t.Cleanup(func() {
		l.applies.Wait()
		a.running.Store(false)
	})
	return l
}

// tickN runs n full ticks, step apart, waiting for scale calls after each.
func tickN(ctx context.Context, l *loop, clk *clock, n int, step time.Duration) {
	for range n {
		l.tickAll(ctx)
		l.applies.Wait()
		clk.Advance(step)
	}
}

func TestNewValidatesConfig(t *testing.T) {
	cat := newTestCatalog()
	sc := &recordingScaler{}
	for _, c := range []struct {
		name string
		cfg  Config
		want string
	}{
		{"no revisions", Config{Scaler: sc}, "Revisions is nil"},
		{"no scaler", Config{Revisions: cat}, "Scaler is nil"},
		{"negative tick", Config{Revisions: cat, Scaler: sc, Tick: -1}, "must not be negative"},
		{"tiny tick", Config{Revisions: cat, Scaler: sc, Tick: time.Microsecond}, "too short"},
		{"negative retries", Config{Revisions: cat, Scaler: sc, RetryAttempts: -1}, "must not be negative"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := New(c.cfg)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("New: %v, want an error containing %q", err, c.want)
			}
		})
	}
	a, err := New(Config{Revisions: cat, Scaler: sc})
	if err != nil {
		t.Fatal(err)
	}
	if a.cfg.Tick != 2*time.Second || a.cfg.ScrapeTimeout != time.Second {
		t.Fatalf("defaults: tick %s scrape timeout %s, want 2s and 1s", a.cfg.Tick, a.cfg.ScrapeTimeout)
	}
}

func TestLoopScalesOnScrapedConcurrency(t *testing.T) {
	ctx := context.Background()
	a, cat, scr, sc, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 1, nil))
	cat.SetReady("hello-00001", instances("hello-00001", 1))
	scr.set("hello-00001-i0", 150)
	l := startLoop(t, a)

	tickN(ctx, l, clk, 1, 2*time.Second)
	calls := sc.Calls()
	if len(calls) != 1 || calls[0].Count != 3 {
		t.Fatalf("calls %+v, want one call for 3 instances (150 concurrent / 70 per instance)", calls)
	}
	if !strings.HasPrefix(calls[0].Reason, "panic: 150.0 concurrent per instance over 70.0 target") {
		t.Errorf("reason %q", calls[0].Reason)
	}
	if calls[0].Meta["panic_mode"] != "true" || calls[0].Meta["stable"] != "150.00" {
		t.Errorf("meta %v", calls[0].Meta)
	}

	// The instances come up and share the load: the count holds.
	cat.SetReady("hello-00001", instances("hello-00001", 3))
	for i := range 3 {
		scr.set(instances("hello-00001", 3)[i].ID, 50)
	}
	tickN(ctx, l, clk, 10, 2*time.Second)
	if n := len(sc.Calls()); n != 1 {
		t.Fatalf("%d scale calls, want 1: a count that does not change is not applied", n)
	}
	st, ok := a.State("hello-00001")
	if !ok || st.Desired != 3 || st.Count != 3 || st.Actual != 3 || st.Stable != 150 || st.Service != "hello" {
		t.Fatalf("state %+v, %v", st, ok)
	}
	if st.LastReason != calls[0].Reason || st.LastScale.IsZero() || st.ScaleCalls != 1 {
		t.Fatalf("state does not record the last scale: %+v", st)
	}
}

func TestLoopFailedScrapeIsUnknownNotZero(t *testing.T) {
	ctx := context.Background()
	a, cat, scr, sc, clk := newTestAutoscaler(t, nil)
	insts := instances("hello-00001", 3)
	cat.SetRevision(testRevision("hello-00001", 3, nil))
	cat.SetReady("hello-00001", insts)
	for _, in := range insts {
		scr.set(in.ID, 60)
	}
	scr.fail(insts[2].ID, errors.New("connection refused"))
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 2*time.Second)
	st, _ := a.State("hello-00001")
	// Two answered 60 each: the unknown third is assumed alike, not idle.
	if st.Stable != 180 || st.ScrapeFailures != 1 {
		t.Fatalf("stable %v scrape failures %d, want 180 and 1", st.Stable, st.ScrapeFailures)
	}

	// Every scrape fails for longer than the stable window: no data, no
	// change, in particular no scale to zero.
	for _, in := range insts {
		scr.fail(in.ID, errors.New("timeout"))
	}
	tickN(ctx, l, clk, 60, 2*time.Second)
	st, _ = a.State("hello-00001")
	if st.Rule != RuleNoData || st.Desired != 3 {
		t.Fatalf("after a minute of failed scrapes: rule %s desired %d, want no-data and 3", st.Rule, st.Desired)
	}
	if n := len(sc.Calls()); n != 0 {
		t.Fatalf("%d scale calls on missing metrics, want 0: %+v", n, sc.Calls())
	}
}

func TestLoopScalesToZeroAfterGrace(t *testing.T) {
	ctx := context.Background()
	a, cat, scr, sc, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 1, func(s *spec.Scaling) {
		s.Window = 6 * time.Second
		s.ScaleToZeroGrace = 10 * time.Second
	}))
	cat.SetReady("hello-00001", instances("hello-00001", 1))
	scr.set("hello-00001-i0", 0)
	l := startLoop(t, a)
	start := clk.Now()
	for i := 0; i < 20 && len(sc.Calls()) == 0; i++ {
		tickN(ctx, l, clk, 1, 2*time.Second)
	}
	calls := sc.Calls()
	if len(calls) != 1 || calls[0].Count != 0 {
		t.Fatalf("calls %+v, want one call to zero", calls)
	}
	// The grace counts from the first tick that saw the activator in the
	// path: the second, once the first decision published a negative
	// excess burst capacity.
	if took := clk.Now().Add(-2 * time.Second).Sub(start); took != 12*time.Second {
		t.Errorf("scaled to zero %s after the first quiet tick, want 12s (2s + 10s grace)", took)
	}
	if calls[0].Reason != "no traffic for 12s" {
		t.Errorf("reason %q, want %q", calls[0].Reason, "no traffic for 12s")
	}
	if ebc, ok := a.ExcessBurstCapacity("hello-00001"); !ok || ebc >= 0 {
		t.Errorf("excess burst capacity %v, %v: want negative (activator in the path)", ebc, ok)
	}
}

func TestLoopActivatorDemandWakesRevisionAtZero(t *testing.T) {
	ctx := context.Background()
	a, cat, _, sc, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	l := startLoop(t, a)
	tickN(ctx, l, clk, 3, 2*time.Second)
	if n := len(sc.Calls()); n != 0 {
		t.Fatalf("%d calls for an idle revision at zero", n)
	}
	if err := a.ReportDemand(ctx, "activator-1", []Demand{{Revision: "hello-00001", Queued: 2}}); err != nil {
		t.Fatal(err)
	}
	tickN(ctx, l, clk, 1, 2*time.Second)
	calls := sc.Calls()
	if len(calls) != 1 || calls[0].Count != 1 || calls[0].Reason != "wake: 2 requests waiting at the activator" {
		t.Fatalf("calls %+v, want one call for 1 instance with a wake reason", calls)
	}
}

func TestLoopDemandOfSeveralReplicasAddsUpAndExpires(t *testing.T) {
	ctx := context.Background()
	a, cat, _, _, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 0, func(s *spec.Scaling) { s.Max = 10 }))
	l := startLoop(t, a)
	a.ReportDemand(ctx, "a1", []Demand{{Revision: "hello-00001", Queued: 3}})
	a.ReportDemand(ctx, "a2", []Demand{{Revision: "hello-00001", Queued: 4}, {Revision: "unknown-00001", Queued: 9}})
	tickN(ctx, l, clk, 1, 0)
	if st, _ := a.State("hello-00001"); st.Queued != 7 {
		t.Fatalf("queued %d, want 3+4", st.Queued)
	}
	clk.Advance(6 * time.Second) // past DemandTTL (5s)
	tickN(ctx, l, clk, 1, 0)
	if st, _ := a.State("hello-00001"); st.Queued != 0 {
		t.Fatalf("queued %d after the reports went stale, want 0", st.Queued)
	}
}

func TestLoopSamplesManyInstancesInTurn(t *testing.T) {
	ctx := context.Background()
	a, cat, scr, _, clk := newTestAutoscaler(t, nil)
	insts := instances("big-00001", 100)
	cat.SetRevision(testRevision("big-00001", 100, nil))
	cat.SetReady("big-00001", insts)
	for _, in := range insts {
		scr.set(in.ID, 70)
	}
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 2*time.Second)
	total := 0
	for _, n := range scr.seen {
		total += n
	}
	if total != sampleSize(100) {
		t.Fatalf("scraped %d instances in one tick, want a sample of %d", total, sampleSize(100))
	}
	if st, _ := a.State("big-00001"); st.Stable != 7000 {
		t.Fatalf("stable %v, want the sample extrapolated to 100 x 70", st.Stable)
	}
	tickN(ctx, l, clk, 7, 2*time.Second)
	if len(scr.seen) != 100 {
		t.Fatalf("%d of 100 instances scraped after 8 ticks, want every one in turn", len(scr.seen))
	}
}

func TestLoopForgetsDeletedRevisions(t *testing.T) {
	ctx := context.Background()
	a, cat, _, _, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	cat.SetRevision(testRevision("hello-00002", 0, nil))
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 2*time.Second)
	if n := len(a.States()); n != 2 {
		t.Fatalf("%d states, want 2", n)
	}
	cat.DeleteRevision("hello-00001")
	tickN(ctx, l, clk, 1, 2*time.Second)
	if _, ok := a.State("hello-00001"); ok {
		t.Fatal("a deleted revision still has state")
	}
	if _, ok := a.ExcessBurstCapacity("hello-00001"); ok {
		t.Fatal("a deleted revision still has a burst capacity")
	}
	if _, ok := a.State("hello-00002"); !ok {
		t.Fatal("the other revision lost its state")
	}
}

func TestApplyRetriesTransientErrors(t *testing.T) {
	ctx := context.Background()
	a, cat, _, sc, clk := newTestAutoscaler(t, nil)
	sc.fail = func(n int, _ scaleCall) error {
		if n <= 2 {
			return transientErr{"nomad: 503 service unavailable"}
		}
		return nil
	}
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	l := startLoop(t, a)
	a.ReportDemand(ctx, "a1", []Demand{{Revision: "hello-00001", Queued: 1}})
	tickN(ctx, l, clk, 1, 2*time.Second)
	if n := len(sc.Calls()); n != 3 {
		t.Fatalf("%d calls, want 3 (two transient failures, then success)", n)
	}
	st, _ := a.State("hello-00001")
	if st.ScaleCalls != 3 || st.ScaleFailures != 2 || st.LastError != "" || st.LastReason == "" {
		t.Fatalf("state after retries: %+v", st)
	}
}

func TestApplyDoesNotRetryPermanentErrors(t *testing.T) {
	ctx := context.Background()
	a, cat, _, sc, clk := newTestAutoscaler(t, nil)
	sc.fail = func(int, scaleCall) error {
		return errors.New("nomad: 400 group count was greater than scaling policy maximum")
	}
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	l := startLoop(t, a)
	a.ReportDemand(ctx, "a1", []Demand{{Revision: "hello-00001", Queued: 1}})
	tickN(ctx, l, clk, 1, 2*time.Second)
	if n := len(sc.Calls()); n != 1 {
		t.Fatalf("%d calls, want 1: a permanent error is not retried", n)
	}
	a.ReportDemand(ctx, "a1", []Demand{{Revision: "hello-00001", Queued: 1}})
	tickN(ctx, l, clk, 2, 2*time.Second)
	if n := len(sc.Calls()); n != 1 {
		t.Fatalf("%d calls, want 1: the same failing count is not asked again every tick", n)
	}
	st, _ := a.State("hello-00001")
	if !strings.Contains(st.LastError, "maximum") || st.ScaleFailures != 1 {
		t.Fatalf("state %+v: want the error recorded", st)
	}
	// After the cool-down it is tried again.
	clk.Advance(10 * time.Second)
	a.ReportDemand(ctx, "a1", []Demand{{Revision: "hello-00001", Queued: 1}})
	tickN(ctx, l, clk, 1, 2*time.Second)
	if n := len(sc.Calls()); n != 2 {
		t.Fatalf("%d calls after the cool-down, want 2", n)
	}
}

func TestApplyNeverAsksAboveMax(t *testing.T) {
	a, cat, _, sc, _ := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 1, func(s *spec.Scaling) { s.Max = 5 }))
	l := startLoop(t, a)
	l.tickAll(context.Background())
	l.applies.Wait()
	st := l.revs["hello-00001"]
	// A decision above max (say a max lowered between decision and apply).
	l.maybeApply(context.Background(), st, Decision{Desired: 12, Count: 1, Rule: RuleStable}, t0)
	l.applies.Wait()
	calls := sc.Calls()
	if len(calls) != 1 || calls[0].Count != 5 {
		t.Fatalf("calls %+v, want one call capped at max 5", calls)
	}
}

func TestRunWakeCoalescesABurstIntoOneScaleCall(t *testing.T) {
	// A long tick: only wakes can cause decisions after the first tick.
	a, cat, _, sc, _ := newTestAutoscaler(t, func(c *Config) { c.Tick = time.Hour })
	// One instance takes the whole burst (target 1000 x 70%), so any call
	// after the first would be a duplicate.
	cat.SetRevision(testRevision("hello-00001", 0, func(s *spec.Scaling) { s.Target = 1000 }))
	release := make(chan struct{})
	sc.block = release // Nomad is slow: wakes keep coming during the call
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	waitFor(t, 20*time.Second, "the first tick", func() bool { _, ok := a.State("hello-00001"); return ok })

	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := a.Wake(ctx, "activator-1", Demand{Revision: "hello-00001", Queued: i + 1}); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	waitFor(t, 20*time.Second, "a scale call", func() bool { return len(sc.Calls()) > 0 })
	close(release)
	waitFor(t, 20*time.Second, "the catalog to show the new count", func() bool {
		r, _ := cat.Revision("hello-00001")
		return r.Desired == 1
	})
	// More wakes after the call: the count is already right.
	for range 20 {
		a.Wake(ctx, "activator-1", Demand{Revision: "hello-00001", Queued: 3})
	}
	waitFor(t, 20*time.Second, "the late wakes to be decided", func() bool {
		a.wakeMu.Lock()
		defer a.wakeMu.Unlock()
		return len(a.wakes) == 0 && len(a.kick) == 0
	})
	// One more wake round-trip so the last decision is surely done.
	a.Wake(ctx, "activator-1", Demand{Revision: "hello-00001", Queued: 3})
	waitFor(t, 20*time.Second, "the last wake", func() bool {
		st, _ := a.State("hello-00001")
		return st.Count == 1
	})
	if calls := sc.Calls(); len(calls) != 1 || calls[0].Count != 1 {
		t.Fatalf("calls %+v, want exactly one call for 1 instance", calls)
	}
}

func TestRunStopsPromptlyAndForgetsEverything(t *testing.T) {
	a, cat, _, sc, _ := newTestAutoscaler(t, func(c *Config) { c.Tick = 10 * time.Millisecond })
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	sc.block = make(chan struct{}) // a scale call hangs until its context ends
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	waitFor(t, 20*time.Second, "leading", a.Leading)
	if err := a.Run(ctx); err == nil {
		t.Error("a second Run while running: no error")
	}
	waitFor(t, 20*time.Second, "a decision", func() bool { _, ok := a.ExcessBurstCapacity("hello-00001"); return ok })
	if err := a.Wake(ctx, "a1", Demand{Revision: "hello-00001", Queued: 1}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "a hanging scale call", func() bool { return len(sc.Calls()) > 0 })

	cancel() // leadership lost
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(testbin.Bound(20 * time.Second)):
		t.Fatal("Run did not return after its context ended")
	}
	if a.Leading() {
		t.Error("still leading after Run returned")
	}
	if _, ok := a.ExcessBurstCapacity("hello-00001"); ok {
		t.Error("burst capacity still known after Run returned")
	}
	if a.States() != nil {
		t.Error("states still served after Run returned")
	}
	if err := a.Wake(context.Background(), "a1", Demand{Revision: "hello-00001", Queued: 1}); !errors.Is(err, ErrNotLeader) {
		t.Errorf("Wake after Run: %v, want ErrNotLeader", err)
	}
	// A new term starts from nothing: no stale reports.
	a.demandMu.Lock()
	n := len(a.reports)
	a.demandMu.Unlock()
	if n != 0 {
		t.Errorf("%d demand reports kept after Run returned", n)
	}
}

func TestExcessBurstCapacityReadAllocatesNothing(t *testing.T) {
	a, cat, _, _, clk := newTestAutoscaler(t, nil)
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	l := startLoop(t, a)
	tickN(context.Background(), l, clk, 1, 0)
	if ebc, ok := a.ExcessBurstCapacity("hello-00001"); !ok || ebc != -211 {
		t.Fatalf("ebc %v, %v; want -211 (no capacity, burst capacity 211)", ebc, ok)
	}
	allocs := testing.AllocsPerRun(1000, func() { a.ExcessBurstCapacity("hello-00001") })
	if allocs != 0 {
		t.Fatalf("ExcessBurstCapacity allocates %v times, want 0", allocs)
	}
}

func TestDemandValidation(t *testing.T) {
	a, _, _, _, _ := newTestAutoscaler(t, nil)
	ctx := context.Background()
	if err := a.ReportDemand(ctx, "a1", nil); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("ReportDemand while not running: %v, want ErrNotLeader", err)
	}
	startLoop(t, a)
	if err := a.ReportDemand(ctx, "a1", []Demand{{Revision: "", Queued: 1}}); err == nil {
		t.Error("a demand without revision was accepted")
	}
	if err := a.Wake(ctx, "a1", Demand{Revision: "x-00001", Queued: -1}); err == nil {
		t.Error("a negative queue was accepted")
	}
}

func TestWakeUpdatesTheReplicasReport(t *testing.T) {
	a, _, _, _, clk := newTestAutoscaler(t, nil)
	ctx := context.Background()
	startLoop(t, a)
	if err := a.ReportDemand(ctx, "a1", []Demand{{Revision: "x-00001", Queued: 1}, {Revision: "y-00001", InFlight: 2}}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := a.Wake(ctx, "a1", Demand{Revision: "x-00001", Queued: 5}); err != nil {
		t.Fatal(err)
	}
	if err := a.Wake(ctx, "a2", Demand{Revision: "y-00001", Queued: 1}); err != nil {
		t.Fatal(err)
	}
	a.demandMu.Lock()
	defer a.demandMu.Unlock()
	r1, r2 := a.reports["a1"], a.reports["a2"]
	if !r1.at.Equal(clk.Now()) || len(r1.demand) != 2 || r1.demand["x-00001"].Queued != 5 || r1.demand["y-00001"].InFlight != 2 {
		t.Errorf("a1's report after a wake: %+v, want x queued 5 and y kept, stamped now", r1)
	}
	if len(r2.demand) != 1 || r2.demand["y-00001"].Queued != 1 {
		t.Errorf("a2's report from a wake alone: %+v", r2)
	}
}

// TestLoopMinHoldsOnlyForReachableRevisions: a deploy that moved the
// route on leaves the previous revision behind; its min no longer holds
// and it goes to zero after the grace like any idle revision, while the
// routed one keeps its min (issue 45's soak: every good deploy left the
// previous revision running until garbage collection).
func TestLoopMinHoldsOnlyForReachableRevisions(t *testing.T) {
	ctx := context.Background()
	a, cat, scr, sc, clk := newTestAutoscaler(t, nil)
	withMin := func(s *spec.Scaling) {
		s.Min = 1
		s.Window = 6 * time.Second
		s.ScaleToZeroGrace = 10 * time.Second
	}
	for _, name := range []string{"hello-00001", "hello-00002"} {
		cat.SetRevision(testRevision(name, 1, withMin))
		cat.SetReady(name, instances(name, 1))
		scr.set(name+"-i0", 0)
	}
	cat.SetService(catalog.Service{Name: "hello", Namespace: "default", Latest: "hello-00002",
		Route: consulroute.Route{Splits: []consulroute.Split{{Revision: "hello-00002", Percent: 100}}}})
	l := startLoop(t, a)
	for i := 0; i < 20 && len(sc.Calls()) == 0; i++ {
		tickN(ctx, l, clk, 1, 2*time.Second)
	}
	tickN(ctx, l, clk, 10, 2*time.Second) // and the routed one stays
	calls := sc.Calls()
	if len(calls) != 1 || calls[0].Revision != "hello-00001" || calls[0].Count != 0 {
		t.Fatalf("calls %+v, want one call: hello-00001 to zero", calls)
	}
	if got, _ := a.State("hello-00002"); got.Desired != 1 || got.Rule != RuleMin {
		t.Errorf("routed revision: desired %d by %s, want 1 by %s", got.Desired, got.Rule, RuleMin)
	}

	// The route moves back by hand: the old one's min holds again, and
	// hello-00002, the latest ready one left behind, goes once idle.
	cat.SetService(catalog.Service{Name: "hello", Namespace: "default", Latest: "hello-00002",
		Route: consulroute.Route{Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 100}}}})
	tickN(ctx, l, clk, 20, 2*time.Second)
	got := map[string][]int{}
	for _, c := range sc.Calls()[1:] {
		got[c.Revision] = append(got[c.Revision], c.Count)
	}
	if !slices.Equal(got["hello-00001"], []int{1}) || !slices.Equal(got["hello-00002"], []int{0}) {
		t.Errorf("after the route moved back: counts asked %v, want hello-00001 back to its min 1 and hello-00002 to zero", got)
	}
}

// TestLoopUnreachableKeepsNomadsFloor: a revision registered before the
// autoscaler held min alone carries min as Nomad's bound, which refuses
// any count below it: left behind, it stays at that floor rather than
// asking Nomad every few seconds for what it refuses.
func TestLoopUnreachableKeepsNomadsFloor(t *testing.T) {
	ctx := context.Background()
	a, cat, scr, sc, clk := newTestAutoscaler(t, nil)
	old := testRevision("hello-00001", 2, func(s *spec.Scaling) {
		s.Min = 2
		s.ScaleToZeroGrace = 10 * time.Second
	})
	old.FloorMin = 2
	cat.SetRevision(old)
	cat.SetRevision(testRevision("hello-00002", 1, nil))
	cat.SetReady("hello-00001", instances("hello-00001", 2))
	scr.set("hello-00001-i0", 0)
	scr.set("hello-00001-i1", 0)
	cat.SetService(catalog.Service{Name: "hello", Namespace: "default", Latest: "hello-00002",
		Route: consulroute.Route{Splits: []consulroute.Split{{Revision: "hello-00002", Percent: 100}}}})
	l := startLoop(t, a)
	tickN(ctx, l, clk, 40, 2*time.Second)
	for _, c := range sc.Calls() {
		if c.Revision == "hello-00001" {
			t.Errorf("call %+v below Nomad's floor of 2", c)
		}
	}
}
