package keepalive

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

// seenRequest is what a handler sees of a request.
type seenRequest struct {
	Method, URL, Path, RawPath, RawQuery string
	ForceQuery                           bool
	Proto                                string
	Host, RequestURI                     string
	Header                               http.Header
	ContentLength                        int64
	Close                                bool
	Body                                 string
	RemoteAddrSet                        bool
}

func recordRequest(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	json.NewEncoder(w).Encode(seenRequest{
		Method: r.Method, URL: r.URL.String(), Path: r.URL.Path, RawPath: r.URL.RawPath, RawQuery: r.URL.RawQuery,
		ForceQuery: r.URL.ForceQuery, Proto: r.Proto, Host: r.Host, RequestURI: r.RequestURI, Header: r.Header,
		ContentLength: r.ContentLength, Close: r.Close, Body: string(b), RemoteAddrSet: r.RemoteAddr != "",
	})
}

// Every request head reaches the handler exactly as net/http would deliver
// it: parsed by the loop when it is a plain request, handed to net/http
// otherwise (bytes intact: the same answer, 400s included). A second
// request on the same connection checks that the connection goes on
// properly after either.
func TestRequestsAsNetHTTPSeesThem(t *testing.T) {
	bigHeader := "X-Big: " + strings.Repeat("b", 5000) + "\r\n"
	cases := []struct {
		name, head string
		taken      bool
	}{
		{"minimal", "GET / HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"escaped path and query", "GET /p/a%20b/%2F?x=1&y=%2F HTTP/1.1\r\nHost: a.example:8080\r\nUser-Agent: t\r\nAccept: */*\r\n\r\n", true},
		{"repeated and lowercase keys", "HEAD /x HTTP/1.1\r\nHost: a\r\nX-Dup: 1\r\nX-Dup: 2\r\nx-lower: v\r\nx-dup: 3\r\n\r\n", true},
		{"empty query", "GET /q? HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"sub-delims in path", "DELETE /a;b=c/@:!$&'()*+,=~ HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"zero length", "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", true},
		{"pragma", "GET / HTTP/1.1\r\nHost: a\r\nPragma: no-cache\r\n\r\n", true},
		{"connection close", "GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", true},
		{"padded value", "GET / HTTP/1.1\r\nHost: a\r\nX-Space:   padded value \t \r\nX-Empty:\r\n\r\n", true},
		{"path needing raw form", "GET /a|b%7C HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"connection tokens", "OPTIONS /x HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, X-Foo\r\nX-Foo: 1\r\n\r\n", true},
		{"two question marks", "GET /a?b?c HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"non-ASCII path", "GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"IPv6 host", "GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n", true},
		{"obs-text value", "GET / HTTP/1.1\r\nHost: a\r\nX-Latin: caf\xe9\r\n\r\n", true},
		{"fragment in target", "GET /a#frag HTTP/1.1\r\nHost: a\r\n\r\n", true},
		{"custom method", "PURGE /a HTTP/1.1\r\nHost: a\r\n\r\n", true},

		{"body", "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc", false},
		{"chunked body", "POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", false},
		{"HTTP/1.0", "GET / HTTP/1.0\r\nHost: a\r\nConnection: keep-alive\r\n\r\n", false},
		{"no host", "GET / HTTP/1.1\r\n\r\n", false},
		{"two hosts", "GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", false},
		{"bad host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", false},
		{"folded line", "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n  folded\r\n\r\n", false},
		{"space in key", "GET / HTTP/1.1\r\nHost: a\r\nBad Key: x\r\n\r\n", false},
		{"space before colon", "GET / HTTP/1.1\r\nHost: a\r\nX-A : x\r\n\r\n", false},
		{"control byte in value", "GET / HTTP/1.1\r\nHost: a\r\nX: a\x01b\r\n\r\n", false},
		{"absolute form", "GET http://h.example/x?y HTTP/1.1\r\nHost: b\r\n\r\n", false},
		{"asterisk", "OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n", false},
		{"upgrade", "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false},
		{"expect", "GET / HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n\r\n", false},
		{"trailer announced", "GET / HTTP/1.1\r\nHost: a\r\nTrailer: X-T\r\n\r\n", false},
		{"bare LF", "GET / HTTP/1.1\nHost: a\n\n", false},
		{"head larger than the buffer", "GET / HTTP/1.1\r\nHost: a\r\n" + bigHeader + "\r\n", false},
		{"zero length twice", "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nContent-Length: 0\r\n\r\n", false},
		{"bad version", "GET / HTTP/1.2\r\nHost: a\r\n\r\n", false},
		{"CONNECT", "CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", false},
	}
	h := http.HandlerFunc(recordRequest)
	loop := startLoop(t, h, nil)
	ref := startNetHTTP(t, h)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := loop.handoffs.Load()
			got := exchangeTwice(t, loop.addr, c.head)
			want := exchangeTwice(t, ref, c.head)
			if !reflect.DeepEqual(got, want) {
				t.Errorf("through the loop:\n%+v\nthrough net/http:\n%+v", got, want)
			}
			if taken := loop.handoffs.Load() == before; taken != c.taken {
				t.Errorf("taken by the loop = %v, want %v", taken, c.taken)
			}
		})
	}
}

// exchangeTwice sends head and, if the connection stays open, a plain
// request after it; it returns what came back (bodies decoded).
func exchangeTwice(t *testing.T, addr, head string) []any {
	t.Helper()
	rc := dial(t, addr)
	method, _, _ := strings.Cut(head, " ")
	rc.send(head)
	var out []any
	first := rc.read(method)
	out = append(out, summarize(first))
	if first.readFail != nil || first.close || first.status >= 400 {
		return out
	}
	rc.send("GET /next?n=2 HTTP/1.1\r\nHost: second\r\n\r\n")
	return append(out, summarize(rc.read("GET")))
}

func summarize(r response) any {
	if r.readFail != nil {
		return "read failed"
	}
	var seen seenRequest
	_ = json.Unmarshal([]byte(r.body), &seen)
	return fmt.Sprintf("%d close=%v %+v", r.status, r.close, seen)
}

// parseSimpleTarget (no url.ParseRequestURI) must give what url gives.
func TestParseSimpleTargetMatchesURL(t *testing.T) {
	var targets []string
	for c := byte(0x21); c < 0x7f; c++ {
		targets = append(targets, "/a"+string(c)+"b", "/a?q"+string(c)+"r")
	}
	targets = append(targets, "/", "/?", "//x", "/a?", "/a?b=c&d", "/a/b/../c", "/%41", "/a b")
	for _, target := range targets {
		var u url.URL
		if !parseSimpleTarget(&u, target) {
			continue
		}
		want, err := url.ParseRequestURI(target)
		if err != nil {
			t.Errorf("%q: taken, but url refuses it: %v", target, err)
			continue
		}
		if u != *want {
			t.Errorf("%q: got %#v, url gives %#v", target, u, *want)
		}
	}
}
