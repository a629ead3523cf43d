package sidecar_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// The first chunk of a streamed response reaches the client while the app
// holds the second: the sidecar passes bytes on as they arrive. (Ordering
// proof: the gate opens only after the client read chunk 1.)
func TestStreamingPassesThrough(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", r.url+"/?stream=3&gate=s1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "chunk 1\n" {
		t.Fatalf("first chunk %q %v (buffered by the proxy?)", line, err)
	}
	a.post(t, "/release?gate=s1")
	rest, err := io.ReadAll(br)
	if err != nil || string(rest) != "chunk 2\nchunk 3\n" {
		t.Fatalf("rest %q %v", rest, err)
	}
}

// A request body reaches the app while the client is still sending it, and
// the app's echo comes back meanwhile (full duplex through the sidecar).
func TestRequestBodyStreams(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	pr, pw := io.Pipe()
	req, _ := http.NewRequestWithContext(ctx, "POST", r.url+"/echo", pr)
	type result struct {
		resp *http.Response
		err  error
	}
	res := make(chan result, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		res <- result{resp, err}
	}()
	if _, err := pw.Write([]byte("first part;")); err != nil {
		t.Fatal(err)
	}
	// The response (and the echo of the first part) arrives before the
	// body is finished: a proxy that buffered the body would wait here
	// until the test's context ends.
	var got result
	select {
	case got = <-res:
	case <-ctx.Done():
		t.Fatal("no response while the body was still open: the request body was buffered")
	}
	if got.err != nil {
		t.Fatal(got.err)
	}
	defer got.resp.Body.Close()
	buf := make([]byte, len("first part;"))
	if _, err := io.ReadFull(got.resp.Body, buf); err != nil || string(buf) != "first part;" {
		t.Fatalf("echo of the first part %q %v", buf, err)
	}
	pw.Write([]byte("second part"))
	pw.Close()
	rest, err := io.ReadAll(got.resp.Body)
	if err != nil || string(rest) != "second part" {
		t.Fatalf("echo of the rest %q %v", rest, err)
	}
}

// A body of known length and one of unknown length (chunked) both arrive
// whole.
func TestRequestBodies(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)
	body := strings.Repeat("0123456789", 50_000)
	for name, mk := range map[string]func() io.Reader{
		"content-length": func() io.Reader { return strings.NewReader(body) },
		"chunked":        func() io.Reader { return io.MultiReader(strings.NewReader(body)) },
	} {
		resp, err := http.Post(r.url+"/echo", "text/plain", mk())
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != body {
			t.Fatalf("%s: echoed %d bytes (%v), sent %d", name, len(got), err, len(body))
		}
	}
}

func TestWebsocketPassesThrough(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	for _, proto := range []string{"", spec.ProtocolH2C} {
		t.Run("app protocol "+proto, func(t *testing.T) { testWebsocket(t, a, proto) })
	}
}

func testWebsocket(t *testing.T, a *app, proto string) {
	sc := config(a.port)
	sc.AppProtocol = proto
	r := startSidecar(t, sc, sidecar.Options{})
	r.waitReady(t)
	cfg, err := websocket.NewConfig("ws"+strings.TrimPrefix(r.url, "http")+"/ws", r.url)
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.DialConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer ws.Close()
	ws.SetDeadline(time.Now().Add(10 * time.Second))
	for _, msg := range []string{"hello", "through the sidecar", strings.Repeat("x", 70000)} {
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		for len(got) < len(msg) {
			var part string
			if err := websocket.Message.Receive(ws, &part); err != nil {
				t.Fatal(err)
			}
			got += part
		}
		if got != msg {
			t.Fatalf("echo of %d bytes came back as %d bytes", len(msg), len(got))
		}
	}
	if st := r.stats(t); st.InFlight != 1 {
		t.Fatalf("an open websocket is one request in flight; stats say %d", st.InFlight)
	}
	ws.Close()
	waitUntil(t, "the websocket ends its request", func() bool { return r.stats(t).InFlight == 0 })
}

// The sidecar serves HTTP/1.1 and h2c clients alike, and the app gets the
// protocol it declared whatever the client spoke: an HTTP/1.1 app serves
// h2c clients, an h2c app (a gRPC server) HTTP/1.1 clients.
func TestH2CBothWays(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)
	h2cApp := config(a.port)
	h2cApp.AppProtocol = spec.ProtocolH2C
	r2 := startSidecar(t, h2cApp, sidecar.Options{})
	r2.waitReady(t)
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	h2c := &http.Client{Transport: &http.Transport{Protocols: &protos}}
	for _, c := range []struct {
		url              string
		client           *http.Client
		wantClient, want string
	}{
		{r.url, h2c, "HTTP/2.0", "HTTP/1.1"},
		{r.url, http.DefaultClient, "HTTP/1.1", "HTTP/1.1"},
		{r2.url, h2c, "HTTP/2.0", "HTTP/2.0"},
		{r2.url, http.DefaultClient, "HTTP/1.1", "HTTP/2.0"},
	} {
		resp, err := c.client.Get(c.url + "/headers")
		if err != nil {
			t.Fatal(err)
		}
		var seen testapp.Request
		err = json.NewDecoder(resp.Body).Decode(&seen)
		resp.Body.Close()
		if err != nil || resp.Proto != c.wantClient || seen.Proto != c.want {
			t.Fatalf("client spoke %s (want %s), app saw %q, want %q (%v)", resp.Proto, c.wantClient, seen.Proto, c.want, err)
		}
	}
	// Streaming works over h2c too.
	resp, err := h2c.Get(r2.url + "/?stream=3")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "chunk 1\nchunk 2\nchunk 3\n" {
		t.Fatalf("h2c stream %q", b)
	}
	// The retired h2c upgrade is answered in HTTP/1.1, not passed on.
	conn, err := net.Dial("tcp", strings.TrimPrefix(r.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET /headers HTTP/1.1\r\nHost: x\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\n\r\n")
	up, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	var seen testapp.Request
	json.NewDecoder(up.Body).Decode(&seen)
	if up.StatusCode != 200 || seen.Headers["Upgrade"] != nil || seen.Headers["Http2-Settings"] != nil {
		t.Fatalf("h2c upgrade: %s, app saw %v", up.Status, seen.Headers)
	}
}

// An h2c app's http readiness probe goes over h2c: an app that speaks
// only HTTP/2 becomes ready.
func TestH2COnlyAppIsProbedOverH2C(t *testing.T) {
	t.Parallel()
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true) // and not HTTP/1.1
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.Proto+" "+r.URL.Path)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	cfg := config(ln.Addr().(*net.TCPAddr).Port)
	cfg.AppProtocol = spec.ProtocolH2C
	cfg.Readiness = &spec.Probe{Type: spec.ProbeHTTP, Path: "/ready", Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 1}
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)
	resp, err := http.Get(r.url + "/x")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "HTTP/2.0 /x" {
		t.Fatalf("HTTP/1.1 client to an h2c-only app: %d %q", resp.StatusCode, b)
	}
}
