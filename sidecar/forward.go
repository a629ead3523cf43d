package sidecar

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/textproto"
	"runtime"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"golang.org/x/net/http/httpguts"
)

// forwardH1 proxies an HTTP/1.x request (no protocol upgrade) to the app
// over a pooled HTTP/1.1 connection, synchronously in the handler
// goroutine.
//
// This replaces httputil.ReverseProxy + http.Transport on the hot path.
// The Transport hands every request to a writer goroutine and every response
// back from a reader goroutine (three channel hand-offs per request), and
// ReverseProxy clones the request and its headers; here the request head is
// written straight from the incoming request and the response head is read
// into the ResponseWriter's header map (two allocations for the whole
// header block), so a plain GET makes no goroutine switch and about a dozen
// allocations in all, most of them net/http's own serving side.
//
// What it keeps of ReverseProxy's behaviour: hop-by-hop headers (and any
// named in Connection) are dropped both ways; X-Forwarded-For gets the
// client appended; a request body streams to the app from its own goroutine
// while the response streams back (full duplex), chunked when its length is
// unknown, trailers included; response trailers pass through; a response
// is flushed to the client whenever no more of it is already buffered, so
// streams flow byte by byte and ordinary responses leave in one write; an
// app error after the response started aborts the client connection rather
// than end the response cleanly. dispatched is when the request left the
// queue (the clock reading the idle connections are judged by).
//
// Failures before the app answered: a request whose connection to the app
// broke before any answer is sent again once on a new connection when it
// is replayable (no body, a method http.Transport replays), or when the
// connection was reused and nothing of it was written; a request that may not be sent twice is never written on a
// connection the app closed while it was idle (rawio.Quiet looks first);
// a connection the app refused marks the sidecar not ready at once; and
// when the app did not serve the request and another instance may, the
// 502 says so (spec.NotServedHeader) for the gateway to retry elsewhere.
//
// Exactly one response per request: a response that starts while the
// request body is still arriving says Connection: close (the rest of the
// body is not read, so the connection cannot carry another request), and a
// body that breaks before the app answered gets one 400 with Connection:
// close. net/http does the same for a handler that is not full duplex; for
// one that is, it keeps the connection and parses the rest of a broken
// body as the next request.
func (h *Handler) forwardH1(x *exchange, r *http.Request, dispatched time.Time) {
	hasBody := r.ContentLength != 0
	replayable := !hasBody && h1.Replayable(r.Method)
	var body *bodyCopy
	if hasBody {
		body = &bodyCopy{done: make(chan error, 1)}
		x.body = body
	}
	if h.othersBeside() {
		// Before the connection is taken: its look at an idle one
		// (rawio.Quiet) must stay just before the write, or an app that
		// dies meanwhile gets a request that cannot be sent again.
		runtime.Gosched() // see othersBeside
	}
	written := false // some attempt wrote a byte of the request to the app
	for attempt := 0; ; attempt++ {
		// The retry goes on a new connection: the idle ones are likely as
		// dead as the first.
		ac, reused, err := h.app.get(dispatched, attempt > 0, !replayable)
		if err != nil {
			h.appFailed(x, r, err, unreached(err) && (!written || replayable))
			return
		}
		if !x.attach(ac) {
			ac.nc.Close()
			h.appFailed(x, r, errAborted, false)
			return
		}
		res, err := h.exchangeH1(x, ac, r, body)
		written = written || res.wrote
		if !x.detach(ac) {
			// The timer broke the connection; it is not reusable.
			res.keep = false
		}
		if res.keep && err == nil {
			h.app.put(ac)
		} else {
			ac.nc.Close()
			if !res.body.running() {
				h.app.release(ac)
			}
		}
		if err == nil {
			return
		}
		// No byte came back: a replayable request goes again, once, on a
		// new connection (as http.Transport replays one whose reused
		// connection failed; here also when the connection was new,
		// since the app may have died with it: the new dial tells,
		// and if it is refused the 502 lets the gateway send the request
		// elsewhere); so does one of which nothing was written.
		if !res.gotResponse && attempt == 0 && !x.aborted.Load() && (replayable || reused && !res.wrote) && !res.body.failed() {
			continue
		}
		if res.headerSent {
			if errors.Is(err, errClientWrite) {
				// The client is gone; the server notices on its own.
				return
			}
			// Do not let the server end a cut response as if complete.
			panic(http.ErrAbortHandler)
		}
		// Not served, for the gateway to send elsewhere: nothing of it
		// reached the app, or it is replayable and no answer came (the
		// app died with it: what http.Transport would replay).
		h.appFailed(x, r, err, !res.gotResponse && (!written || replayable) && !res.body.failed())
		return
	}
}

