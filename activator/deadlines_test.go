package activator

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/websocket"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// streamingSidecar answers at once and then writes n chunks, one every
// interval, echoing the request body first if it has one.
func streamingSidecar(t *testing.T, n int, interval time.Duration) *fakeSidecar {
	return newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(200)
		for i := range n {
			fmt.Fprintf(w, "chunk %d\n", i)
			w.(http.Flusher).Flush()
			if i < n-1 {
				time.Sleep(interval)
			}
		}
	})
}

// The revision's timeout bounds the wait for the response, not the
// response (Knative's rule): a response that started in time and keeps
// flowing arrives whole although it lasts several timeouts, on every path
// through the gateway. The gateway's own connection bound (queue timeout
// plus timeout plus a second) is passed too.
func TestAStartedResponseOutlivesTheTimeout(t *testing.T) {
	const chunks = 12
	cat := oneRevision(0, 300*time.Millisecond)
	sc := streamingSidecar(t, chunks, 150*time.Millisecond) // about 1.7 s in all
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.QueueTimeout = 100 * time.Millisecond })

	for _, c := range []struct {
		name   string
		client *http.Client
		body   io.Reader
	}{
		{"HTTP/1.1 without a body (the fast path)", tg.srv.Client(), nil},
		{"HTTP/1.1 with a body (ReverseProxy)", tg.srv.Client(), strings.NewReader("x")},
		{"h2c", h2cClient(), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			method := http.MethodGet
			if c.body != nil {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, tg.srv.URL+"/", c.body)
			req.Host = "hello.default.localhost"
			resp, err := c.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, err := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || err != nil || strings.Count(string(b), "chunk") != chunks {
				t.Fatalf("%d, %d chunks, %v: want all %d", resp.StatusCode, strings.Count(string(b), "chunk"), err, chunks)
			}
		})
	}
}

// A response that has not started by the timeout is answered 504 on the
// ReverseProxy path as on the fast path, and a head that comes later is
// not passed on.
func TestALateResponseIs504OnEveryPath(t *testing.T) {
	cat := oneRevision(0, 200*time.Millisecond)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
		case <-time.After(2 * time.Second):
		}
		io.WriteString(w, "too late")
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)
	for _, c := range []struct {
		name   string
		client *http.Client
		body   io.Reader
	}{
		{"HTTP/1.1 with a body", tg.srv.Client(), strings.NewReader("x")},
		{"h2c", h2cClient(), nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			method := http.MethodGet
			if c.body != nil {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, tg.srv.URL+"/", c.body)
			req.Host = "hello.default.localhost"
			resp, err := c.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 504 || !strings.Contains(string(b), "timeout of 200ms") {
				t.Fatalf("got %d %q, want 504", resp.StatusCode, b)
			}
		})
	}
}

// A websocket is a response that has started: it stays open past the
// timeout and the gateway's connection bound.
func TestAWebsocketOutlivesTheTimeout(t *testing.T) {
	cat := oneRevision(0, 200*time.Millisecond)
	ws := websocket.Server{Handler: func(c *websocket.Conn) { _, _ = io.Copy(c, c) }}
	sc := newFakeSidecar(t, true, ws.ServeHTTP)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.QueueTimeout = 100 * time.Millisecond })

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
		t.Fatal(err)
	}
	defer c.Close()
	buf := make([]byte, 16)
	for i := range 3 {
		if i > 0 {
			time.Sleep(700 * time.Millisecond) // past 0.2 + 0.1 + 1 s by the third
		}
		msg := fmt.Sprintf("ping %d", i)
		if _, err := c.Write([]byte(msg)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		n, err := c.Read(buf)
		if err != nil || string(buf[:n]) != msg {
			t.Fatalf("echo %d: %q %v", i, buf[:n], err)
		}
	}
}

// Every path adds this hop to Forwarded (RFC 7239) as it does to
// X-Forwarded-For, building the chain from a front proxy's
// X-Forwarded-* when no Forwarded came.
func TestForwardedOnEveryPath(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("X-Got-Forwarded", strings.Join(r.Header["Forwarded"], " | "))
		w.Header().Set("X-Got-Xff", strings.Join(r.Header["X-Forwarded-For"], " | "))
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)
	const self = "for=127.0.0.1;host=hello.default.localhost;proto=http"
	for _, c := range []struct {
		name        string
		client      *http.Client
		body        io.Reader
		hdr         map[string]string
		want, wantX string
	}{
		{"fast path", tg.srv.Client(), nil, nil, self, "127.0.0.1"},
		{"body", tg.srv.Client(), strings.NewReader("x"), nil, self, "127.0.0.1"},
		{"h2c", h2cClient(), nil, nil, self, "127.0.0.1"},
		{"fast path behind a proxy", tg.srv.Client(), nil,
			map[string]string{"X-Forwarded-For": "198.51.100.17", "X-Forwarded-Proto": "https"},
			"for=198.51.100.17;proto=https, " + self, "198.51.100.17, 127.0.0.1"},
		{"body behind a proxy that sets Forwarded", tg.srv.Client(), strings.NewReader("x"),
			map[string]string{"Forwarded": "for=198.51.100.17", "X-Forwarded-For": "198.51.100.17"},
			"for=198.51.100.17, " + self, "198.51.100.17, 127.0.0.1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			method := http.MethodGet
			if c.body != nil {
				method = http.MethodPost
			}
			req, _ := http.NewRequest(method, tg.srv.URL+"/", c.body)
			req.Host = "hello.default.localhost"
			for k, v := range c.hdr {
				req.Header.Set(k, v)
			}
			resp, err := c.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if got := resp.Header.Get("X-Got-Forwarded"); got != c.want {
				t.Errorf("Forwarded at the instance:\n got %s\nwant %s", got, c.want)
			}
			if got := resp.Header.Get("X-Got-Xff"); got != c.wantX {
				t.Errorf("X-Forwarded-For at the instance %q, want %q", got, c.wantX)
			}
		})
	}
}
