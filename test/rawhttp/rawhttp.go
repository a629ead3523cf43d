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

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// Response is one response read off a raw connection.
type Response struct {
	Status int
	Close  bool // it said Connection: close
	Body   string
	Cut    bool // the response ended before its framing said
}

// Expect is what a test expects of an exchange, which tells the exchange
// when it has heard everything: it reads until the server closes the
// connection, or, when Closed is false, until Responses complete responses
// have come and then Quiet passes without a byte (long enough to hear a
// response too many). How long the server takes is never the end: a read
// that waits on nothing it expects ends only at HangBound.
type Expect struct {
	Responses int
	Closed    bool
	Quiet     time.Duration
}

// HangBound bounds a whole exchange (scaled by testbin.Bound): it ends one
// whose server neither answers as expected nor closes.
const HangBound = 20 * time.Second

// Exchange writes each part of a request stream to addr (pausing between
// parts), then reads until want says the exchange is over, and returns
// every response on the connection and whether the server closed it. It
// reads while it writes, so a server that answers before it has read
// everything is heard.
func Exchange(t testing.TB, addr string, parts []string, pause time.Duration, want Expect) ([]Response, bool) {
	t.Helper()
	r := ExchangeDetail(t, addr, parts, pause, want)
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
func ExchangeDetail(t testing.TB, addr string, parts []string, pause time.Duration, want Expect) Result {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	hang := time.Now().Add(testbin.Bound(HangBound))
	got := make(chan []byte, 1)
	closed := make(chan bool, 1)
	reset := make(chan bool, 1)
	go func() {
		var all []byte
		buf := make([]byte, 32<<10)
		for {
			deadline := hang
			if !want.Closed && complete(all) >= want.Responses {
				deadline = time.Now().Add(want.Quiet)
			}
			c.SetReadDeadline(deadline)
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

// complete counts the responses in all that are whole.
func complete(all []byte) int {
	n := 0
	for _, r := range Parse(all) {
		if !r.Cut {
			n++
		}
	}
	return n
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
