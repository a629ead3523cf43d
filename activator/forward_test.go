package activator

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestForwardHeaders(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Connection", "X-Hop")
		h.Set("X-Hop", "must not pass")
		h.Set("Keep-Alive", "timeout=5")
		h.Set("X-App", "passes")
		json.NewEncoder(w).Encode(map[string]any{"host": r.Host, "uri": r.RequestURI, "header": r.Header})
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)

	req, _ := http.NewRequest(http.MethodGet, tg.srv.URL+"/a/b?c=d%20e", nil)
	req.Host = "hello.default.localhost"
	req.Header.Set("Connection", "X-Secret")
	req.Header.Set("X-Secret", "hop")
	req.Header.Set("Proxy-Authorization", "Basic eA==")
	req.Header.Set("X-Forwarded-For", "1.2.3.4")
	req.Header.Set(spec.RevisionHeader, "spoofed")
	req.Header.Add("X-Multi", "one")
	req.Header.Add("X-Multi", "two")
	resp, err := tg.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got struct {
		Host   string
		URI    string
		Header http.Header
	}
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
		t.Fatal(err)
	}
	if got.Host != "hello.default.localhost" || got.URI != "/a/b?c=d%20e" {
		t.Errorf("host %q uri %q", got.Host, got.URI)
	}
	for _, k := range []string{"X-Secret", "Proxy-Authorization"} {
		if v := got.Header.Get(k); v != "" {
			t.Errorf("hop-by-hop %s reached the instance: %q", k, v)
		}
	}
	want := map[string]string{
		"X-Forwarded-For":   "1.2.3.4, 127.0.0.1",
		"X-Forwarded-Host":  "hello.default.localhost",
		"X-Forwarded-Proto": "http",
		spec.RevisionHeader: "hello-00001",
	}
	for k, v := range want {
		if g := strings.Join(got.Header.Values(k), ","); g != v {
			t.Errorf("%s = %q, want %q", k, g, v)
		}
	}
	if g := got.Header.Values("X-Multi"); len(g) != 2 {
		t.Errorf("X-Multi = %v, want both values", g)
	}
	if resp.Header.Get("X-Hop") != "" || resp.Header.Get("Keep-Alive") != "" {
		t.Errorf("hop-by-hop response headers passed: %v", resp.Header)
	}
	if resp.Header.Get("X-App") != "passes" {
		t.Errorf("app header lost: %v", resp.Header)
	}
}

func TestForwardStreamsTrailersAndHead(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	release := make(chan struct{})
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stream":
			io.WriteString(w, "first\n")
			w.(http.Flusher).Flush()
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			io.WriteString(w, "second\n")
		case "/trailer":
			w.Header().Set("Trailer", "X-Sum")
			io.WriteString(w, "body")
			w.Header().Set("X-Sum", "42")
		default:
			w.Header().Set("Content-Length", "5")
			if r.Method != http.MethodHead {
				io.WriteString(w, "hello")
			}
		}
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)
	do := func(method, path string) *http.Response {
		req, _ := http.NewRequest(method, tg.srv.URL+path, nil)
		req.Host = "hello.default.localhost"
		resp, err := tg.srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}

	resp := do(http.MethodGet, "/stream")
	br := bufio.NewReader(resp.Body)
	line, err := br.ReadString('\n')
	if err != nil || line != "first\n" {
		t.Fatalf("first chunk: %q %v (not flushed before the app went on?)", line, err)
	}
	close(release)
	rest, _ := io.ReadAll(br)
	resp.Body.Close()
	if string(rest) != "second\n" {
		t.Fatalf("rest %q", rest)
	}

	resp = do(http.MethodGet, "/trailer")
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "body" || resp.Trailer.Get("X-Sum") != "42" {
		t.Fatalf("trailer: body %q trailer %v", body, resp.Trailer)
	}

	resp = do(http.MethodHead, "/")
	body, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || len(body) != 0 || resp.ContentLength != 5 {
		t.Fatalf("HEAD: %d, %d bytes, length %d", resp.StatusCode, len(body), resp.ContentLength)
	}
}

// rawServer answers each request on a connection with response, written
// as is, and then closes the connection (without saying so).
func rawServer(t *testing.T, response string) (port int, conns *atomic.Int32) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	conns = &atomic.Int32{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				if _, err := http.ReadRequest(br); err != nil {
					return
				}
				io.WriteString(c, response)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, conns
}

