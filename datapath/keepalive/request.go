package keepalive

import (
	"net/http"
	"net/url"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
)

// parseRequest reads a request head (request line, headers, blank line)
// into the connection's reused request. It takes only what forwardH1
// carries and what it can parse exactly as net/http would: an HTTP/1.1
// request in origin form with one valid Host, no body (no Content-Length
// other than 0, no Transfer-Encoding), no Upgrade, Expect or Trailer, no
// folded or invalid header lines. For anything else it returns false and
// the fallback server (net/http) reads the same bytes.
//
// The request, its header map, URL and value slices are the connection's,
// reused from request to request: the handler must not keep them after it
// returns (the gateway does not). Keys and values are substrings of one
// copy of the head: one allocation for the whole request.
func (c *conn) parseRequest(head []byte) bool {
	// The blank line is not part of the header block.
	text := string(head[:len(head)-2])
	line, rest, _ := strings.Cut(text, "\r\n")
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !h1.ValidMethod(method) || method == http.MethodConnect ||
		len(target) == 0 || target[0] != '/' {
		return false
	}

	req := c.req
	if !c.rctx.begin(c.waitedAt) {
		// Somebody waited on the last request's context: it is spent.
		c.rctx = newRequestContext(c.rctx.parent, c)
		c.rctx.begin(c.waitedAt)
		req = req.WithContext(c.rctx)
		c.req = req
	}
	hdr := req.Header
	host, closeConn, vals, ok := h1.ParseSimpleHeaders(rest, hdr, c.vals)
	c.vals = vals
	if !ok {
		return false
	}

	u := &c.url
	if !parseSimpleTarget(u, target) {
		var err error
		if u, err = url.ParseRequestURI(target); err != nil {
			return false
		}
	}
	req.Method = method
	req.URL = u
	req.Proto, req.ProtoMajor, req.ProtoMinor = "HTTP/1.1", 1, 1
	req.Body = http.NoBody
	req.GetBody = nil
	req.ContentLength = 0
	req.TransferEncoding = nil
	req.Close = closeConn
	req.Host = host
	req.Form, req.PostForm, req.MultipartForm = nil, nil, nil
	req.Trailer = nil
	req.RemoteAddr = c.remote
	req.RequestURI = target
	req.TLS = nil
	req.Response = nil
	req.Pattern = ""
	return true
}

// parseSimpleTarget fills u from an origin-form target made only of
// characters that url.ParseRequestURI keeps as they are (no escapes, no
// fragment): the path up to '?', the raw query after it. Anything else is
// left to url.ParseRequestURI (false).
func parseSimpleTarget(u *url.URL, target string) bool {
	q := strings.IndexByte(target, '?')
	path := target
	if q >= 0 {
		path = target[:q]
	}
	for i := 0; i < len(path); i++ {
		if !h1.SimplePathByte(path[i]) {
			return false
		}
	}
	*u = url.URL{Path: path}
	if q >= 0 {
		query := target[q+1:]
		for i := 0; i < len(query); i++ {
			if c := query[i]; c <= ' ' || c >= 0x7f || c == '#' {
				return false
			}
		}
		if query == "" {
			u.ForceQuery = true
		} else if strings.IndexByte(query, '?') >= 0 {
			return false // "a?b?" and the like: let url decide
		}
		u.RawQuery = query
	}
	return true
}
