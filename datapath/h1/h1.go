// Package h1 holds the few HTTP/1.1 header rules that every hand-written
// HTTP/1 path here (the gateway's forwarder, the sidecar's forwarder and
// the keep-alive server both serve through) must apply the same way. They
// are net/http's rules, written again only because net/http does not
// export them, and written so that the common case does not allocate.
package h1

import (
	"bytes"
	"net/http"
	"net/textproto"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// HopByHop reports whether header k (in canonical form) concerns one
// connection only (RFC 9110 7.6.1) and so must not be passed on by a proxy.
func HopByHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
		"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// HopByHopName is HopByHop for a name as it came off the wire, in any
// case, without allocating.
func HopByHopName(name []byte) bool {
	// By length first: most names are ruled out without a comparison.
	switch len(name) {
	case 2:
		return bytes.EqualFold(name, []byte("Te"))
	case 7:
		return bytes.EqualFold(name, []byte("Trailer")) || bytes.EqualFold(name, []byte("Upgrade"))
	case 10:
		return bytes.EqualFold(name, []byte("Connection")) || bytes.EqualFold(name, []byte("Keep-Alive"))
	case 16:
		return bytes.EqualFold(name, []byte("Proxy-Connection"))
	case 17:
		return bytes.EqualFold(name, []byte("Transfer-Encoding"))
	case 18:
		return bytes.EqualFold(name, []byte("Proxy-Authenticate"))
	case 19:
		return bytes.EqualFold(name, []byte("Proxy-Authorization"))
	}
	return false
}

// ValidName reports whether name is a valid header field name (a token,
// RFC 9110 5.1), as httpguts.ValidHeaderFieldName does for a string.
func ValidName(name []byte) bool {
	if len(name) == 0 {
		return false
	}
	for _, c := range name {
		if !httpguts.IsTokenRune(rune(c)) {
			return false
		}
	}
	return true
}

// TrimOWSBytes is TrimOWS for bytes.
func TrimOWSBytes(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// HasToken reports whether comma-separated header values vv list token,
// compared case-insensitively (Connection: keep-alive, Upgrade, close).
func HasToken(vv []string, token string) bool {
	for _, v := range vv {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(TrimOWS(tok), token) {
				return true
			}
		}
	}
	return false
}

// TrimOWS trims spaces and tabs, as net/textproto does to header values.
func TrimOWS(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}

// CanonicalKey is textproto's canonical form of a header name; a name
// already in it (the usual case) is returned as is, without allocating.
// textproto.CanonicalMIMEHeaderKey has that fast path itself, so this is
// only its name here.
func CanonicalKey(k string) string { return textproto.CanonicalMIMEHeaderKey(k) }

// Replayable reports whether a request without a body may be sent again on
// a new connection when a reused one was closed before any response: the
// methods http.Transport replays (GET, HEAD, OPTIONS, TRACE). PUT and
// DELETE are idempotent by the RFC, but Transport does not replay them and
// neither do we: an app may not honour that.
func Replayable(method string) bool {
	switch method {
	case http.MethodGet, http.MethodHead, http.MethodOptions, http.MethodTrace:
		return true
	}
	return false
}

// ClientIP is the host part of a RemoteAddr ("1.2.3.4:5", "[::1]:5"),
// without allocating.
func ClientIP(remote string) string {
	i := strings.LastIndexByte(remote, ':')
	if i < 0 {
		return remote
	}
	host := remote[:i]
	if len(host) > 1 && host[0] == '[' && host[len(host)-1] == ']' {
		host = host[1 : len(host)-1]
	}
	return host
}

// EOFer is a request body that tells whether it was read to its end.
type EOFer interface{ AtEOF() bool }

// AwaitEOF waits up to grace for a request body being read by another
// goroutine to reach its end, and reports whether it did. A proxy about to
// start a response asks it: a response that starts before its request
// body was read to the end must close the connection (what follows the
// body is not known to be a request), and a body sent in full is usually
// read within microseconds. It polls: this is the rare path (an answer
// that overtook its request's body), not worth a channel per request.
func AwaitEOF(body EOFer, grace time.Duration) bool {
	if body.AtEOF() {
		return true
	}
	for deadline := time.Now().Add(grace); time.Now().Before(deadline); {
		time.Sleep(grace / 20)
		if body.AtEOF() {
			return true
		}
	}
	return false
}
