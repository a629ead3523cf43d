package autoscaler_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/dev/localcluster"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// syncBuffer collects process and log output, shown when the test fails.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// loadGen is the component test's load: workers that each keep one request
// in flight to the revision's ready instances (round robin), and, like the
// activator, hold (count as queued) while there is no ready instance,
// reporting that demand to the autoscaler and waking it once.
type loadGen struct {
	cat  *catalog.Catalog
	sink autoscaler.DemandSink
	rev  string

	queued, inFlight, ok, failed atomic.Int64
	next                         atomic.Uint64
	client                       *http.Client
	cancel                       context.CancelFunc
	wg                           sync.WaitGroup
}

// maxLoadRequests bounds the whole test's requests.
const maxLoadRequests = 200_000

func startLoad(t *testing.T, cat *catalog.Catalog, sink autoscaler.DemandSink, rev string, workers int) *loadGen {
	ctx, cancel := context.WithCancel(context.Background())
	g := &loadGen{cat: cat, sink: sink, rev: rev, cancel: cancel,
		client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: workers}}}
	for range workers {
		g.wg.Add(1)
		go g.worker(ctx)
	}
	g.wg.Add(1)
	go g.report(ctx)
	t.Cleanup(g.stop)
	return g
}

func (g *loadGen) worker(ctx context.Context) {
	defer g.wg.Done()
	queued := false
	defer func() {
		if queued {
			g.queued.Add(-1)
		}
	}()
	for ctx.Err() == nil && g.ok.Load()+g.failed.Load() < maxLoadRequests {
		ready := g.cat.Ready(g.rev)
		if len(ready) == 0 {
			if !queued {
				queued = true
				if g.queued.Add(1) == 1 {
					g.sink.Wake(ctx, "loadgen", autoscaler.Demand{Revision: g.rev, Queued: 1})
				}
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond):
			}
			continue
		}
		if queued {
			queued = false
			g.queued.Add(-1)
		}
		in := ready[g.next.Add(1)%uint64(len(ready))]
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+in.HostPort()+"/", nil)
		g.inFlight.Add(1)
		resp, err := g.client.Do(req)
		g.inFlight.Add(-1)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
		}
		switch {
		case ctx.Err() != nil:
		case err == nil && resp.StatusCode == http.StatusOK:
			g.ok.Add(1)
		default:
			// An instance stopping under us (a scale down) can refuse a
			// request; count it, the test bounds the share.
			g.failed.Add(1)
		}
	}
}

// report sends the held demand every 200ms, as the activator does every
// second.
func (g *loadGen) report(ctx context.Context) {
	defer g.wg.Done()
	t := time.NewTicker(200 * time.Millisecond)
	defer t.Stop()
	for {
		g.sink.ReportDemand(ctx, "loadgen", []autoscaler.Demand{{Revision: g.rev, Queued: int(g.queued.Load()), InFlight: int(g.inFlight.Load())}})
		select {
		case <-ctx.Done():
			// The load is gone: say so at once.
			g.sink.ReportDemand(context.Background(), "loadgen", []autoscaler.Demand{{Revision: g.rev}})
			return
		case <-t.C:
		}
	}
}

func (g *loadGen) stop() {
	g.cancel()
	g.wg.Wait()
	g.client.CloseIdleConnections()
}

