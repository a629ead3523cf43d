package activator

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
	"github.com/nomad-serverless/nomad-serverless/datapath/rawio"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// forwardH1 proxies a plain HTTP/1.x request without a body (the common
// GET) to its reserved instance over a pooled connection, synchronously in
// the handler goroutine.
//
// Why not httputil.ReverseProxy here: its http.Transport hands every request
// to a writer goroutine and every response back from a reader goroutine, and
// the proxy clones the request and its headers; on a 2-core machine where
// client, gateway, sidecar and app share the CPUs, those hand-offs cost
// more than the rest of the gateway together (see the gateway benchmark).
// Requests with a body, upgrades and HTTP/2 still take the ReverseProxy
// path (proxy.go), which streams both ways.
//
// What it keeps of ReverseProxy's behaviour: hop-by-hop headers (and any
// named in Connection) are dropped both ways; X-Forwarded-For gets the
// client appended and X-Forwarded-Host/Proto are set when absent; response
// trailers pass through; a response of unknown length is flushed as it
// arrives; an instance failure after the response started aborts the
// client connection instead of ending the response cleanly.
//
// Failures before the response (retry.go, ejection.go): a kept-alive
// connection the instance closed as it was reused is replaced by a new one
// to the same instance when the request is replayable (h1.Replayable) or
// nothing of it was written; a request that must not be sent twice is
// never written on a connection closed meanwhile (rawio.Quiet looks
// first). A failure that proves the app never saw the request (dial
// failed, nothing written, the sidecar's NotServed 502) sends it to
// another instance whatever its method, and an idempotent request whose
// connection broke before any response goes there too, within the
// revision's retry budget; one that proves the instance cannot serve
// ejects it.
func (g *Gateway) forwardH1(w http.ResponseWriter, r *http.Request, f *forward, deadline time.Time, tp tracing.Traceparent) {
	replayable := h1.Replayable(r.Method)
	fresh := false
	for {
		uc, reused, err := f.b.conn(deadline, fresh, !replayable)
		if err != nil {
			fl := classifyDial(err)
			if !fl.retryable() {
				f.status = g.upstreamFailed(w, r, f, err, deadline)
				return
			}
			if !g.retryElsewhere(w, r, f, fl, err, deadline) {
				return
			}
			fresh = false
			continue
		}
		res, err := g.exchangeH1(w, r, f, uc, deadline, tp)
		if err == nil && res.keep {
			f.b.putConn(uc)
		} else {
			uc.nc.Close()
		}
		if err == nil {
			return
		}
		// A kept-alive connection the instance closed just as we reused it
		// (no byte came back): like http.Transport, send again on a new
		// connection if the request is replayable, or if none of it was
		// written.
		if !res.gotResponse && reused && !fresh && (replayable || !res.wrote) && r.Context().Err() == nil {
			fresh = true
			continue
		}
		if res.headerSent {
			if errors.Is(err, errClientWrite) {
				return // the client is gone; net/http notices on its own
			}
			// Do not let net/http end a cut response as if complete.
			panic(http.ErrAbortHandler)
		}
		fl := failOther
		switch {
		case errors.Is(err, errNotServed):
			fl = failNotServed
		case !res.wrote && !res.gotResponse:
			fl = failUnsent
		case replayable && !res.gotResponse && !errors.Is(err, errClientWrite):
			fl = failReset
		}
		if !fl.retryable() || r.Context().Err() != nil {
			f.status = g.upstreamFailed(w, r, f, err, deadline)
			return
		}
		if !g.retryElsewhere(w, r, f, fl, err, deadline) {
			return
		}
		fresh = false
	}
}

