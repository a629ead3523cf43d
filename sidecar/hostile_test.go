package sidecar_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/rawhttp"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
)

// Hostile input straight to the sidecar (no gateway in front), a real test
// app behind it: every request gets exactly one response, a clear 4xx for
// what is malformed or ambiguous, the connection closes after it so that
// nothing that follows is read as a request, and nothing ambiguous reaches
// the app. Plain requests around them show keep-alive still works.
func TestHostileInputSidecar(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)
	addr := strings.TrimPrefix(r.url, "http://")

	const next = "GET /next HTTP/1.1\r\nHost: x\r\n\r\n"
	chunkedPost := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
	}
	huge := "GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + strings.Repeat("b", 2<<20) + "\r\n\r\n"
	type want struct {
		statuses []int // the responses, in order; 0 = any status (one response)
		closed   bool  // the server closes the connection after them
		appSaw   int   // work requests the app saw (-1: do not check)
	}
	for _, c := range []struct {
		name  string
		parts []string
		want  want
	}{
		{"keep-alive control: a POST then a GET", []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok" + next}, want{[]int{200, 200}, false, 2}},
		// The desync the issue measured: one answer, then the
		// connection closes; the bytes after the broken chunk are never a
		// request.
		{"bad chunk size, all at once", []string{chunkedPost("/") + "zz\r\n\r\n" + next}, want{[]int{400}, true, -1}},
		{"bad chunk size to an echo, all at once", []string{chunkedPost("/echo") + "zz\r\n\r\n" + next}, want{[]int{0}, true, -1}},
		{"bad chunk size after the app answered", []string{chunkedPost("/?size=110"), "zz\r\n\r\n" + next}, want{[]int{0}, true, -1}},
		{"bad chunk size mid-echo", []string{chunkedPost("/echo"), "zz\r\n\r\n" + next}, want{[]int{0}, true, -1}},
		{"chunk size overflow", []string{chunkedPost("/") + "fffffffffffffffffff\r\n" + next}, want{[]int{400}, true, -1}},
		{"no CRLF after chunk data", []string{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n" + next}, want{[]int{0}, true, -1}},
		{"bare LF in chunk line", []string{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n" + next}, want{[]int{0}, true, -1}},
		// Full duplex: the echo answers while the client still owes 7
		// bytes; the answer says it closes the connection.
		{"body shorter than its length", []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"}, want{[]int{200}, false, -1}},

		// Smuggling attempts: refused before the app sees anything.
		{"Content-Length with Transfer-Encoding", []string{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next}, want{[]int{400}, true, 0}},
		{"Content-Length with Transfer-Encoding after a plain request", []string{next + "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + next}, want{[]int{200, 400}, true, 1}},
		{"smuggled after a POST on net/http's side", []string{"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok" + "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next}, want{[]int{200, 400}, true, 1}},
		{"two different lengths", []string{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab" + next}, want{[]int{400}, true, 0}},
		{"two equal lengths", []string{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\na" + next}, want{[]int{400}, true, 0}},
		{"obs-fold", []string{"GET / HTTP/1.1\r\nHost: x\r\nX-A: 1\r\n folded\r\n\r\n" + next}, want{[]int{400}, true, 0}},
		{"chunked HTTP/1.0", []string{"POST / HTTP/1.0\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc"}, want{[]int{400}, true, 0}},
		{"space before the colon", []string{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding : chunked\r\n\r\n0\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"unsupported coding", []string{"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"}, want{[]int{501}, true, 0}},
		{"two Host headers", []string{"GET / HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"NUL in a value", []string{"GET / HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"unparsable length", []string{"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"oversized head", []string{huge}, want{[]int{431}, true, 0}},
	} {
		t.Run(c.name, func(t *testing.T) {
			before := a.stats(t).Requests
			resps, closed := rawhttp.Exchange(t, addr, c.parts, 300*time.Millisecond,
				rawhttp.Expect{Responses: len(c.want.statuses), Closed: c.want.closed, Quiet: time.Second})
			saw := a.stats(t).Requests - before
			ok := len(resps) == len(c.want.statuses) && closed == c.want.closed
			for i := 0; ok && i < len(resps); i++ {
				if w := c.want.statuses[i]; w != 0 && resps[i].Status != w {
					ok = false
				}
				if i == len(resps)-1 && !resps[i].Cut && !resps[i].Close && (c.want.closed || i > 0 && c.want.statuses[i] >= 400) {
					ok = false // the last answer must say it closes
				}
			}
			if c.want.appSaw >= 0 && saw != int64(c.want.appSaw) {
				ok = false
			}
			if !ok {
				t.Fatalf("got %d responses %+v, closed=%v, app saw %d; want statuses %v closed=%v app saw %d",
					len(resps), resps, closed, saw, c.want.statuses, c.want.closed, c.want.appSaw)
			}
		})
	}
}
