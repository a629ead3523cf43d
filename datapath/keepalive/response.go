package keepalive

import (
	"net/http"
	"net/textproto"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"golang.org/x/net/http/httpguts"
)

// responseWriter is the http.ResponseWriter of a request on a taken-over
// connection. It frames the response as net/http's server does (see
// chunkWriter.writeHeader there): a Content-Length the handler set is kept;
// otherwise a body the handler finished without flushing gets one, and a
// flushed or large one is sent chunked; Content-Type is sniffed when
// missing, Date added, trailers sent after a chunked body, and a response
// that cannot be finished (short body, write error, client asked to
// close, shutdown) closes the connection with "Connection: close".
//
// The head is written into the connection's buffer at the first body write
// or flush (or at the end), so a small response leaves in one write with its
// body. It is reused by every request on the connection.
type responseWriter struct {
	c   *conn
	req *http.Request
	hdr http.Header // made for the first request, then cleared for each

	status      int
	wroteHeader bool // final status set
	headSent    bool // head in the connection's buffer
	chunked     bool
	isHead      bool
	closeAfter  bool
	cl          int64 // declared Content-Length, -1: none
	written     int64
	pending     []byte // body written before the head was sent
	// State of the header when WriteHeader was called, which is what
	// net/http goes by: whether trailers were announced (by "Trailer" or
	// a TrailerPrefix key), the announced names, and those of them not
	// yet set then (their values come after the body, not in the head).
	trailersDeclared bool
	trailers         []string
	lateTrailers     []string
	err              error // writing to the client failed

	scratch [32]byte

	// The write deadline set last, and how much later than asked it may
	// be (SetWriteDeadline); they outlive the request, as the deadline.
	wdl      time.Time
	wdlSlack time.Duration
}

// pendingCap is how much body waits for the head before it is sent
// chunked: net/http's bufferBeforeChunkingSize.
const pendingCap = 2048

// reset readies w for req. Whether Shutdown closes the connection is
// decided when the head goes out (sendHead, WriteRawHead), not here.
func (w *responseWriter) reset(req *http.Request) {
	if w.hdr == nil {
		w.hdr = make(http.Header, 16)
	}
	clear(w.hdr)
	w.req = req
	w.status = 0
	w.wroteHeader = false
	w.headSent = false
	w.chunked = false
	w.isHead = req.Method == http.MethodHead
	w.closeAfter = req.Close
	w.cl = -1
	w.written = 0
	w.pending = w.pending[:0]
	w.trailersDeclared = false
	w.trailers = w.trailers[:0]
	w.lateTrailers = w.lateTrailers[:0]
	w.err = nil
}

func (w *responseWriter) Header() http.Header { return w.hdr }

func (w *responseWriter) WriteHeader(code int) {
	if code < 100 || code > 999 {
		panic("invalid WriteHeader code " + strconv.Itoa(code))
	}
	if code < 200 && code != http.StatusSwitchingProtocols {
		// Informational: sent at once with the current header, which
		// stays for the final response (RFC 8297).
		if w.wroteHeader {
			return
		}
		w.writeStatusLine(code)
		for k, vv := range w.hdr {
			if k == "Content-Length" || k == "Transfer-Encoding" || strings.HasPrefix(k, http.TrailerPrefix) {
				continue
			}
			w.writeField(k, vv)
		}
		w.c.bw.WriteString("\r\n")
		w.noteErr(w.c.bw.Flush())
		return
	}
	if w.wroteHeader {
		return
	}
	w.wroteHeader = true
	w.status = code
	hd := w.hdr
	for k := range hd {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			w.trailersDeclared = true
			break
		}
	}
	for _, v := range hd["Trailer"] {
		w.trailersDeclared = true
		for tok := range strings.SplitSeq(v, ",") {
			if tok = http.CanonicalHeaderKey(h1.TrimOWS(tok)); tok != "" && httpguts.ValidTrailerHeader(tok) {
				w.trailers = append(w.trailers, tok)
				if _, set := hd[tok]; !set {
					w.lateTrailers = append(w.lateTrailers, tok)
				}
			}
		}
	}
	if v := hd["Content-Length"]; len(v) > 0 {
		n, err := strconv.ParseInt(v[0], 10, 64)
		if err == nil && n >= 0 {
			w.cl = n
		} else {
			delete(hd, "Content-Length")
		}
	}
	// Nothing to wait for (no length to compute, no type to sniff): send
	// the head now, into the buffer that the body or the end flushes.
	if !bodyAllowedForStatus(code) || w.cl >= 0 && w.hasType() {
		w.sendHead(nil, false)
	}
}

