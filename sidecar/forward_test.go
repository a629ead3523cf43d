package sidecar

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/textproto"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Edge cases of the HTTP/1.1 forwarder, against apps in this process.

// proxyTo serves a sidecar in front of the app as deployed (the front
// door: the keepalive loop, net/http for what it hands off).
func proxyTo(t *testing.T, appPort int) *frontServer {
	t.Helper()
	cfg := benchConfig(appPort, 0)
	cfg.Timeout = 10 * time.Second
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	return serveFront(t, s)
}

func appServer(t *testing.T, h http.HandlerFunc) int {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().(*net.TCPAddr).Port
}

// rawResponder answers every request on a connection with resp (one per
// request head read), then does what after says.
func rawResponder(t *testing.T, resp string, closeAfter bool) (port int, conns, open *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns, open = &atomic.Int64{}, &atomic.Int64{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			open.Add(1)
			go func() {
				defer open.Add(-1)
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					tp := textproto.NewReader(br)
					if _, err := tp.ReadLine(); err != nil {
						return
					}
					if _, err := tp.ReadMIMEHeader(); err != nil {
						return
					}
					io.WriteString(c, resp)
					if closeAfter {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, conns, open
}

func TestForwardTrailersBothWays(t *testing.T) {
	var gotTrailer atomic.Value
	port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		gotTrailer.Store(r.Trailer.Get("X-Req-Sum"))
		w.Header().Set("Trailer", "X-Checksum")
		w.Write([]byte("body"))
		w.(http.Flusher).Flush()
		w.Header().Set("X-Checksum", "abc")
	})
	srv := proxyTo(t, port)
	pr, pw := io.Pipe()
	go func() { pw.Write([]byte("payload")); pw.Close() }()
	req, _ := http.NewRequest("POST", srv.URL+"/", pr)
	req.Trailer = http.Header{"X-Req-Sum": {"42"}}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "body" || resp.Trailer.Get("X-Checksum") != "abc" {
		t.Fatalf("body %q trailer %v", b, resp.Trailer)
	}
	if gotTrailer.Load() != "42" {
		t.Fatalf("request trailer at the app: %v", gotTrailer.Load())
	}
}

func TestForwardNoBodyResponses(t *testing.T) {
	port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/204":
			w.WriteHeader(204)
		case "/304":
			w.WriteHeader(304)
		default:
			w.Header().Set("Content-Length", "5")
			w.Write([]byte("hello"))
		}
	})
	srv := proxyTo(t, port)
	resp, err := http.Head(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || resp.ContentLength != 5 {
		t.Fatalf("HEAD: %d length %d", resp.StatusCode, resp.ContentLength)
	}
	for _, p := range []string{"/204", "/304", "/"} {
		resp, err := http.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := strings.TrimPrefix(p, "/"); want != "" && strconv.Itoa(resp.StatusCode) != want || p == "/" && string(b) != "hello" {
			t.Fatalf("%s: %d %q", p, resp.StatusCode, b)
		}
	}
}

