package h1

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"testing"

	"golang.org/x/net/http/httpguts"
)

func TestScreenHead(t *testing.T) {
	for _, c := range []struct {
		head string
		want Head
		err  error
	}{
		{"GET / HTTP/1.1\r\nHost: a\r\n", Head{}, nil},
		{"GET / HTTP/1.1\nHost: a\n", Head{}, nil},
		{"POST / HTTP/1.1\r\nHost: a\r\ncontent-length:  12 \r\n", Head{Framing: BodyLength, Length: 12, Post: true}, nil},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n", Head{Post: true}, nil},
		{"PUT / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: Chunked\r\n", Head{Framing: BodyChunked}, nil},
		{"GET /ws HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n", Head{Upgrade: true}, nil},
		{"POST / HTTP/1.0\r\nContent-Length: 3\r\n", Head{Framing: BodyLength, Length: 3, Post: true}, nil},

		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n", Head{}, ErrLengthAndChunked},
		{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n", Head{}, ErrLengthAndChunked},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n", Head{}, ErrLengths},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n", Head{}, ErrLengths},
		{"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n", Head{}, ErrFolded},
		{"GET / HTTP/1.1\r\n\tHost: a\r\n", Head{}, ErrFolded},
		{"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n", Head{}, ErrChunked10},

		// net/http refuses these itself (400 or 501) and closes.
		{"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n", Head{Framing: BodyUnknown}, nil},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +3\r\n", Head{Framing: BodyUnknown}, nil},
		{"POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 3\r\n", Head{Framing: BodyUnknown}, nil},
		{"GARBAGE\r\n", Head{Framing: BodyUnknown}, nil},
		// Not HTTP/1 requests after this head.
		{"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n", Head{Framing: BodyUnknown}, nil},
		{"PRI * HTTP/2.0\r\n", Head{Framing: BodyUnknown}, nil},
	} {
		got, err := ScreenHead([]byte(c.head))
		if !errors.Is(err, c.err) || err == nil && got != c.want {
			t.Errorf("%q: %+v %v, want %+v %v", c.head, got, err, c.want, c.err)
		}
	}
}

// FuzzScreenHead checks ScreenHead against net/http's reading of the same
// head: a head it lets through with a framing net/http accepts it with,
// and net/http accepts what it lets through with that framing; a head it
// refuses, net/http either refuses or frames by a rule a front proxy may
// not share.
func FuzzScreenHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 12\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n",
		"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n",
		"GET / HTTP/1.9\nHost: a\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, head []byte) {
		// The stream screen hands over lines up to the first empty one.
		if i := bytes.Index(head, []byte("\n\n")); i >= 0 {
			head = head[:i+1]
		}
		if i := bytes.Index(head, []byte("\n\r\n")); i >= 0 {
			head = head[:i+1]
		}
		if len(head) == 0 || head[len(head)-1] != '\n' || head[0] == '\n' || head[0] == '\r' && len(head) > 1 && head[1] == '\n' {
			return
		}
		got, err := ScreenHead(head)
		req, rerr := http.ReadRequest(bufio.NewReader(bytes.NewReader(append(bytes.Clone(head), "\r\n"...))))
		switch {
		case err != nil:
			return // refused: stricter than net/http by design
		case got.Framing == BodyUnknown:
			if rerr == nil && req.Method != http.MethodConnect && req.ProtoMajor == 1 && serverTakesHeader(req.Header) {
				t.Fatalf("%q: the screen gives up on a head net/http takes (%s %s)", head, req.Method, req.Proto)
			}
			return
		case rerr != nil:
			return // net/http refuses it and closes: no framing to agree on
		}
		var want Head
		switch {
		case len(req.TransferEncoding) > 0:
			want.Framing = BodyChunked
		case req.ContentLength > 0:
			want.Framing, want.Length = BodyLength, req.ContentLength
		}
		if got.Framing != want.Framing || got.Length != want.Length {
			t.Fatalf("%q: the screen frames %+v, net/http %+v (length %d, te %v)", head, got, want, req.ContentLength, req.TransferEncoding)
		}
	})
}

// serverTakesHeader applies the header checks net/http's server adds to
// ReadRequest's (server.go's readRequest).
func serverTakesHeader(h http.Header) bool {
	for k, vv := range h {
		if !httpguts.ValidHeaderFieldName(k) {
			return false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return false
			}
		}
	}
	return true
}
