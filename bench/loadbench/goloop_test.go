package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/rawhttp"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
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
// reads before the connection closes, or (when the test expects it kept
// open) goes quiet after the responses the test expects.
func exchange(t *testing.T, addr, raw string, responses int, closed bool) []rawhttp.Response {
	t.Helper()
	rs, _ := rawhttp.Exchange(t, addr, []string{raw}, 0, rawhttp.Expect{Responses: responses, Closed: closed, Quiet: 300 * time.Millisecond})
	return rs
}

func body(r *http.Response) string { b, _ := io.ReadAll(r.Body); return string(b) }

func TestGoloopProxies(t *testing.T) {
	big := strings.Repeat("x", bigBody(t)) // more than the sockets take at once
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
	rs := exchange(t, addr, "GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n", 2, false)
	if len(rs) != 2 || rs[0].Body+"|"+rs[1].Body != "GET /a xff=127.0.0.1|GET /b xff=127.0.0.1" {
		t.Errorf("two requests: %+v", rs)
	}
	// 204 has no body: the next response on the connection must still
	// parse.
	rs = exchange(t, addr, "GET /none HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\nHost: x\r\n\r\n", 2, false)
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
	// nothing. The client reads only once the loop waits. The bound
	// scales with the body: under -race on a busy machine the loop and
	// the upstream pass on about a MiB a second.
	bound := testbin.Bound(time.Duration(len(big)>>20) * 4 * time.Second)
	d := net.Dialer{Timeout: bound, Control: func(_, _ string, rc syscall.RawConn) error {
		// A fixed receive buffer: autotuning would grow it to
		// tcp_rmem's maximum (32 MiB on some hosts) as the client reads.
		var serr error
		err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 64<<10)
		})
		return errors.Join(err, serr)
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(bound))
	waits := goloopDrainWaits.Load()
	if _, err := io.WriteString(conn, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	testbin.Eventually(t, bound, 10*time.Millisecond, "the loop waits for the client's socket to drain", func() (bool, string) {
		n := goloopDrainWaits.Load() - waits
		return n > 0, fmt.Sprintf("%d waits", n)
	})
	resp, err = http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	if b := body(resp); resp.StatusCode != 200 || b != big {
		t.Fatalf("big body: status %d, %d bytes, want %d", resp.StatusCode, len(b), len(big))
	}
	// A request with a body is not the loop's: 501, and the connection
	// closes.
	rs = exchange(t, addr, "POST /p HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi", 1, true)
	if len(rs) != 1 || rs[0].Status != http.StatusNotImplemented || !rs[0].Close {
		t.Errorf("POST: %+v", rs)
	}
	// A head that never ends within maxGoloopHead: 431, and the
	// connection closes.
	rs = exchange(t, addr, "GET /h HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("y", maxGoloopHead+1024), 1, true)
	if len(rs) != 1 || rs[0].Status != http.StatusRequestHeaderFieldsTooLarge || !rs[0].Close {
		t.Errorf("oversized head: %+v", rs)
	}
}

// bigBody is a response size more than the loop's socket to a client
// takes (its send buffer grows to tcp_wmem's maximum) with the client's
// 64 KiB receive buffer: twice that maximum and a MiB.
func bigBody(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/sys/net/ipv4/tcp_wmem")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(b))
	if len(f) != 3 {
		t.Fatalf("tcp_wmem %q: want three numbers", b)
	}
	wmemMax, err := strconv.Atoi(f[2])
	if err != nil {
		t.Fatalf("tcp_wmem %q: %v", b, err)
	}
	return 2*wmemMax + 1<<20
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
	if rs := exchange(t, addr, "GET /die HTTP/1.1\r\nHost: x\r\n\r\n", 1, true); len(rs) != 1 || rs[0].Status != http.StatusBadGateway {
		t.Errorf("upstream closed mid-request: %+v, want a 502", rs)
	}
	upstream.Close()
	if rs := exchange(t, addr, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 1, true); len(rs) != 1 || rs[0].Status != http.StatusBadGateway {
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