func TestForwardFramings(t *testing.T) {
	for _, c := range []struct {
		name, resp, want string
		closeAfter       bool
		wantConns        int64
	}{
		{"connection close", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi", "hi", true, 3},
		{"read to EOF", "HTTP/1.0 200 OK\r\n\r\nuntil the end", "until the end", true, 3},
		{"chunked with extension", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\n\r\n", "abcde", false, 1},
		{"chunked wins over length", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 99\r\n\r\n2\r\nok\r\n0\r\n\r\n", "ok", false, 1},
		{"early hints then answer", "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", "ok", false, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			port, conns, _ := rawResponder(t, c.resp, c.closeAfter)
			srv := proxyTo(t, port)
			for i := 0; i < 3; i++ {
				var early atomic.Int32
				ctx := httptrace.WithClientTrace(context.Background(), &httptrace.ClientTrace{
					Got1xxResponse: func(code int, _ textproto.MIMEHeader) error { early.Store(int32(code)); return nil },
				})
				req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/", nil)
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || string(b) != c.want {
					t.Fatalf("request %d: %d %q %v", i, resp.StatusCode, b, err)
				}
				if strings.Contains(c.resp, "103") && early.Load() != 103 {
					t.Fatalf("103 not passed on")
				}
			}
			if conns.Load() != c.wantConns {
				t.Fatalf("%d app connections for 3 requests, want %d", conns.Load(), c.wantConns)
			}
		})
	}
}

func TestForwardBadResponses(t *testing.T) {
	for _, c := range []struct{ name, resp string }{
		{"garbage", "HELLO\r\n\r\n"},
		{"conflicting lengths", "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nabc"},
		{"bad header", "HTTP/1.1 200 OK\r\nno colon here\r\n\r\n"},
		{"folded header", "HTTP/1.1 200 OK\r\nX-A: 1\r\n  folded\r\n\r\n"},
		{"closed without answer", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			port, _, _ := rawResponder(t, c.resp, true)
			srv := proxyTo(t, port)
			resp, err := http.Get(srv.URL + "/")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway || !strings.Contains(string(b), "did not answer") {
				t.Fatalf("%d %q", resp.StatusCode, b)
			}
		})
	}
}

// A response cut short by the app is cut short for the client too, not
// ended as if complete.
func TestForwardTruncatedBodyAborts(t *testing.T) {
	for _, resp := range []string{
		"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
	} {
		port, _, _ := rawResponder(t, resp, true)
		srv := proxyTo(t, port)
		r, err := http.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		_, err = io.ReadAll(r.Body)
		r.Body.Close()
		if err == nil {
			t.Fatalf("a truncated response (%q) reached the client as complete", resp)
		}
	}
}

// The app closing an idle keep-alive connection is invisible to an
// idempotent request: it is retried on a new connection.
func TestForwardRetriesStaleConnection(t *testing.T) {
	// Answers without Connection: close, then closes: the sidecar's pooled
	// connection is dead when the next request takes it.
	port, conns, open := rawResponder(t, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", true)
	srv := proxyTo(t, port)
	for i := 0; i < 3; i++ {
		resp, err := http.Get(srv.URL + "/")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "ok" {
			t.Fatalf("GET %d: %d %q", i, resp.StatusCode, b)
		}
		time.Sleep(20 * time.Millisecond) // let the close arrive
	}
	if conns.Load() < 3 {
		t.Fatalf("%d connections for 3 requests on a closing app", conns.Load())
	}
	// A POST never goes out on a connection the app closed while it was
	// idle (it is looked at first), so it reaches the app once, on a new
	// one. The app has closed every connection first (a 20 ms pause is
	// not that, on a busy machine).
	waitFor(t, func() bool { return open.Load() == 0 }) // the app closed its connections
	before := conns.Load()
	resp, err := http.Post(srv.URL+"/", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || conns.Load() != before+1 {
		t.Fatalf("POST after a stale connection: %d on %d new connections, want 200 on 1", resp.StatusCode, conns.Load()-before)
	}
}

// A POST the app read and then dropped is not replayed (the app may have
// acted on it), and the 502 does not offer it to another instance.
func TestForwardDoesNotReplayPost(t *testing.T) {
	port, conns, _ := rawResponder(t, "", true) // reads the head, closes
	srv := proxyTo(t, port)
	resp, err := http.Post(srv.URL+"/", "text/plain", strings.NewReader("x"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(spec.NotServedHeader) != "" || conns.Load() != 1 {
		t.Fatalf("POST the app dropped: %d %q on %d connections, want a plain 502 on 1",
			resp.StatusCode, resp.Header.Get(spec.NotServedHeader), conns.Load())
	}
}

// A client that leaves is noticed within clientCheckInterval, and the app's
// connection is closed so the app can stop working on it; both ways the
// handler is served (the loop learns it from a peek at the socket, net/http
// from its background read).
func TestForwardClientGoneAbortsApp(t *testing.T) {
	for _, front := range []bool{true, false} {
		t.Run(map[bool]string{true: "front door", false: "net/http"}[front], func(t *testing.T) {
			appCtxDone := make(chan struct{})
			port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
				select {
				case <-r.Context().Done():
					close(appCtxDone)
				case <-time.After(20 * time.Second):
				}
			})
			cfg := benchConfig(port, 0)
			s, _ := New(cfg, Options{})
			var url string
			if front {
				url = serveFront(t, s).URL
			} else {
				srv := httptest.NewServer(s.Handler())
				defer srv.Close()
				url = srv.URL
			}
			ctx, cancel := context.WithCancel(context.Background())
			req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
			go func() {
				time.Sleep(100 * time.Millisecond)
				cancel()
			}()
			if _, err := http.DefaultClient.Do(req); err == nil {
				t.Fatal("request survived its cancellation")
			}
			select {
			case <-appCtxDone:
			case <-time.After(10 * time.Second):
				t.Fatal("the app never saw the client leave")
			}
			deadline := time.Now().Add(10 * time.Second)
			for s.meter.inFlight() != 0 {
				if time.Now().After(deadline) {
					t.Fatal("request still in flight")
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

func TestParseChunkSize(t *testing.T) {
	for in, want := range map[string]int64{"0\r\n": 0, "1a\r\n": 26, "FF;x=y\r\n": 255, "10 \r\n": 16} {
		if got, ok := parseChunkSize([]byte(in)); !ok || got != want {
			t.Errorf("%q: %d %v", in, got, ok)
		}
	}
	for _, in := range []string{"\r\n", "zz\r\n", "1234567890abcdef0\r\n", "12"} {
		if _, ok := parseChunkSize([]byte(in)); ok {
			t.Errorf("%q accepted", in)
		}
	}
}

// The ReverseProxy paths (h2c here) obey the same timeouts through the
// context the timer cancels.
func TestH2CPathTimesOut(t *testing.T) {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(5 * time.Second):
		case <-r.Context().Done():
		}
	}))
	app.Config.Protocols = &protos
	app.Start()
	defer app.Close()
	cfg := benchConfig(app.Listener.Addr().(*net.TCPAddr).Port, 0)
	cfg.ResponseStartTimeout = 200 * time.Millisecond
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.Config.Protocols = &protos
	srv.Start()
	defer srv.Close()
	var cp http.Protocols
	cp.SetUnencryptedHTTP2(true)
	client := &http.Client{Transport: &http.Transport{Protocols: &cp}}
	resp, err := client.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(b), "response_start_timeout") {
		t.Fatalf("%s %d %q", resp.Proto, resp.StatusCode, b)
	}
}

// Only the sidecar says an app did not serve a request: an app's own
// answer never carries spec.NotServedHeader on, whichever path it takes.
func TestAppCannotForgeNotServed(t *testing.T) {
	port := appServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set(spec.NotServedHeader, spec.NotServedValue)
		w.WriteHeader(http.StatusBadGateway)
	})
	srv := proxyTo(t, port)
	for _, body := range []string{"", "with a body"} {
		var resp *http.Response
		var err error
		if body == "" {
			resp, err = http.Get(srv.URL + "/")
		} else {
			resp, err = http.Post(srv.URL+"/", "text/plain", strings.NewReader(body))
		}
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(spec.NotServedHeader) != "" {
			t.Fatalf("%q: %d with %s=%q: the app's header passed", body, resp.StatusCode, spec.NotServedHeader, resp.Header.Get(spec.NotServedHeader))
		}
	}
}
