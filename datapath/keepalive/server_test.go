package keepalive

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// Requests written back to back are answered in order on one connection.
func TestPipelinedRequests(t *testing.T) {
	var n atomic.Int32
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, r.URL.Path)
		n.Add(1)
	}), nil)
	rc := dial(t, loop.addr)
	rc.send("GET /1 HTTP/1.1\r\nHost: a\r\n\r\nGET /2 HTTP/1.1\r\nHost: a\r\n\r\nPOST /3 HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nxGET /4 HTTP/1.1\r\nHost: a\r\n\r\n")
	for _, want := range []string{"/1", "/2", "/3", "/4"} {
		method := "GET"
		if want == "/3" {
			method = "POST"
		}
		if r := rc.read(method); r.body != want {
			t.Fatalf("got %q (%v), want %q", r.body, r.readFail, want)
		}
	}
	if h := loop.handoffs.Load(); h != 1 {
		t.Errorf("%d hand-offs, want 1 (at the POST)", h)
	}
}

// A client that leaves is noticed by a handler polling Err (within about
// a second: it peeks every clientCheckInterval) and by one waiting on Done
// (at once: its watcher waits on the socket); a client that stays is not
// taken for gone. How soon is logged: on a busy machine it is the
// machine's.
func TestClientGone(t *testing.T) {
	for _, how := range []string{"Err", "Done"} {
		t.Run(how, func(t *testing.T) {
			gone := make(chan time.Duration, 1)
			started := make(chan struct{}, 1)
			loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				start := time.Now()
				started <- struct{}{}
				ctx := r.Context()
				if r.URL.Path == "/stay" {
					// The client waits for this answer: not gone.
					for time.Since(start) < 1500*time.Millisecond {
						if ctx.Err() != nil {
							t.Error("a waiting client was taken for gone")
						}
						time.Sleep(50 * time.Millisecond)
					}
					io.WriteString(w, "stayed")
					return
				}
				bound := testbin.Bound(20 * time.Second)
				deadline := time.After(bound)
				for {
					if how == "Done" {
						select {
						case <-ctx.Done():
						case <-deadline:
						}
					} else {
						select {
						case <-time.After(100 * time.Millisecond):
						case <-deadline:
						}
					}
					if ctx.Err() != nil || time.Since(start) > bound {
						break
					}
				}
				if !errors.Is(ctx.Err(), context.Canceled) {
					t.Errorf("context error %v, want canceled", ctx.Err())
				}
				gone <- time.Since(start)
			}), nil)
			rc := dial(t, loop.addr)
			rc.send("GET /stay HTTP/1.1\r\nHost: a\r\n\r\n")
			if r := rc.read("GET"); r.body != "stayed" {
				t.Fatalf("got %q", r.body)
			}
			<-started
			rc.send("GET /leave HTTP/1.1\r\nHost: a\r\n\r\n")
			<-started
			left := time.Now()
			rc.c.Close()
			select {
			case <-gone:
				t.Logf("noticed %s after the client left", time.Since(left).Round(time.Millisecond))
			case <-time.After(testbin.Bound(30 * time.Second)):
				t.Fatal("the handler never noticed the client leave")
			}
		})
	}
}

// A request's context is canceled when the next request begins if the
// handler waited on it; the next request gets a fresh one.
func TestContextPerRequest(t *testing.T) {
	ctxs := make(chan context.Context, 2)
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if r.URL.Path == "/wait" {
			// Derived contexts hook in through AfterFunc.
			d, cancel := context.WithTimeout(ctx, time.Millisecond)
			<-d.Done()
			cancel()
		}
		if ctx.Err() != nil {
			t.Errorf("%s: context already done: %v", r.URL.Path, ctx.Err())
		}
		ctxs <- ctx
		io.WriteString(w, "ok")
	}), nil)
	rc := dial(t, loop.addr)
	rc.send("GET /wait HTTP/1.1\r\nHost: a\r\n\r\n")
	rc.read("GET")
	first := <-ctxs
	rc.send("GET /plain HTTP/1.1\r\nHost: a\r\n\r\n")
	rc.read("GET")
	second := <-ctxs
	if first == second {
		t.Fatal("a context that was waited on was reused")
	}
	select {
	case <-first.Done():
	case <-time.After(time.Second):
		t.Fatal("the first request's context was not canceled after it ended")
	}
	if second.Err() != nil {
		t.Fatalf("second context: %v", second.Err())
	}
}

