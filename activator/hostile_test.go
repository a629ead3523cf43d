package activator

import (
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/rawhttp"
)

// Hostile input through the gateway to a real sidecar and test app: every
// request gets exactly one response, a clear 4xx for what is malformed,
// ambiguous or too big, the connection closes after it so nothing that
// follows is read as a request, nothing ambiguous reaches an instance, and
// slow heads are cut at ReadHeaderTimeout. Each case runs both on a new
// connection (read by net/http behind the screened listener) and after a
// plain request (the connection is then in the gateway's keep-alive loop,
// which hands it back to net/http, screened, for anything not plain).
func TestHostileInputGateway(t *testing.T) {
	in := startProcInstance(t, "a", 10)
	// ReadHeaderTimeout is short for the slow head's sake, and long
	// enough that no other case's head (200 KiB at most, written at once)
	// meets it on a busy machine.
	const readHeaderTimeout = 2 * time.Second
	pg := startProcGateway(t, 10, func(c *Config) {
		c.ReadHeaderTimeout = readHeaderTimeout
		c.MaxBodyBytes = 1 << 20
	}, in)

	const host = "Host: hello.default.localhost\r\n"
	const plain = "GET /?plain HTTP/1.1\r\n" + host + "\r\n"
	chunked := func(path string) string {
		return "POST " + path + " HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
	}
	type want struct {
		statuses []int // the responses after the lead, in order; 0 = any
		closed   bool
		appSaw   int // work requests the app saw after the lead (-1: any)
	}
	// A head that trickles in, a line every pause, for ten times
	// ReadHeaderTimeout before it ends: the gateway cuts it at the timeout
	// and answers nothing, however slow the machine (a timeout renewed by
	// every read would never cut it, and the head would be answered).
	const pause = 300 * time.Millisecond
	slowHead := []string{"GET / HTTP/1.1\r\n", host}
	for range 10 * readHeaderTimeout / pause {
		slowHead = append(slowHead, "X-A: 1\r\n")
	}
	slowHead = append(slowHead, "\r\n")
	// pastLimit: cases whose client keeps sending after the gateway
	// stopped reading.
	pastLimit := map[string]bool{"chunked body over the limit": true}
	for _, c := range []struct {
		name  string
		parts []string
		want  want
	}{
		{"keep-alive control: a POST then a GET", []string{"POST /echo HTTP/1.1\r\n" + host + "Content-Length: 2\r\n\r\nok" + plain}, want{[]int{200, 200}, false, 2}},
		{"bad chunk size, all at once", []string{chunked("/") + "zz\r\n\r\n" + plain}, want{[]int{400}, true, -1}},
		{"bad chunk size after the app answered", []string{chunked("/?size=110"), "zz\r\n\r\n" + plain}, want{[]int{0}, true, -1}},
		{"bad chunk size mid-echo", []string{chunked("/echo"), "zz\r\n\r\n" + plain}, want{[]int{0}, true, -1}},
		{"chunk size overflow", []string{chunked("/") + "fffffffffffffffffff\r\n" + plain}, want{[]int{400}, true, -1}},
		{"no CRLF after chunk data", []string{"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n" + plain}, want{[]int{0}, true, -1}},

		{"Content-Length with Transfer-Encoding", []string{"POST / HTTP/1.1\r\n" + host + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + plain}, want{[]int{400}, true, 0}},
		{"Transfer-Encoding with Content-Length after a POST", []string{"POST /echo HTTP/1.1\r\n" + host + "Content-Length: 2\r\n\r\nok" +
			"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + plain}, want{[]int{200, 400}, true, 1}},
		{"two different lengths", []string{"POST / HTTP/1.1\r\n" + host + "Content-Length: 1\r\nContent-Length: 2\r\n\r\nab" + plain}, want{[]int{400}, true, 0}},
		{"two equal lengths", []string{"POST / HTTP/1.1\r\n" + host + "Content-Length: 1\r\nContent-Length: 1\r\n\r\na" + plain}, want{[]int{400}, true, 0}},
		{"obs-fold", []string{"GET / HTTP/1.1\r\n" + host + "X-A: 1\r\n folded\r\n\r\n" + plain}, want{[]int{400}, true, 0}},
		{"chunked HTTP/1.0", []string{"POST / HTTP/1.0\r\n" + host + "Transfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc"}, want{[]int{400}, true, 0}},
		{"space before the colon", []string{"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"unsupported coding", []string{"POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: gzip\r\n\r\n"}, want{[]int{501}, true, 0}},
		{"two Host headers", []string{"GET / HTTP/1.1\r\n" + host + "Host: y\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"NUL in a value", []string{"GET / HTTP/1.1\r\n" + host + "X: a\x00b\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"unparsable length", []string{"POST / HTTP/1.1\r\n" + host + "Content-Length: 99999999999999999999\r\n\r\n"}, want{[]int{400}, true, 0}},
		{"oversized head", []string{"GET / HTTP/1.1\r\n" + host + "X-Big: " + strings.Repeat("b", 200<<10) + "\r\n\r\n"}, want{[]int{431}, true, 0}},
		{"declared body over the limit", []string{"POST / HTTP/1.1\r\n" + host + "Content-Length: 2000000\r\n\r\n" + strings.Repeat("x", 1000)}, want{[]int{413}, true, 0}},
		{"chunked body over the limit", []string{"POST /echo HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n100000\r\n" + strings.Repeat("x", 1<<20) + "\r\n100000\r\n" + strings.Repeat("x", 1<<20) + "\r\n0\r\n\r\n"}, want{[]int{0}, true, -1}},
		{"slow head", slowHead, want{nil, true, 0}},
	} {
		for _, lead := range []string{"", plain} {
			name := c.name
			if lead != "" {
				name += ", after a plain request"
			}
			t.Run(name, func(t *testing.T) {
				parts := append([]string(nil), c.parts...)
				parts[0] = lead + parts[0]
				var resps []rawhttp.Response
				var closed bool
				var saw int64
				var reset bool
				// After a plain request its answer is there: what a reset
				// can destroy is the one after it.
				leadAnswers := 0
				if lead != "" {
					leadAnswers = 1
				}
				for attempt := 1; ; attempt++ {
					before := in.appStats(t).Requests
					r := rawhttp.ExchangeDetail(t, pg.addr, parts, pause,
						rawhttp.Expect{Responses: leadAnswers + len(c.want.statuses), Closed: c.want.closed, Quiet: 2 * time.Second})
					resps, closed, saw, reset = r.Responses, r.Closed, in.appStats(t).Requests-before, r.Reset
					// A client that keeps sending past a limit gets a
					// reset when the gateway closes over its unread bytes,
					// and a reset can destroy the answer before the client
					// reads it: TCP's doing, not a missing answer, so try
					// again (an answer that is never sent fails every time).
					if !(pastLimit[c.name] && r.Reset && len(resps) <= leadAnswers && attempt < 3) {
						break
					}
					t.Logf("attempt %d: the connection was reset before the answer was read; again", attempt)
				}
				if lead != "" {
					if len(resps) == 0 || resps[0].Status != 200 {
						t.Fatalf("the plain request first: %+v", resps)
					}
					resps, saw = resps[1:], saw-1
				}
				ok := len(resps) == len(c.want.statuses) && closed == c.want.closed
				for i := 0; ok && i < len(resps); i++ {
					if w := c.want.statuses[i]; w != 0 && resps[i].Status != w {
						ok = false
					}
					if i == len(resps)-1 && c.want.closed && !resps[i].Cut && !resps[i].Close {
						ok = false // the last answer must say it closes
					}
				}
				if c.want.appSaw >= 0 && saw != int64(c.want.appSaw) {
					ok = false
				}
				if !ok {
					t.Fatalf("got %d responses %+v, closed=%v (reset=%v), app saw %d; want statuses %v closed=%v app saw %d",
						len(resps), resps, closed, reset, saw, c.want.statuses, c.want.closed, c.want.appSaw)
				}
			})
		}
	}
}