// unreached tells whether err, from getting a connection to the app,
// means nothing was sent: every dial error does (a pooled connection is
// only handed out unwritten).
func unreached(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

var (
	errAborted     = errors.New("request aborted")
	errClientWrite = errors.New("write to client failed")
	errBadResponse = errors.New("malformed HTTP response from the app")
)

// h1Result says how far an exchange with the app got.
type h1Result struct {
	wrote       bool // a byte of the request reached the app's socket
	gotResponse bool // any byte of a response arrived
	headerSent  bool // the response head went to the client
	keep        bool // the connection can serve another request
	body        *bodyCopy
}

// bodyCopy is the request body's copy to the app, run by its own
// goroutine (copyRequestBody), which may outlive the handler: so it is
// the request's own, not part of the pooled exchange.
type bodyCopy struct {
	done chan error  // buffered 1: the copy's one result
	eof  atomic.Bool // the client's body was read to its end
	// The result, once taken from done; handler goroutine only.
	finished bool
	err      error
}

// atEOF reports whether the whole body was read from the client, so the
// client's connection can carry another request (see exchange.WriteHeader).
func (b *bodyCopy) AtEOF() bool { return b.eof.Load() }

// poll takes the copy's result if it is in, without waiting, and reports
// whether it is.
func (b *bodyCopy) poll() bool {
	if b == nil || b.finished {
		return true
	}
	select {
	case err := <-b.done:
		b.finished, b.err = true, err
		return true
	default:
		return false
	}
}

// running reports whether the copy may still use the connection and the
// request body.
func (b *bodyCopy) running() bool { return !b.poll() }

// failed reports whether the copy ended with the client's body broken.
func (b *bodyCopy) failed() bool { return b.poll() && b != nil && b.err != nil }

// exchangeH1 writes r to ac and relays the response to x; body, when the
// request has one, is started once the head is written.
func (h *Handler) exchangeH1(x *exchange, ac *appConn, r *http.Request, body *bodyCopy) (h1Result, error) {
	var res h1Result
	chunked := r.ContentLength < 0
	writeRequestHead(ac.bw, r, h.appAddr, chunked)
	before := ac.rw.Written()
	if body == nil {
		// Nothing more goes to the app before its answer.
		ac.rw.AwaitReply()
	}
	err := ac.bw.Flush()
	res.wrote = ac.rw.Written() > before || err == nil
	if err != nil {
		return res, err
	}
	if body != nil {
		// The body streams from its own goroutine so the app can answer
		// (or echo) while the client still sends. Until it reports on
		// done the connection's writer is its.
		res.body = body
		go copyRequestBody(ac, r, chunked, h.buffers, body)
	}

	var (
		code   int
		http11 bool
		block  string
	)
	for {
		code, http11, block, res.gotResponse, err = readResponseHead(ac)
		if err != nil {
			return res, res.bodyError(err)
		}
		if code >= 100 && code < 200 {
			if code == http.StatusSwitchingProtocols {
				return res, fmt.Errorf("%w: 101 Switching Protocols to a request that asked for no upgrade", errBadResponse)
			}
			// 100 Continue is ours to swallow; others (103) go on.
			if code != http.StatusContinue {
				if _, err := parseResponseHeader(block, x.Header()); err == nil {
					x.WriteHeader(code)
				}
				clear(x.Header())
			}
			continue
		}
		break
	}
	hd := x.Header()
	info, err := parseResponseHeader(block, hd)
	if err != nil {
		clear(x.Header())
		return res, err
	}
	res.keep = http11 && !info.close || !http11 && info.keepAlive
	// Says Connection: close unless the whole request body was read.
	x.WriteHeader(code)
	res.headerSent = true

	switch {
	case r.Method == http.MethodHead || code == http.StatusNoContent || code == http.StatusNotModified:
	case info.chunked:
		err = copyChunked(x, ac)
	case info.contentLength >= 0:
		err = copyFixed(x, ac.br, info.contentLength)
	default:
		res.keep = false
		err = copyToEOF(x, ac.br)
	}
	if err != nil {
		res.keep = false
		return res, res.bodyError(err)
	}
	if res.body.running() || res.body.failed() {
		// The app answered before taking the whole body (or the body
		// broke): the connection is mid-request, so it goes (and with it
		// the body copy, whose next write fails).
		res.keep = false
	}
	return res, nil
}

// othersBeside tells forwardH1 whether requests other than its own are
// in flight; if so its request head waits, before it goes to the app,
// until the goroutines already runnable have had their turn (the request
// side of keepalive.Server.YieldFirst). With one P the sidecar otherwise
// sends the app one request per turn of its only thread, a turn being
// another request's whole read, forward and answer: the app wakes for
// each (a Go app then wakes a second thread too) and pays for it in CPU
// that, on shared cores, the client and the proxy needed. An event loop
// such as HAProxy's reads every ready connection before it sends, so the
// app finds its requests together. Measured with perf and /proc (32
// connections, 3 rounds): the test app's CPU per request fell from 34 to
// 42 us to 30 to 31 us, HAProxy's single-threaded level, and 6 paired
// wrk rounds against the sidecar without it were 6 wins, 1.083x the
// throughput (0.80 -> 0.87 of HAProxy with two threads). A request alone
// does not yield, so the single-connection latency does not pay for it.
//
// Nor does a request while others wait for a concurrency slot: it holds
// one, and its turn's wait would keep that slot from the app while they
// queue for it. With concurrency 10 at 32 connections, 5 paired wrk
// rounds against yielding there too: 5 wins, 1.05x the throughput
// (22,111 against 21,106 requests a second).
func (h *Handler) othersBeside() bool {
	return h.meter.inFlight() > 1 && (h.breaker == nil || h.breaker.Waiting() == 0)
}

// bodyError prefers the request body's error (a client that went away
// mid-upload, a malformed chunk) over the one it caused on the app side.
func (res *h1Result) bodyError(err error) error {
	if res.body.failed() {
		return res.body.err
	}
	return err
}

// notPassedOn reports whether a request header must not reach the app: the
// hop-by-hop ones, and the framing and routing the sidecar redoes itself.
func notPassedOn(k string) bool {
	switch k {
	case "Host", "Content-Length", "Expect", "X-Forwarded-For", "Forwarded":
		return true
	}
	return h1.HopByHop(k)
}

// writeRequestHead writes the request line and headers. Header names and
// values come from net/http's parser, which has refused CR, LF and invalid
// names, so they are written as they are.
func writeRequestHead(bw *bufio.Writer, r *http.Request, appAddr string, chunked bool) {
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	target := r.RequestURI
	if target == "" || target[0] != '/' && target != "*" {
		// Absolute form ("http://host/path"): the app gets origin form.
		target = r.URL.RequestURI()
	}
	bw.WriteString(target)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	if r.Host != "" {
		bw.WriteString(r.Host)
	} else {
		bw.WriteString(appAddr)
	}
	bw.WriteString("\r\n")
	conn := r.Header["Connection"]
	for k, vv := range r.Header {
		if notPassedOn(k) || len(conn) > 0 && h1.HasToken(conn, k) {
			continue
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if te := r.Header["Te"]; len(te) > 0 && h1.HasToken(te, "trailers") {
		bw.WriteString("Te: trailers\r\n")
	}
	bw.WriteString("X-Forwarded-For: ")
	for _, v := range r.Header["X-Forwarded-For"] {
		bw.WriteString(v)
		bw.WriteString(", ")
	}
	client := h1.ClientIP(r.RemoteAddr)
	bw.WriteString(client)
	bw.WriteString("\r\nForwarded: ")
	h1.WriteForwarded(bw, r.Header, client, r.Host, "http")
	bw.WriteString("\r\n")
	switch {
	case chunked:
		bw.WriteString("Transfer-Encoding: chunked\r\n")
		if len(r.Trailer) > 0 {
			bw.WriteString("Trailer: ")
			first := true
			for k := range r.Trailer {
				if !first {
					bw.WriteString(", ")
				}
				first = false
				bw.WriteString(k)
			}
			bw.WriteString("\r\n")
		}
	case r.ContentLength > 0:
		bw.WriteString("Content-Length: ")
		var num [20]byte
		bw.Write(strconv.AppendInt(num[:0], r.ContentLength, 10))
		bw.WriteString("\r\n")
	case r.Method == http.MethodPost || r.Method == http.MethodPut || r.Method == http.MethodPatch:
		bw.WriteString("Content-Length: 0\r\n")
	}
	bw.WriteString("\r\n")
}

// copyRequestBody streams r's body to the app, chunk-encoding it when its
// length is unknown, flushing after every read so the app sees bytes as
// the client sends them. It reports on done and touches nothing else of the
// request's state: it may outlive the handler when the app answers early.
func copyRequestBody(ac *appConn, r *http.Request, chunked bool, buffers *bufferPool, b *bodyCopy) {
	done := b.done
	buf := buffers.Get()
	defer buffers.Put(buf)
	bw := ac.bw
	var err error
	for {
		n, rerr := r.Body.Read(buf)
		if rerr == io.EOF {
			// Before the last bytes go: the app's answer to them must
			// find the body complete, or it closes the client's
			// connection for nothing (net/http returns EOF with a body's
			// last bytes when it can).
			b.eof.Store(true)
		}
		if n > 0 {
			if chunked {
				var num [16]byte
				bw.Write(strconv.AppendUint(num[:0], uint64(n), 16))
				bw.WriteString("\r\n")
				bw.Write(buf[:n])
				bw.WriteString("\r\n")
			} else {
				bw.Write(buf[:n])
			}
			if werr := bw.Flush(); werr != nil {
				done <- nil // the app side failed; the response read reports it
				return
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			err = fmt.Errorf("%w: %v", errClientBody, rerr)
			// The result first (done never blocks), then unblock the
			// response read, which the app keeps waiting for bytes that
			// will not come: woken, it must find the body's error to
			// answer 400 (bodyError), not its own timeout's 502.
			done <- err
			_ = ac.nc.SetReadDeadline(pastDeadline)
			return
		}
	}
	if chunked {
		bw.WriteString("0\r\n")
		for k, vv := range r.Trailer {
			for _, v := range vv {
				bw.WriteString(k)
				bw.WriteString(": ")
				bw.WriteString(v)
				bw.WriteString("\r\n")
			}
		}
		bw.WriteString("\r\n")
		_ = bw.Flush()
	}
	done <- nil
}

var errClientBody = errors.New("reading the request body from the client failed")

// readResponseHead reads a status line and header block. The header block
// is returned as one string (one allocation), which parseResponseHeader
// slices into keys and values without copying.
func readResponseHead(ac *appConn) (code int, http11 bool, block string, got bool, err error) {
	line, err := ac.br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return 0, false, "", true, fmt.Errorf("%w: status line too long", errBadResponse)
		}
		if len(line) == 0 && errors.Is(err, io.EOF) {
			err = errAppClosed
		}
		return 0, false, "", len(line) > 0, err
	}
	// "HTTP/1.1 200 OK"
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' || (len(line) > 12 && line[12] != ' ' && line[12] != '\r' && line[12] != '\n') {
		return 0, false, "", true, fmt.Errorf("%w: status line %q", errBadResponse, trimLine(line))
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, false, "", true, fmt.Errorf("%w: status line %q", errBadResponse, trimLine(line))
		}
		code = code*10 + int(c-'0')
	}
	if code < 100 {
		return 0, false, "", true, fmt.Errorf("%w: status %d", errBadResponse, code)
	}
	http11 = line[7] == '1'

	scratch := ac.scratch[:0]
	atLineStart := true
	for {
		line, err = ac.br.ReadSlice('\n')
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			ac.scratch = scratch
			return 0, false, "", true, err
		}
		if len(scratch)+len(line) > maxResponseHead {
			ac.scratch = nil
			return 0, false, "", true, fmt.Errorf("%w: header larger than %d bytes", errBadResponse, maxResponseHead)
		}
		if err == nil && atLineStart && (len(line) == 1 || len(line) == 2 && line[0] == '\r') {
			break
		}
		scratch = append(scratch, line...)
		atLineStart = err == nil
	}
	ac.scratch = scratch
	return code, http11, string(scratch), true, nil
}

