// Package keepalive serves plain HTTP/1.1 requests on keep-alive
// connections with far less work per request than net/http, for the two
// proxies every request crosses (the gateway and the sidecar).
//
// # Why
//
// For every request net/http starts a goroutine that keeps a read pending on
// the client's connection (so that it notices a client leaving), arms and
// disarms it with three deadline changes, allocates the request, its header
// map, context and response, and wakes threads to run all of that. For a
// proxy whose own work is to pass a few hundred bytes on, that is most of the
// cost: on two cores shared by client, gateway, sidecar and app, the
// gateway cost as much CPU as sidecar and app together.
//
// # What
//
// Server.ServeConn serves a connection in one goroutine: the request head is
// parsed from the read buffer into a request whose header map, URL and
// value slices are reused from one request to the next (request.go); the
// response is framed as net/http frames it, head and body leaving in one
// write (response.go); deadlines move at most once a second; a departed
// client is noticed on demand, by a peek at the socket, not by a read kept
// pending (context.go).
//
// It takes only plain requests: HTTP/1.1, origin form, no body, no
// upgrade, no expectation, nothing unusual (see parseRequest). At the first
// request it does not take, the connection, with the bytes already read, is
// handed off (Server.HandOff, typically to a ConnQueue that an http.Server
// serves) and net/http serves it, and the rest of that connection, as it
// always would, malformed requests and their 400s included.
package keepalive

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/rawio"
)

// Server serves keep-alive connections (ServeConn) and closes them on
// Shutdown. Set its fields before the first ServeConn; they are not changed
// after.
type Server struct {
	// Handler serves the requests the loop takes. It must not keep the
	// request (or anything in it) after it returns: the request is the
	// connection's and is reused.
	Handler http.Handler
	// HandOff takes a connection whose next request the loop does not
	// take; reading it yields the bytes the loop read, then the rest. It
	// must not block for long.
	HandOff func(net.Conn)
	// IdleTimeout bounds the wait for a request after the previous one
	// (0: none); ReadHeaderTimeout the arrival of a head that came in
	// pieces (0: none). As net/http's.
	IdleTimeout, ReadHeaderTimeout time.Duration
	// Log receives handler panics; nil discards them.
	Log *slog.Logger
	// ScreenHeads, when not 0, screens every connection handed off
	// (ScreenConn) with heads up to that many bytes (the fallback
	// server's MaxHeaderBytes plus 4 KiB): the heads net/http reads are
	// then refused when a front proxy could frame them differently. The
	// loop's own heads need no screen: it takes none of them.
	ScreenHeads int
	// YieldFirst, when not nil, is asked before a response's last write
	// (the one that wakes its client; the handler has returned) whether
	// other requests are in flight; if so the write waits until the
	// goroutines already runnable have had their turn (one
	// runtime.Gosched). For a proxy with one P on a node whose cores its
	// clients and app share, as the sidecar runs: the woken client takes
	// the proxy's CPU on the way out of that write (on Linux 6.18, 97 %
	// of the sidecar's involuntary context switches are there, measured
	// with perf), and until the proxy runs again nothing of it runs, so
	// the requests it has read wait to reach the app, which sleeps
	// meanwhile (behind the sidecar it slept 0.43 times a request, behind
	// HAProxy 0.22). Yielding first sends those requests on before the
	// write. A request alone does not yield, so the single-connection
	// latency does not pay for it. The caller counts the requests already
	// (the sidecar's meter), so the loop keeps no count of its own.
	YieldFirst func() bool

	closing atomic.Bool
	mu      sync.Mutex
	conns   map[*conn]struct{}
	active  sync.WaitGroup
	// readers and writers hold the buffers of connections that ended.
	readers, writers sync.Pool
}

// Supported tells whether this platform has what a Server needs (a socket
// peek); where it does not, callers leave connections to net/http.
const Supported = peekSupported

// Closing reports whether Shutdown was called.
func (s *Server) Closing() bool { return s.closing.Load() }

// Shutdown makes every connection close: idle ones at once, busy ones
// after the response they are writing (which says Connection: close). It
// does not wait; Wait does. Connections served afterwards answer one request
// and close.
func (s *Server) Shutdown() {
	s.mu.Lock()
	s.closing.Store(true)
	conns := make([]*conn, 0, len(s.conns))
	for c := range s.conns {
		conns = append(conns, c)
	}
	s.mu.Unlock()
	for _, c := range conns {
		c.interruptIfIdle()
	}
}

// Conns is the number of connections being served.
func (s *Server) Conns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.conns)
}

// Close closes every connection at once, cutting requests in flight.
func (s *Server) Close() {
	s.Shutdown()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.nc.Close()
	}
	s.mu.Unlock()
}