// retryElsewhere handles a retryable failure fl of the attempt at f.b: the
// instance is ejected if fl says so, and the request goes to another
// instance if its tries and the revision's budget allow (true: f.b is the
// new one). Otherwise the request is answered here (false).
func (g *Gateway) retryElsewhere(w http.ResponseWriter, r *http.Request, f *forward, fl failure, err error, deadline time.Time) bool {
	if fl.ejects() {
		g.ejectBackend(f.rev, f.b, fl)
	}
	if why := f.mayRetry(); why != "" {
		if !fl.unseen() {
			// It may have reached the app: answered as any failure
			// after the request was sent, not as one safe to retry.
			f.status = g.upstreamFailed(w, r, f, err, deadline)
			return false
		}
		f.status = g.notRetried(w, f, fl, err, why)
		return false
	}
	if f.reacquire(r, deadline) {
		return true
	}
	f.status = g.writeAcquireError(w, r, f.rev, f.rev.cfg.Load(), f.err)
	return false
}

// mayRetry takes a retry from the request's tries and the revision's
// budget, or says why not.
func (f *forward) mayRetry() string {
	if f.tries >= maxRetries {
		f.rev.metrics().triesExhausted.Inc()
		return fmt.Sprintf("it was tried %d times", f.tries+1)
	}
	if !f.rev.budget.withdraw(time.Now()) {
		f.rev.metrics().budgetDenied.Inc()
		return "the revision's retry budget is spent (many of its requests fail this way at once)"
	}
	return ""
}

// reacquire gives up the slot on the failed instance and reserves one on
// another (waiting in the queue if need be).
func (f *forward) reacquire(r *http.Request, deadline time.Time) bool {
	g := f.g
	f.tries++
	f.rev.metrics().retries.Inc()
	g.log.Debug("instance could not serve the request; retrying on another", "revision", f.rev.name, "instance", f.b.hostPort)
	f.rev.release(f.b)
	f.b = nil
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	b, _, err := f.rev.acquire(ctx, g.cfg.QueueDepth, g.cfg.QueueTimeout)
	if err != nil {
		f.err = err
		return false
	}
	f.b = b
	return true
}

// notRetried answers a request that never reached an app but may not be
// retried (why), and returns the status: 503, so that the client knows it
// may send it again.
func (g *Gateway) notRetried(w http.ResponseWriter, f *forward, fl failure, err error, why string) int {
	addr := ""
	if f.b != nil {
		addr = f.b.hostPort
	}
	g.log.Warn("request not retried", "revision", f.rev.name, "instance", addr, "reason", fl.String(), "why", why, "err", err)
	w.Header().Set("Retry-After", "1")
	writeError(w, http.StatusServiceUnavailable, "instance %s of revision %s could not serve the request (%s; it did not reach the app) and it is not retried here: %s; retry",
		addr, f.rev.name, fl, why)
	return http.StatusServiceUnavailable
}

// upstreamFailed answers a request whose instance failed before the
// response started, and returns the status written (0: client gone).
func (g *Gateway) upstreamFailed(w http.ResponseWriter, r *http.Request, f *forward, err error, deadline time.Time) int {
	rev := f.rev
	switch {
	case r.Context().Err() != nil:
		return 0
	case !time.Now().Before(deadline) || errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusGatewayTimeout, "revision %s did not answer within its timeout of %s", rev.name, rev.cfg.Load().timeout)
		return http.StatusGatewayTimeout
	}
	addr := ""
	if f.b != nil {
		addr = f.b.hostPort
	}
	g.log.Warn("proxy to instance failed", "revision", rev.name, "instance", addr, "err", err)
	writeError(w, http.StatusBadGateway, "instance %s of revision %s failed to answer: %v", addr, rev.name, err)
	return http.StatusBadGateway
}

var errClientWrite = errors.New("write to client failed")

// h1Result says how far an exchange got.
type h1Result struct {
	wrote       bool // a byte of the request reached the connection
	gotResponse bool // a response head arrived
	headerSent  bool // the response head went to the client
	keep        bool // the connection can serve another request
}