// A handler that waited on its context (a request that waited in the
// activator's queue) and then polls Err (the upstream read that wakes every
// clientCheckInterval) gets its answer to a client that waits for it. Err
// once peeked at the socket then, and the peek waited for the read lock
// the watcher holds until the client sends or leaves: the request hung
// until the client gave up (TestComponentColdBurst lost 2 of 200 requests
// that way on a busy machine, where the app's answer took over a second).
func TestErrAfterDone(t *testing.T) {
	errs := make(chan error, 1)
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		d, cancel := context.WithTimeout(ctx, time.Millisecond) // AfterFunc: the watcher starts
		<-d.Done()
		cancel()
		time.Sleep(clientCheckInterval + 100*time.Millisecond) // the next Err looks at the client
		go func() { errs <- ctx.Err() }()
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("Err = %v for a client that waits", err)
			}
		case <-time.After(testbin.Bound(10 * time.Second)):
			t.Error("Err blocked while the client waited for its answer")
		}
		io.WriteString(w, "ok")
	}), nil)
	rc := dial(t, loop.addr)
	rc.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if r := rc.read("GET"); r.body != "ok" {
		t.Fatalf("got %q (%v)", r.body, r.readFail)
	}
}

// Shutdown closes an idle connection at once; a busy one finishes its
// response, which says Connection: close, and then closes; Wait returns
// when both are gone.
func TestShutdown(t *testing.T) {
	release := make(chan struct{})
	inHandler := make(chan struct{})
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/slow" {
			close(inHandler)
			<-release
		}
		io.WriteString(w, "done")
	}), nil)
	idle, busy := dial(t, loop.addr), dial(t, loop.addr)
	idle.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	idle.read("GET")
	busy.send("GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
	<-inHandler

	loop.s.Shutdown()
	if !idle.closed() {
		t.Error("idle connection still open after Shutdown")
	}
	if loop.s.Wait(100 * time.Millisecond) {
		t.Fatal("Wait returned with a request in flight")
	}
	close(release)
	r := busy.read("GET")
	if r.body != "done" || !r.close {
		t.Errorf("busy connection: body %q close %v, want done and Connection: close", r.body, r.close)
	}
	if !busy.closed() {
		t.Error("busy connection still open after its response")
	}
	if !loop.s.Wait(5 * time.Second) {
		t.Error("Wait: connections still open")
	}
}

// An idle connection closes after IdleTimeout; a head that does not
// complete within ReadHeaderTimeout closes its connection.
func TestTimeouts(t *testing.T) {
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }),
		func(s *Server) { s.IdleTimeout, s.ReadHeaderTimeout = 200*time.Millisecond, 200*time.Millisecond })
	idle := dial(t, loop.addr)
	idle.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	idle.read("GET")
	start := time.Now()
	if !idle.closed() {
		t.Error("idle connection not closed")
	} else if d := time.Since(start); d > time.Second {
		t.Errorf("idle connection closed after %s, want about 200ms", d)
	}

	slow := dial(t, loop.addr)
	slow.send("GET / HTTP/1.1\r\nHost: a\r\n")
	start = time.Now()
	if !slow.closed() {
		t.Error("connection with an incomplete head not closed")
	} else if d := time.Since(start); d > time.Second {
		t.Errorf("incomplete head closed after %s, want about 200ms", d)
	}
}

// A panicking handler cuts its connection; the server goes on.
func TestHandlerPanic(t *testing.T) {
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/abort":
			w.Header().Set("Content-Length", "10")
			io.WriteString(w, "part")
			w.(http.Flusher).Flush()
			panic(http.ErrAbortHandler)
		case "/bug":
			panic("bug")
		}
		io.WriteString(w, "ok")
	}), nil)
	for _, path := range []string{"/abort", "/bug"} {
		rc := dial(t, loop.addr)
		rc.send("GET " + path + " HTTP/1.1\r\nHost: a\r\n\r\n")
		r := rc.read("GET")
		if r.readFail == nil && r.bodyErr == nil {
			t.Errorf("%s: got a complete response %d %q", path, r.status, r.body)
		}
		if !rc.closed() {
			t.Errorf("%s: connection left open", path)
		}
	}
	rc := dial(t, loop.addr)
	rc.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if r := rc.read("GET"); r.body != "ok" {
		t.Errorf("after the panics: %q", r.body)
	}
}