// Wait waits up to d for every connection to close and reports whether they
// did.
func (s *Server) Wait(d time.Duration) bool {
	done := make(chan struct{})
	go func() { s.active.Wait(); close(done) }()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// Eligible reports whether a request net/http has read is one the loop
// would take, so a handler may hijack its connection and pass it to
// ServeConn.
func Eligible(r *http.Request) bool {
	if !Supported || r.ProtoMajor != 1 || r.ProtoMinor != 1 || r.Close || r.TLS != nil ||
		r.ContentLength != 0 || len(r.TransferEncoding) > 0 || r.Method == http.MethodConnect {
		return false
	}
	h := r.Header
	for _, k := range [...]string{"Upgrade", "Expect", "Trailer"} {
		if _, ok := h[k]; ok {
			return false
		}
	}
	return r.Body == nil || r.Body == http.NoBody
}

// bufferSize is the size of a connection's read and write buffers, as
// net/http's; a request head must fit in the read buffer.
const bufferSize = 4 << 10

// buffers returns read and write buffers on rw, from the pools if they
// have some.
func (s *Server) buffers(rw io.ReadWriter) (*bufio.Reader, *bufio.Writer) {
	br, ok := s.readers.Get().(*bufio.Reader)
	if !ok {
		br = bufio.NewReaderSize(nil, bufferSize)
	}
	bw, ok := s.writers.Get().(*bufio.Writer)
	if !ok {
		bw = bufio.NewWriterSize(nil, bufferSize)
	}
	br.Reset(rw)
	bw.Reset(rw)
	return br, bw
}

// ServeConn serves nc until the client closes it, it idles out, a request
// or the response asks to close it, Shutdown, or a request the loop does
// not take (then HandOff gets it). br and bw are nc's buffers if the
// caller has them (a hijacked connection), else nil; first is a request
// already read from nc, to be served first (a hijacked connection), else
// nil.
func (s *Server) ServeConn(nc net.Conn, br *bufio.Reader, bw *bufio.Writer, first *http.Request) {
	// A screened connection (ScreenListener) is the loop's to screen
	// now; it reads the socket directly unless the screen holds bytes.
	if sc, ok := nc.(*ScreenConn); ok {
		if raw, ok := sc.Unscreen(); ok {
			nc = raw
		}
	}
	// A hijacked connection's buffers read and write through net/http's
	// wrappers; once nothing is left in them, pooled ones on the raw
	// socket take over (a pipelined request keeps the hijacked ones).
	if br != nil && br.Buffered() == 0 && bw.Buffered() == 0 {
		br, bw = nil, nil
	}
	pooled := br == nil
	var rw *rawio.Conn
	if pooled {
		rw = rawio.New(nc)
		br, bw = s.buffers(rw)
	}
	c := &conn{s: s, nc: nc, rw: rw, br: br, bw: bw, remote: nc.RemoteAddr().String()}
	if first != nil {
		c.remote = first.RemoteAddr
	}
	// Without a socket to peek at (no such listener in practice) a
	// departed client goes unnoticed until a write to it fails. A TLS
	// connection is peeked at through its TCP socket: the bytes waiting
	// there are records, which a departed client's close_notify may be
	// (tlsRecords; see peek).
	sock := nc
	if sc, ok := sock.(*ScreenConn); ok {
		sock = sc.Conn // the screen holds bytes: peek under it
	}
	if tc, ok := sock.(*tls.Conn); ok {
		sock, c.tlsRecords = tc.NetConn(), true
	}
	if sc, ok := sock.(syscall.Conn); ok {
		c.raw, _ = sc.SyscallConn()
	}
	c.w.c = c

	s.mu.Lock()
	if s.conns == nil {
		s.conns = map[*conn]struct{}{}
	}
	s.conns[c] = struct{}{}
	s.active.Add(1)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		s.active.Done()
	}()

	handedOff := c.serve(first)
	if pooled && !handedOff {
		br.Reset(nil)
		s.readers.Put(br)
		bw.Reset(nil)
		s.writers.Put(bw)
	}
}

