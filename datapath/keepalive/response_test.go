package keepalive

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// Every way a handler can answer comes out framed as net/http frames it:
// status, headers, body, trailers, and whether the connection stays open.
func TestResponsesAsNetHTTPFramesThem(t *testing.T) {
	big := strings.Repeat("0123456789", 1000)
	cases := []struct {
		name    string
		method  string
		handler http.HandlerFunc
	}{
		{"small body, no length", "GET", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "hello\n")
		}},
		{"declared length", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("Content-Length", "6")
			io.WriteString(w, "hello\n")
		}},
		{"declared length, sniffed type", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "21")
			io.WriteString(w, "<html><b>x</b></html>")
		}},
		{"large body", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, big)
		}},
		{"many small writes past the buffer", "GET", func(w http.ResponseWriter, r *http.Request) {
			for range 300 {
				io.WriteString(w, "0123456789")
			}
		}},
		{"flushed", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "one ")
			w.(http.Flusher).Flush()
			io.WriteString(w, "two")
		}},
		{"flush before anything", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush()
		}},
		{"declared trailers", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-Sum, X-Count")
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "body")
			w.Header().Set("X-Sum", "abc")
			w.Header().Set("X-Count", "1")
		}},
		{"prefixed trailers", "GET", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "body")
			w.Header().Set(http.TrailerPrefix+"X-Late", "yes")
		}},
		{"trailers with a length", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Trailer", "X-T")
			w.Header().Set("Content-Length", "4")
			io.WriteString(w, "body")
			w.Header().Set("X-T", "dropped")
		}},
		{"no content", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "5")
			w.WriteHeader(http.StatusNoContent)
			io.WriteString(w, "ignored")
		}},
		{"not modified", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain")
			w.Header().Set("ETag", `"x"`)
			w.WriteHeader(http.StatusNotModified)
		}},
		{"head with body written", "HEAD", func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "not sent")
		}},
		{"head with declared length", "HEAD", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "1000")
			w.Header().Set("Content-Type", "text/plain")
		}},
		{"head, nothing written", "HEAD", func(w http.ResponseWriter, r *http.Request) {}},
		{"early hints", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "final")
		}},
		{"handler asks to close", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Connection", "close")
			io.WriteString(w, "bye")
		}},
		{"short body", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Length", "10")
			w.Header().Set("Content-Type", "text/plain")
			io.WriteString(w, "short")
		}},
		{"suppressed type and date", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header()["Content-Type"] = nil
			w.Header()["Date"] = nil
			io.WriteString(w, "<html></html>")
		}},
		{"odd header values and names", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header()["X-Multi"] = []string{"a\r\nInjected: yes", " b "}
			w.Header()["Bad Name"] = []string{"skipped"}
			io.WriteString(w, "x")
		}},
		{"identity transfer encoding", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Transfer-Encoding", "identity")
			w.(http.Flusher).Flush()
			io.WriteString(w, "until close")
		}},
		{"status without text", "GET", func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(599)
		}},
		{"error status", "GET", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "nope", http.StatusServiceUnavailable)
		}},
		{"empty", "GET", func(w http.ResponseWriter, r *http.Request) {}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			loop := startLoop(t, c.handler, nil)
			ref := startNetHTTP(t, c.handler)
			got, want := twoResponses(t, loop.addr, c.method), twoResponses(t, ref, c.method)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("through the loop:\n%s\nthrough net/http:\n%s", got, want)
			}
			if n := loop.handoffs.Load(); n != 0 {
				t.Errorf("%d connections handed off", n)
			}
		})
	}
}

// twoResponses sends two requests on one connection (the second only if
// the first left it open) and describes what came back.
func twoResponses(t *testing.T, addr, method string) string {
	t.Helper()
	rc := dial(t, addr)
	var b strings.Builder
	for i := range 2 {
		rc.send(method + " /r HTTP/1.1\r\nHost: h\r\n\r\n")
		r := rc.read(method)
		if r.readFail != nil {
			fmt.Fprintf(&b, "#%d: read failed\n", i)
			return b.String()
		}
		fmt.Fprintf(&b, "#%d: %d header=%v body=%q bodyErr=%v trailer=%v close=%v chunked=%v length=%d dates=%d\n",
			i, r.status, r.header, r.body, r.bodyErr != nil, r.trailer, r.close, r.chunked, r.length, r.dates)
		if r.close || r.bodyErr != nil {
			fmt.Fprintf(&b, "closed=%v\n", rc.closed())
			return b.String()
		}
	}
	return b.String()
}

