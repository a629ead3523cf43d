package sidecar_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// Component tests: the test app runs as a real process (the
// nomad-serverless binary's testapp command); the sidecar runs in this
// process, on real listeners on 127.0.0.1, so the race detector sees it.

type app struct {
	port int
	url  string
	proc *testbin.Proc
}

func startApp(t *testing.T, env map[string]string) *app {
	t.Helper()
	port := testbin.FreePort(t)
	if env == nil {
		env = map[string]string{}
	}
	env[testapp.EnvPort] = strconv.Itoa(port)
	p := testbin.Start(t, testbin.Path(t), []string{"testapp"}, env)
	if env[testapp.EnvStartDelay] == "" {
		p.WaitPort(t, port, 20*time.Second)
	}
	return &app{port: port, url: "http://127.0.0.1:" + strconv.Itoa(port), proc: p}
}

func (a *app) stats(t *testing.T) testapp.Stats {
	t.Helper()
	var st testapp.Stats
	getJSON(t, a.url+"/stats", &st)
	return st
}

func (a *app) post(t *testing.T, path string) {
	t.Helper()
	resp, err := http.Post(a.url+path, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
}

type running struct {
	sc       *sidecar.Sidecar
	url      string
	adminURL string
	port     int
	stop     func() // cancels Serve and waits for it
}

func config(appPort int) spec.SidecarConfig {
	return spec.SidecarConfig{
		AppPort:      appPort,
		Service:      "hello",
		Revision:     "hello-00001",
		Instance:     "alloc-1",
		Timeout:      30 * time.Second,
		DrainGrace:   200 * time.Millisecond,
		DrainTimeout: 5 * time.Second,
	}
}

func startSidecar(t *testing.T, cfg spec.SidecarConfig, opts sidecar.Options) *running {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	adm, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Port = ln.Addr().(*net.TCPAddr).Port
	cfg.AdminPort = adm.Addr().(*net.TCPAddr).Port
	sc, err := sidecar.New(cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- sc.Serve(ctx, ln, adm) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("Serve: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("sidecar did not stop within 30s")
			}
		})
	}
	t.Cleanup(stop)
	return &running{sc: sc, url: "http://" + ln.Addr().String(), adminURL: "http://" + adm.Addr().String(), port: cfg.Port, stop: stop}
}

// waitReady polls the probe header until the sidecar answers 200.
func (r *running) waitReady(t *testing.T) {
	t.Helper()
	bound := testbin.Bound(30 * time.Second)
	deadline := time.Now().Add(bound)
	for {
		if code, _ := probe(t, r.url); code == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sidecar not ready within %s", bound)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (r *running) stats(t *testing.T) spec.Stats {
	t.Helper()
	var st spec.Stats
	getJSON(t, r.adminURL+spec.StatsPath, &st)
	return st
}

func probe(t *testing.T, url string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", url+"/", nil)
	req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: decode: %v", url, err)
	}
}