func (g *Gateway) exchangeH1(w http.ResponseWriter, r *http.Request, f *forward, uc *upConn, deadline time.Time, tp tracing.Traceparent) (h1Result, error) {
	var res h1Result
	uc.begin(r.Context(), deadline)
	defer uc.end()

	before := uc.rw.Written()
	if f.wake != nil {
		f.wake.sending()
	}
	writeRequestHead(uc.bw, r, f.rev.header[0], tp)
	uc.rw.AwaitReply() // the fast path's requests have no body
	err := uc.bw.Flush()
	res.wrote = err == nil || uc.rw.Written() > before
	if err != nil {
		return res, err
	}
	var (
		block  []byte
		status int
		http11 bool
	)
	for {
		var (
			got bool
			err error
		)
		block, got, err = uc.readBlock()
		if err == nil {
			status, http11, block, err = parseStatus(block)
		}
		if err != nil {
			res.gotResponse = got
			return res, err
		}
		// Informational answers (103) are the instance's to give and
		// ours to skip; the final one follows.
		if status >= 200 || status == http.StatusSwitchingProtocols {
			break
		}
	}
	res.gotResponse = true
	if status == http.StatusBadGateway && hasNotServed(block) {
		// The sidecar's word that its app did not serve the request: the
		// caller may send it elsewhere, so nothing goes to the client.
		res.keep = discardResponse(uc, status, http11, block, r.Method == http.MethodHead)
		return res, errNotServed
	}
	f.status = status
	if f.wake != nil {
		f.wake.answered(f.b.alloc)
	}
	if status == http.StatusSwitchingProtocols {
		return res, errors.New("instance switched protocols for a request that asked for no upgrade")
	}
	// The common response goes to the client as the instance wrote it;
	// the rest through the header map.
	dst := w.Header()
	var head respHead
	raw := false
	if rw, ok := w.(keepalive.RawHeadWriter); ok && r.Method != http.MethodHead {
		var rh keepalive.RawHead
		rh, head, raw = rawHead(status, http11, block, uc.fields)
		uc.fields = rh.Fields[:0]
		raw = raw && rw.WriteRawHead(rh)
	}
	if !raw {
		var err error
		head, err = parseHead(status, http11, block, dst, r.Method == http.MethodHead, f.vals[:0])
		if err != nil {
			return res, err
		}
		w.WriteHeader(status)
	}
	res.headerSent = true
	// The response has started: the timeout no longer applies, and its
	// body is read from the instance as long as it flows (deadlines.go).
	uc.deadline = never

	var body io.Reader
	switch {
	case !head.hasBody:
	case head.chunked:
		body = httputil.NewChunkedReader(uc.br)
	case head.length >= 0:
		uc.lr = io.LimitedReader{R: uc.br, N: head.length}
		body = &uc.lr
	default:
		body = uc.br // until the instance closes the connection
	}
	if body != nil {
		buf := g.buffers.Get()
		err := copyBody(w, body, buf, head.length < 0, f.stall)
		g.buffers.Put(buf)
		if err != nil {
			return res, err
		}
		if head.length > 0 && uc.lr.N > 0 {
			return res, io.ErrUnexpectedEOF
		}
		if head.chunked {
			if err := uc.readTrailers(dst); err != nil {
				return res, err
			}
		}
	}
	// The read deadline stays: an idle connection is not read, and the
	// next exchange keeps or moves it (begin).
	res.keep = head.keepAlive && (!head.hasBody || head.chunked || head.length >= 0)
	return res, nil
}

// respHead is what parseHead or rawHead learned of a response's framing.
type respHead struct {
	hasBody   bool
	chunked   bool
	length    int64 // -1: unknown
	keepAlive bool
}

// maxResponseHead bounds a response's status line and header block.
const maxResponseHead = 64 << 10

var errBadResponse = errors.New("malformed HTTP response from the instance")

// readBlock reads a response's status line and header block (without the
// blank line that ends it) into uc.scratch. got tells whether any byte
// arrived.
func (uc *upConn) readBlock() (block []byte, got bool, err error) {
	block = uc.scratch[:0]
	defer func() { uc.scratch = block }()
	for {
		line, err := uc.br.ReadSlice('\n')
		if len(line) > 0 {
			got = true
		}
		if err != nil {
			if errors.Is(err, bufio.ErrBufferFull) {
				err = errBadResponse
			}
			return block, got, err
		}
		if len(block)+len(line) > maxResponseHead {
			return block, got, errBadResponse
		}
		if len(block) > 0 && (len(line) == 1 || len(line) == 2 && line[0] == '\r') {
			return block, got, nil
		}
		block = append(block, line...)
	}
}