// A head handed over in wire form (RawHeadWriter) comes out as net/http
// frames the same head set in the header map, and the writer refuses the
// responses it does not take, which then go through the map as usual.
func TestRawHeadAsNetHTTPFramesIt(t *testing.T) {
	cases := []struct {
		name   string
		method string
		head   RawHead
		body   string
		taken  bool
		preset bool // a header is set before WriteRawHead
	}{
		{name: "plain", method: "GET", taken: true, body: "hello\n",
			head: RawHead{Status: 200, Fields: []byte("Content-Type: text/plain\r\nX-A: 1\r\nX-A: 2\r\n"), Length: 6}},
		{name: "with a date", method: "GET", taken: true, body: "{}",
			head: RawHead{Status: 201, Fields: []byte("Content-Type: application/json\r\nDate: Mon, 30 Nov 2026 04:00:00 GMT\r\n"), Length: 2, HasDate: true}},
		{name: "error status", method: "GET", taken: true, body: "nope",
			head: RawHead{Status: 503, Fields: []byte("Content-Type: text/plain\r\n"), Length: 4}},
		{name: "empty body", method: "GET", taken: true,
			head: RawHead{Status: 200, Fields: []byte("Content-Type: text/plain\r\n"), Length: 0}},
		{name: "short body closes", method: "GET", taken: true, body: "short",
			head: RawHead{Status: 200, Fields: []byte("Content-Type: text/plain\r\n"), Length: 10}},
		{name: "refused for HEAD", method: "HEAD", taken: false,
			head: RawHead{Status: 200, Fields: []byte("Content-Type: text/plain\r\n"), Length: 6}},
		{name: "refused without a body", method: "GET", taken: false,
			head: RawHead{Status: 204, Fields: []byte("Content-Type: text/plain\r\n"), Length: 0}},
		{name: "refused after a header was set", method: "GET", taken: false, preset: true, body: "x",
			head: RawHead{Status: 200, Fields: []byte("Content-Type: text/plain\r\n"), Length: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			// viaMap answers as the head says through the header map.
			viaMap := func(w http.ResponseWriter) {
				for line := range strings.SplitSeq(strings.TrimSuffix(string(c.head.Fields), "\r\n"), "\r\n") {
					k, v, _ := strings.Cut(line, ": ")
					w.Header().Add(k, v)
				}
				w.Header().Set("Content-Length", fmt.Sprint(c.head.Length))
				w.WriteHeader(c.head.Status)
				io.WriteString(w, c.body)
			}
			var taken atomic.Bool
			loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.preset {
					w.Header().Set("X-Preset", "1")
				}
				rw, ok := w.(RawHeadWriter)
				if !ok {
					t.Error("the loop's ResponseWriter is not a RawHeadWriter")
					return
				}
				if rw.WriteRawHead(c.head) {
					taken.Store(true)
					io.WriteString(w, c.body)
					return
				}
				viaMap(w)
			}), nil)
			ref := startNetHTTP(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if c.preset {
					w.Header().Set("X-Preset", "1")
				}
				viaMap(w)
			}))
			got, want := twoResponses(t, loop.addr, c.method), twoResponses(t, ref, c.method)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("raw head through the loop:\n%s\nthe same through net/http:\n%s", got, want)
			}
			if taken.Load() != c.taken {
				t.Errorf("WriteRawHead took it: %v, want %v", taken.Load(), c.taken)
			}
		})
	}
}

// deadlineConn records the write deadlines set on it.
type deadlineConn struct {
	net.Conn
	set []time.Time
}

func (d *deadlineConn) SetWriteDeadline(t time.Time) error {
	d.set = append(d.set, t)
	return nil
}

// SetWriteDeadline moves the deadline only when the one set last is
// earlier than asked or later by more than its slack; zero clears it.
func TestSetWriteDeadlineMovesLazily(t *testing.T) {
	dc := &deadlineConn{}
	w := &responseWriter{c: &conn{nc: dc}}
	base := time.Now().Add(time.Minute)
	soon := time.Now().Add(2 * time.Second) // slack: an eighth of 2s
	steps := []struct {
		t    time.Time
		move bool
	}{
		{time.Time{}, false}, // none set, none asked
		{base, true},         // first: base plus a second of slack
		{base.Add(300 * time.Millisecond), false}, // within the slack
		{base.Add(time.Second), false},            // at its end
		{base.Add(1100 * time.Millisecond), true}, // past it: later
		{base.Add(-100 * time.Millisecond), true}, // more than the slack before it: earlier
		{soon, true}, // slack about 250ms
		{soon.Add(200 * time.Millisecond), false}, // within it
		{soon.Add(300 * time.Millisecond), true},  // past it
		{time.Time{}, true},                       // cleared
		{time.Time{}, false},
	}
	for i, s := range steps {
		before := len(dc.set)
		if err := w.SetWriteDeadline(s.t); err != nil {
			t.Fatal(err)
		}
		if moved := len(dc.set) > before; moved != s.move {
			t.Fatalf("step %d (%v): moved %v, want %v", i, s.t, moved, s.move)
		}
		if len(dc.set) == 0 {
			continue
		}
		// Moved or not, the deadline in force is what was asked, or up
		// to a second later.
		if got := dc.set[len(dc.set)-1]; got.Before(s.t) || got.After(s.t.Add(time.Second)) || got.IsZero() != s.t.IsZero() {
			t.Fatalf("step %d: deadline %v for %v: want it at most a second later", i, got, s.t)
		}
	}
}
