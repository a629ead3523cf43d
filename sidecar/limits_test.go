package sidecar_test

import (
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// newClient returns a client with enough idle connections for parallel
// tests (the default keeps two).
func newClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: conns, MaxConnsPerHost: 0}, Timeout: 60 * time.Second}
}

// The app itself records its maximum concurrency: behind a limit of 5, 200
// parallel requests never have more than 5 in the app, and all succeed.
func TestConcurrencyLimitHeldUnder200Parallel(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	cfg := config(a.port)
	cfg.Concurrency = 5
	cfg.QueueDepth = 300
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)
	a.post(t, "/reset")

	const n = 200
	client := newClient(n)
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(r.url + "/?sleep=20ms")
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				ok.Add(1)
			}
		}()
	}
	wg.Wait()
	st := a.stats(t)
	if ok.Load() != n || st.Requests != n {
		t.Fatalf("%d of %d succeeded, app saw %d", ok.Load(), n, st.Requests)
	}
	if st.MaxConcurrency > 5 {
		t.Fatalf("the app saw %d requests at once; the limit is 5", st.MaxConcurrency)
	}
	if st.MaxConcurrency < 2 {
		t.Fatalf("the app never saw more than %d at once: the load did not overlap", st.MaxConcurrency)
	}
	if s := r.stats(t); s.InFlight != 0 || s.Queued != 0 || s.Requests != n {
		t.Fatalf("sidecar stats after the load: %+v", s)
	}
}

// A full queue fails fast with 503 and says why.
func TestQueueFullFailsFast(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	cfg := config(a.port)
	cfg.Concurrency = 1
	cfg.QueueDepth = 2
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)

	// Fill the app slot and the queue with requests held for a while.
	client := newClient(8)
	var wg sync.WaitGroup
	codes := make(chan int, 3)
	for i := 0; i < 3; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := client.Get(r.url + "/?sleep=1500ms")
			if err != nil {
				t.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			codes <- resp.StatusCode
		}()
	}
	waitUntil(t, "one in the app and two queued", func() bool { s := r.stats(t); return s.InFlight == 3 && s.Queued == 2 })
	start := time.Now()
	code, body := get(t, r.url+"/")
	if code != http.StatusServiceUnavailable || !strings.Contains(body, "concurrency limit") || !strings.Contains(body, "queue is full") {
		t.Fatalf("over the queue: %d %q", code, body)
	}
	if waited := time.Since(start); waited > time.Second {
		t.Errorf("the refusal took %s; it must not wait for a slot", waited)
	}
	wg.Wait()
	close(codes)
	for c := range codes {
		if c != 200 {
			t.Fatalf("an admitted request got %d", c)
		}
	}
	_, metrics := get(t, r.adminURL+"/metrics")
	if !strings.Contains(metrics, `nomad_serverless_sidecar_breaker_rejections_total{revision="hello-00001",service="hello"} 1`) {
		t.Fatalf("rejection not counted:\n%s", grepLines(metrics, "rejections"))
	}
}

func TestTimeouts(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	cfg := config(a.port)
	cfg.Concurrency = 1
	cfg.QueueDepth = 5
	cfg.Timeout = 900 * time.Millisecond
	cfg.ResponseStartTimeout = 300 * time.Millisecond
	cfg.IdleTimeout = 400 * time.Millisecond
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)

	t.Run("response start", func(t *testing.T) {
		code, body := get(t, r.url+"/?sleep=2s")
		if code != http.StatusGatewayTimeout || !strings.Contains(body, "response_start_timeout") {
			t.Fatalf("%d %q", code, body)
		}
	})
	t.Run("idle", func(t *testing.T) {
		// The headers and first chunk come at once, then nothing for 1 s.
		resp, err := http.Get(r.url + "/?stream=3&interval=1s")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || err == nil || string(b) != "chunk 1\n" {
			t.Fatalf("status %d, body %q, err %v: want the stream cut after chunk 1", resp.StatusCode, b, err)
		}
	})
	t.Run("a flowing response outlives timeout", func(t *testing.T) {
		// Chunks every 100 ms keep the 400 ms idle timer happy and run
		// past the 900 ms timeout: as in Knative, timeout bounds the wait
		// for the response, not the response, so the stream ends whole.
		resp, err := http.Get(r.url + "/?stream=15&interval=100ms")
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || strings.Count(string(b), "chunk") != 15 {
			t.Fatalf("body %q err %v: want all 15 chunks", b, err)
		}
	})

	// Without response_start_timeout, idle_timeout answers an app that
	// stays silent before its first byte; without either, timeout does.
	idleOnly := config(a.port)
	idleOnly.Timeout = time.Minute
	idleOnly.IdleTimeout = 300 * time.Millisecond
	ri := startSidecar(t, idleOnly, sidecar.Options{})
	ri.waitReady(t)
	t.Run("idle before the first byte", func(t *testing.T) {
		code, body := get(t, ri.url+"/?sleep=5s")
		if code != http.StatusGatewayTimeout || !strings.Contains(body, "idle_timeout (300ms)") {
			t.Fatalf("%d %q", code, body)
		}
	})
	timeoutOnly := config(a.port)
	timeoutOnly.Timeout = 300 * time.Millisecond
	rt := startSidecar(t, timeoutOnly, sidecar.Options{})
	rt.waitReady(t)
	t.Run("timeout before the first byte", func(t *testing.T) {
		code, body := get(t, rt.url+"/?sleep=5s")
		if code != http.StatusGatewayTimeout || !strings.Contains(body, "timeout") {
			t.Fatalf("%d %q", code, body)
		}
	})
	// Every timed-out request released its slot and its in-flight count.
	waitUntil(t, "nothing in flight", func() bool { s := r.stats(t); return s.InFlight == 0 && s.Queued == 0 })
	if code, _ := get(t, r.url+"/"); code != 200 {
		t.Fatalf("after the timeouts a plain request got %d", code)
	}
	for _, c := range []struct {
		r     *running
		kinds []string
	}{{r, []string{"response_start", "idle"}}, {ri, []string{"idle"}}, {rt, []string{"request"}}} {
		_, metrics := get(t, c.r.adminURL+"/metrics")
		for _, kind := range c.kinds {
			if !strings.Contains(metrics, `timeout="`+kind+`"} `) || strings.Contains(metrics, `timeout="`+kind+`"} 0`) {
				t.Errorf("timeout %s not counted:\n%s", kind, grepLines(metrics, "timeouts_total"))
			}
		}
	}
}