func (w *responseWriter) hasType() bool {
	hd := w.hdr
	_, ok := hd["Content-Type"]
	return ok || len(hd["Content-Encoding"]) > 0 || len(hd["Transfer-Encoding"]) > 0
}

func (w *responseWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if !bodyAllowedForStatus(w.status) {
		return 0, http.ErrBodyNotAllowed
	}
	w.written += int64(len(p))
	if w.cl >= 0 && w.written > w.cl {
		return 0, http.ErrContentLength
	}
	if w.err != nil {
		return 0, w.err
	}
	if !w.headSent {
		if len(w.pending)+len(p) <= pendingCap {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.sendPending(p)
	}
	w.writeBody(p)
	if w.err != nil {
		return 0, w.err
	}
	return len(p), nil
}

// sendPending sends the head (sniffing from the pending body and next)
// and the pending body.
func (w *responseWriter) sendPending(next []byte) {
	sniff := w.pending
	if len(sniff) == 0 {
		sniff = next
	}
	w.sendHead(sniff, false)
	if len(w.pending) > 0 {
		w.writeBody(w.pending)
		w.pending = w.pending[:0]
	}
}

func (w *responseWriter) writeBody(p []byte) {
	if w.isHead || w.err != nil {
		return
	}
	bw := w.c.bw
	if w.chunked {
		bw.Write(strconv.AppendInt(w.scratch[:0], int64(len(p)), 16))
		bw.WriteString("\r\n")
		bw.Write(p)
		_, err := bw.WriteString("\r\n")
		w.noteErr(err)
		return
	}
	_, err := bw.Write(p)
	w.noteErr(err)
}

func (w *responseWriter) noteErr(err error) {
	if err != nil && w.err == nil {
		w.err = err
		w.closeAfter = true
	}
}

// Flush sends what is buffered; streams flow through it.
func (w *responseWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.headSent {
		w.sendPending(nil)
	}
	w.noteErr(w.c.bw.Flush())
}

// SetWriteDeadline moves the connection's write deadline to t or a little
// later: the gateway sets one per request, and moving it once a second
// instead of per request spares a timer update each. The slack, a second
// or an eighth of the time left, is chosen when the deadline moves and
// kept until it moves again, so a deadline that stays costs no clock
// reading either.
func (w *responseWriter) SetWriteDeadline(t time.Time) error {
	if !w.wdl.Before(t) && !w.wdl.After(t.Add(w.wdlSlack)) {
		return nil // also: both zero
	}
	w.wdlSlack = 0
	if !t.IsZero() {
		w.wdlSlack = max(min(time.Second, time.Until(t)/8), 0)
	}
	w.wdl = t.Add(w.wdlSlack)
	return w.c.nc.SetWriteDeadline(w.wdl)
}

// SetReadDeadline: requests in the loop have no body to read.
func (w *responseWriter) SetReadDeadline(time.Time) error { return nil }

// finish ends the response after the handler returned.
func (w *responseWriter) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.headSent {
		w.sendHead(w.pending, true)
		if len(w.pending) > 0 {
			w.writeBody(w.pending)
		}
	}
	if w.chunked && w.err == nil {
		bw := w.c.bw
		bw.WriteString("0\r\n")
		w.writeTrailers()
		bw.WriteString("\r\n")
	}
	if w.cl >= 0 && w.written != w.cl && bodyAllowedForStatus(w.status) && !w.isHead {
		// A short body: the client cannot tell where it ends.
		w.closeAfter = true
	}
	c := w.c
	if w.err == nil && c.rw != nil && !w.closeAfter && !c.s.closing.Load() && c.br.Buffered() == 0 {
		// The connection waits for its next request once this response
		// is out: readHead sends the last bytes itself, as it starts that
		// wait, so that its first read need not fail with EAGAIN
		// (rawio.Conn.AwaitReply). What the loop does before it (the
		// request context's end, the idle state and deadline) then
		// happens before the client has its answer.
		c.sendOnWait = true
		return nil
	}
	return w.sendLast(false)
}

