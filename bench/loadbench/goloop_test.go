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

	"github.com/nomad-serverless/nomad-serverless/test/rawhttp"
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

// exchange writes raw on a new connection and returns the responses it
// reads before the connection goes quiet or closes.
func exchange(t *testing.T, addr, raw string) []rawhttp.Response {
	t.Helper()
	rs, _ := rawhttp.Exchange(t, addr, []string{raw}, 0, 300*time.Millisecond)
	return rs
}

func body(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

func TestGoloopProxies(t *testing.T) {
	big := strings.Repeat("x", 32<<20) // more than the sockets take at once
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
	rs := exchange(t, addr, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
	if len(rs) != 2 || rs[0].Body+"|"+rs[1].Body != "GET /a xff=127.0.0.1|GET /b xff=127.0.0.1" {
		t.Errorf("two requests: %+v", rs)
	}
	// 204 has no body: the next response on the connection must still
	// parse.
	rs = exchange(t, addr, "GET /none HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n")
	if len(rs) != 2 || rs[0].Status != 204 || rs[1].Body != "GET /c xff=127.0.0.1" {
		t.Errorf("204, GET: %+v", rs)
	}
	// HEAD has a Content-Length and no body; the GET after it on the same
	// kept-alive connection must get its own answer.
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Head("http://" + addr + "/h")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength <= 0 {
		t.Errorf("HEAD: %d (length %d)", resp.StatusCode, resp.ContentLength)
	}
	resp, err = c.Get("http://" + addr + "/after-head")
	if err != nil {
		t.Fatal(err)
	}
	if b := body(resp); b != "GET /after-head xff=127.0.0.1" {
		t.Errorf("GET after HEAD: %q", b)
	}
	resp.Body.Close()
	// A client that reads late, a body more than the sockets hold: the
	// loop must wait for the client's socket to drain (EPOLLOUT) and lose
	// nothing.
	conn, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(conn, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // the loop's writes fill the socket meanwhile
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(resp); resp.StatusCode != 200 || b != big {
		t.Fatalf("big body: status %d, %d bytes, want %d", resp.StatusCode, len(b), len(big))
	}
	// A request with a body is not the loop's: 501, and the connection
	// closes.
	rs = exchange(t, addr, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi")
	if len(rs) != 1 || rs[0].Status != http.StatusNotImplemented || !rs[0].Close {
		t.Errorf("POST: %+v", rs)
	}
	// A head that never ends within maxGoloopHead: 431, and the
	// connection closes.
	rs = exchange(t, addr, "GET /h HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("y", maxGoloopHead+1024))
	if len(rs) != 1 || rs[0].Status != http.StatusRequestHeaderFieldsTooLarge || !rs[0].Close {
		t.Errorf("oversized head: %+v", rs)
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
	if rs := exchange(t, addr, "GET /die HTTP/1.1\r\nHost: x\r\n\r\n"); len(rs) != 1 || rs[0].Status != http.StatusBadGateway {
		t.Errorf("upstream closed mid-request: %+v, want a 502", rs)
	}
	upstream.Close()
	if rs := exchange(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n"); len(rs) != 1 || rs[0].Status != http.StatusBadGateway {
		t.Errorf("upstream refusing: %+v, want a 502", rs)
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