// A write to a client that left fails, and the connection closes.
func TestWriteToDepartedClient(t *testing.T) {
	wrote := make(chan error, 1)
	proceed := make(chan struct{})
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		<-proceed
		var err error
		for i := 0; i < 1000 && err == nil; i++ {
			_, err = io.WriteString(w, strings.Repeat("x", 32<<10))
			w.(http.Flusher).Flush()
		}
		wrote <- err
	}), nil)
	rc := dial(t, loop.addr)
	rc.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	time.Sleep(50 * time.Millisecond)
	rc.c.Close()
	close(proceed)
	select {
	case err := <-wrote:
		if err == nil {
			t.Error("32 MB written to a closed connection without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("handler stuck writing")
	}
	if !loop.s.Wait(5 * time.Second) {
		t.Error("connection not closed")
	}
}

func TestEligible(t *testing.T) {
	mk := func(mod func(*http.Request)) *http.Request {
		r, _ := http.NewRequest("GET", "http://a/", nil)
		r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
		if mod != nil {
			mod(r)
		}
		return r
	}
	cases := []struct {
		name string
		r    *http.Request
		want bool
	}{
		{"plain GET", mk(nil), Supported},
		{"HTTP/1.0", mk(func(r *http.Request) { r.ProtoMinor = 0 }), false},
		{"HTTP/2", mk(func(r *http.Request) { r.ProtoMajor = 2 }), false},
		{"close", mk(func(r *http.Request) { r.Close = true }), false},
		{"body", mk(func(r *http.Request) { r.ContentLength = 3; r.Body = io.NopCloser(strings.NewReader("abc")) }), false},
		{"chunked", mk(func(r *http.Request) { r.ContentLength = -1; r.TransferEncoding = []string{"chunked"} }), false},
		{"upgrade", mk(func(r *http.Request) { r.Header.Set("Upgrade", "websocket") }), false},
		{"expect", mk(func(r *http.Request) { r.Header.Set("Expect", "100-continue") }), false},
		{"CONNECT", mk(func(r *http.Request) { r.Method = http.MethodConnect }), false},
	}
	for _, c := range cases {
		if got := Eligible(c.r); got != c.want {
			t.Errorf("%s: Eligible = %v, want %v", c.name, got, c.want)
		}
	}
}

// YieldFirst is asked once per response the loop writes, after its
// handler returned and before the client has it; not for a request that
// panicked or was handed off. Yielding leaves the response as it was.
func TestYieldFirst(t *testing.T) {
	var returned atomic.Bool // the handler of the request being answered
	var asked, askedEarly atomic.Int32
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		returned.Store(false)
		if r.URL.Path == "/bug" {
			panic("bug")
		}
		io.WriteString(w, "ok "+r.URL.Path)
		returned.Store(true)
	}), func(s *Server) {
		s.YieldFirst = func() bool {
			if !returned.Load() {
				askedEarly.Add(1)
			}
			asked.Add(1)
			return true
		}
	})

	rc := dial(t, loop.addr)
	for i, path := range []string{"/one", "/two"} {
		rc.send("GET " + path + " HTTP/1.1\r\nHost: a\r\n\r\n")
		if r := rc.read("GET"); r.status != 200 || r.body != "ok "+path || r.close {
			t.Fatalf("%s: %d %q close=%v", path, r.status, r.body, r.close)
		}
		if n := asked.Load(); n != int32(i+1) {
			t.Errorf("after %s: asked %d times, want %d", path, n, i+1)
		}
	}
	bug := dial(t, loop.addr)
	bug.send("GET /bug HTTP/1.1\r\nHost: a\r\n\r\n")
	if !bug.closed() {
		t.Error("a panicked request left its connection open")
	}
	post := dial(t, loop.addr)
	post.send("POST /post HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nhi")
	if r := post.read("POST"); r.body != "ok /post" {
		t.Fatalf("handed off: %q", r.body)
	}
	if loop.handoffs.Load() != 1 {
		t.Errorf("%d connections handed off, want the POST's", loop.handoffs.Load())
	}
	if n := asked.Load(); n != 2 {
		t.Errorf("asked %d times in all, want 2 (not for the panicked or the handed-off request)", n)
	}
	if n := askedEarly.Load(); n != 0 {
		t.Errorf("asked %d times before the handler returned", n)
	}
}