// TestComponentLoadStep wires the autoscaler to real sidecar and test app
// processes (localcluster): a load step from zero scales the revision up,
// the count holds while the load holds, and returns to zero after the
// scale-to-zero grace once the load stops. Time is scaled down through the
// scaling settings (6s window, 3s grace, 250ms tick), not sleeps of minutes.
func TestComponentLoadStep(t *testing.T) {
	if testing.Short() {
		t.Skip("component test: starts processes")
	}
	const (
		rev     = "load-00001"
		workers = 15 // concurrent requests: 3 instances at 5 per instance
		grace   = 3 * time.Second
	)
	out := &syncBuffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("autoscaler log and process output:\n%s", out.String())
		}
	})
	cat := catalog.New()
	cl, err := localcluster.New(cat, localcluster.Options{
		Binary:        testbin.Path(t),
		CheckInterval: 200 * time.Millisecond,
		Output:        out,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cl.Close(); err != nil {
			t.Errorf("close cluster: %v", err)
		}
	})
	s := spec.DefaultScaling()
	s.Window = 6 * time.Second
	s.Target, s.Utilization = 10, 50 // 5 concurrent per instance
	s.ScaleToZeroGrace = grace
	s.Initial, s.Max = 0, 4
	if err := cl.AddRevision(catalog.Revision{Name: rev, Timeout: 10 * time.Second, Scaling: s},
		localcluster.App{Sleep: 400 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}

	a, err := autoscaler.New(autoscaler.Config{
		Revisions:     cat,
		Scaler:        cl,
		Tick:          250 * time.Millisecond,
		ScrapeTimeout: 200 * time.Millisecond,
		DemandTTL:     time.Second,
		Logger:        slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(testbin.Bound(30 * time.Second)):
			t.Error("autoscaler did not stop")
		}
	})
	waitUntil(t, 10*time.Second, "the autoscaler's first decision", func() bool { _, ok := a.State(rev); return ok })
	if st, _ := a.State(rev); st.Desired != 0 || st.Count != 0 {
		t.Fatalf("idle revision at zero: %+v", st)
	}

	// Load step.
	load := startLoad(t, cat, a, rev, workers)
	waitUntil(t, 60*time.Second, "the count to go up to 3 ready instances", func() bool {
		return cl.Desired(rev) >= 3 && len(cat.Ready(rev)) >= 3
	})
	up := a.States()
	t.Logf("scaled up: %+v", up)

	// Hold: while the load holds the count does not fall.
	holdUntil := time.Now().Add(4 * time.Second)
	for time.Now().Before(holdUntil) {
		if d := cl.Desired(rev); d < 3 {
			st, _ := a.State(rev)
			t.Fatalf("count fell to %d under steady load: %+v", d, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	st, _ := a.State(rev)
	if st.Stable < 10 || st.Stable > float64(workers)+1 {
		t.Errorf("stable concurrency %.1f under %d concurrent requests", st.Stable, workers)
	}
	load.stop()
	stopped := time.Now()
	okN, failedN := load.ok.Load(), load.failed.Load()
	if okN == 0 || failedN*20 > okN {
		t.Fatalf("load: %d ok, %d failed; want most requests served", okN, failedN)
	}

	// Back to zero, not before the grace period.
	waitUntil(t, 60*time.Second, "the count to return to zero", func() bool { return cl.Desired(rev) == 0 })
	ev := cl.ScaleEvents(rev)
	last := ev[len(ev)-1]
	if last.To != 0 || !strings.HasPrefix(last.Reason, "no traffic for ") {
		t.Fatalf("last scale event %+v, want to zero for no traffic", last)
	}
	if idle := last.At.Sub(stopped); idle < grace {
		t.Fatalf("scaled to zero %s after the load stopped, before the %s grace", idle, grace)
	}
	var rose bool
	for _, e := range ev {
		if e.From == 0 && e.To > 0 {
			rose = true
		}
		if e.To > s.Max {
			t.Errorf("scale event above max %d: %+v", s.Max, e)
		}
		t.Logf("scale event: %d -> %d at +%s: %s", e.From, e.To, e.At.Sub(ev[0].At).Round(time.Millisecond), e.Reason)
	}
	t.Logf("load stopped at +%s after %d requests (%d failed)", stopped.Sub(ev[0].At).Round(time.Millisecond), okN, failedN)
	if !rose {
		t.Errorf("no scale event from zero: %+v", ev)
	}
	waitUntil(t, 30*time.Second, "the instances to stop", func() bool { return cl.Running(rev) == 0 && len(cat.Ready(rev)) == 0 })
}

func waitUntil(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	d = testbin.Bound(d)
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