// parseStatus reads the status line at the start of block: the status,
// whether it is HTTP/1.1, and the rest of the block.
func parseStatus(block []byte) (status int, http11 bool, rest []byte, err error) {
	line, rest, _ := bytes.Cut(block, []byte("\n"))
	line = bytes.TrimRight(line, "\r")
	if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
		return 0, false, nil, errBadResponse
	}
	for _, c := range line[9:12] {
		if c < '0' || c > '9' {
			return 0, false, nil, errBadResponse
		}
		status = status*10 + int(c-'0')
	}
	if status < 100 {
		return 0, false, nil, errBadResponse
	}
	return status, line[7] == '1', rest, nil
}

// parseHead reads the header block after the status line into dst,
// dropping hop-by-hop headers (and those Connection names). The block
// becomes one string that keys and values slice, so a response head costs
// a couple of allocations whatever its size.
func parseHead(status int, http11 bool, block []byte, dst http.Header, head bool, vals []string) (respHead, error) {
	h := respHead{length: -1, keepAlive: http11}
	rest := string(block)
	var conn []string
	var te string
	lengths := 0
	for rest != "" {
		var line string
		line, rest, _ = strings.Cut(rest, "\n")
		line = strings.TrimRight(line, "\r")
		if line == "" {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			return h, errBadResponse
		}
		k = h1.CanonicalKey(k)
		v = strings.TrimSpace(v)
		switch k {
		case "Content-Length":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || (lengths > 0 && n != h.length) {
				return h, errBadResponse
			}
			h.length = n
			lengths++
		case "Connection":
			conn = append(conn, v)
			continue
		case "Transfer-Encoding":
			te = v
			continue
		}
		if k != "Trailer" && h1.HopByHop(k) || k == notServedKey {
			continue
		}
		if old, ok := dst[k]; ok {
			dst[k] = append(old, v)
		} else {
			n := len(vals)
			vals = append(vals, v)
			dst[k] = vals[n : n+1 : n+1]
		}
	}
	for _, c := range conn {
		for tok := range strings.SplitSeq(c, ",") {
			tok = strings.TrimSpace(tok)
			switch {
			case strings.EqualFold(tok, "close"):
				h.keepAlive = false
			case strings.EqualFold(tok, "keep-alive"):
				h.keepAlive = true
			default:
				delete(dst, http.CanonicalHeaderKey(tok))
			}
		}
	}
	h.hasBody = !head && status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
	if te != "" {
		// Chunked must come last; any other coding is read to the end of
		// the connection (RFC 9112 6.3).
		if strings.EqualFold(strings.TrimSpace(lastToken(te)), "chunked") {
			h.chunked = true
		} else {
			h.keepAlive = false
		}
		h.length = -1
		delete(dst, "Content-Length")
	}
	if !h.hasBody {
		h.length = 0
	}
	return h, nil
}

// rawHead prepares the header block after the status line of a final
// response to be passed on as it is (keepalive.RawHead), into fields. It
// takes only the common case, a body of known length with a Content-Type
// and nothing a proxy must rework, and reports false for anything else
// (chunked or other codings, trailers, Connection naming other fields, a
// line it would have to mend or reject), which parseHead then handles.
// rh.Fields reuses fields' memory whatever it reports.
// Header names keep the instance's spelling: they are case-insensitive.
func rawHead(status int, http11 bool, block, fields []byte) (keepalive.RawHead, respHead, bool) {
	h := respHead{length: -1, keepAlive: http11, hasBody: true}
	rh := keepalive.RawHead{Status: status}
	hasType := false
	rh.Fields = fields[:0]
	for rest := block; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 {
			continue
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 || bytes.IndexByte(line, '\r') >= 0 || !h1.ValidName(line[:colon]) {
			return rh, h, false
		}
		name, value := line[:colon], h1.TrimOWSBytes(line[colon+1:])
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			n, ok := parseLength(value)
			if !ok || (h.length >= 0 && n != h.length) {
				return rh, h, false
			}
			h.length = n
			continue
		case bytes.EqualFold(name, []byte("Connection")):
			for tok := range bytes.SplitSeq(value, []byte(",")) {
				switch tok = h1.TrimOWSBytes(tok); {
				case bytes.EqualFold(tok, []byte("close")):
					h.keepAlive = false
				case bytes.EqualFold(tok, []byte("keep-alive")):
					h.keepAlive = true
				case len(tok) > 0:
					return rh, h, false
				}
			}
			continue
		case bytes.EqualFold(name, []byte("Transfer-Encoding")), bytes.EqualFold(name, []byte("Trailer")):
			return rh, h, false
		case h1.HopByHopName(name):
			continue
		case bytes.EqualFold(name, []byte("Content-Type")):
			hasType = true
		case bytes.EqualFold(name, []byte("Date")):
			rh.HasDate = true
		}
		rh.Fields = append(rh.Fields, line...)
		rh.Fields = append(rh.Fields, '\r', '\n')
	}
	if h.length < 0 || !hasType {
		return rh, h, false
	}
	rh.Length = h.length
	return rh, h, true
}

