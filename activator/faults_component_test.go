package activator

// Component tests of the retry, budget and ejection rules with real
// sidecar and test app processes: kill -9 of one instance's app under load
// through the gateway, the catalog saying what Nomad and Consul would (the
// allocation stays Running while Nomad restarts the task in place; Consul
// marks it critical at its next check).

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// loadResult counts what a load run got.
type loadResult struct {
	ok, failed atomic.Int64
	mu         sync.Mutex
	samples    []string    // a few failures
	failedAt   []time.Time // when each failed request started
	starts     []time.Time // when every request started
}

func (lr *loadResult) fail(start time.Time, s string) {
	lr.failed.Add(1)
	lr.mu.Lock()
	if len(lr.samples) < 5 {
		lr.samples = append(lr.samples, s)
	}
	lr.failedAt = append(lr.failedAt, start)
	lr.mu.Unlock()
}

// startedWithin counts the requests started in [from, to).
func (lr *loadResult) startedWithin(from, to time.Time) int {
	lr.mu.Lock()
	defer lr.mu.Unlock()
	n := 0
	for _, s := range lr.starts {
		if !s.Before(from) && s.Before(to) {
			n++
		}
	}
	return n
}

// runLoad sends requests from conns clients (keep-alive each) until ctx
// ends; body non-empty makes them POSTs with that body to /echo?sleep=.
func runLoad(ctx context.Context, url string, conns int, body string, lr *loadResult) *sync.WaitGroup {
	var wg sync.WaitGroup
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cli := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}, Timeout: 30 * time.Second}
			defer cli.CloseIdleConnections()
			for ctx.Err() == nil {
				method, path := http.MethodGet, "/?sleep=10ms"
				var rd io.Reader
				if body != "" {
					method, path, rd = http.MethodPost, "/echo?sleep=10ms", strings.NewReader(body)
				}
				req, _ := http.NewRequest(method, url+path, rd)
				req.Host = "hello.default.localhost"
				start := time.Now()
				lr.mu.Lock()
				lr.starts = append(lr.starts, start)
				lr.mu.Unlock()
				resp, err := cli.Do(req)
				if err != nil {
					lr.fail(start, err.Error())
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				switch {
				case err != nil:
					lr.fail(start, fmt.Sprintf("%d, body cut: %v", resp.StatusCode, err))
				case resp.StatusCode != 200:
					lr.fail(start, fmt.Sprintf("%d %q", resp.StatusCode, strings.TrimSpace(string(b))))
				case body != "" && string(b) != body:
					lr.fail(start, fmt.Sprintf("echo of %d bytes came back as %d", len(body), len(b)))
				default:
					lr.ok.Add(1)
				}
			}
		}()
	}
	return &wg
}

// killUnderLoad runs 8-connection load over two instances (concurrency 10
// each), kills one's app with SIGKILL after a second, and, as Consul and
// Nomad would, drops it from the passing list a check interval later and
// restarts its app a little after. It returns the load's result, the
// requests in flight to the killed instance at the kill, and when the app
// was gone (its port refused: the process takes a moment to die, and
// requests written to its sockets meanwhile were in flight at the kill
// too).
func killUnderLoad(t *testing.T, body string) (*loadResult, int, time.Time, time.Time) {
	a := startProcInstance(t, "a", 10)
	b := startProcInstance(t, "b", 10)
	pg := startProcGateway(t, 10, nil, a, b)

	ctx, cancel := context.WithCancel(context.Background())
	lr := &loadResult{}
	wg := runLoad(ctx, pg.url(), 8, body, lr)
	time.Sleep(time.Second)

	inFlightToA := func() int {
		for _, st := range pg.g.Revisions() {
			for _, in := range st.Instances {
				if in.Address == a.addr() {
					return in.InFlight
				}
			}
		}
		return 0
	}
	// The count and the kill cannot be one instant: the requests in
	// flight at the kill are at most the larger of the counts just before
	// and just after it, and the ones sent from the first count on (the
	// window returned starts there).
	killed := time.Now()
	inFlight := inFlightToA()
	before := lr.ok.Load() + lr.failed.Load()
	if err := a.app.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	inFlight = max(inFlight, inFlightToA())
	var gone time.Time
	for gone.IsZero() {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", fmt.Sprint(a.appPort)), 100*time.Millisecond)
		if err != nil {
			gone = time.Now()
			break
		}
		c.Close()
		time.Sleep(100 * time.Microsecond)
	}
	// Consul's check (interval 1s here) sees the sidecar's 503 next.
	time.Sleep(time.Second)
	pg.cat.SetReady("hello-00001", []consulroute.Instance{b.consul()})
	// Nomad restarts the task in place after its restart delay.
	time.Sleep(500 * time.Millisecond)
	restarted := testbin.Start(t, testbin.Path(t), []string{"testapp"}, map[string]string{
		testapp.EnvPort: fmt.Sprint(a.appPort), testapp.EnvName: "a"})
	restarted.WaitPort(t, a.appPort, 20*time.Second)
	pg.cat.SetReady("hello-00001", []consulroute.Instance{a.consul(), b.consul()})
	time.Sleep(time.Second)
	cancel()
	wg.Wait()

	st := in2(t, a)
	t.Logf("%d requests (%d before the kill), %d failed; %d in flight to the killed instance at the kill; restarted app served %d",
		lr.ok.Load()+lr.failed.Load(), before, lr.failed.Load(), inFlight, st)
	t.Logf("gateway: retries %.0f, ejections %.0f, denied %.0f; kill at %s",
		counter(t, pg.reg, "nomad_serverless_gateway_retries_total", nil),
		counter(t, pg.reg, "nomad_serverless_gateway_ejections_total", nil),
		counter(t, pg.reg, "nomad_serverless_gateway_retries_denied_total", nil), killed.Format("15:04:05.000"))
	for _, s := range lr.samples {
		t.Logf("failure: %s", s)
	}
	return lr, inFlight, killed, gone
}

// in2 is how many work requests the restarted app served (0 if none).
func in2(t *testing.T, in *procInstance) int64 { return in.appStats(t).Requests }

// kill -9 of one instance's app under GET load: no request fails. The
// requests the dead app had are answered NotServed by its sidecar (they
// are replayable) and retried on the other instance; the instance leaves
// balancing at its first such answer and comes back after its probe once
// the app is restarted.
func TestComponentKillAppUnderGETLoad(t *testing.T) {
	lr, _, _, _ := killUnderLoad(t, "")
	if n := lr.failed.Load(); n != 0 {
		t.Fatalf("%d of %d GETs failed, want 0", n, n+lr.ok.Load())
	}
}

// Under POST load (bodies, not replayable), at most the requests the app
// had when it died fail: everything after never reaches it and is retried
// with its body on the other instance.
func TestComponentKillAppUnderPOSTLoad(t *testing.T) {
	lr, inFlight, killed, gone := killUnderLoad(t, strings.Repeat("p", 512))
	dying := lr.startedWithin(killed, gone)
	t.Logf("%d more requests sent while the app died (%s)", dying, gone.Sub(killed).Round(time.Microsecond))
	if n := lr.failed.Load(); n > int64(inFlight+dying) {
		t.Errorf("%d POSTs failed, more than the %d in flight to the killed instance", n, inFlight+dying)
	}
	for _, at := range lr.failedAt {
		if !at.Before(gone) {
			t.Errorf("a POST sent %s after the app was gone failed", at.Sub(gone))
		}
	}
}