func trimLine(b []byte) string {
	if len(b) > 64 {
		b = b[:64]
	}
	return strings.TrimRight(string(b), "\r\n")
}

// respInfo is what the response head says about framing and the connection.
type respInfo struct {
	contentLength int64 // -1: not given
	chunked       bool
	close         bool
	keepAlive     bool
}

// parseResponseHeader fills hd from a header block, dropping hop-by-hop
// fields. Keys and values are substrings of block; all values share one
// []string backing array, each header a full slice of it, so an append
// (a repeated header) copies instead of overwriting a neighbour.
func parseResponseHeader(block string, hd http.Header) (respInfo, error) {
	info := respInfo{contentLength: -1}
	vals := make([]string, strings.Count(block, "\n"))
	n := 0
	var connTokens []string
	for len(block) > 0 {
		i := strings.IndexByte(block, '\n')
		if i < 0 {
			i = len(block)
		}
		line := block[:i]
		block = block[min(i+1, len(block)):]
		line = strings.TrimSuffix(line, "\r")
		if line == "" {
			continue
		}
		if line[0] == ' ' || line[0] == '\t' {
			return info, fmt.Errorf("%w: folded header line", errBadResponse)
		}
		colon := strings.IndexByte(line, ':')
		if colon <= 0 || !httpguts.ValidHeaderFieldName(line[:colon]) {
			return info, fmt.Errorf("%w: header line %q", errBadResponse, trimLine([]byte(line)))
		}
		key := textproto.CanonicalMIMEHeaderKey(line[:colon])
		value := strings.Trim(line[colon+1:], " \t")
		switch key {
		case "Content-Length":
			cl, err := strconv.ParseInt(value, 10, 64)
			if err != nil || cl < 0 || info.contentLength >= 0 && info.contentLength != cl {
				return info, fmt.Errorf("%w: Content-Length %q", errBadResponse, value)
			}
			if info.contentLength >= 0 {
				continue // the same value twice
			}
			info.contentLength = cl
		case "Transfer-Encoding":
			// Only a final "chunked" frames the body; anything else is
			// read until the connection closes (RFC 9112 6.3).
			last := value
			if j := strings.LastIndexByte(value, ','); j >= 0 {
				last = value[j+1:]
			}
			info.chunked = strings.EqualFold(strings.TrimSpace(last), "chunked")
			continue
		case "Connection":
			for tok := range strings.SplitSeq(value, ",") {
				tok = strings.TrimSpace(tok)
				switch {
				case strings.EqualFold(tok, "close"):
					info.close = true
				case strings.EqualFold(tok, "keep-alive"):
					info.keepAlive = true
				case tok != "":
					connTokens = append(connTokens, tok)
				}
			}
			continue
		case "Keep-Alive", "Proxy-Connection", "Upgrade", "Te", "X-Serverless-Not-Served":
			// The last is spec.NotServedHeader: the sidecar's to say.
			continue
		}
		vals[n] = value
		if prev, ok := hd[key]; ok {
			hd[key] = append(prev, value)
		} else {
			hd[key] = vals[n : n+1 : n+1]
		}
		n++
	}
	for _, tok := range connTokens {
		delete(hd, textproto.CanonicalMIMEHeaderKey(tok))
	}
	if info.chunked {
		// Both framings given: chunked wins, and the length must not
		// reach the client.
		delete(hd, "Content-Length")
		info.contentLength = -1
	}
	return info, nil
}