// sendLast writes the response's last bytes (those the buffer holds); with
// await the write also waits for the next request (readHead's, whose read
// buffer is empty).
func (w *responseWriter) sendLast(await bool) error {
	if others := w.c.s.YieldFirst; others != nil && others() {
		runtime.Gosched() // see Server.YieldFirst
	}
	if await && w.c.bw.Buffered() > 0 {
		w.c.rw.AwaitReply()
	}
	w.noteErr(w.c.bw.Flush())
	return w.err
}

func (w *responseWriter) writeTrailers() {
	hd := w.hdr
	for k, vv := range hd {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
			w.writeField(name, vv)
		}
	}
	for _, k := range w.trailers {
		if vv := hd[k]; len(vv) > 0 {
			w.writeField(k, vv)
		}
	}
}

// sendHead writes the status line and header into the connection's
// buffer. first is the start of the body (for sniffing and, when final, its
// length); final means the handler has returned. The handler's header map
// is not changed: what net/http would add or drop is decided here.
func (w *responseWriter) sendHead(first []byte, final bool) {
	w.headSent = true
	hd := w.hdr
	code := w.status
	bodyOK := bodyAllowedForStatus(code)

	declared := w.trailersDeclared
	te := ""
	if v := hd["Transfer-Encoding"]; len(v) > 0 {
		te = v[0]
	}
	var (
		dropCL, dropTE, dropType bool
		addCL, addChunked        bool
		sniffed                  string
	)
	if final && !declared && te == "" && bodyOK && w.cl < 0 && (!w.isHead || len(first) > 0) {
		w.cl = int64(len(first))
		addCL = true
	}
	if h1.HasToken(hd["Connection"], "close") || w.c.s.closing.Load() {
		w.closeAfter = true
	}
	if bodyOK {
		if !w.hasType() && len(first) > 0 {
			sniffed = http.DetectContentType(first)
		}
	} else {
		dropType = code == http.StatusNotModified
		dropCL, dropTE = true, true
		w.cl = -1
	}
	_, hasDate := hd["Date"]
	if w.cl >= 0 && te != "" && te != "identity" {
		dropCL, addCL = true, false
		w.cl = -1
	}
	switch {
	case w.isHead || !bodyOK, w.cl >= 0:
		dropTE = true
	case te == "identity":
		w.closeAfter = true
		dropTE = true
	default:
		w.chunked = true
		dropTE, addChunked = true, true
		dropCL = true
	}

	w.writeStatusLine(code)
	bw := w.c.bw
	for k, vv := range hd {
		switch {
		case k == "Content-Length" && dropCL, k == "Transfer-Encoding" && dropTE,
			k == "Content-Type" && dropType, k == "Connection" && w.closeAfter, // endHead says close
			strings.HasPrefix(k, http.TrailerPrefix), len(w.lateTrailers) > 0 && slices.Contains(w.lateTrailers, k):
		default:
			w.writeField(k, vv)
		}
	}
	if sniffed != "" {
		bw.WriteString("Content-Type: ")
		bw.WriteString(sniffed)
		bw.WriteString("\r\n")
	}
	if addChunked {
		bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	cl := int64(-1)
	if addCL {
		cl = w.cl
	}
	w.endHead(cl, hasDate)
}

// endHead ends a head in the connection's buffer with what both kinds of
// head (sendHead, WriteRawHead) may add: a Content-Length of cl (none if
// negative), a Date unless the handler gave one, Connection: close when the
// connection closes after this response, and the blank line.
func (w *responseWriter) endHead(cl int64, hasDate bool) {
	bw := w.c.bw
	if cl >= 0 {
		bw.WriteString("Content-Length: ")
		bw.Write(strconv.AppendInt(w.scratch[:0], cl, 10))
		bw.WriteString("\r\n")
	}
	if !hasDate {
		bw.WriteString("Date: ")
		bw.Write(time.Now().UTC().AppendFormat(w.scratch[:0], http.TimeFormat))
		bw.WriteString("\r\n")
	}
	if w.closeAfter {
		bw.WriteString("Connection: close\r\n")
	}
	_, err := bw.WriteString("\r\n")
	w.noteErr(err)
}

func (w *responseWriter) writeStatusLine(code int) {
	bw := w.c.bw
	bw.WriteString("HTTP/1.1 ")
	bw.Write(strconv.AppendInt(w.scratch[:0], int64(code), 10))
	bw.WriteByte(' ')
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	bw.WriteString(text)
	bw.WriteString("\r\n")
}

// writeField writes one header field, as net/http's Header.Write does:
// invalid names are skipped, line breaks in values become spaces.
func (w *responseWriter) writeField(k string, vv []string) {
	if !httpguts.ValidHeaderFieldName(k) {
		return
	}
	bw := w.c.bw
	for _, v := range vv {
		if strings.ContainsAny(v, "\r\n") {
			v = newlineToSpace.Replace(v)
		}
		bw.WriteString(k)
		bw.WriteString(": ")
		bw.WriteString(textproto.TrimString(v))
		bw.WriteString("\r\n")
	}
}

// newlineToSpace is net/http's headerNewlineToSpace.
var newlineToSpace = strings.NewReplacer("\n", " ", "\r", " ")

func bodyAllowedForStatus(status int) bool {
	switch {
	case status >= 100 && status <= 199, status == http.StatusNoContent, status == http.StatusNotModified:
		return false
	}
	return true
}

// RawHead is a response head a proxy already holds in wire form: it is sent
// as it is, instead of being parsed into the header map only to be written
// out again (a tenth of the gateway's CPU went to that).
type RawHead struct {
	Status int
	// Fields are the header lines as they are to be sent, each
	// "Name: value\r\n": valid names, no CR or LF inside a value, no
	// hop-by-hop field, no Content-Length (Length is sent), and a
	// Content-Type among them (nothing is sniffed).
	Fields []byte
	// Length is the length of the body the handler then writes.
	Length int64
	// HasDate tells that Fields hold a Date; otherwise one is added.
	HasDate bool
}

// RawHeadWriter is implemented by the ResponseWriter of the requests the
// loop serves.
type RawHeadWriter interface {
	// WriteRawHead sends h as the response head and reports true; it
	// does nothing and reports false for a response it does not take (a
	// HEAD request, a status without a body, a header set or written
	// already): the caller then uses Header and WriteHeader.
	WriteRawHead(h RawHead) bool
}

// WriteRawHead frames the response as sendHead would for a header map
// holding Fields and a Content-Length of h.Length.
func (w *responseWriter) WriteRawHead(h RawHead) bool {
	if w.wroteHeader || w.isHead || h.Length < 0 || h.Status < 200 || h.Status > 999 ||
		!bodyAllowedForStatus(h.Status) || len(w.hdr) > 0 {
		return false
	}
	w.wroteHeader, w.headSent = true, true
	w.status, w.cl = h.Status, h.Length
	if w.c.s.closing.Load() {
		w.closeAfter = true
	}
	w.writeStatusLine(h.Status)
	w.c.bw.Write(h.Fields)
	w.endHead(h.Length, h.HasDate)
	return true
}
