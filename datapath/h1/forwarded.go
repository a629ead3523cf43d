package h1

import (
	"net/http"
	"strings"
)

// The Forwarded header (RFC 7239), kept in step with X-Forwarded-For: each
// hop that appends its client to X-Forwarded-For appends the same client
// as an element of Forwarded. A request that comes without Forwarded but
// with X-Forwarded-For (from a proxy in front that speaks only the older
// header) first gets one element per X-Forwarded-For entry, each with the
// X-Forwarded-Proto and X-Forwarded-Host it came with, as Knative's
// queue-proxy does; so the two headers name the same chain, whichever the
// app reads. Knative's runtime contract requires the header.

// StringWriter is what the Forwarded writers write to: a bufio.Writer on
// the fast paths, a strings.Builder for a header map.
type StringWriter interface {
	WriteString(s string) (int, error)
	WriteByte(c byte) error
}

// WriteForwarded writes the Forwarded value for r passed on by one more
// hop, whose client is clientIP and which r reached over proto ("http" or
// "https"): r's own Forwarded (or the elements X-Forwarded-* imply), then
// "for=<clientIP>;host=<r.Host>;proto=<proto>". It allocates nothing.
func WriteForwarded(w StringWriter, h http.Header, clientIP, host, proto string) {
	if prior := h["Forwarded"]; len(prior) > 0 {
		for _, v := range prior {
			w.WriteString(v)
			w.WriteString(", ")
		}
	} else if xff := h["X-Forwarded-For"]; len(xff) > 0 {
		xfh, xfp := first(h["X-Forwarded-Host"]), first(h["X-Forwarded-Proto"])
		for _, v := range xff {
			for v != "" {
				var node string
				node, v, _ = strings.Cut(v, ",")
				if node = TrimOWS(node); node == "" {
					continue
				}
				writeElement(w, node, xfh, xfp)
				w.WriteString(", ")
			}
		}
	}
	writeElement(w, clientIP, host, proto)
}

// Forwarded is WriteForwarded's value as a string, for a header map.
func Forwarded(h http.Header, clientIP, host, proto string) string {
	var b strings.Builder
	WriteForwarded(&b, h, clientIP, host, proto)
	return b.String()
}

func first(vv []string) string {
	if len(vv) == 0 {
		return ""
	}
	return TrimOWS(vv[0])
}

// writeElement writes "for=<node>;host=<host>;proto=<proto>", leaving out
// the empty ones.
func writeElement(w StringWriter, node, host, proto string) {
	w.WriteString("for=")
	if strings.IndexByte(node, ':') >= 0 && node[0] != '[' && node[0] != '"' {
		// An IPv6 address is written in brackets, quoted (RFC 7239 §6).
		w.WriteString(`"[`)
		w.WriteString(node)
		w.WriteString(`]"`)
	} else {
		writeValue(w, node)
	}
	if host != "" {
		w.WriteString(";host=")
		writeValue(w, host)
	}
	if proto != "" {
		w.WriteString(";proto=")
		writeValue(w, proto)
	}
}

// writeValue writes v as a token, or as a quoted-string when it is not one
// (a host with a port, say).
func writeValue(w StringWriter, v string) {
	if isToken(v) {
		w.WriteString(v)
		return
	}
	w.WriteByte('"')
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c == '"' || c == '\\' {
			w.WriteByte('\\')
		}
		w.WriteByte(c)
	}
	w.WriteByte('"')
}

// isToken reports whether v is a non-empty RFC 9110 token.
func isToken(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