// parseLength parses a Content-Length value: decimal digits only.
func parseLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// readTrailers reads a chunked body's trailer section into dst.
func (uc *upConn) readTrailers(dst http.Header) error {
	for n := 0; ; n++ {
		line, err := uc.br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if len(line) == 1 || len(line) == 2 && line[0] == '\r' {
			return nil
		}
		if n > 100 {
			return errBadResponse
		}
		k, v, ok := strings.Cut(strings.TrimRight(string(line), "\r\n"), ":")
		if !ok {
			return errBadResponse
		}
		k = h1.CanonicalKey(k)
		if !h1.HopByHop(k) {
			dst[http.TrailerPrefix+k] = append(dst[http.TrailerPrefix+k], strings.TrimSpace(v))
		}
	}
}

// hasNotServed reports whether a response head's block (after the status
// line) has spec.NotServedHeader; only 502s are looked at.
func hasNotServed(block []byte) bool {
	for rest := block; len(rest) > 0; {
		var line []byte
		line, rest, _ = bytes.Cut(rest, []byte("\n"))
		name, _, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(name, notServedName) {
			return true
		}
	}
	return false
}

var notServedName = []byte(spec.NotServedHeader)

// discardResponse reads the body of a response the gateway does not pass
// on, and reports whether the connection can serve another request.
func discardResponse(uc *upConn, status int, http11 bool, block []byte, head bool) bool {
	h, err := parseHead(status, http11, block, http.Header{}, head, nil)
	if err != nil || !h.keepAlive || h.hasBody && (h.chunked || h.length < 0 || h.length > 64<<10) {
		return false
	}
	if h.hasBody {
		if _, err := uc.br.Discard(int(h.length)); err != nil {
			return false
		}
	}
	return true
}

func lastToken(s string) string {
	if i := strings.LastIndexByte(s, ','); i >= 0 {
		return s[i+1:]
	}
	return s
}

// copyBody relays a response body; with flush, every chunk goes to the
// client as it arrives (streams, server-sent events).
func copyBody(w http.ResponseWriter, body io.Reader, buf []byte, flush bool, stall time.Duration) error {
	var fl http.Flusher
	if flush {
		fl, _ = w.(http.Flusher)
	}
	// Past its first half second a body keeps the client's write deadline
	// a stall bound ahead (deadlines.go); most bodies end before. The
	// deadline serveHTTP set lasts at least a second past the response's
	// start, so the first move comes in time.
	var guard *stallGuard
	moveAt := time.Now().Add(500 * time.Millisecond)
	for {
		n, rerr := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return errClientWrite
			}
			if fl != nil {
				fl.Flush()
			}
			if guard != nil {
				guard.flowed()
			} else if time.Now().After(moveAt) {
				guard = newStallGuard(http.NewResponseController(w).SetWriteDeadline, stall)
				guard.next = time.Time{} // move it now
				guard.flowed()
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return rerr
		}
	}
}

