package sidecar

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// A request waiting in the queue past its timeout gets 504 and leaves the
// queue. (With one timeout for all requests, a queued request only outlives
// its deadline when the slot is held from outside, as here.)
func TestQueuedRequestTimesOut(t *testing.T) {
	cfg := benchConfig(rawApp(t), 1)
	cfg.Timeout = 200 * time.Millisecond
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveFront(t, s)
	if err := s.breaker.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(b), "timeout (200ms)") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if s.breaker.Waiting() != 0 || s.meter.inFlight() != 0 {
		t.Fatalf("waiting %d in flight %d after the timeout", s.breaker.Waiting(), s.meter.inFlight())
	}
	s.breaker.Release()
	resp, err = http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after release: %d", resp.StatusCode)
	}
}

// The sidecar reaches the app, and probes it, on the configured app host (a
// container's published port is bound on the node's address, not on
// loopback): an app listening only on 127.0.0.2 is proxied and probed there.
func TestAppHostIsWhereTheAppIsReached(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.2:0")
	if err != nil {
		t.Skipf("127.0.0.2 is not usable here: %v", err)
	}
	app := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "from 127.0.0.2") })}
	go app.Serve(ln)
	t.Cleanup(func() { app.Close() })

	cfg := benchConfig(ln.Addr().(*net.TCPAddr).Port, 0)
	cfg.AppHost = "127.0.0.2"
	cfg.Readiness = &spec.Probe{Type: spec.ProbeTCP, Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 1}
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := serveFront(t, s)
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "from 127.0.0.2" {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	p, err := newProber(*cfg.Readiness, appHost(cfg), cfg.AppPort, false)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := p.probe(ctx); err != nil {
		t.Fatalf("probe of 127.0.0.2: %v", err)
	}
}

// While draining every response says Connection: close and the connection
// closes after it: the app's answers and the sidecar's own, on the
// keepalive loop and on net/http (a request with a body is handed off).
func TestDrainingResponsesCloseTheirConnection(t *testing.T) {
	closedPort := testbin.FreePort(t) // nothing listens there
	for _, c := range []struct {
		name     string
		appPort  int
		req      string
		wantCode int
	}{
		{"app answer, loop", rawApp(t), "GET / HTTP/1.1\r\nHost: a\r\n\r\n", 200},
		{"app answer, net/http", rawApp(t), "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi", 200},
		{"sidecar's 502, loop", closedPort, "GET / HTTP/1.1\r\nHost: a\r\n\r\n", http.StatusBadGateway},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(benchConfig(c.appPort, 0), Options{})
			if err != nil {
				t.Fatal(err)
			}
			srv := serveFront(t, s)
			s.state.draining.Store(true)
			nc, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			_ = nc.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.WriteString(nc, c.req); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(nc)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != c.wantCode || !resp.Close {
				t.Fatalf("%d, Connection %q: want %d and close", resp.StatusCode, resp.Header.Get("Connection"), c.wantCode)
			}
			if _, err := br.ReadByte(); err != io.EOF {
				t.Fatalf("connection still open after a draining response (%v)", err)
			}
		})
	}
}

