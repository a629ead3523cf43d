package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// clock is a settable time source.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: t0} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// scaleCall is one call the recording scaler saw.
type scaleCall struct {
	Revision string
	Count    int
	Reason   string
	Meta     map[string]string
}

// recordingScaler records calls and, like Nomad's event stream feeding the
// catalog, sets the revision's Desired in cat after a successful call.
// fail, when set, decides each call's error.
type recordingScaler struct {
	cat *catalog.Catalog

	mu    sync.Mutex
	calls []scaleCall
	fail  func(n int, c scaleCall) error // n counts calls from 1
	block chan struct{}                  // when non-nil, calls wait for it or ctx
}

func (s *recordingScaler) Scale(ctx context.Context, revision string, count int, reason string, meta map[string]string) error {
	s.mu.Lock()
	c := scaleCall{revision, count, reason, meta}
	s.calls = append(s.calls, c)
	n := len(s.calls)
	fail, block := s.fail, s.block
	s.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail != nil {
		if err := fail(n, c); err != nil {
			return err
		}
	}
	if s.cat != nil {
		if r, ok := s.cat.Revision(revision); ok {
			r.Desired = count
			s.cat.SetRevision(r)
		}
	}
	return nil
}

func (s *recordingScaler) Calls() []scaleCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]scaleCall(nil), s.calls...)
}

// transientErr is what nomadjob's retryable errors look like to us.
type transientErr struct{ msg string }

func (e transientErr) Error() string   { return e.msg }
func (e transientErr) Transient() bool { return true }

// fakeScraper answers from a table: instance ID -> stats or error.
type fakeScraper struct {
	mu    sync.Mutex
	stats map[string]spec.Stats
	errs  map[string]error
	seen  map[string]int
}

func newFakeScraper() *fakeScraper {
	return &fakeScraper{stats: map[string]spec.Stats{}, errs: map[string]error{}, seen: map[string]int{}}
}

func (f *fakeScraper) Scrape(_ context.Context, inst consulroute.Instance) (spec.Stats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.seen[inst.ID]++
	if err := f.errs[inst.ID]; err != nil {
		return spec.Stats{}, err
	}
	st, ok := f.stats[inst.ID]
	if !ok {
		return spec.Stats{}, errors.New("fake scraper: unknown instance " + inst.ID)
	}
	return st, nil
}

func (f *fakeScraper) set(id string, concurrency float64) {
	f.mu.Lock()
	f.stats[id] = spec.Stats{Revision: "", AverageConcurrency: concurrency, IntervalSeconds: 2}
	delete(f.errs, id)
	f.mu.Unlock()
}

func (f *fakeScraper) fail(id string, err error) {
	f.mu.Lock()
	f.errs[id] = err
	f.mu.Unlock()
}

// instances returns n instances of rev named <rev>-i<k>.
func instances(rev string, n int) []consulroute.Instance {
	out := make([]consulroute.Instance, n)
	for i := range out {
		out[i] = consulroute.Instance{
			ID: fmt.Sprintf("%s-i%d", rev, i), Revision: rev,
			Address: "127.0.0.1", Port: 20000 + i, AdminPort: 30000 + i,
		}
	}
	return out
}

// testRevision is a catalog revision with default scaling changed by mod.
func testRevision(name string, count int, mod func(*spec.Scaling)) catalog.Revision {
	s := spec.DefaultScaling()
	if mod != nil {
		mod(&s)
	}
	svc, gen, _ := spec.ParseRevisionName(name)
	return catalog.Revision{Name: name, Service: svc, Namespace: "default", Generation: gen, Scaling: s, Desired: count}
}

// newTestAutoscaler wires an autoscaler to a catalog, a fake scraper, a
// recording scaler and a settable clock.
func newTestAutoscaler(t *testing.T, mod func(*Config)) (*Autoscaler, *catalog.Catalog, *fakeScraper, *recordingScaler, *clock) {
	t.Helper()
	cat := catalog.New()
	scr := newFakeScraper()
	sc := &recordingScaler{cat: cat}
	clk := newClock()
	cfg := Config{
		Revisions:    cat,
		Scaler:       sc,
		Scraper:      scr,
		Tick:         2 * time.Second,
		Now:          clk.Now,
		RetryBackoff: time.Millisecond,
	}
	if mod != nil {
		mod(&cfg)
	}
	a, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return a, cat, scr, sc, clk
}

// waitFor polls cond every 5ms for up to d.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	d = testbin.Bound(d)
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func newTestCatalog() *catalog.Catalog { return catalog.New() }