const (
	rawOK   = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	rawCut  = "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten.."
	rawEOF  = "HTTP/1.1 200 OK\r\nX-A: 1\r\n\r\nuntil the end"
	rawHint = "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-B: 2\r\n\r\nok"
)

func rawGateway(t *testing.T, response string) (*testGateway, *atomic.Int32) {
	t.Helper()
	port, conns := rawServer(t, response)
	cat := oneRevision(0, time.Minute)
	cat.SetReady("hello-00001", []consulroute.Instance{{ID: "raw", Revision: "hello-00001", Address: "127.0.0.1", Port: port}})
	return startGateway(t, cat, nil, nil), conns
}

func TestForwardCloseDelimitedAndInformational(t *testing.T) {
	tg, _ := rawGateway(t, rawEOF)
	code, body, h := tg.get(t, "hello.default.localhost", "/", nil)
	if code != 200 || body != "until the end" || h.Get("X-A") != "1" {
		t.Fatalf("close-delimited: %d %q %v", code, body, h)
	}
	tg, _ = rawGateway(t, rawHint)
	code, body, h = tg.get(t, "hello.default.localhost", "/", nil)
	if code != 200 || body != "ok" || h.Get("X-B") != "2" || h.Get("Link") != "" {
		t.Fatalf("after 103: %d %q %v", code, body, h)
	}
}

func TestForwardRetriesStaleKeptAliveConnection(t *testing.T) {
	tg, conns := rawGateway(t, rawOK)
	for i := range 3 {
		code, body, _ := tg.get(t, "hello.default.localhost", "/", nil)
		if code != 200 || body != "ok" {
			t.Fatalf("request %d: %d %q", i, code, body)
		}
		time.Sleep(20 * time.Millisecond) // let the close arrive
	}
	if n := conns.Load(); n < 3 {
		t.Fatalf("%d connections for 3 requests on a server that closes each", n)
	}
}

func TestForwardAbortsCutResponse(t *testing.T) {
	tg, _ := rawGateway(t, rawCut)
	req, _ := http.NewRequest(http.MethodGet, tg.srv.URL+"/", nil)
	req.Host = "hello.default.localhost"
	// The client must see an error: at once (the head was still
	// buffered when the connection was aborted) or reading the body.
	if resp, err := tg.srv.Client().Do(req); err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		if err == nil {
			t.Fatal("a response the instance cut reached the client as complete")
		}
	}
	waitFor(t, "slot freed", func() bool { return tg.g.Revisions()[0].InFlight == 0 })
	if s := tg.g.Revisions()[0]; s.InFlight != 0 || s.Instances[0].InFlight != 0 {
		t.Fatalf("slot leaked after an aborted response: %+v", s)
	}
}

