package autoscaler

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// statsServer is a sidecar admin port serving spec.Stats.
type statsServer struct {
	srv   *httptest.Server
	stats atomic.Pointer[spec.Stats]
	hits  atomic.Int64
}

func newStatsServer(t *testing.T, revision string, concurrency float64) *statsServer {
	t.Helper()
	s := &statsServer{}
	s.set(revision, concurrency)
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.hits.Add(1)
		if r.URL.Path != spec.StatsPath {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(s.stats.Load())
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *statsServer) set(revision string, concurrency float64) {
	s.stats.Store(&spec.Stats{Service: "hello", Revision: revision, Instance: "x", IntervalSeconds: 2,
		AverageConcurrency: concurrency, Requests: concurrency * 4, RPS: concurrency * 2, Ready: true})
}

// instance is the consulroute.Instance of an httptest server's admin port.
func instanceOf(t *testing.T, id, revision string, url string) consulroute.Instance {
	t.Helper()
	host, port, err := net.SplitHostPort(url[len("http://"):])
	if err != nil {
		t.Fatal(err)
	}
	p, _ := strconv.Atoi(port)
	return consulroute.Instance{ID: id, Revision: revision, Address: host, Port: 1, AdminPort: p}
}

// closedPort is a 127.0.0.1 port nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	return p
}

func TestHTTPScraper(t *testing.T) {
	ok := newStatsServer(t, "hello-00001", 4.5)
	broken := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "boom", http.StatusInternalServerError)
	}))
	t.Cleanup(broken.Close)
	garbage := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Write([]byte("<html>not stats</html>"))
	}))
	t.Cleanup(garbage.Close)
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hang); slow.Close() })

	sc := NewHTTPScraper(nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()

	st, err := sc.Scrape(ctx, instanceOf(t, "i1", "hello-00001", ok.srv.URL))
	if err != nil || st.AverageConcurrency != 4.5 || st.Revision != "hello-00001" {
		t.Fatalf("scrape of a healthy sidecar: %+v, %v", st, err)
	}
	for name, inst := range map[string]consulroute.Instance{
		"500":           instanceOf(t, "i2", "hello-00001", broken.URL),
		"not JSON":      instanceOf(t, "i3", "hello-00001", garbage.URL),
		"timeout":       instanceOf(t, "i4", "hello-00001", slow.URL),
		"refused":       {ID: "i5", Address: "127.0.0.1", AdminPort: closedPort(t)},
		"no admin port": {ID: "i6", Address: "127.0.0.1"},
	} {
		if _, err := sc.Scrape(ctx, inst); err == nil {
			t.Errorf("%s: no error", name)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestCollectorMarksFailuresUnknown(t *testing.T) {
	good := newStatsServer(t, "hello-00001", 3)
	other := newStatsServer(t, "other-00001", 50) // the port was reused
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	t.Cleanup(func() { close(hang); slow.Close() })

	c := collector{scraper: NewHTTPScraper(nil), timeout: 300 * time.Millisecond, workers: 4}
	insts := []consulroute.Instance{
		instanceOf(t, "a", "hello-00001", good.srv.URL),
		instanceOf(t, "b", "hello-00001", good.srv.URL),
		instanceOf(t, "c", "hello-00001", other.srv.URL),
		instanceOf(t, "d", "hello-00001", slow.URL),
		{ID: "e", Revision: "hello-00001", Address: "127.0.0.1", AdminPort: closedPort(t)},
	}
	c.add(0, spec.MetricConcurrency, &insts[0])
	c.add(0, spec.MetricRPS, &insts[1])
	c.add(1, spec.MetricConcurrency, &insts[2])
	c.add(1, spec.MetricConcurrency, &insts[3])
	c.add(2, spec.MetricConcurrency, &insts[4])
	start := time.Now()
	c.run(context.Background())
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("a round of scrapes took %s; the timeout does not bound it", took)
	}
	want := []scrapeResult{{3, true}, {6, true}, {}, {}, {}}
	for i, w := range want {
		if c.results[i] != w {
			t.Errorf("job %d (%s): %+v, want %+v (err %v)", i, c.jobs[i].inst.ID, c.results[i], w, c.failed[i])
		}
	}
}

// TestAutoscalerOverHTTPStats runs the whole loop against real stats
// endpoints: the collector feeds the windows, the decider scales.
func TestAutoscalerOverHTTPStats(t *testing.T) {
	const rev = "hello-00001"
	servers := []*statsServer{newStatsServer(t, rev, 100), newStatsServer(t, rev, 110)}
	var insts []consulroute.Instance
	for i, s := range servers {
		insts = append(insts, instanceOf(t, "alloc-"+strconv.Itoa(i), rev, s.srv.URL))
	}
	cat := catalog.New()
	cat.SetRevision(testRevision(rev, 2, nil))
	cat.SetReady(rev, insts)
	sc := &recordingScaler{cat: cat}
	clk := newClock()
	a, err := New(Config{Revisions: cat, Scaler: sc, Now: clk.Now, ScrapeTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	l := startLoop(t, a)
	ctx := context.Background()
	tickN(ctx, l, clk, 1, 2*time.Second)
	st, ok := a.State(rev)
	if !ok || st.Stable != 210 || st.ScrapeFailures != 0 {
		t.Fatalf("state %+v, want stable 210 from two sidecars", st)
	}
	// Two instances started in panic mode (a fresh decider); 210 / 70 = 3.
	calls := sc.Calls()
	if len(calls) != 1 || calls[0].Count != 3 {
		t.Fatalf("calls %+v, want one call for 3", calls)
	}
	for i, s := range servers {
		if s.hits.Load() != 1 {
			t.Errorf("sidecar %d scraped %d times, want 1", i, s.hits.Load())
		}
	}
	// One sidecar dies: it is unknown, the other stands for it.
	servers[1].srv.Close()
	tickN(ctx, l, clk, 1, 2*time.Second)
	if st, _ := a.State(rev); st.ScrapeFailures != 1 {
		t.Fatalf("scrape failures %d after a sidecar died, want 1", st.ScrapeFailures)
	}
}