// copyFixed relays exactly n bytes of body.
func copyFixed(x *exchange, br *bufio.Reader, n int64) error {
	for n > 0 {
		if br.Buffered() == 0 {
			// About to wait for the app: let the client have what it
			// has so far.
			x.Flush()
			if _, err := br.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					err = io.ErrUnexpectedEOF
				}
				return err
			}
		}
		b, _ := br.Peek(int(min(int64(br.Buffered()), n)))
		if _, err := x.Write(b); err != nil {
			return fmt.Errorf("%w: %v", errClientWrite, err)
		}
		br.Discard(len(b))
		n -= int64(len(b))
	}
	return nil
}

// copyToEOF relays a body delimited by the app closing the connection.
func copyToEOF(x *exchange, br *bufio.Reader) error {
	for {
		if br.Buffered() == 0 {
			x.Flush()
			if _, err := br.Peek(1); err != nil {
				if errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
		b, _ := br.Peek(br.Buffered())
		if _, err := x.Write(b); err != nil {
			return fmt.Errorf("%w: %v", errClientWrite, err)
		}
		br.Discard(len(b))
	}
}

// copyChunked relays a chunked body chunk by chunk (the server re-chunks
// it towards the client) and its trailers.
func copyChunked(x *exchange, ac *appConn) error {
	br := ac.br
	for {
		if br.Buffered() == 0 {
			x.Flush()
		}
		line, err := br.ReadSlice('\n')
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		size, ok := parseChunkSize(line)
		if !ok {
			return fmt.Errorf("%w: chunk size line %q", errBadResponse, trimLine(line))
		}
		if size == 0 {
			return copyTrailers(x, br)
		}
		if err := copyFixed(x, br, size); err != nil {
			return err
		}
		if crlf, err := br.ReadSlice('\n'); err != nil || len(crlf) > 2 || len(crlf) == 2 && crlf[0] != '\r' {
			return fmt.Errorf("%w: chunk not followed by CRLF", errBadResponse)
		}
	}
}

func parseChunkSize(line []byte) (int64, bool) {
	var n int64
	digits := 0
	for _, c := range line {
		var d byte
		switch {
		case c >= '0' && c <= '9':
			d = c - '0'
		case c >= 'a' && c <= 'f':
			d = c - 'a' + 10
		case c >= 'A' && c <= 'F':
			d = c - 'A' + 10
		default:
			// Extensions (";name=value") and the line end.
			return n, digits > 0 && (c == ';' || c == '\r' || c == '\n' || c == ' ' || c == '\t')
		}
		if digits == 15 {
			return 0, false // over 2^60: no real chunk is that big
		}
		n = n<<4 | int64(d)
		digits++
	}
	return n, false
}

// copyTrailers reads the trailer section after the last chunk and hands it
// to the server as trailers (TrailerPrefix keys).
func copyTrailers(x *exchange, br *bufio.Reader) error {
	var hd http.Header
	for {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return fmt.Errorf("%w: trailers: %v", errBadResponse, err)
		}
		if len(line) == 1 || len(line) == 2 && line[0] == '\r' {
			return nil
		}
		s := strings.TrimRight(string(line), "\r\n")
		k, v, ok := strings.Cut(s, ":")
		if !ok || !httpguts.ValidHeaderFieldName(k) {
			return fmt.Errorf("%w: trailer line %q", errBadResponse, s)
		}
		if hd == nil {
			hd = x.Header()
		}
		hd.Add(http.TrailerPrefix+textproto.CanonicalMIMEHeaderKey(k), strings.Trim(v, " \t"))
	}
}