// conn is one connection and the state its requests reuse.
type conn struct {
	s   *Server
	nc  net.Conn
	raw syscall.RawConn // nil: cannot peek
	// tlsRecords: nc is a *tls.Conn, raw its TCP socket, whose waiting
	// bytes are TLS records: a pipelined request or a client's
	// close_notify alert, which peek cannot tell apart (TLS 1.3 encrypts
	// the alert's type).
	tlsRecords bool
	rw         *rawio.Conn // br's and bw's, nil for a hijacked connection's buffers
	br         *bufio.Reader
	bw         *bufio.Writer
	remote     string

	// sendOnWait: the last response's final write is left to readHead,
	// which sends it as it starts to wait for the next request (see
	// responseWriter.finish).
	sendOnWait bool

	req  *http.Request // reused: see parseRequest
	url  url.URL
	rctx *requestContext
	vals []string // header values of the current request
	w    responseWriter
	// waitedAt is the clock reading readHead took before waiting for the
	// current request (for a pipelined one, an earlier request's; for the
	// request net/http read, ServeConn's). It is near enough to the
	// request's start for its context (begin), which then needs no
	// reading of its own.
	waitedAt time.Time

	// idle is true while the loop waits for a request (Shutdown may
	// interrupt it then).
	idle atomic.Bool

	// deadlineMu orders the changes of the read deadline, with rdl: the
	// loop, the client watcher, Err and Shutdown all move it.
	deadlineMu sync.Mutex
	// rdl is the read deadline set last, in Unix ns (0: none).
	// Atomic so that the loop can see without the lock that the idle
	// deadline need not move, as on nearly every request: a change made
	// under the lock after that look wins, as it would after the lock.
	rdl atomic.Int64
}

// serve is the loop; it reports whether the connection was handed off.
func (c *conn) serve(first *http.Request) (handedOff bool) {
	if first != nil {
		c.rctx = newRequestContext(first.Context(), c)
		c.waitedAt = time.Now()
		c.rctx.begin(c.waitedAt)
		c.req = first.WithContext(c.rctx)
		if !c.serveRequest() {
			c.close()
			return false
		}
	} else {
		c.rctx = newRequestContext(context.Background(), c)
		c.req = (&http.Request{Header: make(http.Header, 8)}).WithContext(c.rctx)
	}
	for {
		head, err := c.readHead()
		if err != nil {
			c.close()
			return false
		}
		if head == nil || !c.parseRequest(head) {
			c.handOff()
			return true
		}
		c.br.Discard(len(head))
		if !c.serveRequest() {
			c.close()
			return false
		}
	}
}

// handOff gives the connection, with what was read of it, to HandOff.
func (c *conn) handOff() {
	if c.s.HandOff == nil {
		c.close()
		return
	}
	// The new owner sets its own deadlines.
	c.deadlineMu.Lock()
	_ = c.nc.SetDeadline(time.Time{})
	c.rdl.Store(0)
	c.deadlineMu.Unlock()
	_ = c.bw.Flush()
	var nc net.Conn = c.nc
	if c.br.Buffered() > 0 {
		// Copy what was read: the buffer goes back to its pool.
		b, _ := c.br.Peek(c.br.Buffered())
		nc = &prefixConn{Conn: c.nc, prefix: bytes.Clone(b)}
	}
	if c.s.ScreenHeads > 0 {
		// The next byte starts a head: the loop reads whole heads.
		nc = NewScreenConn(nc, c.s.ScreenHeads)
	}
	c.s.HandOff(nc)
}

// serveRequest runs the handler for c.req and finishes its response. It
// reports whether the connection may serve another request.
func (c *conn) serveRequest() (keep bool) {
	c.w.reset(c.req)
	defer c.rctx.end()
	if !c.runHandler() {
		return false
	}
	if err := c.w.finish(); err != nil {
		return false
	}
	return !c.w.closeAfter && !c.s.closing.Load()
}