// Upgrades (websocket) take the ReverseProxy path and hold their slot while
// open.
func TestWebsocketThroughGateway(t *testing.T) {
	cat := oneRevision(1, time.Minute)
	ws := websocket.Server{Handler: func(c *websocket.Conn) { _, _ = io.Copy(c, c) }}
	sc := newFakeSidecar(t, true, ws.ServeHTTP)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)

	cfg, err := websocket.NewConfig("ws://hello.default.localhost/ws", "http://localhost/")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", tg.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	c, err := websocket.NewClient(cfg, conn)
	if err != nil {
		t.Fatalf("websocket handshake through the gateway: %v", err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "ping" {
		t.Fatalf("echo: %q %v", buf[:n], err)
	}
	if s := tg.g.Revisions()[0]; s.InFlight != 1 {
		t.Fatalf("open websocket: in flight %d, want 1 (it holds the instance's only slot)", s.InFlight)
	}
	c.Close()
	waitFor(t, "slot freed after close", func() bool { return tg.g.Revisions()[0].InFlight == 0 })
}

// Both forwarding paths borrow copy buffers; lending one costs nothing.
func TestBufferPoolAllocatesNothing(t *testing.T) {
	bp := newBufferPool()
	bp.Put(bp.Get()) // warm the pool
	allocs := testing.AllocsPerRun(1000, func() {
		b := bp.Get()
		if len(b) != copyBufferSize {
			t.Fatalf("buffer of %d bytes, want %d", len(b), copyBufferSize)
		}
		bp.Put(b)
	})
	if allocs != 0 {
		t.Fatalf("Get+Put allocates %.1f times, want 0", allocs)
	}
}

// The common response (a length and a type, nothing to rework) leaves the
// gateway as the instance wrote it, less its hop-by-hop fields; anything
// else goes through the header map as before. The wire shows which: the
// map path writes names in canonical form.
func TestForwardPassesCommonHeadsThrough(t *testing.T) {
	cases := []struct {
		name     string
		response string
		status   int
		has      []string // header lines the client gets, exactly
		hasNot   []string // substrings (any case) it must not see
		body     string
	}{
		{name: "passed through",
			response: "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\nx-lower:  1 \r\nX-Dup: a\r\nX-Dup: b\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\nProxy-Connection: x\r\nDate: Mon, 30 Nov 2026 04:00:00 GMT\r\nContent-Length: 2\r\n\r\nok",
			status:   200, body: "ok",
			has:    []string{"content-type: text/plain", "x-lower:  1 ", "X-Dup: a", "X-Dup: b", "Date: Mon, 30 Nov 2026 04:00:00 GMT", "Content-Length: 2"},
			hasNot: []string{"keep-alive", "proxy-connection"}},
		{name: "error status passed through",
			response: "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nRetry-After: 1\r\nContent-Length: 4\r\n\r\nbusy",
			status:   503, body: "busy",
			has: []string{"Retry-After: 1", "Content-Length: 4"}},
		{name: "no type: sniffed through the map",
			response: "HTTP/1.1 200 OK\r\nx-lower: 1\r\nContent-Length: 6\r\n\r\n<html>",
			status:   200, body: "<html>",
			has: []string{"X-Lower: 1", "Content-Type: text/html; charset=utf-8"}},
		{name: "connection names a field: dropped through the map",
			response: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nConnection: x-private\r\nx-private: secret\r\nContent-Length: 2\r\n\r\nok",
			status:   200, body: "ok",
			has:    []string{"Content-Type: text/plain"},
			hasNot: []string{"x-private", "secret"}},
		{name: "chunked: through the map",
			response: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nx-c: 1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
			status:   200, body: "ok",
			has: []string{"X-C: 1"}},
		{name: "bare CR in a value: mended through the map",
			response: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Weird: a\rb\r\nContent-Length: 2\r\n\r\nok",
			status:   200, body: "ok",
			has: []string{"X-Weird: a b"}},
		{name: "lengths that disagree: bad gateway",
			response: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
			status:   502},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tg, _ := rawGateway(t, c.response)
			conn, err := net.Dial("tcp", tg.srv.Listener.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			conn.SetDeadline(time.Now().Add(10 * time.Second))
			io.WriteString(conn, "GET / HTTP/1.1\r\nHost: hello.default.localhost\r\n\r\n")
			br := bufio.NewReader(conn)
			status, _ := br.ReadString('\n')
			var lines []string
			for {
				l, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("reading the head: %v", err)
				}
				if l == "\r\n" {
					break
				}
				lines = append(lines, strings.TrimSuffix(l, "\r\n"))
			}
			resp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(status+strings.Join(lines, "\r\n")+"\r\n\r\n")), nil)
			if err != nil {
				t.Fatalf("head %q: %v", lines, err)
			}
			if resp.StatusCode != c.status {
				t.Fatalf("status %d, want %d (head %q)", resp.StatusCode, c.status, lines)
			}
			if c.status == 502 {
				return
			}
			var body []byte
			if resp.ContentLength >= 0 {
				body = make([]byte, resp.ContentLength)
				_, err = io.ReadFull(br, body)
			} else {
				body, err = io.ReadAll(httputil.NewChunkedReader(br))
			}
			if err != nil || string(body) != c.body {
				t.Fatalf("body %q, %v; want %q", body, err, c.body)
			}
			for _, want := range c.has {
				if !slices.Contains(lines, want) {
					t.Errorf("no %q among %q", want, lines)
				}
			}
			head := strings.ToLower(strings.Join(lines, "\n"))
			for _, not := range c.hasNot {
				if strings.Contains(head, strings.ToLower(not)) {
					t.Errorf("%q reached the client: %q", not, lines)
				}
			}
			if resp.Header.Get("Date") == "" {
				t.Errorf("no Date: %q", lines)
			}
		})
	}
}
