//go:build linux

package sidecar

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// loopOf returns the event loops serving f; the tests below are about
// them, so a front door without them fails.
func loopOf(t *testing.T, f *frontServer) *loopFront {
	t.Helper()
	if f.front.ev == nil {
		t.Fatal("the front door runs without its event loops")
	}
	return f.front.ev
}

// readResponses reads n responses from br, each to a GET.
func readResponses(t *testing.T, br *bufio.Reader, n int) []*http.Response {
	t.Helper()
	var out []*http.Response
	for range n {
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("response %d: %v", len(out)+1, err)
		}
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("response %d body: %v", len(out)+1, err)
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		out = append(out, resp)
	}
	return out
}

// Plain requests are the loops' (keep-alive, pipelined, probes); a request
// with a body, an upgrade or HTTP/1.0 moves its connection to net/http,
// which answers it as before.
func TestEventLoopTakesPlainRequestsAndHandsOffTheRest(t *testing.T) {
	var seen atomic.Value
	port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/b" {
			seen.Store(r.Header.Get("X-Forwarded-For") + " " + r.Header.Get("Forwarded"))
		}
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%s %s %d", r.Method, r.URL.RequestURI(), len(b))
	})
	f := proxyTo(t, port)
	ev := loopOf(t, f)

	nc, err := net.Dial("tcp", strings.TrimPrefix(f.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	br := bufio.NewReader(nc)
	// Three pipelined in one write, then a probe.
	io.WriteString(nc, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b?q=1 HTTP/1.1\r\nHost: x\r\nX-Forwarded-For: 10.0.0.1\r\n\r\nHEAD /c HTTP/1.1\r\nHost: x\r\n\r\n")
	resps := readResponses(t, br, 2)
	for i, want := range []string{"GET /a 0", "GET /b?q=1 0"} {
		b, _ := io.ReadAll(resps[i].Body)
		if resps[i].StatusCode != 200 || string(b) != want {
			t.Fatalf("response %d: %d %q, want %q", i, resps[i].StatusCode, b, want)
		}
	}
	if v, _ := seen.Load().(string); v != "10.0.0.1, 127.0.0.1 for=10.0.0.1, for=127.0.0.1;host=x;proto=http" {
		t.Fatalf("the app saw X-Forwarded-For and Forwarded %q", v)
	}
	head, err := http.ReadResponse(br, &http.Request{Method: "HEAD"})
	if err != nil || head.StatusCode != 200 || head.ContentLength != int64(len("HEAD /c 0")) {
		t.Fatalf("HEAD: %v %+v", err, head)
	}
	io.WriteString(nc, "GET / HTTP/1.1\r\nHost: x\r\nK-Network-Probe: queue\r\n\r\n")
	probe := readResponses(t, br, 1)[0]
	if b, _ := io.ReadAll(probe.Body); string(b) != "queue" && probe.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("probe: %d %q", probe.StatusCode, b)
	}
	if got := ev.served.Load(); got != 4 {
		t.Fatalf("the loops served %d requests, want 4", got)
	}
	if ev.handed.Load() != 0 {
		t.Fatal("a plain request was handed to net/http")
	}

	// A body: net/http's, on the same connection, and the loop is done
	// with it.
	io.WriteString(nc, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /after HTTP/1.1\r\nHost: x\r\n\r\n")
	resps = readResponses(t, br, 2)
	for i, want := range []string{"POST /p 3", "GET /after 0"} {
		b, _ := io.ReadAll(resps[i].Body)
		if string(b) != want {
			t.Fatalf("after the hand-off, response %d: %q, want %q", i, b, want)
		}
	}
	if ev.handed.Load() != 1 || ev.served.Load() != 4 {
		t.Fatalf("handed %d served %d, want 1 and 4", ev.handed.Load(), ev.served.Load())
	}

	// HTTP/1.0 and an upgrade: net/http's too.
	for _, req := range []string{
		"GET /old HTTP/1.0\r\nHost: x\r\n\r\n",
		"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
	} {
		c, err := net.Dial("tcp", strings.TrimPrefix(f.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, req)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		c.Close()
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		resp.Body.Close()
	}
	if ev.handed.Load() != 3 {
		t.Fatalf("handed %d connections, want 3", ev.handed.Load())
	}
}

// A client that does not read holds back its app through the socket
// buffers: the loop stops reading the app while the client's backlog is
// unsent, so what a slow reader costs is bounded, whatever the response's
// size and framing.
func TestEventLoopBackPressure(t *testing.T) {
	const size = 48 << 20
	chunk := bytes.Repeat([]byte("0123456789abcdef"), 4<<10) // 64 KiB
	port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/fixed" {
			w.Header().Set("Content-Length", strconv.Itoa(size))
		}
		for n := 0; n < size; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	f := proxyTo(t, port)
	ev := loopOf(t, f)
	for _, path := range []string{"/fixed", "/chunked"} {
		t.Run(path, func(t *testing.T) {
			pauses := ev.pauses.Load()
			nc, err := net.Dial("tcp", strings.TrimPrefix(f.URL, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			io.WriteString(nc, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
			// Read nothing until the loop has stopped reading the app.
			deadline := time.Now().Add(30 * time.Second)
			for ev.pauses.Load() == pauses {
				if time.Now().After(deadline) {
					t.Fatal("the loop never held its app back")
				}
				time.Sleep(5 * time.Millisecond)
			}
			resp, err := http.ReadResponse(bufio.NewReader(nc), nil)
			if err != nil {
				t.Fatal(err)
			}
			n, err := io.Copy(io.Discard, resp.Body)
			if err != nil || n != size {
				t.Fatalf("read %d bytes (%v), want %d", n, err, size)
			}
			if b := ev.maxBacklog.Load(); b > 256<<10 {
				t.Fatalf("a client's backlog reached %d bytes", b)
			}
		})
	}
}

// With concurrency 1 and a queue of 1: one request in the app, one
// waiting (handed back to its loop when the slot frees), the third
// refused with 503; a client that leaves releases its slot and its place
// in the meter.
func TestEventLoopBreaker(t *testing.T) {
	release := make(chan struct{})
	var inApp atomic.Int64
	port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
		inApp.Add(1)
		defer inApp.Add(-1)
		if r.URL.Path == "/hold" {
			select {
			case <-release:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "done "+r.URL.Path)
	})
	cfg := benchConfig(port, 1)
	cfg.QueueDepth = 1
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	f := serveFront(t, s)
	loopOf(t, f)
	addr := strings.TrimPrefix(f.URL, "http://")
	send := func(path string) (net.Conn, *bufio.Reader) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "GET "+path+" HTTP/1.1\r\nHost: x\r\n\r\n")
		return c, bufio.NewReader(c)
	}
	_, brA := send("/hold")
	loopWait(t, "the first request in the app", func() bool { return inApp.Load() == 1 })
	_, brB := send("/queued")
	loopWait(t, "the second request queued", func() bool { return s.breaker.Waiting() == 1 })
	_, brC := send("/refused")
	if r := readResponses(t, brC, 1)[0]; r.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("third request: %d, want 503", r.StatusCode)
	}
	close(release)
	for _, br := range []*bufio.Reader{brA, brB} {
		if r := readResponses(t, br, 1)[0]; r.StatusCode != 200 {
			t.Fatalf("%d", r.StatusCode)
		}
	}
	loopWait(t, "the slot freed", func() bool { return s.breaker.Active() == 0 && s.meter.inFlight() == 0 })

	// A client that leaves while its request is in the app, and one that
	// leaves while queued behind it.
	hold := make(chan struct{})
	defer close(hold)
	release = hold
	cA, _ := send("/hold")
	loopWait(t, "the request in the app", func() bool { return inApp.Load() == 1 })
	cB, _ := send("/queued")
	loopWait(t, "the request queued", func() bool { return s.breaker.Waiting() == 1 })
	cB.Close()
	loopWait(t, "the queued client's place freed", func() bool { return s.breaker.Waiting() == 0 && s.meter.inFlight() == 1 })
	cA.Close()
	loopWait(t, "the app to see its client leave", func() bool { return inApp.Load() == 0 })
	loopWait(t, "the slot freed", func() bool { return s.breaker.Active() == 0 && s.meter.inFlight() == 0 })
	_, br := send("/after")
	if r := readResponses(t, br, 1)[0]; r.StatusCode != 200 {
		t.Fatalf("after the departures: %d", r.StatusCode)
	}
}

// The three timeouts answer 504 from the loop before the response starts;
// idle_timeout cuts a response that stalls after it started.
func TestEventLoopTimeouts(t *testing.T) {
	port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/slow":
			select {
			case <-time.After(20 * time.Second):
			case <-r.Context().Done():
			}
		case "/stall":
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "12345")
			w.(http.Flusher).Flush()
			select {
			case <-time.After(20 * time.Second):
			case <-r.Context().Done():
			}
		}
	})
	for _, tc := range []struct {
		name string
		set  func(*specTimeouts)
		want string
	}{
		{"timeout", func(c *specTimeouts) { c.Timeout = 300 * time.Millisecond }, "within timeout (300ms)"},
		{"response start", func(c *specTimeouts) { c.ResponseStartTimeout = 300 * time.Millisecond }, "response_start_timeout (300ms)"},
		{"idle", func(c *specTimeouts) { c.IdleTimeout = 300 * time.Millisecond }, "idle_timeout (300ms)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := benchConfig(port, 0)
			tm := specTimeouts{Timeout: 30 * time.Second}
			tc.set(&tm)
			cfg.Timeout, cfg.ResponseStartTimeout, cfg.IdleTimeout = tm.Timeout, tm.ResponseStartTimeout, tm.IdleTimeout
			s, err := New(cfg, Options{})
			if err != nil {
				t.Fatal(err)
			}
			f := serveFront(t, s)
			ev := loopOf(t, f)
			resp, err := http.Get(f.URL + "/slow")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(b), tc.want) {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
			if ev.served.Load() != 1 {
				t.Fatal("not the loop's request")
			}
			if tc.name != "idle" {
				return
			}
			resp, err = http.Get(f.URL + "/stall")
			if err != nil {
				t.Fatal(err)
			}
			_, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || err == nil {
				t.Fatalf("a stalled response ended cleanly: %d %v", resp.StatusCode, err)
			}
			loopWait(t, "the request to end", func() bool { return s.meter.inFlight() == 0 })
		})
	}
}

type specTimeouts struct{ Timeout, ResponseStartTimeout, IdleTimeout time.Duration }

// A request the app refuses is answered 502 NotServed from the loop, and
// the sidecar marks itself not ready; the gateway can send it elsewhere.
func TestEventLoopAppGone(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	cfg := benchConfig(port, 0)
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	var refused atomic.Int64
	s.handler.appRefused = func() { refused.Add(1) }
	f := serveFront(t, s)
	loopOf(t, f)
	req, _ := http.NewRequestWithContext(context.Background(), "POST", f.URL+"/", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(notServedKey) == "" || !strings.Contains(string(b), "connection refused") {
		t.Fatalf("%d %v %q", resp.StatusCode, resp.Header, b)
	}
	if refused.Load() == 0 {
		t.Fatal("the refusal was not reported")
	}
}

// loopWait polls cond until it holds, failing after a generous deadline.
func loopWait(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("gave up waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
