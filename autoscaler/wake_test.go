package autoscaler

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// memRaiser is ScaleAtLeast over the catalog's count (as Nomad's event
// stream would set it), recording calls; block, when non-nil, holds each
// call until it is closed.
type memRaiser struct {
	cat *catalog.Catalog
	err error

	mu    sync.Mutex
	calls []scaleCall
	block chan struct{}
}

func (m *memRaiser) ScaleAtLeast(ctx context.Context, revision string, n int, reason string, meta map[string]string) (bool, error) {
	m.mu.Lock()
	m.calls = append(m.calls, scaleCall{revision, n, reason, meta})
	block, err := m.block, m.err
	m.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	if err != nil {
		return false, err
	}
	r, ok := m.cat.Revision(revision)
	if !ok || r.Desired >= n {
		return false, nil
	}
	r.Desired = n
	m.cat.SetRevision(r)
	return true, nil
}

func (m *memRaiser) Calls() []scaleCall {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]scaleCall(nil), m.calls...)
}

// memNext is the way to the leader: it records wakes and reports and
// fails them with err (the leader is gone); block, when non-nil, holds a
// wake until it is closed or the call's context ends (a leader that does
// not answer).
type memNext struct {
	err   error
	block chan struct{}

	mu      sync.Mutex
	wakes   []Demand
	reports int
}

func (m *memNext) ReportDemand(context.Context, string, []Demand) error {
	m.mu.Lock()
	m.reports++
	m.mu.Unlock()
	return m.err
}
func (m *memNext) ExcessBurstCapacity(string) (float64, bool) { return -1, true }
func (m *memNext) Wake(ctx context.Context, _ string, d Demand) error {
	m.mu.Lock()
	m.wakes = append(m.wakes, d)
	m.mu.Unlock()
	if m.block != nil {
		select {
		case <-m.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return m.err
}

func (m *memNext) Wakes() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.wakes)
}

// partialRevision is a revision as serve's first listing puts it in the
// catalog: its scaling a placeholder, its count the summary's instances.
func partialRevision(name string, instances int) catalog.Revision {
	r := testRevision(name, instances, nil)
	r.Scaling = spec.DefaultScaling()
	r.Partial = true
	return r
}

var errLeaderGone = errors.New("POST /v1/autoscaler/wake: connection refused")

