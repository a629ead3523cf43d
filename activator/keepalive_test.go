package activator

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
)

// rawClient is one client connection to the gateway.
type rawClient struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dialGateway(t *testing.T, tg *testGateway) *rawClient {
	t.Helper()
	c, err := net.Dial("tcp", tg.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
}

// do sends one request and returns the status, the body and whether the
// response closes the connection.
func (rc *rawClient) do(method, path, body string) (int, string, bool) {
	rc.t.Helper()
	req := method + " " + path + " HTTP/1.1\r\nHost: hello.default.localhost\r\n"
	if body != "" {
		req += "Content-Length: " + strconv.Itoa(len(body)) + "\r\n"
	}
	if _, err := io.WriteString(rc.c, req+"\r\n"+body); err != nil {
		rc.t.Fatal(err)
	}
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		rc.t.Fatalf("%s %s: %v", method, path, err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		rc.t.Fatalf("%s %s: body: %v", method, path, err)
	}
	return resp.StatusCode, string(b), resp.Close
}

// A keep-alive connection moves into the gateway's loop at its first plain
// request; a request with a body on it goes, with the rest of the
// connection, to the fallback net/http server; both answer correctly. The
// same holds on the HTTPS port (HTTP/1.1 over TLS), where every request,
// whoever serves it, is known to have come over TLS.
func TestKeepAliveTakeOverAndFallback(t *testing.T) {
	if !keepalive.Supported {
		t.Skip("no connection takeover on this platform")
	}
	for _, scheme := range []string{"http", "https"} {
		t.Run(scheme, func(t *testing.T) {
			cat := oneRevision(0, time.Minute)
			sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
				b, _ := io.ReadAll(r.Body)
				proto := "Forwarded without proto=" + scheme
				if strings.Contains(r.Header.Get("Forwarded"), "proto="+scheme) {
					proto = "proto=" + scheme
				}
				io.WriteString(w, r.Method+" "+r.URL.Path+" "+string(b)+" "+r.Header.Get("X-Forwarded-Proto")+" "+proto)
			})
			cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
			var (
				rc *rawClient
				g  *Gateway
			)
			if scheme == "http" {
				tg := startGateway(t, cat, nil, nil)
				rc, g = dialGateway(t, tg), tg.g
			} else {
				tg := startTLSGateway(t, cat, nil)
				g = tg.g
				c, err := tls.Dial("tcp", tg.tlsAddr, &tls.Config{RootCAs: tg.pool, ServerName: "hello.default.localhost", NextProtos: []string{"http/1.1"}})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { c.Close() })
				_ = c.SetDeadline(time.Now().Add(20 * time.Second))
				rc = &rawClient{t: t, c: c, br: bufio.NewReader(c)}
			}
			// The server the connection came in on has the last takeOver:
			// Server's for http, TLSServer's (made after it) for https.
			g.takeOversMu.Lock()
			loop := &g.takeOvers[len(g.takeOvers)-1].loop
			g.takeOversMu.Unlock()

			for i, step := range []struct{ method, path, body string }{
				{"GET", "/one", ""}, {"GET", "/two", ""}, {"POST", "/three", "payload"}, {"GET", "/four", ""},
			} {
				code, body, closed := rc.do(step.method, step.path, step.body)
				if want := step.method + " " + step.path + " " + step.body + " " + scheme + " proto=" + scheme; code != 200 || body != want || closed {
					t.Fatalf("%s %s: %d %q close=%v, want 200 %q", step.method, step.path, code, body, closed, want)
				}
				// Until the POST the connection is the loop's; from it
				// on, the fallback server's. The loop forgets a
				// handed-off connection just after handing it over, so
				// the fallback may answer first: allow it a moment.
				want := map[bool]int{true: 1, false: 0}[i < 2]
				waitFor(t, fmt.Sprintf("%d connections in the loop after %s %s", want, step.method, step.path),
					func() bool { return loop.Conns() == want })
			}
		})
	}
}

// Shutdown of the gateway's server closes the loop's idle connections; a
// request in flight finishes (Connection: close) and Run, when it ends,
// waits for it.
func TestKeepAliveShutdownAndRunWait(t *testing.T) {
	if !keepalive.Supported {
		t.Skip("no connection takeover on this platform")
	}
	cat := oneRevision(0, time.Minute)
	release := make(chan struct{})
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			<-release
		}
		io.WriteString(w, "ok")
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{}, ProbeInterval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan struct{})
	go func() { _ = g.Run(ctx); close(runDone) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := g.Server("")
	go srv.Serve(ln)
	defer srv.Close()
	waitFor(t, "gateway healthy", func() bool { return g.healthy.Load() })
	dialRaw := func() *rawClient {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(20 * time.Second))
		return &rawClient{t: t, c: c, br: bufio.NewReader(c)}
	}
	idle, busy := dialRaw(), dialRaw()
	if code, _, _ := idle.do("GET", "/", ""); code != 200 {
		t.Fatalf("idle: %d", code)
	}
	type result struct {
		code   int
		closed bool
	}
	busyDone := make(chan result, 1)
	go func() {
		code, _, closed := busy.do("GET", "/slow", "")
		busyDone <- result{code, closed}
	}()
	loop := &g.takeOvers[0].loop
	waitFor(t, "both connections in the loop", func() bool { return loop.Conns() == 2 && sc.inflight.Load() == 1 })

	sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer scancel()
	if err := srv.Shutdown(sctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	waitFor(t, "idle connection closed", func() bool { return loop.Conns() == 1 })
	cancel()
	select {
	case <-runDone:
		t.Fatal("Run returned with a request in flight on a taken-over connection")
	case <-time.After(200 * time.Millisecond):
	}
	close(release)
	if r := <-busyDone; r.code != 200 || !r.closed {
		t.Errorf("busy request: %d close=%v, want 200 and Connection: close", r.code, r.closed)
	}
	select {
	case <-runDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after the last request")
	}
}