// fastPathOK tells whether forwardH1 can carry r: HTTP/1.x, no body, no
// upgrade, no expectation, no trailers.
func fastPathOK(r *http.Request) bool {
	if r.ProtoMajor != 1 || r.ContentLength != 0 || len(r.TransferEncoding) > 0 {
		return false
	}
	h := r.Header
	if _, ok := h["Upgrade"]; ok {
		return false
	}
	if _, ok := h["Expect"]; ok {
		return false
	}
	if _, ok := h["Trailer"]; ok {
		return false
	}
	// ContentLength 0 is "no body" for a request a server read (its Body
	// is then NoBody), but "unknown" for one built with http.NewRequest.
	return r.Body == nil || r.Body == http.NoBody
}

// writeRequestHead writes the request line and headers for the instance,
// with tp, a root request's not-sampled decision, if set: formatted in
// the writer's own buffer, so carrying it allocates nothing.
func writeRequestHead(bw *bufio.Writer, r *http.Request, revision string, tp tracing.Traceparent) {
	uri := r.RequestURI
	if uri == "" || (uri[0] != '/' && uri != "*") {
		uri = r.URL.RequestURI()
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	h := r.Header
	connTokens := h["Connection"]
	for k, vv := range h {
		if h1.HopByHop(k) || k == revisionHeaderKey || k == headerXFF || k == headerForwarded || (connTokens != nil && h1.HasToken(connTokens, k)) {
			continue
		}
		for _, v := range vv {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	bw.WriteString(revisionHeaderKey)
	bw.WriteString(": ")
	bw.WriteString(revision)
	bw.WriteString("\r\n")
	if tp.IsSet() {
		bw.WriteString("Traceparent: ")
		bw.Write(tp.Append(bw.AvailableBuffer()))
		bw.WriteString("\r\n")
	}
	// X-Forwarded-For and Forwarded: the chain so far, then this hop's
	// client.
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		bw.WriteString("X-Forwarded-For: ")
		for _, v := range h[headerXFF] {
			bw.WriteString(v)
			bw.WriteString(", ")
		}
		bw.WriteString(ip)
		bw.WriteString("\r\nForwarded: ")
		h1.WriteForwarded(bw, h, ip, r.Host, schemeOf(r))
		bw.WriteString("\r\n")
	}
	if _, ok := h[headerXFH]; !ok {
		bw.WriteString("X-Forwarded-Host: ")
		bw.WriteString(r.Host)
		bw.WriteString("\r\n")
	}
	if _, ok := h[headerXFP]; !ok {
		bw.WriteString("X-Forwarded-Proto: ")
		bw.WriteString(schemeOf(r))
		bw.WriteString("\r\n")
	}
	bw.WriteString("\r\n")
}

// schemeOf is how the client reached the gateway.
func schemeOf(r *http.Request) string {
	if r.TLS != nil {
		return "https"
	}
	return "http"
}

// upConn is one kept-alive connection to an instance's sidecar.
type upConn struct {
	nc      net.Conn
	rw      *rawio.Conn   // nc's reads and writes
	br      *bufio.Reader // reads through upConn.Read
	bw      *bufio.Writer
	idle    time.Time // when it went back to the pool
	scratch []byte    // response head being read
	fields  []byte    // the head's fields, passed on as they are
	lr      io.LimitedReader

	// The exchange in progress: its request's context and deadline.
	ctx      context.Context
	deadline time.Time
	armed    time.Time // the read deadline set last
}

// clientCheckInterval is how often a request waiting on its instance checks
// that its client is still there (and the server not shutting down).
const clientCheckInterval = time.Second

// begin arms the connection for one exchange. Reads wait at most until
// deadline, and at least every clientCheckInterval they look whether the
// client left, so a departed client frees its slot within a second. That
// is a read deadline, not a callback registered on the request's context
// (which cost more than the rest of the gateway's own work on a short
// request), and the one an earlier exchange armed is kept while it is at
// least half an interval ahead and not past this exchange's deadline: Read
// moves it on when it fires. So the timer moves about twice a second per
// busy connection, not per request.
func (uc *upConn) begin(ctx context.Context, deadline time.Time) {
	uc.ctx, uc.deadline = ctx, deadline
	now := time.Now()
	if uc.armed.Sub(now) >= clientCheckInterval/2 && !uc.armed.After(deadline) {
		return
	}
	uc.arm(earliest(deadline, now.Add(clientCheckInterval)))
}

func (uc *upConn) arm(t time.Time) {
	uc.armed = t
	_ = uc.nc.SetReadDeadline(t)
}

// end forgets the exchange (the idle connection keeps no request alive).
func (uc *upConn) end() { uc.ctx = nil }

// Read is the bufio.Reader's source: a read that times out before the
// request's deadline, with its client still there, is extended and goes on.
func (uc *upConn) Read(p []byte) (int, error) {
	for {
		n, err := uc.rw.Read(p)
		if n > 0 || err == nil || !errors.Is(err, os.ErrDeadlineExceeded) || uc.ctx == nil {
			return n, err
		}
		now := time.Now()
		if !now.Before(uc.deadline) || uc.ctx.Err() != nil {
			return n, err
		}
		uc.arm(earliest(uc.deadline, now.Add(clientCheckInterval)))
	}
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// maxIdlePerBackend bounds the connections kept open to one instance.
const maxIdlePerBackend = 1024

// idleConnTimeout is how long an unused connection is kept.
const idleConnTimeout = 60 * time.Second

// connPool is a backend's idle connections, newest last (reused first, so
// the rest can age out).
type connPool struct {
	mu     sync.Mutex
	idle   []*upConn
	closed bool
}

// conn returns a connection to the backend: an idle one unless fresh, or a
// new one. reused tells which. With check, an idle connection is looked at
// first (rawio.Quiet, one system call) and dropped if the sidecar closed or
// reset it: a request that must not be sent twice goes on a live one or a
// new one.
func (b *backend) conn(deadline time.Time, fresh, check bool) (uc *upConn, reused bool, err error) {
	for !fresh {
		b.pool.mu.Lock()
		if n := len(b.pool.idle); n > 0 {
			uc = b.pool.idle[n-1]
			b.pool.idle[n-1] = nil
			b.pool.idle = b.pool.idle[:n-1]
		}
		b.pool.mu.Unlock()
		if uc == nil {
			break
		}
		if !check || rawio.Quiet(uc.nc) {
			return uc, true, nil
		}
		uc.nc.Close()
		uc = nil
	}
	d := net.Dialer{Timeout: dialTimeout, Deadline: deadline, KeepAlive: 30 * time.Second}
	nc, err := d.Dial("tcp", b.hostPort)
	if err != nil {
		return nil, false, err
	}
	uc = &upConn{nc: nc, rw: rawio.New(nc)}
	uc.bw = bufio.NewWriterSize(uc.rw, 8<<10)
	uc.br = bufio.NewReaderSize(uc, 16<<10)
	return uc, false, nil
}

// dialTimeout bounds a connection attempt to a sidecar.
const dialTimeout = 2 * time.Second

func (b *backend) putConn(uc *upConn) {
	uc.idle = time.Now()
	b.pool.mu.Lock()
	if b.pool.closed || len(b.pool.idle) >= maxIdlePerBackend {
		b.pool.mu.Unlock()
		uc.nc.Close()
		return
	}
	b.pool.idle = append(b.pool.idle, uc)
	b.pool.mu.Unlock()
}

// closeIdle closes idle connections unused since before cutoff (all of them
// and any returned later when forever is set: the instance is gone).
func (b *backend) closeIdle(cutoff time.Time, forever bool) {
	b.pool.mu.Lock()
	var old []*upConn
	keep := b.pool.idle[:0]
	for _, uc := range b.pool.idle {
		if forever || uc.idle.Before(cutoff) {
			old = append(old, uc)
		} else {
			keep = append(keep, uc)
		}
	}
	clear(b.pool.idle[len(keep):])
	b.pool.idle = keep
	if forever {
		b.pool.closed = true
	}
	b.pool.mu.Unlock()
	for _, uc := range old {
		uc.nc.Close()
	}
}