// Every wake rule, as a table: whether the replica raises the revision
// itself, to what, and whether the wake counts as done.
func TestWakerRules(t *testing.T) {
	cases := []struct {
		name    string
		rev     catalog.Revision
		known   bool  // in this replica's catalog
		leading bool  // this replica's autoscaler runs
		raise   error // the raise fails
		next    error // the leader cannot be reached
		slow    bool  // the leader does not answer
		// Want.
		raisedTo int // 0: no raise tried
		count    int
		err      bool
	}{
		{name: "at zero, the leader takes the wake: it raises it, not this replica", rev: testRevision("hello-00001", 0, nil), known: true,
			count: 0},
		{name: "at zero, the leader gone: raised here to the activation scale", rev: testRevision("hello-00001", 0, nil), known: true, next: errLeaderGone,
			raisedTo: 1, count: 1},
		{name: "activation scale 3, the leader gone: raised to 3", rev: testRevision("hello-00001", 0, func(s *spec.Scaling) { s.ActivationScale = 3 }), known: true, next: errLeaderGone,
			raisedTo: 3, count: 3},
		{name: "activation scale above max: raised to max", rev: testRevision("hello-00001", 0, func(s *spec.Scaling) { s.ActivationScale = 5; s.Max = 2 }), known: true, next: errLeaderGone,
			raisedTo: 2, count: 2},
		{name: "at zero, the leader does not answer within the hand-off: raised here", rev: testRevision("hello-00001", 0, nil), known: true, slow: true,
			raisedTo: 1, count: 1},
		{name: "the leader gone and the raise fails: failed", rev: testRevision("hello-00001", 0, nil), known: true, next: errLeaderGone, raise: errors.New("Nomad unreachable"),
			raisedTo: 1, count: 0, err: true},
		{name: "not at zero, the leader gone: no failure, more capacity is the leader's decision", rev: testRevision("hello-00001", 1, func(s *spec.Scaling) { s.ActivationScale = 3 }), known: true, next: errLeaderGone,
			count: 1},
		{name: "this replica leads: its autoscaler decides, nothing raised here", rev: testRevision("hello-00001", 0, nil), known: true, leading: true,
			count: 0},
		// A revision listed but its job not read yet (a replica just
		// started, or the new leader after a failover): no decision waits
		// for it anywhere, so it is raised here at once, to 1 (its
		// activation scale is not known), whoever leads, and the leader
		// hears of the wake too.
		{name: "listed, job not read, at zero: raised here to 1 at once though the leader takes the wake", rev: partialRevision("hello-00001", 0), known: true,
			raisedTo: 1, count: 1},
		{name: "listed, job not read, at zero, this replica leads: raised here to 1", rev: partialRevision("hello-00001", 0), known: true, leading: true,
			raisedTo: 1, count: 1},
		{name: "listed, job not read, with instances: nothing raised", rev: partialRevision("hello-00001", 2), known: true, leading: true,
			count: 2},
		{name: "unknown here: left to the leader", rev: testRevision("hello-00001", 0, nil),
			count: -1},
		{name: "unknown here and the leader gone: failed", rev: testRevision("hello-00001", 0, nil), next: errLeaderGone,
			count: -1, err: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cat := catalog.New()
			if tc.known {
				cat.SetRevision(tc.rev)
			}
			raiser := &memRaiser{cat: cat, err: tc.raise}
			next := &memNext{err: tc.next}
			if tc.slow {
				next.block = make(chan struct{}) // never answers
			}
			cfg := WakerConfig{Revisions: cat, Raiser: raiser, Next: next, HandOff: 20 * time.Millisecond}
			if tc.leading {
				a, _, _, _, _ := newTestAutoscaler(t, func(c *Config) { c.Revisions = cat })
				ctx, cancel := context.WithCancel(context.Background())
				done := make(chan struct{})
				go func() { defer close(done); _ = a.Run(ctx) }()
				t.Cleanup(func() { cancel(); <-done })
				waitFor(t, 20*time.Second, "the local autoscaler runs", a.Leading)
				cfg.Local = a
			}
			w, err := NewWaker(cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = w.Wake(context.Background(), "r2", Demand{Revision: tc.rev.Name, Queued: 1})
			if (err != nil) != tc.err {
				t.Errorf("Wake = %v, want error %v", err, tc.err)
			}
			calls := raiser.Calls()
			switch {
			case tc.raisedTo == 0 && len(calls) != 0:
				t.Errorf("raised %+v, want no raise", calls)
			case tc.raisedTo != 0 && (len(calls) != 1 || calls[0].Count != tc.raisedTo):
				t.Errorf("raises %+v, want one to %d", calls, tc.raisedTo)
			case tc.raisedTo != 0 && (!strings.Contains(calls[0].Reason, "1 request waiting at the activator of replica r2") || calls[0].Meta["rule"] != "wake"):
				t.Errorf("raise reason %q meta %v", calls[0].Reason, calls[0].Meta)
			}
			if r, ok := cat.Revision(tc.rev.Name); ok && r.Desired != tc.count {
				t.Errorf("count %d, want %d", r.Desired, tc.count)
			}
			if next.Wakes() != 1 {
				t.Errorf("%d wakes passed on to the leader, want 1", next.Wakes())
			}
		})
	}
}

