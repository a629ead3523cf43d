package activator

// Component tests: the gateway, the activator and the real autoscaler wired
// to a local cluster of real sidecar + test app processes on 127.0.0.1.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/dev/localcluster"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// stack is a whole serving path: catalog, local cluster, autoscaler,
// gateway, and an HTTP server in front of the gateway.
type stack struct {
	cat *catalog.Catalog
	lc  *localcluster.Cluster
	as  *autoscaler.Autoscaler
	g   *Gateway
	srv *httptest.Server
	reg *prometheus.Registry
	out *lockedBuf
	cli *http.Client
}

type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

type stackOptions struct {
	checkInterval time.Duration
	gateway       func(*Config)
}

func startStack(t *testing.T, o stackOptions) *stack {
	t.Helper()
	if testing.Short() {
		t.Skip("component test with real processes (skipped in -short)")
	}
	bin := testbin.Path(t)
	out := &lockedBuf{}
	log := slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cat := catalog.New()
	lc, err := localcluster.New(cat, localcluster.Options{
		Binary: bin, CheckInterval: o.checkInterval, ShutdownDelay: 200 * time.Millisecond,
		Output: out, Logger: log,
	})
	if err != nil {
		t.Fatal(err)
	}
	as, err := autoscaler.New(autoscaler.Config{Revisions: cat, Scaler: lc, Tick: 250 * time.Millisecond, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	cfg := Config{Catalog: cat, Autoscaler: as, Registerer: reg, Logger: log, Replica: "test"}
	if o.gateway != nil {
		o.gateway(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = as.Run(ctx) }()
	go func() { defer wg.Done(); _ = g.Run(ctx) }()
	srv := httptest.NewUnstartedServer(g)
	srv.Config = g.Server("")
	srv.Start()
	s := &stack{cat: cat, lc: lc, as: as, g: g, srv: srv, reg: reg, out: out,
		cli: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}, Timeout: 60 * time.Second}}
	t.Cleanup(func() {
		srv.Close()
		cancel()
		wg.Wait()
		if err := lc.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
		if t.Failed() || os.Getenv("ACTIVATOR_TEST_LOG") != "" {
			t.Logf("log and process output:\n%s", out.String())
		}
	})
	waitFor(t, "gateway healthy", func() bool { return g.healthy.Load() })
	return s
}

// testScaling is Knative's defaults with windows short enough for a test.
func testScaling() spec.Scaling {
	s := spec.DefaultScaling()
	s.Window = 3 * time.Second
	s.ScaleToZeroGrace = 2 * time.Second
	return s
}

// addService adds revisions of one service and routes 100 % to the first.
func (s *stack) addService(t *testing.T, svc string, revs []catalog.Revision, app localcluster.App) {
	t.Helper()
	for _, r := range revs {
		r.Service = svc
		if r.Scaling == (spec.Scaling{}) {
			r.Scaling = testScaling()
		}
		if r.Timeout == 0 {
			r.Timeout = 30 * time.Second
		}
		a := app
		a.Name = r.Name
		if err := s.lc.AddRevision(r, a); err != nil {
			t.Fatal(err)
		}
	}
	s.setRoute(t, catalog.Service{Name: svc, Route: consulroute.Route{
		Splits: []consulroute.Split{{Revision: revs[0].Name, Percent: 100}}}})
}

// setRoute publishes a route and waits until the gateway routes its hosts
// (the table is rebuilt asynchronously, within milliseconds).
func (s *stack) setRoute(t *testing.T, svc catalog.Service) {
	t.Helper()
	if err := s.lc.SetRoute(svc); err != nil {
		t.Fatal(err)
	}
	host := serviceHost(svc.Name, spec.DefaultNamespace, DefaultDomain)
	waitFor(t, "route of "+svc.Name, func() bool {
		rt := s.g.table.Load().hosts[host]
		if rt == nil || len(rt.targets) != len(svc.Route.Splits) {
			return false
		}
		for i, sp := range svc.Route.Splits {
			if rt.targets[i].name != sp.Revision {
				return false
			}
		}
		for tag := range svc.Route.Tags {
			if s.g.table.Load().hosts[tagHost(tag, svc.Name, spec.DefaultNamespace, DefaultDomain)] == nil {
				return false
			}
		}
		return true
	})
}

type result struct {
	code int
	body string
	rev  string // X-Testapp-Name: the revision that answered
}

func (s *stack) do(ctx context.Context, host, path string) result {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.srv.URL+path, nil)
	if err != nil {
		return result{body: err.Error()}
	}
	req.Host = host
	resp, err := s.cli.Do(req)
	if err != nil {
		return result{body: err.Error()}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return result{code: resp.StatusCode, body: string(b), rev: resp.Header.Get("X-Testapp-Name")}
}

// load sends requests from n clients until stop closes (or each client has
// sent max), and returns every result.
func (s *stack) load(host, path string, n, max int, stop <-chan struct{}) []result {
	var mu sync.Mutex
	var out []result
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < max; i++ {
				select {
				case <-stop:
					return
				default:
				}
				r := s.do(context.Background(), host, path)
				mu.Lock()
				out = append(out, r)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return out
}

func failures(rs []result) []string {
	var bad []string
	for _, r := range rs {
		if r.code != 200 {
			bad = append(bad, fmt.Sprintf("%d %q", r.code, strings.TrimSpace(r.body)))
		}
	}
	return bad
}

// appStats reads an instance's test app counters directly; ok is false when
// the app is gone (scaled down meanwhile).
func appStats(t *testing.T, port int) (maxConc, requests int64, ok bool) {
	t.Helper()
	resp, err := http.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/stats")
	if err != nil {
		t.Logf("app stats of port %d: %v", port, err)
		return 0, 0, false
	}
	defer resp.Body.Close()
	var st struct {
		MaxConcurrency int64 `json:"max_concurrency"`
		Requests       int64 `json:"requests"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		t.Fatal(err)
	}
	return st.MaxConcurrency, st.Requests, true
}

// (1) 200 concurrent requests to a revision at zero all succeed, with one
// wake from zero, each instance getting at most its concurrency, and the
// first answers coming from the activator's probe, before Consul's check.
func TestComponentColdBurst(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 3 * time.Second})
	s.addService(t, "hello", []catalog.Revision{{Name: "hello-00001", Concurrency: 10}}, localcluster.App{Sleep: 50 * time.Millisecond})

	const n = 200
	start := time.Now()
	results := make(chan result, n)
	var first atomic.Int64
	for range n {
		go func() {
			r := s.do(context.Background(), "hello.default.localhost", "/")
			if r.code == 200 {
				first.CompareAndSwap(0, time.Now().UnixNano())
			}
			results <- r
		}()
	}
	var all []result
	for range n {
		all = append(all, <-results)
	}
	if bad := failures(all); len(bad) > 0 {
		t.Fatalf("%d of %d failed, e.g. %s", len(bad), n, bad[0])
	}
	if w := s.lc.Wakes("hello-00001"); w != 1 {
		t.Fatalf("%d wakes from zero, want 1 (events %+v)", w, s.lc.ScaleEvents("hello-00001"))
	}
	timings := s.lc.Timings("hello-00001")
	firstCheck := time.Time{}
	for _, x := range timings {
		if !x.FirstCheckPass.IsZero() && (firstCheck.IsZero() || x.FirstCheckPass.Before(firstCheck)) {
			firstCheck = x.FirstCheckPass
		}
		if x.AppPort != 0 && x.Stopping.IsZero() {
			if m, _, ok := appStats(t, x.AppPort); ok && m > 10 {
				t.Errorf("instance %s saw %d requests at once, limit 10", x.Alloc, m)
			}
		}
	}
	if !firstCheck.IsZero() && time.Unix(0, first.Load()).After(firstCheck) {
		t.Errorf("first answer after the first Consul check: the activator's own probe did not open the way")
	}
	if n := counter(t, s.reg, "nomad_serverless_activator_probes_total", map[string]string{"result": "ready"}); n < 1 {
		t.Errorf("no successful direct probe recorded")
	}
	for _, e := range s.lc.ScaleEvents("hello-00001") {
		t.Logf("scale %d -> %d at +%s: %s", e.From, e.To, e.At.Sub(start).Round(time.Millisecond), e.Reason)
	}
	t.Logf("first answer at +%s, last at +%s", time.Unix(0, first.Load()).Sub(start).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// (2) A 30/70 split over 2,000 requests lands within a few percent.
func TestComponentSplit(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond})
	sc := testScaling()
	sc.Min = 1
	s.addService(t, "split", []catalog.Revision{{Name: "split-00001", Scaling: sc}, {Name: "split-00002", Scaling: sc}}, localcluster.App{})
	s.setRoute(t, catalog.Service{Name: "split", Route: consulroute.Route{Splits: []consulroute.Split{
		{Revision: "split-00001", Percent: 30}, {Revision: "split-00002", Percent: 70}}}})
	rs := s.load("split.default.localhost", "/", 20, 100, nil)
	if bad := failures(rs); len(bad) > 0 {
		t.Fatalf("%d failed, e.g. %s", len(bad), bad[0])
	}
	count := map[string]int{}
	for _, r := range rs {
		count[r.rev]++
	}
	share := float64(count["split-00001"]) / float64(len(rs))
	t.Logf("2000 requests: %v (%.1f%% to split-00001)", count, 100*share)
	if len(rs) != 2000 || share < 0.27 || share > 0.33 {
		t.Fatalf("split %v of %d, want 30/70 within 3 points", count, len(rs))
	}
}

// (3) A tag host reaches its revision, whatever the split says.
func TestComponentTagHost(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond})
	s.addService(t, "tagged", []catalog.Revision{{Name: "tagged-00001"}, {Name: "tagged-00002"}}, localcluster.App{})
	s.setRoute(t, catalog.Service{Name: "tagged", Route: consulroute.Route{
		Splits: []consulroute.Split{{Revision: "tagged-00001", Percent: 100}},
		Tags:   map[string]string{"canary": "tagged-00002"}}})
	for range 5 {
		if r := s.do(context.Background(), "canary-tagged.default.localhost", "/"); r.code != 200 || r.rev != "tagged-00002" {
			t.Fatalf("tag host: %d from %q: %s", r.code, r.rev, r.body)
		}
	}
	if r := s.do(context.Background(), "tagged.default.localhost", "/"); r.code != 200 || r.rev != "tagged-00001" {
		t.Fatalf("service host: %d from %q", r.code, r.rev)
	}
}

// (4) Scaling down under steady load loses no request: the gateway stops
// sending to an allocation the moment it stops Running and the sidecar
// drains what it has.
func TestComponentScaleDownUnderLoad(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond})
	s.addService(t, "steady", []catalog.Revision{{Name: "steady-00001", Concurrency: 4}}, localcluster.App{Sleep: 20 * time.Millisecond})
	const host = "steady.default.localhost"

	// Phase 1: 8 clients against a capacity of 2.8 per instance
	// (concurrency 4 at 70 %): the autoscaler scales up to 3 or more.
	stopBusy, stopLight := make(chan struct{}), make(chan struct{})
	busy, light := make(chan []result), make(chan []result)
	go func() { busy <- s.load(host, "/", 7, 1<<30, stopBusy) }()
	go func() { light <- s.load(host, "/", 1, 1<<30, stopLight) }()
	deadline := time.Now().Add(20 * time.Second)
	for s.lc.Running("steady-00001") < 3 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := s.lc.Running("steady-00001"); n < 3 {
		t.Fatalf("phase 1: %d instances, want the autoscaler to reach 3: %+v", n, s.lc.ScaleEvents("steady-00001"))
	}

	// Phase 2: one client keeps going; the autoscaler scales down under it.
	quiet := time.Now()
	close(stopBusy)
	scaledDown := func() bool {
		for _, e := range s.lc.ScaleEvents("steady-00001") {
			if e.At.After(quiet) && e.To < e.From && e.To > 0 {
				return true
			}
		}
		return false
	}
	deadline = time.Now().Add(20 * time.Second)
	for !scaledDown() && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second) // keep the load on while the removed ones drain
	close(stopLight)
	rs := append(<-busy, <-light...)
	if !scaledDown() {
		t.Fatalf("the autoscaler did not scale down under load: %+v", s.lc.ScaleEvents("steady-00001"))
	}
	if bad := failures(rs); len(bad) > 0 {
		t.Fatalf("%d of %d requests failed, e.g. %s", len(bad), len(rs), bad[0])
	}
	stopped := 0
	for _, x := range s.lc.Timings("steady-00001") {
		if !x.Stopping.IsZero() {
			stopped++
		}
	}
	if stopped == 0 {
		t.Fatal("no instance was stopped")
	}
	t.Logf("%d requests, all 200; %d instances stopped under load", len(rs), stopped)
}

// (5) Unknown host 404, full queue 503, revision timeout 504, each with a
// clear body, from a real stack.
func TestComponentErrors(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond, gateway: func(c *Config) {
		c.QueueDepth = 5
		c.QueueTimeout = 20 * time.Second
	}})
	s.addService(t, "slowstart", []catalog.Revision{{Name: "slowstart-00001"}}, localcluster.App{StartDelay: 1500 * time.Millisecond})
	s.addService(t, "slow", []catalog.Revision{{Name: "slow-00001", Timeout: 300 * time.Millisecond}}, localcluster.App{Sleep: 3 * time.Second})

	r := s.do(context.Background(), "nope.default.localhost", "/")
	if r.code != 404 || !strings.Contains(r.body, "no service answers on host") {
		t.Fatalf("unknown host: %d %q", r.code, r.body)
	}

	// Five requests wait for a revision that takes 1.5 s to start; the sixth
	// finds the queue full at once.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	held := make(chan result, 5)
	for range 5 {
		go func() { held <- s.do(ctx, "slowstart.default.localhost", "/") }()
	}
	waitFor(t, "5 queued", func() bool {
		for _, st := range s.g.Revisions() {
			if st.Revision == "slowstart-00001" {
				return st.Queued == 5
			}
		}
		return false
	})
	r = s.do(context.Background(), "slowstart.default.localhost", "/")
	if r.code != 503 || !strings.Contains(r.body, "5 requests already wait") {
		t.Fatalf("queue full: %d %q", r.code, r.body)
	}
	for range 5 {
		if r := <-held; r.code != 200 {
			t.Fatalf("held request: %d %q", r.code, r.body)
		}
	}

	// The gateway and the sidecar both bound the request by the
	// revision's timeout; on a busy machine either may answer first, and
	// each names the bound ("timeout of 300ms", "within timeout (300ms)").
	r = s.do(context.Background(), "slow.default.localhost", "/")
	if r.code != 504 || !strings.Contains(r.body, "300ms") {
		t.Fatalf("timeout: %d %q", r.code, r.body)
	}
}

// (6) Changing the route under load loses nothing and takes effect.
func TestComponentRouteChangeUnderLoad(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond})
	sc := testScaling()
	sc.Min = 1
	s.addService(t, "roll", []catalog.Revision{{Name: "roll-00001", Scaling: sc}, {Name: "roll-00002", Scaling: sc}}, localcluster.App{Sleep: 10 * time.Millisecond})
	waitFor(t, "both revisions routable", func() bool {
		return len(s.g.routable("roll-00001")) > 0 && len(s.g.routable("roll-00002")) > 0
	})
	stop := make(chan struct{})
	done := make(chan []result)
	go func() { done <- s.load("roll.default.localhost", "/", 8, 1<<30, stop) }()
	routes := [][]consulroute.Split{
		{{Revision: "roll-00001", Percent: 50}, {Revision: "roll-00002", Percent: 50}},
		{{Revision: "roll-00002", Percent: 100}},
	}
	for _, sp := range routes {
		time.Sleep(700 * time.Millisecond)
		if err := s.lc.SetRoute(catalog.Service{Name: "roll", Route: consulroute.Route{Splits: sp}}); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Second)
	close(stop)
	rs := <-done
	if bad := failures(rs); len(bad) > 0 {
		t.Fatalf("%d of %d failed during route changes, e.g. %s", len(bad), len(rs), bad[0])
	}
	// After the last change every new request goes to roll-00002.
	for range 20 {
		if r := s.do(context.Background(), "roll.default.localhost", "/"); r.rev != "roll-00002" {
			t.Fatalf("after the change a request went to %q", r.rev)
		}
	}
	count := map[string]int{}
	for _, r := range rs {
		count[r.rev]++
	}
	if count["roll-00001"] == 0 || count["roll-00002"] == 0 {
		t.Fatalf("traffic %v: both revisions should have served", count)
	}
}

// (7) A wake from zero over real sidecars is timed: the timeline reaches
// OnWake with the gateway's and the sidecar's steps present and in their
// causal order (the local cluster is no Nomad: its steps are missing), its
// total is the first byte's time after the held request, and each step
// lands in the histogram.
func TestComponentWakeTimeline(t *testing.T) {
	timelines := make(chan spec.WakeTimeline, 4)
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond, gateway: func(c *Config) {
		c.OnWake = func(tl spec.WakeTimeline) { timelines <- tl }
	}})
	s.g.wakes.settle = 3 * time.Second // Nomad's steps never come here
	s.addService(t, "hello", []catalog.Revision{{Name: "hello-00001"}}, localcluster.App{})

	start := time.Now()
	if r := s.do(context.Background(), "hello.default.localhost", "/"); r.code != 200 {
		t.Fatalf("request at zero: %d %s", r.code, r.body)
	}
	answered := time.Since(start)
	var tl spec.WakeTimeline
	select {
	case tl = <-timelines:
	case <-time.After(30 * time.Second):
		t.Fatal("no wake timeline within 30s")
	}
	for _, step := range []spec.WakeStep{spec.WakeHeld, spec.WakeSidecarUp, spec.WakeAppAccepted, spec.WakeAppReady,
		spec.WakeProbeReady, spec.WakeSent, spec.WakeFirstByte, spec.WakeConsulPassing} {
		if _, ok := tl.At(step); !ok {
			t.Errorf("step %s missing from %+v", step, tl)
		}
	}
	if bad := tl.OutOfOrder(0); len(bad) > 0 {
		t.Errorf("steps out of order: %v", bad)
	}
	if fb, ok := tl.FirstByte(); !ok || fb <= 0 || fb > answered {
		t.Errorf("first byte %s after the held request, but the client had its answer %s after sending", fb, answered)
	}
	if tl.Revision != "hello-00001" || tl.Service != "hello" || tl.Replica != "test" || tl.Alloc == "" {
		t.Errorf("timeline of %s/%s by %s for alloc %q", tl.Service, tl.Revision, tl.Replica, tl.Alloc)
	}
	if n := counter(t, s.reg, "nomad_serverless_activator_wake_step_seconds", map[string]string{"service": "hello", "step": string(spec.WakeFirstByte)}); n != 1 {
		t.Errorf("first_byte observed %v times in the wake step histogram, want 1", n)
	}
	t.Logf("%s", tl.Summary())
}