// runHandler calls the handler and reports false if it panicked (the
// response is then cut: the connection must close). http.ErrAbortHandler
// is the quiet way to do that, as with net/http.
func (c *conn) runHandler() (ok bool) {
	defer func() {
		if p := recover(); p != nil {
			ok = false
			if p != http.ErrAbortHandler && c.s.Log != nil {
				c.s.Log.Error("panic serving a request", "remote", c.remote, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			}
		}
	}()
	c.s.Handler.ServeHTTP(&c.w, c.req)
	return true
}

var errClosing = errors.New("server shutting down")

// readHead waits for the next request's head and returns it, still in the
// read buffer (nil: not for the loop: too big, or bare LF line ends).
func (c *conn) readHead() ([]byte, error) {
	if c.br.Buffered() == 0 {
		c.idle.Store(true)
		c.waitedAt = time.Now()
		c.setIdleDeadline(c.waitedAt)
		if c.s.closing.Load() {
			return nil, errClosing
		}
		if c.sendOnWait {
			c.sendOnWait = false
			if err := c.w.sendLast(true); err != nil {
				c.idle.Store(false)
				return nil, err
			}
		}
		_, err := c.br.Peek(1)
		c.idle.Store(false)
		if err != nil {
			return nil, err
		}
	}
	started := false
	for {
		buf, _ := c.br.Peek(c.br.Buffered())
		if i := bytes.Index(buf, crlfcrlf); i >= 0 {
			return buf[:i+4], nil
		}
		if c.br.Buffered() >= c.br.Size() || bytes.Contains(buf, lflf) || bytes.Contains(buf, lfcrlf) {
			return nil, nil
		}
		if !started {
			// A head in pieces: it must be complete within
			// ReadHeaderTimeout.
			started = true
			if c.s.ReadHeaderTimeout > 0 {
				c.setReadDeadline(time.Now().Add(c.s.ReadHeaderTimeout))
			}
		}
		if _, err := c.br.Peek(c.br.Buffered() + 1); err != nil {
			return nil, err
		}
	}
}

var (
	crlfcrlf = []byte("\r\n\r\n")
	lflf     = []byte("\n\n")
	lfcrlf   = []byte("\n\r\n")
)

// setIdleDeadline makes the read deadline now+IdleTimeout plus up to a
// slack (a second, or an eighth of IdleTimeout): it is moved once per slack
// at most, not per request.
func (c *conn) setIdleDeadline(now time.Time) {
	var want time.Time // zero: no deadline
	var slack time.Duration
	if c.s.IdleTimeout > 0 {
		want = now.Add(c.s.IdleTimeout)
		slack = min(time.Second, c.s.IdleTimeout/8)
	}
	if d, w := c.rdl.Load(), unixNano(want); d >= w && d <= w+int64(slack) {
		return
	}
	c.setReadDeadline(want.Add(slack))
}

// setReadDeadline sets the read deadline (t zero: none) and rdl.
func (c *conn) setReadDeadline(t time.Time) {
	c.deadlineMu.Lock()
	c.rdl.Store(unixNano(t))
	_ = c.nc.SetReadDeadline(t)
	c.deadlineMu.Unlock()
}

// unixNano is t in Unix ns, 0 for the zero time (no deadline).
func unixNano(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// interruptIfIdle wakes a loop that waits for a request (Shutdown); it
// then sees closing and closes the connection.
func (c *conn) interruptIfIdle() {
	if c.idle.Load() {
		c.setReadDeadline(pastDeadline)
	}
}

func (c *conn) close() {
	_ = c.bw.Flush()
	_ = c.nc.Close()
}

// pastDeadline makes a blocked read return at once.
var pastDeadline = time.Unix(1, 0)

// ConnQueue is a net.Listener whose connections are handed to it (Push),
// for an http.Server that serves what a Server hands off.
type ConnQueue struct {
	ch     chan net.Conn
	done   chan struct{}
	closed sync.Once
	addr   net.Addr
}

// NewConnQueue returns a queue that reports addr as its address.
func NewConnQueue(addr net.Addr) *ConnQueue {
	return &ConnQueue{ch: make(chan net.Conn), done: make(chan struct{}), addr: addr}
}

// Push hands c to Accept; once the queue is closed it closes c instead.
func (q *ConnQueue) Push(c net.Conn) {
	select {
	case q.ch <- c:
	case <-q.done:
		c.Close()
	}
}

// Accept returns the next pushed connection.
func (q *ConnQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

// Close makes Accept fail and Push close what it gets.
func (q *ConnQueue) Close() error {
	q.closed.Do(func() { close(q.done) })
	return nil
}

// Addr is the address given to NewConnQueue.
func (q *ConnQueue) Addr() net.Addr { return q.addr }

// PrefixConn returns nc with prefix read from it first: for a connection
// whose first bytes someone else read before handing it on (the sidecar's
// event loop hands connections to net/http this way). prefix is kept, not
// copied.
func PrefixConn(nc net.Conn, prefix []byte) net.Conn {
	if len(prefix) == 0 {
		return nc
	}
	return &prefixConn{Conn: nc, prefix: prefix}
}

// prefixConn replays bytes read before the hand-off.
type prefixConn struct {
	net.Conn
	prefix []byte // guarded by the reader: net/http never reads concurrently
}

func (p *prefixConn) Read(b []byte) (int, error) {
	if len(p.prefix) > 0 {
		n := copy(b, p.prefix)
		p.prefix = p.prefix[n:]
		return n, nil
	}
	return p.Conn.Read(b)
}

// NetConn returns the connection under the replayed bytes (as
// tls.Conn.NetConn does), for whoever needs to know what it is.
func (p *prefixConn) NetConn() net.Conn { return p.Conn }

// CloseWrite lets net/http half-close the connection as it does a TCP one.
func (p *prefixConn) CloseWrite() error {
	if cw, ok := p.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