// A probe that asks to wait (spec.ProbeWaitHeader) is held while the app is
// not ready and answered at the change: ready, draining, or the end of its
// wait. One that cannot be read is answered at once.
func TestProbeWaitsForReadiness(t *testing.T) {
	for _, c := range []struct {
		name     string
		wait     string
		change   func(*Sidecar) // nil: nothing changes
		wantCode int
		wantBody string
	}{
		{"ready", "5s", func(s *Sidecar) { s.state.setReady(true) }, 200, spec.ProbeHeaderValue},
		{"draining", "5s", func(s *Sidecar) { s.state.setDraining() }, http.StatusServiceUnavailable, "draining\n"},
		{"wait over", "150ms", nil, http.StatusServiceUnavailable, "not ready\n"},
		{"unreadable", "soon", nil, http.StatusServiceUnavailable, "not ready\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			s, err := New(benchConfig(testbin.FreePort(t), 0), Options{})
			if err != nil {
				t.Fatal(err)
			}
			srv := serveFront(t, s)
			type answer struct {
				code int
				body string
				err  error
			}
			answers := make(chan answer, 1)
			go func() {
				req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
				req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
				req.Header.Set(spec.ProbeWaitHeader, c.wait)
				// Shorter than spec.MaxProbeWait: an unreadable wait
				// held to the cap fails here.
				resp, err := (&http.Client{Timeout: 5 * time.Second}).Do(req)
				if err != nil {
					answers <- answer{err: err}
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				answers <- answer{code: resp.StatusCode, body: string(b)}
			}()
			if c.change != nil {
				// Not answered while nothing changes.
				select {
				case a := <-answers:
					t.Fatalf("answered before the app was ready: %+v", a)
				case <-time.After(200 * time.Millisecond):
				}
				c.change(s)
			}
			a := <-answers
			if a.err != nil || a.code != c.wantCode || a.body != c.wantBody {
				t.Fatalf("got %d %q (%v), want %d %q", a.code, a.body, a.err, c.wantCode, c.wantBody)
			}
		})
	}
}

// The front door asks othersInFlight after the handler returned: the
// answered request has left the meter by then, so a request alone has no
// company and one beside another in flight has.
func TestOthersInFlight(t *testing.T) {
	s, err := New(benchConfig(rawApp(t), 0), Options{})
	if err != nil {
		t.Fatal(err)
	}
	serve := func() {
		w := &discardWriter{h: http.Header{}}
		req, _ := http.NewRequest("GET", "http://sidecar/", nil)
		s.Handler().ServeHTTP(w, req)
	}
	serve()
	if s.othersInFlight() {
		t.Error("after a request alone: others in flight, want none")
	}
	if !s.meter.begin(time.Now()) {
		t.Fatal("meter refused a request")
	}
	serve()
	if !s.othersInFlight() {
		t.Error("beside a request in flight: no others, want one")
	}
	s.meter.end(time.Now())
	if s.othersInFlight() {
		t.Error("after the other ended: others in flight, want none")
	}

	// The request side counts itself: it is in the meter while it sends.
	h := s.handler
	if !s.meter.begin(time.Now()) {
		t.Fatal("meter refused a request")
	}
	if h.othersBeside() {
		t.Error("a request alone: others beside it, want none")
	}
	if !s.meter.begin(time.Now()) {
		t.Fatal("meter refused a request")
	}
	if !h.othersBeside() {
		t.Error("two requests in flight: none beside, want one")
	}
	s.meter.end(time.Now())
	s.meter.end(time.Now())

	// Behind a concurrency limit, not while others wait for a slot.
	limited, err := New(benchConfig(rawApp(t), 1), Options{})
	if err != nil {
		t.Fatal(err)
	}
	lh, b := limited.handler, limited.handler.breaker
	for range 2 {
		if !limited.meter.begin(time.Now()) {
			t.Fatal("meter refused a request")
		}
	}
	if !b.TryAcquire() {
		t.Fatal("breaker refused the first request")
	}
	if !lh.othersBeside() {
		t.Error("two requests in flight, none waiting for a slot: none beside, want one")
	}
	w, err := b.Enqueue()
	if err != nil || w == nil {
		t.Fatalf("Enqueue = %v, %v; want a waiter", w, err)
	}
	if lh.othersBeside() {
		t.Error("another request waits for the slot: the holder yields, want it to send at once")
	}
	b.Release() // hands the slot to the waiter
	if err := b.Wait(w); err != nil {
		t.Fatal(err)
	}
	b.Recycle(w)
	if !lh.othersBeside() {
		t.Error("the waiter got its slot: none beside, want one")
	}
	b.Release()
	limited.meter.end(time.Now())
	limited.meter.end(time.Now())
}
