//go:build linux

package main

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// startTestGoloop runs loops reference loops in front of h.
func startTestGoloop(t *testing.T, loops int, h http.Handler) (addr string, upstream *httptest.Server) {
	t.Helper()
	upstream = httptest.NewServer(h)
	t.Cleanup(upstream.Close)
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	addr = addrOf(port)
	stop, err := startGoloops(addr, upstream.Listener.Addr().String(), loops)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return addr, upstream
}

// exchangeRaw writes raw on a new connection and reads a response for each
// of methods, the methods of the requests in raw.
func exchangeRaw(t *testing.T, addr, raw string, methods ...string) []*http.Response {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out []*http.Response
	for _, m := range methods {
		resp, err := http.ReadResponse(br, &http.Request{Method: m})
		if err != nil {
			t.Fatalf("response %d of %q: %v", len(out)+1, raw, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(strings.NewReader(string(b)))
		out = append(out, resp)
	}
	return out
}

func body(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

func TestGoloopProxies(t *testing.T) {
	big := strings.Repeat("x", 1<<20) // more than a socket takes at once
	addr, _ := startTestGoloop(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/big":
			// The loop frames responses by Content-Length only.
			w.Header().Set("Content-Length", fmt.Sprint(len(big)))
			w.Write([]byte(big))
		case "/none":
			w.WriteHeader(http.StatusNoContent)
		default:
			fmt.Fprintf(w, "%s %s xff=%s", r.Method, r.URL.Path, r.Header.Get("X-Forwarded-For"))
		}
	}))

	// Keep-alive, two requests written at once: answered in order.
	rs := exchangeRaw(t, addr, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n", "GET", "GET")
	if got := body(rs[0]) + "|" + body(rs[1]); got != "GET /a xff=127.0.0.1|GET /b xff=127.0.0.1" {
		t.Errorf("two requests: %q", got)
	}
	// HEAD has a Content-Length and no body; 204 neither: the next
	// response on the connection must still parse.
	rs = exchangeRaw(t, addr, "HEAD /h HTTP/1.1\r\nHost: x\r\n\r\nGET /none HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n", "HEAD", "GET", "GET")
	if rs[0].StatusCode != 200 || rs[0].ContentLength <= 0 || rs[1].StatusCode != 204 || body(rs[2]) != "GET /c xff=127.0.0.1" {
		t.Errorf("HEAD, 204, GET: %d (length %d), %d, %q", rs[0].StatusCode, rs[0].ContentLength, rs[1].StatusCode, body(rs[2]))
	}
	// A megabyte fills the client's socket: the loop must wait for it to
	// drain (EPOLLOUT) and lose nothing.
	c := &http.Client{Timeout: 5 * time.Second}
	for range 3 {
		resp, err := c.Get("http://" + addr + "/big")
		if err != nil {
			t.Fatal(err)
		}
		if b := body(resp); resp.StatusCode != 200 || b != big {
			t.Fatalf("big body: status %d, %d bytes, want %d", resp.StatusCode, len(b), len(big))
		}
		resp.Body.Close()
	}
	// A request with a body is not the loop's: 501, and the connection
	// closes.
	rs = exchangeRaw(t, addr, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", "POST")
	if rs[0].StatusCode != http.StatusNotImplemented || !rs[0].Close {
		t.Errorf("POST: %d close=%v", rs[0].StatusCode, rs[0].Close)
	}
}

func TestGoloopUpstreamGone(t *testing.T) {
	addr, upstream := startTestGoloop(t, 1, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/die" {
			// The upstream drops the connection without an answer.
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		w.Write([]byte("ok"))
	}))
	if rs := exchangeRaw(t, addr, "GET /die HTTP/1.1\r\nHost: x\r\n\r\n", "GET"); rs[0].StatusCode != http.StatusBadGateway {
		t.Errorf("upstream closed mid-request: %d, want 502", rs[0].StatusCode)
	}
	upstream.Close()
	if rs := exchangeRaw(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", "GET"); rs[0].StatusCode != http.StatusBadGateway {
		t.Errorf("upstream refusing: %d, want 502", rs[0].StatusCode)
	}
}

func TestGoloopStopClosesListener(t *testing.T) {
	upstream := httptest.NewServer(http.NotFoundHandler())
	defer upstream.Close()
	port, err := freePort()
	if err != nil {
		t.Fatal(err)
	}
	stop, err := startGoloops(addrOf(port), upstream.Listener.Addr().String(), 2)
	if err != nil {
		t.Fatal(err)
	}
	stop()
	if c, err := net.DialTimeout("tcp", addrOf(port), time.Second); err == nil {
		c.Close()
		t.Error("still listening after stop")
	}
	if _, err := startGoloops("localhost:x", "127.0.0.1:1", 1); err == nil {
		t.Error("bad listen address accepted")
	}
}
