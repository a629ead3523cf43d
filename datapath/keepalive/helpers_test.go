package keepalive

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// loopServer serves h on 127.0.0.1 the way the sidecar does: every
// connection goes to a Server, which hands what it does not take to a
// net/http server with the same handler.
type loopServer struct {
	addr     string
	s        *Server
	fallback *http.Server
	handoffs atomic.Int32 // connections handed to net/http
}

func startLoop(t *testing.T, h http.Handler, mod func(*Server)) *loopServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ls := &loopServer{addr: ln.Addr().String()}
	q := NewConnQueue(ln.Addr())
	ls.fallback = &http.Server{Handler: h, ReadHeaderTimeout: 5 * time.Second}
	ls.s = &Server{
		Handler:           h,
		HandOff:           func(c net.Conn) { ls.handoffs.Add(1); q.Push(c) },
		IdleTimeout:       time.Minute,
		ReadHeaderTimeout: 5 * time.Second,
	}
	if mod != nil {
		mod(ls.s)
	}
	go func() { _ = ls.fallback.Serve(q) }()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go ls.s.ServeConn(c, nil, nil, nil)
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		q.Close()
		ls.fallback.Close()
		ls.s.Close()
		if !ls.s.Wait(5 * time.Second) {
			t.Error("connections still open 5s after Close")
		}
	})
	return ls
}

// startNetHTTP serves h with net/http alone, the reference.
func startNetHTTP(t *testing.T, h http.Handler) string {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.Listener.Addr().String()
}

// rawConn is a client connection that sends bytes as they are.
type rawConn struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func dial(t *testing.T, addr string) *rawConn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &rawConn{t: t, c: c, br: bufio.NewReader(c)}
}

func (rc *rawConn) send(s string) {
	rc.t.Helper()
	if _, err := io.WriteString(rc.c, s); err != nil {
		rc.t.Fatal(err)
	}
}

// response is what a client saw of one response.
type response struct {
	status   int
	header   http.Header
	body     string
	bodyErr  error
	trailer  http.Header
	close    bool
	chunked  bool
	length   int64
	dates    int // Date fields (their values vary, so only counted)
	readFail error
}

// read reads one response to a request with method.
func (rc *rawConn) read(method string) response {
	rc.t.Helper()
	resp, err := http.ReadResponse(rc.br, &http.Request{Method: method})
	if err != nil {
		return response{readFail: err}
	}
	b, berr := io.ReadAll(resp.Body)
	resp.Body.Close()
	r := response{
		status: resp.StatusCode, header: resp.Header, body: string(b), bodyErr: berr,
		trailer: resp.Trailer, close: resp.Close, length: resp.ContentLength,
		chunked: len(resp.TransferEncoding) > 0 && resp.TransferEncoding[0] == "chunked",
	}
	r.dates = len(resp.Header["Date"])
	delete(r.header, "Date")
	return r
}

// closed reports whether the server closed the connection (reads EOF).
func (rc *rawConn) closed() bool {
	_ = rc.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := rc.br.ReadByte()
	return errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed)
}
