package h1

import (
	"bytes"
	"errors"
)

// Framing is how a request's body is delimited, as net/http reads it.
type Framing int

const (
	// BodyNone: no body; the next request follows the head.
	BodyNone Framing = iota
	// BodyLength: Content-Length bytes follow.
	BodyLength
	// BodyChunked: a chunked body follows.
	BodyChunked
	// BodyUnknown: net/http refuses the head (and closes the connection),
	// or what follows is not HTTP/1 requests (CONNECT, HTTP/2's preface):
	// a screen of the stream stops here.
	BodyUnknown
)

// Head is what ScreenHead learned of a request head.
type Head struct {
	Framing Framing
	Length  int64 // for BodyLength
	// Post: net/http tolerates up to four CR or LF bytes after a POST
	// before the next request line (old clients' extra CRLF).
	Post bool
	// Upgrade: the request asks for a protocol switch; if it is answered
	// 101, the rest of the connection is a tunnel.
	Upgrade bool
}

// Heads a proxy refuses although net/http would take them, because a
// front proxy may read them differently and so see another request where
// we see a body, or the reverse (request smuggling, RFC 9112 11.2).
var (
	// ErrLengthAndChunked: Content-Length and Transfer-Encoding together.
	// net/http lets Transfer-Encoding win and keeps the connection; RFC
	// 9112 6.3 says it "ought to be handled as an error".
	ErrLengthAndChunked = errors.New("request has both Content-Length and Transfer-Encoding")
	// ErrLengths: Content-Length more than once, even with equal values
	// (net/http takes equal ones).
	ErrLengths = errors.New("request has more than one Content-Length")
	// ErrFolded: a header line continued on the next (obs-fold). net/http
	// joins the lines; RFC 9112 5.2 allows refusing them, and a proxy that
	// does not join them reads another header.
	ErrFolded = errors.New("request has a folded header line (obs-fold)")
	// ErrChunked10: Transfer-Encoding in an HTTP/1.0 request. net/http
	// ignores it and reads Content-Length; a proxy in front may not.
	ErrChunked10 = errors.New("HTTP/1.0 request has Transfer-Encoding")
)

// ScreenHead reads a request head (request line and header lines, each
// ending in LF or CRLF, without the empty line that ends the head) the way
// net/http frames it, and refuses (one of the errors above) a head whose
// framing a front proxy could read differently. It does not validate what
// net/http validates itself (it answers 400, 431 or 501 and closes the
// connection): such heads come back with BodyUnknown.
//
// It is checked against net/http by FuzzScreenHead.
func ScreenHead(head []byte) (Head, error) {
	var h Head
	line, rest, _ := bytes.Cut(head, []byte("\n"))
	line = bytes.TrimSuffix(line, []byte("\r"))
	method, line, ok1 := bytes.Cut(line, []byte(" "))
	_, proto, ok2 := bytes.Cut(line, []byte(" "))
	if !ok1 || !ok2 || string(method) == "CONNECT" {
		return Head{Framing: BodyUnknown}, nil
	}
	var http10 bool
	switch {
	case string(proto) == "HTTP/1.0":
		http10 = true
	case len(proto) == 8 && string(proto[:7]) == "HTTP/1." && proto[7] >= '1' && proto[7] <= '9':
	default:
		// HTTP/2's preface ("PRI * HTTP/2.0"), or a version net/http
		// refuses.
		return Head{Framing: BodyUnknown}, nil
	}
	h.Post = string(method) == "POST"

	var lengths, encodings int
	var length, encoding []byte
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) > 0 && (line[0] == ' ' || line[0] == '\t') {
			return h, ErrFolded
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !ValidName(name) {
			return Head{Framing: BodyUnknown}, nil // net/http: 400
		}
		value = TrimOWSBytes(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			lengths++
			length = value
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			encodings++
			encoding = value
		case bytes.EqualFold(name, []byte("Upgrade")):
			h.Upgrade = true
		}
	}
	switch {
	case encodings > 0 && lengths > 0:
		return h, ErrLengthAndChunked
	case lengths > 1:
		return h, ErrLengths
	case encodings > 0 && http10:
		return h, ErrChunked10
	case encodings > 0:
		if encodings > 1 || !bytes.EqualFold(encoding, []byte("chunked")) {
			return Head{Framing: BodyUnknown}, nil // net/http: 501
		}
		h.Framing = BodyChunked
	case lengths == 1:
		n, ok := parseLength(length)
		if !ok {
			return Head{Framing: BodyUnknown}, nil // net/http: 400
		}
		h.Framing, h.Length = BodyLength, n
		if n == 0 {
			h.Framing = BodyNone
		}
	}
	return h, nil
}

// parseLength is strconv.ParseUint(v, 10, 63), as net/http parses
// Content-Length, without allocating.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 19 {
		return 0, false
	}
	var n uint64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + uint64(c-'0')
	}
	if n > 1<<63-1 {
		return 0, false
	}
	return int64(n), true
}
