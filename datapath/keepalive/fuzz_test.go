package keepalive

import (
	"bufio"
	"bytes"
	"context"
	"net/http"
	"net/textproto"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http/httpguts"
)

// netHTTPRead reads a request head the way net/http's server does: its
// ReadRequest, then the checks the server adds (the Host rules and header
// validity of server.go's readRequest).
func netHTTPRead(head []byte) (*http.Request, bool) {
	req, err := http.ReadRequest(bufio.NewReader(bytes.NewReader(head)))
	if err != nil {
		return nil, false
	}
	// ReadRequest removed Host from the header; count the lines again.
	tp := textproto.NewReader(bufio.NewReader(bytes.NewReader(head)))
	if _, err := tp.ReadLine(); err != nil {
		return nil, false
	}
	raw, err := tp.ReadMIMEHeader()
	if err != nil {
		return nil, false
	}
	hosts, haveHost := raw["Host"]
	if req.ProtoAtLeast(1, 1) && (!haveHost || len(hosts) == 0) && req.Method != http.MethodConnect {
		return nil, false
	}
	if len(hosts) > 1 || len(hosts) == 1 && !httpguts.ValidHostHeader(hosts[0]) {
		return nil, false
	}
	for k, vv := range raw {
		if !httpguts.ValidHeaderFieldName(k) {
			return nil, false
		}
		for _, v := range vv {
			if !httpguts.ValidHeaderFieldValue(v) {
				return nil, false
			}
		}
	}
	return req, true
}

// loopHead is what the loop would parse of in: the head readHead finds
// (the first CRLFCRLF, none of the bare-LF ends before it), or nil.
func loopHead(in []byte) []byte {
	i := bytes.Index(in, crlfcrlf)
	if i < 0 || i+4 > bufferSize {
		return nil
	}
	if bytes.Contains(in[:i+4], lflf) || bytes.Contains(in[:i+4], lfcrlf) {
		return nil
	}
	return in[:i+4]
}

// FuzzParseRequest feeds the loop's parser and net/http's the same bytes:
// every request the loop takes, net/http accepts and parses the same way
// (method, target, URL, protocol, Host, headers, body framing, close);
// so every request net/http refuses is left to net/http, which refuses it
// on the same connection as it always would.
func FuzzParseRequest(f *testing.F) {
	for _, seed := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /p/a%20b?x=1&y=%2F HTTP/1.1\r\nHost: a.example:8080\r\nUser-Agent: t\r\n\r\n",
		"HEAD /x HTTP/1.1\r\nHost: a\r\nX-Dup: 1\r\nx-dup: 2\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nConnection: close, X-Foo\r\nPragma: no-cache\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nX:   padded \t \r\nX-Empty:\r\n\r\n",
		"GET /a#frag HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
		"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc",
		"GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  folded\r\n\r\n",
		"GET http://h/x HTTP/1.1\r\nHost: b\r\n\r\n",
		"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\nX-L: caf\xe9\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n",
		"GET / HTTP/1.1\r\nhost: a\r\nTransfer-Encoding: chunked\r\n\r\n",
	} {
		f.Add([]byte(seed))
	}
	c := &conn{s: &Server{}, remote: "192.0.2.1:1234"}
	c.rctx = newRequestContext(context.Background(), c)
	c.req = (&http.Request{Header: make(http.Header, 8)}).WithContext(c.rctx)
	f.Fuzz(func(t *testing.T, in []byte) {
		head := loopHead(in)
		if head == nil {
			return
		}
		c.waitedAt = time.Now()
		taken := c.parseRequest(head)
		want, accepted := netHTTPRead(head)
		if !taken {
			return // handed to net/http, which reads the same bytes
		}
		if !accepted {
			t.Fatalf("the loop takes %q, net/http refuses it", head)
		}
		got := c.req
		if got.Method != want.Method || got.RequestURI != want.RequestURI || *got.URL != *want.URL ||
			got.Proto != want.Proto || got.ProtoMajor != want.ProtoMajor || got.ProtoMinor != want.ProtoMinor ||
			got.Host != want.Host || got.Close != want.Close || got.ContentLength != want.ContentLength ||
			len(got.TransferEncoding) != len(want.TransferEncoding) {
			t.Fatalf("%q:\nloop:     %s %q %#v %s host=%q close=%v length=%d te=%v\nnet/http: %s %q %#v %s host=%q close=%v length=%d te=%v",
				head, got.Method, got.RequestURI, *got.URL, got.Proto, got.Host, got.Close, got.ContentLength, got.TransferEncoding,
				want.Method, want.RequestURI, *want.URL, want.Proto, want.Host, want.Close, want.ContentLength, want.TransferEncoding)
		}
		if !reflect.DeepEqual(map[string][]string(got.Header), map[string][]string(want.Header)) {
			t.Fatalf("%q: headers\nloop:     %q\nnet/http: %q", head, got.Header, want.Header)
		}
		if want.Body != http.NoBody && want.Body != nil {
			if n, _ := want.Body.Read(make([]byte, 1)); n > 0 {
				t.Fatalf("%q: net/http sees a body, the loop none", head)
			}
		}
	})
}

// FuzzScreenStream sends the same byte stream to net/http with and without
// the screen in front: without a refusal the handler sees exactly the same
// requests (the screen is transparent, its framing is net/http's); with
// one, it sees a prefix of them and the stream ends in one 400.
func FuzzScreenStream(f *testing.F) {
	get := "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
	for _, seed := range []string{
		get + get,
		"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello" + get,
		"POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x\r\nhello\r\n0\r\nT: 1\r\n\r\n\r\n" + get,
		"POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get,
		"GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n 2\r\n\r\n" + get,
		"POST /a HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\nz" + get,
		"GET / HTTP/1.1\nHost: a\n\n" + get,
		"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n" + get,
	} {
		f.Add([]byte(seed))
	}
	plain, screened := startStreamServer(f, false), startStreamServer(f, true)
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) > 8<<10 {
			return
		}
		plainOut := plain.send(t, string(in))
		wantCalls := plain.rec.take()
		screened.mu.Lock()
		screened.conns = nil
		screened.mu.Unlock()
		out := screened.send(t, string(in))
		calls := screened.rec.take()
		if !screened.refused() {
			if !reflect.DeepEqual(calls, wantCalls) {
				t.Fatalf("%q:\nbehind the screen %+v\nwithout %+v", in, calls, wantCalls)
			}
			if strip(out) != strip(plainOut) {
				t.Fatalf("%q: answers differ:\n%q\n%q", in, out, plainOut)
			}
			return
		}
		if len(calls) > len(wantCalls) || len(calls) > 0 && !reflect.DeepEqual(calls, wantCalls[:len(calls)]) {
			t.Fatalf("%q:\nbehind the screen %+v\nnot a prefix of %+v", in, calls, wantCalls)
		}
		// The refused head was one net/http would have read (or the
		// connection ended before it: HTTP/1.0, Connection: close).
		if len(calls) < len(wantCalls) && !strings.HasSuffix(out, "400 Bad Request") {
			t.Fatalf("%q: a refusal that does not end in a 400:\n%q", in, out)
		}
	})
}
