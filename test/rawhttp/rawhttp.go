// Package rawhttp is a test client that speaks HTTP/1.1 as raw bytes: it
// writes a request stream exactly as given (malformed, smuggled, slow) and
// reads back every response the server sends on that one connection, so a
// test can count them. The hostile-input tables of the gateway, the sidecar
// and the admin API share it.
package rawhttp

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"
	"testing"
	"time"
)

// Response is one response read off a raw connection.
type Response struct {
	Status int
	Close  bool // it said Connection: close
	Body   string
	Cut    bool // the response ended before its framing said
}

// Exchange writes each part of a request stream to addr (pausing between
// parts), then reads until the server closes the connection or it stays
// quiet for quiet, and returns every response on it and whether the server
// closed it. It reads while it writes, so a server that answers before it
// has read everything is heard.
func Exchange(t testing.TB, addr string, parts []string, pause, quiet time.Duration) ([]Response, bool) {
	t.Helper()
	r := ExchangeDetail(t, addr, parts, pause, quiet)
	return r.Responses, r.Closed
}

// Result is what one exchange saw.
type Result struct {
	Responses []Response
	// Closed: the server closed the connection (it did not just go
	// quiet). Reset: it closed with a reset, which can destroy an answer
	// the client had not read yet (a server closing with bytes of the
	// request unread sends one).
	Closed, Reset bool
}

// ExchangeDetail is Exchange, saying also whether the close was a reset.
func ExchangeDetail(t testing.TB, addr string, parts []string, pause, quiet time.Duration) Result {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make(chan []byte, 1)
	closed := make(chan bool, 1)
	reset := make(chan bool, 1)
	go func() {
		var all []byte
		buf := make([]byte, 32<<10)
		for {
			c.SetReadDeadline(time.Now().Add(quiet))
			n, err := c.Read(buf)
			all = append(all, buf[:n]...)
			if err != nil {
				var ne net.Error
				closed <- !(errors.As(err, &ne) && ne.Timeout())
				reset <- errors.Is(err, syscall.ECONNRESET)
				got <- all
				return
			}
		}
	}()
	for i, p := range parts {
		if i > 0 {
			time.Sleep(pause)
		}
		if _, err := c.Write([]byte(p)); err != nil {
			break // the server closed: what it answered is read below
		}
	}
	wasClosed, wasReset, all := <-closed, <-reset, <-got
	return Result{Responses: Parse(all), Closed: wasClosed, Reset: wasReset}
}

// Parse splits bytes read off a connection into responses; one whose
// framing the bytes do not complete is the last, marked Cut.
func Parse(all []byte) []Response {
	var out []Response
	br := bufio.NewReader(bytes.NewReader(all))
	for {
		if _, err := br.Peek(1); err != nil {
			break
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			out = append(out, Response{Cut: true, Body: err.Error()})
			break
		}
		b, err := io.ReadAll(resp.Body)
		out = append(out, Response{Status: resp.StatusCode, Close: resp.Close, Body: string(b), Cut: err != nil})
	}
	return out
}
