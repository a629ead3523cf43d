package activator

import (
	"crypto/tls"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/rawh2"
)

// h2ResetGateway is a gateway on the screened listener (tls false) or on
// its HTTPS port (tls true, the client negotiating h2) in front of a fake
// sidecar whose /hold/ requests send their head and wait for the client
// to go. dial opens a client connection to it.
func h2ResetGateway(t *testing.T, overTLS bool) (dial func() *rawh2.Conn, sc *fakeSidecar) {
	sc = newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/hold/") {
			w.WriteHeader(200)
			io.WriteString(w, "held\n")
			w.(http.Flusher).Flush()
			<-r.Context().Done()
			return
		}
		io.WriteString(w, "ok")
	})
	cat := oneRevision(0, time.Minute)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	if !overTLS {
		addr := serveScreened(t, startGateway(t, cat, nil, nil).g)
		return func() *rawh2.Conn { return rawh2.Dial(t, addr) }, sc
	}
	tg := startTLSGateway(t, cat, nil)
	return func() *rawh2.Conn {
		c, err := tls.Dial("tcp", tg.tlsAddr, &tls.Config{RootCAs: tg.pool, ServerName: "hello.default.localhost", NextProtos: []string{"h2"}})
		if err != nil {
			t.Fatal(err)
		}
		if p := c.ConnectionState().NegotiatedProtocol; p != "h2" {
			t.Fatalf("negotiated %q, want h2", p)
		}
		return rawh2.Wrap(t, c)
	}, sc
}

// openThenReset opens stream id on a held request, waits until the gateway
// passed it on and its head came back (so its handler surely ran), then
// resets it; false when the connection ended first.
func openThenReset(t *testing.T, c *rawh2.Conn, id uint32) bool {
	t.Helper()
	if err := c.Request(id, "GET", "hello.default.localhost", "/hold/x", true); err != nil {
		return false
	}
	o, ok := c.Wait(rawh2.Within, func(o *rawh2.Outcome) bool { return o.Statuses[id] != "" })
	if !ok {
		t.Fatalf("stream %d: no answer within %s: %s", id, rawh2.Within, &o)
	}
	if o.Over() {
		return false
	}
	return c.Frames(func(fr *http2.Framer) error { return fr.WriteRSTStream(id, http2.ErrCodeCancel) }) == nil
}

// A connection whose streams the client resets at once, one after the
// other, is closed once it has had prematureMinStreams streams: what rapid
// reset passes on to the instance is bounded by that, not by the
// attacker's speed.
// The same holds for HTTP/2 over TLS.
func TestH2RapidResetClosesTheConnection(t *testing.T) {
	for _, overTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "h2c", true: "h2 over TLS"}[overTLS], func(t *testing.T) {
			dial, sc := h2ResetGateway(t, overTLS)
			c := dial()
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			n := 0
			for ; n < 2*prematureMinStreams && openThenReset(t, c, uint32(2*n+1)); n++ {
			}
			o, ok := c.Wait(rawh2.Within, nil)
			if !ok || !o.Closed {
				t.Fatalf("after %d open-then-reset streams the connection is still open: %s", n, &o)
			}
			if n < prematureMinStreams-1 || n > prematureMinStreams+1 {
				t.Errorf("closed after %d streams, want about %d", n, prematureMinStreams)
			}
			if got := sc.requests.Load(); got > prematureMinStreams+1 {
				t.Errorf("the instance saw %d requests, want at most %d", got, prematureMinStreams+1)
			}
		})
	}
}

// A client that cancels some of its calls (a quarter here, each right
// after its head came back) keeps its connection.
func TestH2SomeResetsKeepTheConnection(t *testing.T) {
	dial, _ := h2ResetGateway(t, false)
	c := dial()
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	const streams = 3 * prematureMinStreams
	for i := range streams {
		id := uint32(2*i + 1)
		if i%4 == 0 {
			if !openThenReset(t, c, id) {
				t.Fatalf("the connection ended at stream %d", id)
			}
			continue
		}
		if err := c.Request(id, "GET", "hello.default.localhost", "/", true); err != nil {
			t.Fatalf("stream %d: %v", id, err)
		}
		if o, ok := c.Wait(rawh2.Within, func(o *rawh2.Outcome) bool { return o.Ended[id] }); !ok || o.Over() || o.Statuses[id] != "200" {
			t.Fatalf("stream %d: %s", id, &o)
		}
	}
}