// The averages the autoscaler reads match the load sent.
func TestStatsMatchLoad(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)
	r.stats(t) // start a fresh window

	// Four clients, each sending back-to-back 100 ms requests for a while:
	// concurrency 4 almost all the time.
	const clients, each = 4, 8
	client := newClient(clients)
	var wg sync.WaitGroup
	var busy atomic.Int64 // client-side request time, ns
	start := time.Now()
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < each; i++ {
				t0 := time.Now()
				resp, err := client.Get(r.url + "/?sleep=100ms")
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				busy.Add(int64(time.Since(t0)))
			}
		}()
	}
	wg.Wait()
	st := r.stats(t)
	elapsed := time.Since(start)
	if st.Requests != clients*each {
		t.Fatalf("stats counted %v requests, sent %d", st.Requests, clients*each)
	}
	// The sidecar sees each request for a little less time than the
	// client does, and its window is a little longer than the load.
	clientSide := float64(busy.Load()) / float64(elapsed)
	if st.AverageConcurrency > clientSide*1.01 || st.AverageConcurrency < clientSide*0.8 {
		t.Fatalf("average concurrency %.3f; client-side %.3f", st.AverageConcurrency, clientSide)
	}
	if math.Abs(st.RPS-st.Requests/st.IntervalSeconds) > 1e-9 || st.Service != "hello" || st.Revision != "hello-00001" || st.Instance != "alloc-1" {
		t.Fatalf("stats %+v", st)
	}
	// Reading starts a new window: nothing happened since.
	if st2 := r.stats(t); st2.Requests != 0 || st2.AverageConcurrency != 0 {
		t.Fatalf("second read %+v", st2)
	}
}

func TestAdminPortIsReadOnly(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	cfg := config(a.port)
	cfg.Liveness = &spec.Probe{Type: spec.ProbeHTTP, Path: "/healthz", Period: 50 * time.Millisecond, Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 2}
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)
	for _, m := range []string{"POST", "PUT", "DELETE", "PATCH"} {
		for _, p := range []string{"/stats", "/metrics", "/liveness", "/drain", "/"} {
			req, _ := http.NewRequest(m, r.adminURL+p, strings.NewReader("x"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, p, resp.StatusCode)
			}
		}
	}
	if code, _ := get(t, r.adminURL+"/drain"); code != http.StatusNotFound {
		t.Errorf("GET /drain: %d", code)
	}
	if code, _ := probe(t, r.url); code != 200 {
		t.Fatal("the admin calls changed the sidecar's state")
	}
	// Liveness reflects the app's /healthz.
	if code, _ := get(t, r.adminURL+"/liveness"); code != 200 {
		t.Fatalf("liveness %d", code)
	}
	a.post(t, "/fail-live")
	waitUntil(t, "liveness fails", func() bool { c, _ := get(t, r.adminURL+"/liveness"); return c == 503 })
	_, body := get(t, r.adminURL+"/liveness")
	if !strings.Contains(body, "503") {
		t.Errorf("liveness body %q does not say why", body)
	}
	a.post(t, "/live-ok")
	waitUntil(t, "liveness passes again", func() bool { c, _ := get(t, r.adminURL+"/liveness"); return c == 200 })
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
