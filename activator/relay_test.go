package activator

import (
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/rawh2"
)

// The relayed stream's deadlines, as serve bounds a request.
func TestStreamDeadlineTable(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const timeout, queue = 10 * time.Second, 4 * time.Second
	for _, tc := range []struct {
		name string
		c    streamClock
		at   time.Time
		kind int
	}{
		{"waiting: the queue timeout first", streamClock{arrived: t0, waiting: true}, t0.Add(queue), dlQueue},
		{"dispatched: the timeout from arrival", streamClock{arrived: t0, granted: t0.Add(time.Second)}, t0.Add(timeout), dlTimeout},
		{"started, nothing sent: the stall bound from dispatch", streamClock{arrived: t0, granted: t0.Add(time.Second), started: true},
			t0.Add(time.Second + timeout + stallSlack), dlStall},
		{"started: the stall bound moves with the bytes", streamClock{arrived: t0, granted: t0, lastSent: t0.Add(time.Minute), started: true},
			t0.Add(time.Minute + timeout + stallSlack), dlStall},
	} {
		at, kind := streamDeadline(tc.c, timeout, queue)
		if !at.Equal(tc.at) || kind != tc.kind {
			t.Errorf("%s: %v kind %d, want %v kind %d", tc.name, at.Sub(t0), kind, tc.at.Sub(t0), tc.kind)
		}
	}
	// A queue timeout longer than the revision's: the timeout first (504).
	if at, kind := streamDeadline(streamClock{arrived: t0, waiting: true}, time.Second, time.Minute); !at.Equal(t0.Add(time.Second)) || kind != dlTimeout {
		t.Errorf("long queue timeout: %v kind %d", at.Sub(t0), kind)
	}
}

// h2cDo sends one h2c request through the gateway.
func h2cDo(t *testing.T, c *http.Client, url, method, host, body string) (int, string, http.Header) {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.ProtoMajor != 2 {
		t.Fatalf("answered over %s, want HTTP/2", resp.Proto)
	}
	return resp.StatusCode, string(b), resp.Header
}

// Over the relay, a stream the instance's app did not serve goes to
// another instance with its body (kept for the retry), and the instance
// leaves balancing at its first such answer.
func TestRelayNotServedRetriedWithBody(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	bad, _ := deadAppSidecar(t)
	good := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		io.WriteString(w, r.Method+" "+r.Proto+" "+string(b))
	})
	cat.SetReady("hello-00001", []consulroute.Instance{bad.instance("hello-00001"), good.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Policy = PolicyRoundRobin })
	c := h2cClient()
	for i := range 10 {
		body := strings.Repeat("b", 1000*(i+1))
		code, got, hdr := h2cDo(t, c, tg.srv.URL+"/", http.MethodPost, "hello.default.localhost", body)
		if code != 200 || got != "POST HTTP/2.0 "+body {
			t.Fatalf("call %d: %d %.80q", i, code, got)
		}
		if hdr.Get(spec.NotServedHeader) != "" {
			t.Fatal("the sidecar's header reached the client")
		}
	}
	if n := bad.requests.Load(); n != 1 {
		t.Errorf("the instance whose app is down got %d requests, want 1", n)
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_retries_total", nil); n != 1 {
		t.Errorf("retries_total = %v, want 1", n)
	}
}

// A stream whose instance cannot be dialled goes to another one; the
// dead instance leaves balancing.
func TestRelayDialFailureRetried(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	good := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close() // nothing listens there now: refused
	dead := consulroute.Instance{ID: "dead", Revision: "hello-00001", Address: "127.0.0.1", Port: deadPort}
	cat.SetReady("hello-00001", []consulroute.Instance{dead, good.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Policy = PolicyRoundRobin })
	c := h2cClient()
	for i := range 6 {
		code, got, _ := h2cDo(t, c, tg.srv.URL+"/", http.MethodGet, "hello.default.localhost", "")
		if code != 200 || got != "ok" {
			t.Fatalf("call %d: %d %q", i, code, got)
		}
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_ejections_total", nil); n != 1 {
		t.Errorf("ejections_total = %v, want 1", n)
	}
}

// A revision at zero holds its streams in the activator's queue, without
// a goroutine each, until the queue timeout: 503 with Retry-After.
func TestRelayQueueTimeout(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	tg := startGateway(t, cat, nil, func(c *Config) { c.QueueTimeout = 200 * time.Millisecond })
	c := h2cClient()
	start := time.Now()
	code, body, hdr := h2cDo(t, c, tg.srv.URL+"/", http.MethodGet, "hello.default.localhost", "")
	if code != http.StatusServiceUnavailable || hdr.Get("Retry-After") == "" || !strings.Contains(body, "queue timeout") {
		t.Fatalf("%d %q %v", code, body, hdr)
	}
	if took := time.Since(start); took < 200*time.Millisecond {
		t.Errorf("answered after %s, before the queue timeout", took)
	}
	if n := tg.g.table.Load().revisions["hello-00001"].queued.Load(); n != 0 {
		t.Errorf("%d still queued", n)
	}
}

// Streams held at zero are let go, in order, when an instance comes; the
// routing, the revision header and the forwarding fields are serve's.
func TestRelayHeldAtZeroThenServed(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Header.Get(spec.RevisionHeader)+" "+r.Header.Get("X-Forwarded-Proto")+" "+
			r.Header.Get("X-Forwarded-Host")+" "+strconv.Itoa(len(r.Header.Values("Forwarded"))))
	})
	tg := startGateway(t, cat, nil, nil)
	c := h2cClient()
	type res struct {
		code int
		body string
	}
	out := make(chan res, 5)
	for range 5 {
		go func() {
			req, _ := http.NewRequest(http.MethodGet, tg.srv.URL+"/", nil)
			req.Host = "hello.default.localhost"
			req.Header.Set(spec.RevisionHeader, "forged")
			resp, err := c.Do(req)
			if err != nil {
				out <- res{0, err.Error()}
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			out <- res{resp.StatusCode, string(b)}
		}()
	}
	waitFor(t, "5 streams held", func() bool { return tg.g.table.Load().revisions["hello-00001"].queued.Load() == 5 })
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	for range 5 {
		r := <-out
		if r.code != 200 || r.body != "hello-00001 http hello.default.localhost 1" {
			t.Fatalf("%d %q", r.code, r.body)
		}
	}
}

// A client that PINGs thousands of times a second keeps its connection,
// as grpc-go's window estimates do on a busy one (make bench-grpc's 32
// streams on one connection lost it at the relay's default of 1,000 a
// second), and its PINGs are answered.
func TestRelayManyPingsKeepTheConnection(t *testing.T) {
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	cat := oneRevision(0, time.Minute)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	c := rawh2.Dial(t, serveScreened(t, startGateway(t, cat, nil, nil).g))
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	const pings = 3000
	for i := range pings {
		if err := c.Frames(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{byte(i), byte(i >> 8)}) }); err != nil {
			t.Fatalf("ping %d: %v", i, err)
		}
	}
	if err := c.Request(1, "GET", "hello.default.localhost", "/", true); err != nil {
		t.Fatal(err)
	}
	o, ok := c.Wait(rawh2.Within, func(o *rawh2.Outcome) bool { return o.Ended[1] })
	if !ok || o.Over() || o.Statuses[1] != "200" {
		t.Fatalf("after %d PINGs: %s", pings, &o)
	}
}