// The leader took the wake but the revision is still at zero (it lost its
// lock before deciding, or cannot reach Nomad): the activator's demand
// report LeaderGrace later raises it here. Reports the leader cannot take
// raise it at once; reports without requests waiting raise nothing.
func TestWakerDemandReports(t *testing.T) {
	clk := newClock()
	newWaker := func(next *memNext, rev catalog.Revision) (*Waker, *memRaiser, *catalog.Catalog) {
		cat := catalog.New()
		cat.SetRevision(rev)
		raiser := &memRaiser{cat: cat}
		w, err := NewWaker(WakerConfig{Revisions: cat, Raiser: raiser, Next: next, Now: clk.Now, LeaderGrace: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return w, raiser, cat
	}
	ctx := context.Background()
	waiting := []Demand{{Revision: "hello-00001", Queued: 2}}

	w, raiser, cat := newWaker(&memNext{}, testRevision("hello-00001", 0, nil))
	if err := w.Wake(ctx, "r2", waiting[0]); err != nil || len(raiser.Calls()) != 0 {
		t.Fatalf("wake the leader took: %v, raises %+v", err, raiser.Calls())
	}
	clk.Advance(time.Second)
	_ = w.ReportDemand(ctx, "r2", waiting)
	w.Wait()
	if n := len(raiser.Calls()); n != 0 {
		t.Fatalf("raised %d times within the leader's grace", n)
	}
	clk.Advance(time.Second)
	_ = w.ReportDemand(ctx, "r2", waiting)
	w.Wait()
	if calls := raiser.Calls(); len(calls) != 1 || calls[0].Count != 1 {
		t.Fatalf("raises %+v once the leader's grace was over, want one to 1", calls)
	}
	if r, _ := cat.Revision("hello-00001"); r.Desired != 1 {
		t.Errorf("count %d, want 1", r.Desired)
	}

	w, raiser, _ = newWaker(&memNext{err: errLeaderGone}, testRevision("hello-00001", 0, nil))
	if err := w.ReportDemand(ctx, "r2", waiting); !errors.Is(err, errLeaderGone) {
		t.Errorf("report = %v, want the leader's error (the activator logs it)", err)
	}
	w.Wait()
	if n := len(raiser.Calls()); n != 1 {
		t.Errorf("%d raises after a report the leader could not take, want 1", n)
	}

	w, raiser, _ = newWaker(&memNext{err: errLeaderGone}, testRevision("hello-00001", 0, nil))
	_ = w.ReportDemand(ctx, "r2", []Demand{{Revision: "hello-00001", InFlight: 1}})
	w.Wait()
	if n := len(raiser.Calls()); n != 0 {
		t.Errorf("%d raises for a report without requests waiting, want 0", n)
	}
}

// A burst of wakes (many requests, many activator goroutines) the leader
// cannot take makes one raise; so do the wakes right after it while the
// catalog lags.
func TestWakerOneRaisePerBurst(t *testing.T) {
	cat := catalog.New()
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	release := make(chan struct{})
	// The raise blocks until released and does not touch this catalog: it
	// stands for a Nomad whose event has not reached the catalog yet.
	raiser := &memRaiser{cat: catalog.New(), block: release}
	clk := newClock()
	w, err := NewWaker(WakerConfig{Revisions: cat, Raiser: raiser, Next: &memNext{err: errLeaderGone}, Now: clk.Now, Recent: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 50 {
		wg.Go(func() { _ = w.Wake(context.Background(), "r2", Demand{Revision: "hello-00001", Queued: 1}) })
	}
	waitFor(t, 20*time.Second, "the first raise", func() bool { return len(raiser.Calls()) >= 1 })
	close(release)
	wg.Wait()
	if n := len(raiser.Calls()); n != 1 {
		t.Fatalf("%d raises for a burst, want 1", n)
	}
	clk.Advance(4 * time.Second)
	_ = w.Wake(context.Background(), "r2", Demand{Revision: "hello-00001", Queued: 3})
	if n := len(raiser.Calls()); n != 1 {
		t.Errorf("%d raises within Recent of the first, want still 1", n)
	}
	// Once Recent has passed and the catalog still says zero (someone
	// took it back down), a new wake raises again.
	clk.Advance(2 * time.Second)
	_ = w.Wake(context.Background(), "r2", Demand{Revision: "hello-00001", Queued: 1})
	if n := len(raiser.Calls()); n != 2 {
		t.Errorf("%d raises after Recent, want 2", n)
	}
}

func TestNewWakerValidates(t *testing.T) {
	cat := catalog.New()
	for _, cfg := range []WakerConfig{
		{Raiser: &memRaiser{}, Next: &memNext{}},
		{Revisions: cat, Next: &memNext{}},
		{Revisions: cat, Raiser: &memRaiser{}},
		{Revisions: cat, Raiser: &memRaiser{}, Next: &memNext{}, Recent: -time.Second},
		{Revisions: cat, Raiser: &memRaiser{}, Next: &memNext{}, HandOff: -time.Second},
	} {
		if _, err := NewWaker(cfg); err == nil {
			t.Errorf("NewWaker(%+v) accepted", cfg)
		}
	}
}
