package h1

import (
	"net/http"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// ParseSimpleHeaders parses a request head's header lines (after the
// request line, without the blank line) the way the data path's own loops
// take a request: exactly as net/http would read it, and only a request
// with one valid Host, no body (no Content-Length other than 0, no
// Transfer-Encoding), no Upgrade, Expect or Trailer, no folded or invalid
// line. For anything else ok is false and the caller hands the bytes to
// net/http. hdr is cleared and filled; values are appended to vals (each
// key's values share its backing array, so a request allocates no slice
// per header), which it returns for the caller to reuse. closeConn says
// whether Connection asked to close. The keepalive loop (the gateway) and
// the sidecar's event loop both parse with it.
func ParseSimpleHeaders(block string, hdr http.Header, vals []string) (host string, closeConn bool, out []string, ok bool) {
	clear(hdr)
	vals = vals[:0]
	hosts := 0
	for block != "" {
		var l string
		l, block, _ = strings.Cut(block, "\r\n")
		colon := strings.IndexByte(l, ':')
		if colon <= 0 {
			return "", false, vals, false
		}
		k := l[:colon]
		if !httpguts.ValidHeaderFieldName(k) {
			return "", false, vals, false // also refuses folded lines and spaces before the colon
		}
		v := TrimOWS(l[colon+1:])
		if !httpguts.ValidHeaderFieldValue(v) {
			return "", false, vals, false
		}
		k = CanonicalKey(k)
		switch k {
		case "Host":
			hosts++
			host = v
			continue
		case "Content-Length":
			if v != "0" || hdr[k] != nil {
				return "", false, vals, false
			}
		case "Transfer-Encoding", "Upgrade", "Expect", "Trailer":
			return "", false, vals, false
		case "Connection":
			for tok := range strings.SplitSeq(v, ",") {
				tok = TrimOWS(tok)
				switch {
				case strings.EqualFold(tok, "close"):
					closeConn = true
				case strings.EqualFold(tok, "upgrade"):
					return "", false, vals, false
				}
			}
		}
		vals = append(vals, v)
		if prev, ok := hdr[k]; ok {
			hdr[k] = append(prev, v)
		} else {
			n := len(vals)
			hdr[k] = vals[n-1 : n : n]
		}
	}
	if hosts != 1 || !httpguts.ValidHostHeader(host) {
		return "", false, vals, false // net/http answers 400
	}
	// net/http's fixPragmaCacheControl.
	if p := hdr["Pragma"]; len(p) > 0 && p[0] == "no-cache" {
		if _, ok := hdr["Cache-Control"]; !ok {
			hdr["Cache-Control"] = []string{"no-cache"}
		}
	}
	return host, closeConn, vals, true
}

// ValidMethod reports whether m is a token (RFC 9110 5.6.2), as a request
// method must be.
func ValidMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !httpguts.IsTokenRune(rune(m[i])) {
			return false
		}
	}
	return true
}

// SimplePathByte reports whether a path keeps byte c unchanged through
// url.ParseRequestURI (unreserved, some sub-delims, ':', '@', '/'): a
// target made only of these needs no url parse (checked against url in
// keepalive's TestParseSimpleTargetMatchesURL).
func SimplePathByte(c byte) bool { return simplePathBytes[c] }

var simplePathBytes = func() (t [256]bool) {
	for _, c := range []byte("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~/$&+,;=:@") {
		t[c] = true
	}
	return t
}()
