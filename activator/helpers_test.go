package activator

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// fakeAutoscaler records what the activator tells it and answers a fixed
// excess burst capacity.
type fakeAutoscaler struct {
	mu      sync.Mutex
	wakes   []autoscaler.Demand
	reports [][]autoscaler.Demand
	ebc     float64
	known   bool
	onWake  func(autoscaler.Demand)
	// wakeTraces are the trace contexts the wakes came with.
	wakeTraces []trace.SpanContext
}

func (f *fakeAutoscaler) ReportDemand(_ context.Context, _ string, d []autoscaler.Demand) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, d)
	return nil
}

func (f *fakeAutoscaler) Wake(ctx context.Context, _ string, d autoscaler.Demand) error {
	f.mu.Lock()
	f.wakes = append(f.wakes, d)
	f.wakeTraces = append(f.wakeTraces, trace.SpanContextFromContext(ctx))
	cb := f.onWake
	f.mu.Unlock()
	if cb != nil {
		cb(d)
	}
	return nil
}

func (f *fakeAutoscaler) ExcessBurstCapacity(string) (float64, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ebc, f.known
}

func (f *fakeAutoscaler) wakeCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.wakes)
}

func (f *fakeAutoscaler) maxReportedQueued(rev string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, r := range f.reports {
		for _, d := range r {
			if d.Revision == rev {
				n = max(n, d.Queued)
			}
		}
	}
	return n
}

// fakeSidecar is an HTTP server on 127.0.0.1 that answers the readiness
// probe like the queue-proxy and serves requests with handler, counting
// its concurrency.
type fakeSidecar struct {
	srv      *httptest.Server
	ready    atomic.Bool
	probes   atomic.Int64
	requests atomic.Int64
	inflight atomic.Int64
	maxConc  atomic.Int64
	handler  http.HandlerFunc
	port     int
	// hold makes it hold a probe that asks to wait (spec.ProbeWaitHeader)
	// until ready, as the real sidecar does; waits holds what was asked.
	hold  atomic.Bool
	waits chan string
}

func newFakeSidecar(t *testing.T, ready bool, handler http.HandlerFunc) *fakeSidecar {
	t.Helper()
	s := &fakeSidecar{handler: handler, waits: make(chan string, 16)}
	s.ready.Store(ready)
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(spec.ProbeHeader) == spec.ProbeHeaderValue {
			s.probes.Add(1)
			if wait := r.Header.Get(spec.ProbeWaitHeader); wait != "" && s.hold.Load() {
				select {
				case s.waits <- wait:
				default:
				}
				d, _ := time.ParseDuration(wait)
				for end := time.Now().Add(d); !s.ready.Load() && time.Now().Before(end) && r.Context().Err() == nil; {
					time.Sleep(time.Millisecond)
				}
			}
			if !s.ready.Load() {
				http.Error(w, "not ready", http.StatusServiceUnavailable)
				return
			}
			io.WriteString(w, spec.ProbeHeaderValue)
			return
		}
		n := s.inflight.Add(1)
		defer s.inflight.Add(-1)
		for {
			m := s.maxConc.Load()
			if n <= m || s.maxConc.CompareAndSwap(m, n) {
				break
			}
		}
		s.requests.Add(1)
		if s.handler != nil {
			s.handler(w, r)
			return
		}
		w.Header().Set("X-Got-Revision", r.Header.Get(spec.RevisionHeader))
		w.Header().Set("X-Got-Proto", r.Proto)
		io.WriteString(w, "ok from "+r.Host)
	}))
	// HTTP/1.1 and h2c on one port, as the real sidecar serves.
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	s.srv.Config.Protocols = &protos
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	s.port = s.srv.Listener.Addr().(*net.TCPAddr).Port
	return s
}

func (s *fakeSidecar) instance(rev string) consulroute.Instance {
	return consulroute.Instance{ID: "c-" + strconv.Itoa(s.port), Revision: rev, Address: "127.0.0.1", Port: s.port}
}

func (s *fakeSidecar) allocation(rev, id string, running bool) catalog.Allocation {
	return catalog.Allocation{ID: id, Revision: rev, Address: "127.0.0.1", Port: s.port, Running: running}
}

// testGateway runs a gateway over cat behind an httptest server; both stop
// at the end of the test.
type testGateway struct {
	g   *Gateway
	srv *httptest.Server
	as  *fakeAutoscaler
	reg *prometheus.Registry
}

func startGateway(t *testing.T, cat *catalog.Catalog, as *fakeAutoscaler, mod func(*Config)) *testGateway {
	t.Helper()
	if as == nil {
		as = &fakeAutoscaler{}
	}
	reg := prometheus.NewRegistry()
	cfg := Config{Catalog: cat, Autoscaler: as, Registerer: reg, ProbeInterval: 10 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	g, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	srv := httptest.NewUnstartedServer(g)
	srv.Config = g.Server("")
	srv.Start()
	t.Cleanup(func() {
		srv.Close()
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of cancel")
		}
	})
	waitFor(t, "gateway healthy", func() bool { return g.healthy.Load() })
	return &testGateway{g: g, srv: srv, as: as, reg: reg}
}

// get sends a request with the given Host through the gateway.
func (tg *testGateway) get(t *testing.T, host, path string, hdr map[string]string) (int, string, http.Header) {
	t.Helper()
	resp, body := tg.send(t, http.MethodGet, host, path, nil, hdr)
	return resp.StatusCode, body, resp.Header
}

// post sends body to / on host and returns the response (its body read
// and closed) and the body.
func (tg *testGateway) post(t *testing.T, host, body string) (*http.Response, string) {
	t.Helper()
	return tg.send(t, http.MethodPost, host, "/", strings.NewReader(body), nil)
}

// send is one request through the gateway; the response's body is read
// and closed.
func (tg *testGateway) send(t *testing.T, method, host, path string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, tg.srv.URL+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := tg.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// counter reads a metric's value (sum over label sets matching labels).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metric:
		for _, m := range mf.GetMetric() {
			for k, v := range labels {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == k && lp.GetValue() == v {
						found = true
					}
				}
				if !found {
					continue metric
				}
			}
			switch {
			case m.Counter != nil:
				total += m.Counter.GetValue()
			case m.Gauge != nil:
				total += m.Gauge.GetValue()
			case m.Histogram != nil:
				total += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return total
}

// waitFor polls cond every 5 ms for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testbin.Bound(30 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// oneRevision is a catalog with service hello -> hello-00001.
func oneRevision(concurrency int, timeout time.Duration) *catalog.Catalog {
	cat := catalog.New()
	cat.SetRevision(catalog.Revision{Name: "hello-00001", Service: "hello", Namespace: "default",
		Concurrency: concurrency, Timeout: timeout, Scaling: spec.DefaultScaling()})
	cat.SetService(catalog.Service{Name: "hello", Namespace: "default", Domains: []string{"hello.example.com"},
		Route: consulroute.Route{Service: "hello", Namespace: "default",
			Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 100}},
			Tags:   map[string]string{"canary": "hello-00001"}}})
	return cat
}

func splitHostPort(tb testing.TB, addr string) (string, int) {
	tb.Helper()
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		tb.Fatal(err)
	}
	n, _ := strconv.Atoi(p)
	return h, n
}

// routable lists the addresses the gateway sends a revision's requests to.
func (g *Gateway) routable(rev string) []string {
	t := g.table.Load()
	r := t.revisions[rev]
	if r == nil {
		return nil
	}
	var out []string
	for _, b := range r.pool.Load().backends {
		out = append(out, b.hostPort)
	}
	slices.Sort(out)
	return out
}
