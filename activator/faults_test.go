package activator

import (
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// deadAppSidecar is a fake sidecar whose app is down while dead is set: it
// answers requests as the real one does then (502 with NotServedHeader)
// and its probe 503.
func deadAppSidecar(t *testing.T) (*fakeSidecar, *atomic.Bool) {
	dead := &atomic.Bool{}
	dead.Store(true)
	var s *fakeSidecar
	s = newFakeSidecar(t, false, func(w http.ResponseWriter, r *http.Request) {
		if dead.Load() {
			io.Copy(io.Discard, r.Body)
			w.Header().Set(spec.NotServedHeader, spec.NotServedValue)
			http.Error(w, "nomad-serverless: the app did not answer: connection refused", http.StatusBadGateway)
			return
		}
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, "revived "+string(b))
	})
	return s, dead
}

// A request the instance's app did not serve goes to another instance,
// whatever its method and with its body; the instance leaves balancing at
// its first such answer and comes back only after its probe passes.
func TestNotServedRetriedAndEjected(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	bad, dead := deadAppSidecar(t)
	good := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Method+" "+string(b))
	})
	cat.SetReady("hello-00001", []consulroute.Instance{bad.instance("hello-00001"), good.instance("hello-00001")})
	// Round robin sends every other request to the bad one but for the
	// ejection.
	tg := startGateway(t, cat, nil, func(c *Config) { c.Policy = PolicyRoundRobin })
	send := func(method, body string) (int, string, http.Header) {
		req, _ := http.NewRequest(method, tg.srv.URL+"/", strings.NewReader(body))
		if body == "" {
			req.Body = nil
		}
		req.Host = "hello.default.localhost"
		resp, err := tg.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	for i := range 20 {
		method, body := "GET", ""
		if i%2 == 1 {
			method, body = "POST", strings.Repeat("p", 1000+i)
		}
		code, got, hdr := send(method, body)
		if code != 200 || got != method+" "+body {
			t.Fatalf("%s %d: %d %q", method, i, code, got)
		}
		if hdr.Get(spec.NotServedHeader) != "" {
			t.Fatal("the sidecar's header reached the client")
		}
	}
	if n := bad.requests.Load(); n != 1 {
		t.Errorf("the instance whose app is down got %d requests, want 1 (ejected at its first 502)", n)
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_ejections_total", nil); n != 1 {
		t.Errorf("ejections_total = %v, want 1", n)
	}
	waitFor(t, "a probe of the ejected instance", func() bool { return bad.probes.Load() > 0 })

	// Its app comes back: the probe passes and it serves again.
	dead.Store(false)
	bad.ready.Store(true)
	waitFor(t, "the instance back in balancing", func() bool {
		for _, b := range tg.g.table.Load().revisions["hello-00001"].pool.Load().backends {
			if b.ejected.Load() {
				return false
			}
		}
		return true
	})
	before := bad.requests.Load()
	for range 10 {
		if code, got, _ := send("POST", "x"); code != 200 || !strings.HasSuffix(got, "x") {
			t.Fatalf("after the return: %d %q", code, got)
		}
	}
	if bad.requests.Load() == before {
		t.Error("the restored instance gets no requests")
	}
}

// With every instance's app down, requests are not retried without end:
// the revision's budget bounds the retries, and the answer is a 503 the
// client may retry (the app never saw the request).
func TestRetryBudgetBoundsAnOutage(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	// Probes pass, answers do not: each instance comes back as soon as
	// it is ejected, the worst case for amplification.
	var a, b *fakeSidecar
	notServed := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(spec.NotServedHeader, spec.NotServedValue)
		http.Error(w, "app down", http.StatusBadGateway)
	}
	a = newFakeSidecar(t, true, notServed)
	b = newFakeSidecar(t, true, notServed)
	cat.SetReady("hello-00001", []consulroute.Instance{a.instance("hello-00001"), b.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)
	const n = 200
	start := time.Now()
	codes := map[int]int{}
	for range n {
		code, body, hdr := tg.get(t, "hello.default.localhost", "/", nil)
		codes[code]++
		if code == 503 && (!strings.Contains(body, "did not reach the app") || hdr.Get("Retry-After") == "") {
			t.Fatalf("503 without saying it may be retried: %q", body)
		}
	}
	elapsed := time.Since(start)
	attempts := a.requests.Load() + b.requests.Load()
	retries := counter(t, tg.reg, "nomad_serverless_gateway_retries_total", nil)
	// A second's floor to start with, 20 % of the requests, the floor
	// for the time it took.
	allowed := float64(retryFloorPerSecond) + retryPercent*n/100.0 + retryFloorPerSecond*elapsed.Seconds() + 1
	t.Logf("%d requests in %s: codes %v, %d attempts, %.0f retries (budget %.0f)", n, elapsed.Round(time.Millisecond), codes, attempts, retries, allowed)
	if retries > allowed || float64(attempts) > n+allowed {
		t.Fatalf("%.0f retries, %d attempts for %d requests: over the budget of %.0f", retries, attempts, n, allowed)
	}
	if codes[503] == 0 || codes[200] != 0 {
		t.Fatalf("codes %v: want 503s (the budget ran out)", codes)
	}
	if counter(t, tg.reg, "nomad_serverless_gateway_retries_denied_total", map[string]string{"reason": "budget"}) == 0 {
		t.Fatal("no retry denied for the budget")
	}
}

// An idempotent request in flight when its instance dies (the connection
// resets after the request was written, before any response) goes to
// another instance, as Envoy's retry_on: reset does for it; a POST that
// may have reached the app is answered, not run twice. A reset does not
// eject (the request may be what kills its app).
func TestResetInFlightRetriedWhenIdempotent(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	dying := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		c, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0) // close with a reset, as a killed process's socket does
		}
		c.Close()
	})
	good := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		io.WriteString(w, "ok "+r.Method)
	})
	cat.SetReady("hello-00001", []consulroute.Instance{dying.instance("hello-00001"), good.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Policy = PolicyRoundRobin })
	for i := range 10 {
		code, body, _ := tg.get(t, "hello.default.localhost", "/", nil)
		if code != 200 || body != "ok GET" {
			t.Fatalf("GET %d: %d %q, want 200 from the other instance", i, code, body)
		}
	}
	if dying.requests.Load() == 0 {
		t.Fatal("no GET reached the dying instance: the test proves nothing")
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_ejections_total", nil); n != 0 {
		t.Errorf("ejections_total = %v, want 0: a reset with a request in flight does not eject", n)
	}
	before := dying.requests.Load()
	failed := 0
	for range 10 {
		if resp, _ := tg.post(t, "hello.default.localhost", "p"); resp.StatusCode != 200 {
			failed++
		}
	}
	if got := dying.requests.Load() - before; failed == 0 || int64(failed) != got {
		t.Errorf("%d POSTs failed, %d reached the dying instance: want every POST it took answered with an error, not retried", failed, got)
	}
}