func TestProxyBasicsAndHeaders(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)

	if code, body := get(t, r.url+"/"); code != 200 || body != "ok\n" {
		t.Fatalf("GET /: %d %q", code, body)
	}
	if code, _ := get(t, r.url+"/?status=503"); code != 503 {
		t.Fatalf("app's 503 came back as %d", code)
	}
	if _, body := get(t, r.url+"/?size=300000"); len(body) != 300000 {
		t.Fatalf("large body: %d bytes", len(body))
	}

	req, _ := http.NewRequest("GET", r.url+"/headers?x=1", nil)
	req.Host = "hello.example.com"
	req.Header.Set("Traceparent", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	req.Header.Set("X-Forwarded-For", "203.0.113.9")
	req.Header.Set("X-Forwarded-Proto", "https")
	req.Header.Set("X-Forwarded-Host", "hello.example.com")
	req.Header.Set("Connection", "X-Hop")
	req.Header.Set("X-Hop", "must not pass")
	req.Header.Set("Keep-Alive", "timeout=5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var seen testapp.Request
	err = json.NewDecoder(resp.Body).Decode(&seen)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header(seen.Headers)
	for k, want := range map[string]string{
		"Traceparent":       "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		"X-Forwarded-For":   "203.0.113.9, 127.0.0.1",
		"X-Forwarded-Proto": "https",
		"X-Forwarded-Host":  "hello.example.com",
		// Built from X-Forwarded-* (no Forwarded came), then this hop.
		"Forwarded": "for=203.0.113.9;host=hello.example.com;proto=https, for=127.0.0.1;host=hello.example.com;proto=http",
	} {
		if got := h.Get(k); got != want {
			t.Errorf("app saw %s %q, want %q", k, got, want)
		}
	}
	// The ReverseProxy path (an h2c client of this HTTP/1.1 app) extends
	// a Forwarded that came.
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	req, _ = http.NewRequest("GET", r.url+"/headers?x=1", nil)
	req.Host = "hello.example.com"
	req.Header.Set("Forwarded", "for=203.0.113.9;proto=https")
	resp, err = (&http.Client{Transport: &http.Transport{Protocols: &protos}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	seen = testapp.Request{}
	err = json.NewDecoder(resp.Body).Decode(&seen)
	resp.Body.Close()
	if got, want := http.Header(seen.Headers).Get("Forwarded"), "for=203.0.113.9;proto=https, for=127.0.0.1;host=hello.example.com;proto=http"; err != nil || got != want {
		t.Errorf("h2c client: app saw Forwarded %q, want %q (%v)", got, want, err)
	}
	for _, k := range []string{"X-Hop", "Keep-Alive", "Connection", spec.ProbeHeader} {
		if v := h.Get(k); v != "" {
			t.Errorf("hop-by-hop %s reached the app: %q", k, v)
		}
	}
	if seen.Host != "hello.example.com" || seen.URI != "/headers?x=1" || seen.Proto != "HTTP/1.1" {
		t.Errorf("app saw host %q uri %q proto %q", seen.Host, seen.URI, seen.Proto)
	}
}

// The probe header is answered by the sidecar and never reaches the app.
func TestProbeHeaderAnsweredBySidecar(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	cfg := config(a.port)
	cfg.Readiness = &spec.Probe{Type: spec.ProbeHTTP, Path: "/ready", Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 1, Period: 50 * time.Millisecond}
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)
	before := a.stats(t).Requests
	for i := 0; i < 20; i++ {
		code, body := probe(t, r.url)
		if code != 200 || body != spec.ProbeHeaderValue {
			t.Fatalf("probe %d: %d %q", i, code, body)
		}
	}
	if after := a.stats(t).Requests; after != before {
		t.Fatalf("probes reached the app: %d work requests became %d", before, after)
	}
	// User readiness failing makes the probe fail (Consul check wraps it).
	a.post(t, "/fail-ready")
	waitUntil(t, "probe fails after the app's readiness fails", func() bool { c, _ := probe(t, r.url); return c == 503 })
	if _, body := probe(t, r.url); !strings.Contains(body, "not ready") {
		t.Fatalf("not-ready body %q", body)
	}
	if st := r.stats(t); st.Ready {
		t.Fatal("stats say ready")
	}
	a.post(t, "/ready-ok")
	waitUntil(t, "probe passes again", func() bool { c, _ := probe(t, r.url); return c == 200 })
}

// With period 0 the sidecar probes every 25 ms until the first success, so
// it turns ready on the app's very first successful readiness answer.
func TestAggressiveProbingFindsSlowApp(t *testing.T) {
	t.Parallel()
	a := startApp(t, map[string]string{testapp.EnvReadyDelay: "1s"})
	cfg := config(a.port)
	cfg.Readiness = &spec.Probe{Type: spec.ProbeHTTP, Path: "/ready", Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 3}
	r := startSidecar(t, cfg, sidecar.Options{})
	if code, _ := probe(t, r.url); code != http.StatusServiceUnavailable {
		t.Fatalf("ready before the app: %d", code)
	}
	r.waitReady(t)
	st := a.stats(t)
	// Ordering, not wall-clock: the app had answered /ready with 200 exactly
	// once when the sidecar turned ready (the next probe is a whole
	// DefaultProbePeriod later), so the sidecar turned ready on that first
	// success, within one 25 ms probe period of the app becoming ready.
	if st.FirstReadyUnixNano == 0 || st.ReadyOK != 1 {
		t.Fatalf("app stats %+v: want exactly one successful /ready before the sidecar was ready", st)
	}
	// And it had been asking often: a 1 s period would have asked once or
	// twice in the app's 1 s start-up; 25 ms asks about forty times.
	if st.ReadyFailed < 5 {
		t.Fatalf("only %d failed /ready probes during start-up: not probing aggressively", st.ReadyFailed)
	}
}

// Without a declared readiness probe, a TCP connect to the app port is the
// readiness: the sidecar is not ready until the app listens.
func TestDefaultReadinessIsTCP(t *testing.T) {
	t.Parallel()
	port := testbin.FreePort(t)
	r := startSidecar(t, config(port), sidecar.Options{})
	time.Sleep(100 * time.Millisecond)
	if code, _ := probe(t, r.url); code != http.StatusServiceUnavailable {
		t.Fatalf("ready with no app: %d", code)
	}
	if code, _ := get(t, r.url+"/"); code != http.StatusBadGateway {
		t.Fatalf("request with no app: %d, want 502", code)
	}
	testbin.Start(t, testbin.Path(t), []string{"testapp"}, map[string]string{testapp.EnvPort: strconv.Itoa(port)})
	r.waitReady(t)
	if code, _ := get(t, r.url+"/"); code != 200 {
		t.Fatalf("request after the app started: %d", code)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testbin.Bound(30 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A held probe (the gateway's) comes back with the instance's times for
// the wake's timeline, in their causal order: the sidecar started, then
// the app (which needs a second to be ready) accepted the readiness
// probe's connection, then answered it ready. Consul's check, which does
// not wait, gets none of them.
func TestHeldProbeCarriesInstanceTimes(t *testing.T) {
	t.Parallel()
	started := time.Now().Add(-time.Millisecond)
	a := startApp(t, map[string]string{testapp.EnvReadyDelay: "300ms"})
	cfg := config(a.port)
	cfg.Readiness = &spec.Probe{Type: spec.ProbeHTTP, Path: "/ready", Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 3}
	r := startSidecar(t, cfg, sidecar.Options{Started: started})

	req, _ := http.NewRequest(http.MethodGet, r.url+"/", nil)
	req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
	req.Header.Set(spec.ProbeWaitHeader, "10s")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("held probe: %d, want 200 once the app is ready", resp.StatusCode)
	}
	got := spec.ParseInstanceTimes(resp.Header.Get(spec.InstanceTimesHeader))
	if !got.Started.Equal(started) {
		t.Errorf("started %v, want the time given in Options (%v)", got.Started, started)
	}
	// Accepted before ready: the app listened at once and answered /ready
	// with 503 until its delay was over.
	if got.AppAccepted.IsZero() || got.AppReady.IsZero() || !got.Started.Before(got.AppAccepted) || !got.AppAccepted.Before(got.AppReady) {
		t.Errorf("instance times %+v (header %q): want started < app accepted < app ready", got, resp.Header.Get(spec.InstanceTimesHeader))
	}
	if st := a.stats(t); st.FirstReadyUnixNano == 0 || got.AppReady.Before(time.Unix(0, st.FirstReadyUnixNano)) {
		t.Errorf("app ready at %v, before the app's own first ready answer (%d)", got.AppReady, st.FirstReadyUnixNano)
	}

	req, _ = http.NewRequest(http.MethodGet, r.url+"/", nil)
	req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if v := resp.Header.Get(spec.InstanceTimesHeader); v != "" {
		t.Errorf("a probe that does not wait got %s: %q", spec.InstanceTimesHeader, v)
	}
}
