//go:build linux

package sidecar

import (
	"bufio"
	"bytes"
	"container/heap"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"golang.org/x/net/http/httpguts"
)

// loopFront serves the sidecar's plain HTTP/1.1 requests from event loops:
// N loops (N = GOMAXPROCS, one for the default reservation), each one
// goroutine with an epoll instance of its own, its own client and app
// connections, each request a state machine the loop advances as its
// sockets become ready (see docs/design-notes.md, "The sidecar's event
// loops"). Nothing of a plain request runs in a goroutine of its own, so
// the Go scheduler has no hand-off to make per request: the loop goes on
// to the next ready socket and parks (in Go's poller, see wait) only when
// none is.
//
// What a loop takes is what the keepalive loop took (HTTP/1.1, origin
// form, no body, no upgrade, expectation or trailer, nothing odd; see
// parseHead) to an HTTP/1.1 app, plus the probe header without a wait. At
// the first request it does not take, the connection, with the bytes
// already read, goes to net/http (handOff) for good, as from the keepalive
// loop. Everything else of a request the loop does itself, as the
// goroutine path does it (Handler.ServeHTTP, forwardH1), and the
// sidecar's suites run through it: the breaker (a queued request waits in
// a goroutine of its own, the only one, and is handed back to its loop),
// stats and metrics, the three timeouts, retries and NotServed, client
// departure, response framing (fixed, chunked with trailers, to EOF, 1xx),
// back-pressure (a client that does not read stops the reads from its
// app), draining and shutdown.
type loopFront struct {
	h   *Handler
	log *slog.Logger
	// lnfd is a duplicate of the listener's socket, watched by every loop
	// (EPOLLEXCLUSIVE: one loop is woken per connection).
	lnfd  int
	loops []*evloop
	// handOff gives a connection and the bytes read of it to net/http.
	handOff func(nc net.Conn, prefix []byte)
	// As net/http's: the wait for a request after the previous one, and
	// for the rest of a head that came in pieces (or the first one).
	idleTimeout, headerTimeout time.Duration

	app     syscall.Sockaddr
	appNet  *net.TCPAddr
	appFam  int
	maxIdle int

	closing atomic.Bool // Shutdown: idle connections close, busy ones after their response
	killing atomic.Bool // Close: everything closes now
	done    chan struct{}
	running sync.WaitGroup

	// served and handed count requests the loops answered and connections
	// they gave to net/http: what the tests check the loop took.
	served, handed atomic.Uint64
	// pauses counts the times a client's backlog stopped the reads from
	// its app, and maxBacklog is the largest backlog seen then: the
	// back-pressure test's proof that it engaged and that it bounds what
	// a slow reader costs.
	pauses     atomic.Uint64
	maxBacklog atomic.Int64
}

// errNoLoop says the event loops cannot serve this sidecar; the keepalive
// goroutine path does.
var errNoLoop = errors.New("event loops not available")

// epollExclusive is EPOLLEXCLUSIVE, which package syscall does not name.
const epollExclusive = 1 << 28

// appDialTimeout bounds a connect to the app, as the goroutine path's
// dialer.
const appDialTimeout = 5 * time.Second

// appIdleTimeout is how long an idle app connection is kept.
const appIdleTimeout = 90 * time.Second

// maxLoopHead is the largest request head the loop reads; a bigger one
// goes to net/http (which takes up to MaxHeaderBytes), as from the
// keepalive loop, whose read buffer is this size.
const maxLoopHead = 4 << 10

func newLoopFront(ln net.Listener, h *Handler, srv *http.Server, log *slog.Logger, handOff func(net.Conn, []byte)) (*loopFront, error) {
	if h.h2cApp || h.tracing != nil {
		// Traced requests keep the goroutine path, which makes their
		// spans (the loop does not trace yet).
		return nil, errNoLoop
	}
	sc, ok := ln.(syscall.Conn)
	if !ok {
		return nil, errNoLoop
	}
	addr, err := net.ResolveTCPAddr("tcp", h.appAddr)
	if err != nil {
		return nil, fmt.Errorf("resolve the app's address %s: %w", h.appAddr, err)
	}
	f := &loopFront{
		h: h, log: log, lnfd: -1, handOff: handOff,
		idleTimeout: srv.IdleTimeout, headerTimeout: srv.ReadHeaderTimeout,
		appNet: addr, maxIdle: maxIdleConns(h.cfg), done: make(chan struct{}),
	}
	if ip4 := addr.IP.To4(); ip4 != nil {
		sa := &syscall.SockaddrInet4{Port: addr.Port}
		copy(sa.Addr[:], ip4)
		f.app, f.appFam = sa, syscall.AF_INET
	} else {
		sa := &syscall.SockaddrInet6{Port: addr.Port}
		copy(sa.Addr[:], addr.IP.To16())
		f.app, f.appFam = sa, syscall.AF_INET6
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, errNoLoop
	}
	var derr error
	if cerr := rc.Control(func(fd uintptr) {
		r, _, e := syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_DUPFD_CLOEXEC, 0)
		if e != 0 {
			derr = e
			return
		}
		f.lnfd = int(r)
	}); cerr != nil || derr != nil {
		return nil, fmt.Errorf("duplicate the listener: %w", errors.Join(cerr, derr))
	}
	for range max(runtime.GOMAXPROCS(0), 1) {
		l, err := newEvloop(f)
		if err != nil {
			for _, l := range f.loops {
				l.closeFDs()
			}
			syscall.Close(f.lnfd)
			return nil, err
		}
		f.loops = append(f.loops, l)
	}
	return f, nil
}

// serve runs the loops until Shutdown has let every connection close, or
// Close.
func (f *loopFront) serve() {
	for _, l := range f.loops {
		f.running.Add(1)
		go func() { defer f.running.Done(); l.run() }()
	}
	f.running.Wait()
	syscall.Close(f.lnfd)
	close(f.done)
}

// shutdown stops accepting: idle connections close at once, busy ones
// after their response (which says Connection: close).
func (f *loopFront) shutdown() {
	f.closing.Store(true)
	f.wakeAll()
}

// close cuts every connection.
func (f *loopFront) close() {
	f.closing.Store(true)
	f.killing.Store(true)
	f.wakeAll()
}

// wait waits up to d for the loops to end and reports whether they did.
func (f *loopFront) wait(d time.Duration) bool {
	t := time.NewTimer(max(d, 0))
	defer t.Stop()
	select {
	case <-f.done:
		return true
	case <-t.C:
		return false
	}
}

func (f *loopFront) wakeAll() {
	for _, l := range f.loops {
		l.wake()
	}
}

// evloop is one loop: its epoll instance, its sockets and its timers. All
// of its state is its thread's; other goroutines reach it only through
// post (breaker grants) and wake (shutdown), under mu.
type evloop struct {
	f *loopFront
	// app is this loop's copy of the app's address: syscall.Connect
	// writes into a Sockaddr's raw form, so loops may not share one.
	app syscall.Sockaddr

	h       *Handler
	ep      int
	wakeR   int
	wakeW   int
	socks   map[int]*lsock
	clients int
	timers  timerHeap
	idleApp []*lsock // LIFO, as appClient's pool
	events  [128]syscall.EpollEvent
	buf     [64 << 10]byte
	scratch []byte // a chunked body's data (decodeChunks)
	// dateText is the Date header's value for the second dateSec.
	dateSec  int64
	dateText []byte
	// reqw writes a request head into reqBuf through writeRequestHead,
	// which the goroutine path uses too: the app sees the same head
	// either way.
	reqBuf appendWriter
	reqw   *bufio.Writer
	req    http.Request
	listen bool

	grants []*ticket // slots this loop handed its own waiters (release)
	// epf is ep as a file in Go's poller and epc its raw connection (see
	// wait); waitUntil is the read deadline set on it (Unix ns, 0: none).
	epf       *os.File
	epc       syscall.RawConn
	waitUntil int64
	pollFn    func(uintptr) bool
	pollN     int
	pollErr   error

	mu      sync.Mutex
	posted  []*ticket
	stopped bool // the loop has returned: its pipe is closed
}

// appendWriter collects what is written to it.
type appendWriter struct{ b []byte }

func (w *appendWriter) Write(p []byte) (int, error) { w.b = append(w.b, p...); return len(p), nil }

func newEvloop(f *loopFront) (*evloop, error) {
	l := &evloop{f: f, h: f.h, ep: -1, wakeR: -1, wakeW: -1, socks: map[int]*lsock{}}
	switch sa := f.app.(type) {
	case *syscall.SockaddrInet4:
		c := *sa
		l.app = &c
	case *syscall.SockaddrInet6:
		c := *sa
		l.app = &c
	}
	l.pollFn = l.poll
	l.reqw = bufio.NewWriterSize(&l.reqBuf, 4<<10)
	var err error
	if l.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, fmt.Errorf("epoll_create: %w", err)
	}
	// Non-blocking, so that NewFile puts it in Go's poller (see wait).
	if err = syscall.SetNonblock(l.ep, true); err != nil {
		syscall.Close(l.ep)
		return nil, fmt.Errorf("epoll instance: %w", err)
	}
	l.epf = os.NewFile(uintptr(l.ep), "sidecar-evloop")
	if l.epc, err = l.epf.SyscallConn(); err != nil {
		l.epf.Close()
		return nil, fmt.Errorf("epoll instance: %w", err)
	}
	var p [2]int
	if err = syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		l.closeFDs()
		return nil, fmt.Errorf("pipe: %w", err)
	}
	l.wakeR, l.wakeW = p[0], p[1]
	if err = l.ctl(syscall.EPOLL_CTL_ADD, l.wakeR, syscall.EPOLLIN); err != nil {
		l.closeFDs()
		return nil, err
	}
	if err = l.ctl(syscall.EPOLL_CTL_ADD, f.lnfd, syscall.EPOLLIN|epollExclusive); err != nil {
		l.closeFDs()
		return nil, err
	}
	l.listen = true
	return l, nil
}

func (l *evloop) ctl(op, fd int, events uint32) error {
	if err := syscall.EpollCtl(l.ep, op, fd, &syscall.EpollEvent{Events: events, Fd: int32(fd)}); err != nil {
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
}

func (l *evloop) closeFDs() {
	l.mu.Lock()
	l.stopped = true
	l.mu.Unlock()
	if l.epf != nil {
		_ = l.epf.Close() // closes ep
	} else if l.ep >= 0 {
		syscall.Close(l.ep)
	}
	for _, fd := range []int{l.wakeR, l.wakeW} {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

// wake makes the loop look at its flags and posted grants.
func (l *evloop) wake() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.stopped {
		var b [1]byte
		_, _ = syscall.Write(l.wakeW, b[:])
	}
}

// ticket is a request waiting in the breaker's queue. When a slot is
// handed to it, it comes back to its loop: through grants when the loop
// itself released the slot (ReleaseNext), through post and the pipe when
// another goroutine did (a request net/http serves). It comes back exactly
// once if it was handed a slot, never if Cancel took it out of line.
type ticket struct {
	l         *evloop
	c         *lsock
	w         *Waiter
	abandoned bool // the request ended (timeout, client gone) while it waited
}

func (l *evloop) post(t *ticket) {
	l.mu.Lock()
	if l.stopped {
		// The loop ended every request before it returned: this one was
		// abandoned, and the slot handed to it goes on.
		l.mu.Unlock()
		l.h.breaker.Recycle(t.w)
		l.h.breaker.Release()
		return
	}
	l.posted = append(l.posted, t)
	var b [1]byte
	_, _ = syscall.Write(l.wakeW, b[:])
	l.mu.Unlock()
}

// release gives back a breaker slot; a waiter of this loop's that gets it
// is granted in this loop's next turn, without a wake-up.
func (l *evloop) release() {
	w := l.h.breaker.ReleaseNext()
	if w == nil {
		return
	}
	if t, ok := w.Tag.(*ticket); ok && t.l == l {
		l.grants = append(l.grants, t)
		return
	}
	w.Notify()
}

// runGrants takes the slots this loop handed itself.
func (l *evloop) runGrants() {
	for i := 0; i < len(l.grants); i++ {
		t := l.grants[i]
		l.grants[i] = nil
		l.granted(t)
	}
	l.grants = l.grants[:0]
}

// run is the loop. It returns once Shutdown has let every connection go,
// or at Close.
func (l *evloop) run() {
	defer l.closeFDs()
	for {
		if l.f.killing.Load() {
			l.killAll()
			return
		}
		if l.f.closing.Load() {
			l.startClosing()
			if l.clients == 0 {
				l.closeIdleApp()
				return
			}
		}
		n, err := l.wait()
		if err != nil {
			l.f.log.Error("sidecar event loop stopped", "error", err)
			l.killAll()
			return
		}
		for i := range max(n, 0) {
			ev := l.events[i]
			fd := int(ev.Fd)
			switch {
			case fd == l.wakeR:
				l.drainWake()
			case fd == l.f.lnfd:
				l.accept()
			default:
				if s := l.socks[fd]; s != nil {
					if s.app {
						l.onApp(s, ev.Events)
					} else {
						l.onClient(s, ev.Events)
					}
				}
			}
		}
		// Requests handed a slot in this turn go to the app together, after
		// the turn's events: the app finds them at once, as it finds the
		// requests of the turn's ready clients (one wake-up of the app for
		// several requests, not one each).
		l.runGrants()
		l.fireTimers()
		l.runGrants()
	}
}

// wait returns the events ready now; when none is, it parks the loop's
// goroutine in Go's network poller, which watches the loop's epoll
// instance itself (an epoll descriptor is readable while it has events),
// until one is or the earliest timer is due.
//
// Why not a blocking epoll_wait on a locked thread: with one P (the
// sidecar's default), a thread blocked in a system call keeps its P until
// the runtime's monitor takes it back, after 20 µs to 10 ms, and
// meanwhile nothing else of the sidecar runs (the requests net/http serves,
// probes, stats). BenchmarkServe, whose client and app share the process,
// took 266 µs a request that way against the keepalive loop's 23 µs.
// Parked in the poller, the goroutine gives its P up at once, and under
// load it rarely parks: the first look (a raw epoll_wait that does not
// wait, which the scheduler need not be told of) finds events.
func (l *evloop) wait() (int, error) {
	at := int64(0)
	if len(l.timers) > 0 {
		at = l.timers[0].timerAt
	}
	if at != l.waitUntil {
		l.waitUntil = at
		t := time.Time{}
		if at != 0 {
			t = time.Unix(0, at)
		}
		if err := l.epf.SetReadDeadline(t); err != nil {
			return 0, fmt.Errorf("set the loop's deadline: %w", err)
		}
	}
	l.pollN, l.pollErr = 0, nil
	err := l.epc.Read(l.pollFn)
	n, werr := l.pollN, l.pollErr
	switch {
	case werr != nil:
		return 0, fmt.Errorf("epoll_wait: %w", werr)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return 0, nil // a timer is due
	case err != nil:
		return 0, fmt.Errorf("wait for the loop's events: %w", err)
	}
	return n, nil
}

// poll is wait's look at the epoll instance (bound once to pollFn, so a
// wait allocates nothing); false makes the poller wait for readiness.
func (l *evloop) poll(uintptr) bool {
	l.pollN, l.pollErr = rawEpollWait(l.ep, l.events[:])
	return l.pollN > 0 || l.pollErr != nil
}

func (l *evloop) drainWake() {
	for {
		if n, _ := syscall.Read(l.wakeR, l.buf[:64]); n <= 0 {
			break
		}
	}
	l.mu.Lock()
	posted := l.posted
	l.posted = nil
	l.mu.Unlock()
	for _, t := range posted {
		l.granted(t)
	}
	l.runGrants()
}

// startClosing stops accepting and closes the idle client connections;
// the busy ones close after their response.
func (l *evloop) startClosing() {
	if l.listen {
		l.listen = false
		_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, l.f.lnfd, nil)
	}
	for _, s := range l.socks {
		if !s.app && !s.busy && len(s.out) == 0 {
			l.closeClient(s)
		}
	}
}

// killAll cuts every connection; requests in flight end as if their
// clients had gone.
func (l *evloop) killAll() {
	for _, s := range l.socks {
		if !s.app && s.busy {
			l.abandon(s, statusClientClosed)
		}
	}
	l.runGrants() // slots handed to the abandoned go back
	for _, s := range l.socks {
		l.closeSock(s)
	}
	l.idleApp = nil
	if l.listen {
		l.listen = false
		_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, l.f.lnfd, nil)
	}
}

func (l *evloop) closeIdleApp() {
	for _, a := range l.idleApp {
		l.closeSock(a)
	}
	l.idleApp = nil
}

// lsock is one socket of a loop: a client's connection or one to the app.
type lsock struct {
	fd     int
	app    bool
	closed bool
	events uint32 // epoll interest set
	in     []byte // read, not used yet
	out    []byte // to write; out[sent:] is not written yet
	sent   int

	// The socket's timer (timerHeap): at timerAt (Unix ns), index in the
	// heap (-1: not armed).
	timerAt  int64
	timerIdx int

	// Client side.
	remote, clientIP string
	hdr              http.Header // the request's, reused
	rhdr             http.Header // the response's, reused
	vals             []string
	busy             bool // a request is in flight (r)
	closeAfter       bool
	headTimed        bool   // the timer bounds a head that started coming
	pausedApp        *lsock // whose reads wait for out to drain
	r                lreq

	// App side.
	client     *lsock // the client it serves; nil while idle
	connecting bool
	dialAt     time.Time
	idleSince  time.Time
}

// Response body framings.
const (
	frameNone = iota
	frameFixed
	frameChunked
	frameEOF
)

// Chunked decoding states.
const (
	chunkSize = iota
	chunkData
	chunkDataEnd
	chunkTrailers
	chunkDone
)

// lreq is a client's request in flight: the state the goroutine path
// keeps in its exchange and on its stack.
type lreq struct {
	start, dispatched time.Time
	tracked, slot     bool
	ticket            *ticket
	method, target    string
	path              string // for the access log
	close             bool
	head              []byte // the request as the app gets it
	replayable        bool
	attempt           int
	written, wrote    bool // some attempt / this attempt wrote a byte to the app
	reused            bool // this attempt's connection was pooled
	gotResponse       bool
	app               *lsock
	headSent          bool
	status            int
	bytes             int64
	isHead            bool
	frame             int
	left              int64 // fixed: body left; chunked: left of the chunk
	chunkState        int
	trailers          []byte
	chunkedOut        bool
	lastWrite         time.Time
	expired           *timeoutError
}

func (l *evloop) accept() {
	for {
		fd, sa, err := syscall.Accept4(l.f.lnfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			// EAGAIN, or out of descriptors and the like: the listener
			// stays readable and the next wake-up retries.
			return
		}
		c := &lsock{fd: fd, timerIdx: -1, hdr: make(http.Header, 8), rhdr: make(http.Header, 8)}
		switch a := sa.(type) {
		case *syscall.SockaddrInet4:
			c.remote = (&net.TCPAddr{IP: a.Addr[:], Port: a.Port}).String()
		case *syscall.SockaddrInet6:
			c.remote = (&net.TCPAddr{IP: a.Addr[:], Port: a.Port}).String()
		}
		c.clientIP = h1.ClientIP(c.remote)
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		c.events = syscall.EPOLLIN | syscall.EPOLLRDHUP
		if l.ctl(syscall.EPOLL_CTL_ADD, fd, c.events) != nil {
			syscall.Close(fd)
			continue
		}
		l.socks[fd] = c
		l.clients++
		if l.f.closing.Load() {
			c.closeAfter = true
		}
		l.armHeadTimer(c, true)
	}
}

// setEvents changes s's epoll interest.
func (l *evloop) setEvents(s *lsock, events uint32) {
	if s.events == events || s.closed {
		return
	}
	s.events = events
	if l.ctl(syscall.EPOLL_CTL_MOD, s.fd, events) != nil {
		// Only a closed descriptor fails here; its owner is ending.
		s.events = 0
	}
}

// closeSock closes s (epoll forgets it with its last descriptor).
func (l *evloop) closeSock(s *lsock) {
	if s.closed {
		return
	}
	s.closed = true
	l.disarm(s)
	delete(l.socks, s.fd)
	syscall.Close(s.fd)
	if !s.app {
		l.clients--
	}
}

func (l *evloop) closeClient(c *lsock) {
	if c.pausedApp != nil {
		c.pausedApp = nil
	}
	l.closeSock(c)
}

// ---- client side ----

func (l *evloop) onClient(c *lsock, ev uint32) {
	if ev&syscall.EPOLLOUT != 0 {
		if !l.flushClient(c) {
			return
		}
	}
	if ev&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) == 0 {
		return
	}
	n, err := rawRead(c.fd, l.buf[:])
	if errors.Is(err, syscall.EAGAIN) {
		return
	}
	if n <= 0 {
		// The client left (or failed): a request in flight ends as
		// net/http ends one whose client's connection closed.
		if c.busy {
			l.abandon(c, statusClientClosed)
		}
		l.closeClient(c)
		return
	}
	c.in = append(c.in, l.buf[:n]...)
	if c.busy {
		// A pipelined request, kept for when this one is answered. The
		// client stays watched for reading (no epoll_ctl per request), so
		// its departure is seen at once; only a client that pipelines
		// more than a head's worth is not read further meanwhile.
		if len(c.in) >= maxLoopHead {
			l.setEvents(c, c.events&^syscall.EPOLLIN)
		}
		return
	}
	l.nextRequest(c)
}

// nextRequest starts the request at the front of c.in, if its head is
// complete and the previous response has left.
func (l *evloop) nextRequest(c *lsock) {
	if c.busy || len(c.out) > 0 || c.closed {
		return
	}
	if len(c.in) == 0 {
		if c.closeAfter {
			l.closeClient(c)
			return
		}
		l.armHeadTimer(c, false)
		return
	}
	end, ok := requestHeadEnd(c.in)
	if !ok {
		l.handOff(c) // bare LF line ends: net/http's to read
		return
	}
	if end < 0 {
		if len(c.in) >= maxLoopHead {
			l.handOff(c)
			return
		}
		l.armHeadTimer(c, true)
		return
	}
	if !l.parseHead(c, c.in[:end]) {
		l.handOff(c)
		return
	}
	c.in = c.in[:copy(c.in, c.in[end:])]
	c.headTimed = false
	l.f.served.Add(1)
	l.begin(c)
}

// requestHeadEnd is where the head at the start of b ends (after its blank
// line), -1 while incomplete; ok is false for a head with bare LF line
// ends, which the loop leaves to net/http.
func requestHeadEnd(b []byte) (end int, ok bool) {
	i := bytes.IndexByte(b, '\n')
	for i >= 0 {
		if i == 0 || b[i-1] != '\r' {
			return -1, false
		}
		rest := b[i+1:]
		if len(rest) >= 2 && rest[0] == '\r' && rest[1] == '\n' {
			return i + 3, true
		}
		if len(rest) == 1 && rest[0] == '\r' || len(rest) == 0 {
			return -1, true
		}
		if rest[0] == '\n' {
			return -1, false
		}
		j := bytes.IndexByte(rest, '\n')
		if j < 0 {
			return -1, true
		}
		i += 1 + j
	}
	return -1, true
}

// parseHead reads a request head into c.hdr and c.r. It takes what the
// keepalive loop takes (keepalive's parseRequest, whose rules it follows):
// an HTTP/1.1 request in origin form with one valid Host, no body, no
// Upgrade, Expect or Trailer, no folded or invalid lines. Besides, a probe
// that asks to wait is net/http's (it is held in a goroutine; rare).
func (l *evloop) parseHead(c *lsock, head []byte) bool {
	text := string(head[:len(head)-2])
	line, rest, _ := strings.Cut(text, "\r\n")
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !h1.ValidMethod(method) || method == http.MethodConnect ||
		len(target) == 0 || target[0] != '/' {
		return false
	}
	hdr := c.hdr
	host, closeConn, vals, ok := h1.ParseSimpleHeaders(rest, hdr, c.vals)
	c.vals = vals
	if !ok {
		return false
	}
	if _, ok := hdr[probeWaitHeader]; ok {
		if v := hdr[probeHeader]; len(v) == 1 && v[0] == spec.ProbeHeaderValue {
			return false
		}
	}
	path, simple := simplePath(target)
	if !simple {
		u, err := url.ParseRequestURI(target)
		if err != nil {
			return false
		}
		path = u.Path
	}
	r := &c.r
	r.method, r.target, r.path, r.close = method, target, path, closeConn
	r.isHead = method == http.MethodHead
	// The request writeRequestHead reads (hdr is c's).
	q := &l.req
	q.Method, q.RequestURI, q.Host, q.RemoteAddr, q.Header = method, target, host, c.remote, hdr
	q.ContentLength, q.Trailer = 0, nil
	l.reqw.Reset(&l.reqBuf)
	l.reqBuf.b = r.head[:0]
	writeRequestHead(l.reqw, q, l.h.appAddr, false)
	_ = l.reqw.Flush()
	r.head = l.reqBuf.b
	l.reqBuf.b = nil
	return true
}

// simplePath returns target's path when it is made only of bytes
// url.ParseRequestURI keeps as they are (keepalive's parseSimpleTarget).
func simplePath(target string) (string, bool) {
	path, query, _ := strings.Cut(target, "?")
	for i := 0; i < len(path); i++ {
		if !h1.SimplePathByte(path[i]) {
			return "", false
		}
	}
	for i := 0; i < len(query); i++ {
		if c := query[i]; c <= ' ' || c >= 0x7f || c == '#' || c == '?' {
			return "", false
		}
	}
	return path, true
}

// handOff gives c, with what was read of it, to net/http.
func (l *evloop) handOff(c *lsock) {
	l.disarm(c)
	_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, c.fd, nil)
	delete(l.socks, c.fd)
	l.clients--
	c.closed = true
	// FileConn takes a duplicate and gives it to Go's poller.
	file := os.NewFile(uintptr(c.fd), "client")
	nc, err := net.FileConn(file)
	_ = file.Close()
	if err != nil {
		return
	}
	l.f.handed.Add(1)
	l.f.handOff(nc, bytes.Clone(c.in))
}

// ---- requests ----

// begin starts c's request: a probe is answered here; anything else goes
// through the breaker to the app.
func (l *evloop) begin(c *lsock) {
	h := l.h
	r := &c.r
	hdr := c.hdr
	if v := hdr[probeHeader]; len(v) == 1 && v[0] == spec.ProbeHeaderValue {
		l.answerProbe(c)
		return
	}
	now := time.Now()
	r.start, r.dispatched = now, time.Time{}
	r.tracked = h.meter.begin(now)
	r.slot, r.ticket = false, nil
	r.replayable = h1.Replayable(r.method)
	r.attempt, r.written, r.wrote, r.reused, r.gotResponse = 0, false, false, false, false
	r.app, r.headSent, r.status, r.bytes = nil, false, 0, 0
	r.frame, r.left, r.chunkState, r.trailers, r.chunkedOut = frameNone, 0, chunkSize, r.trailers[:0], false
	r.expired = nil
	c.busy = true
	if b := h.breaker; b != nil {
		if b.TryAcquire() {
			r.slot = true
		} else {
			t := &ticket{l: l, c: c}
			w, err := b.EnqueueFunc(func() { l.post(t) }, t)
			switch {
			case err != nil:
				h.metrics.rejections.Inc()
				l.sidecarError(c, http.StatusServiceUnavailable, h.queueFullBody, false)
				return
			case w == nil:
				r.slot = true
			default:
				t.w = w
				r.ticket = t
				l.armRequestTimer(c)
				return
			}
		}
	}
	l.dispatch(c)
}

// granted takes a ticket back from its goroutine.
func (l *evloop) granted(t *ticket) {
	l.h.breaker.Recycle(t.w)
	if t.abandoned {
		l.release() // handed a slot as the request ended
		return
	}
	c := t.c
	c.r.ticket, c.r.slot = nil, true
	l.dispatch(c)
}

func (l *evloop) dispatch(c *lsock) {
	c.r.dispatched = time.Now()
	l.armRequestTimer(c)
	l.sendToApp(c)
}

// sendToApp sends c's request on a pooled connection or a new one (a
// retry always dials).
func (l *evloop) sendToApp(c *lsock) {
	r := &c.r
	r.wrote, r.reused = false, false
	var a *lsock
	if r.attempt == 0 {
		a = l.pooled(!r.replayable)
	}
	if a != nil {
		r.reused = true
		l.attach(c, a)
		l.writeApp(a)
		return
	}
	a, err := l.dial()
	if err != nil {
		l.appFailed(c, err, true)
		return
	}
	l.attach(c, a)
	if !a.connecting {
		l.writeApp(a)
	}
}

func (l *evloop) attach(c, a *lsock) {
	c.r.app = a
	a.client = c
	a.out, a.sent = append(a.out[:0], c.r.head...), 0
	a.in = a.in[:0]
}

// pooled returns the most recently used idle connection to the app that
// is still fit, or nil. check: the request may not be sent twice, so a
// connection the app may have closed meanwhile is not used (a peek, as
// rawio.Quiet does for the goroutine path).
func (l *evloop) pooled(check bool) *lsock {
	now := time.Now()
	for len(l.idleApp) > 0 {
		a := l.idleApp[len(l.idleApp)-1]
		l.idleApp = l.idleApp[:len(l.idleApp)-1]
		if now.Sub(a.idleSince) > appIdleTimeout {
			l.closeSock(a)
			continue
		}
		if check {
			_, _, err := syscall.Recvfrom(a.fd, l.buf[:1], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if !errors.Is(err, syscall.EAGAIN) {
				l.closeSock(a)
				continue
			}
		}
		return a
	}
	return nil
}

// dial starts a connection to the app.
func (l *evloop) dial() (*lsock, error) {
	fd, err := syscall.Socket(l.f.appFam, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, l.dialError(err)
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	a := &lsock{fd: fd, app: true, timerIdx: -1, dialAt: time.Now()}
	err = syscall.Connect(fd, l.app)
	switch {
	case err == nil:
		a.events = syscall.EPOLLIN | syscall.EPOLLRDHUP
	case errors.Is(err, syscall.EINPROGRESS):
		a.connecting = true
		a.events = syscall.EPOLLOUT
	default:
		syscall.Close(fd)
		return nil, l.dialError(err)
	}
	if err := l.ctl(syscall.EPOLL_CTL_ADD, fd, a.events); err != nil {
		syscall.Close(fd)
		return nil, l.dialError(err)
	}
	l.socks[fd] = a
	return a, nil
}

// dialError is err as net.Dial reports it, so the 502's text, the log and
// unreached read the same as on the goroutine path.
func (l *evloop) dialError(err error) error {
	if errno, ok := err.(syscall.Errno); ok {
		err = os.NewSyscallError("connect", errno)
	}
	return &net.OpError{Op: "dial", Net: "tcp", Addr: l.f.appNet, Err: err}
}

// writeApp writes what a has to write.
func (l *evloop) writeApp(a *lsock) {
	c := a.client
	for a.sent < len(a.out) {
		n, err := rawWrite(a.fd, a.out[a.sent:])
		if n > 0 {
			a.sent += n
			c.r.wrote, c.r.written = true, true
		}
		if errors.Is(err, syscall.EAGAIN) {
			l.setEvents(a, syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLOUT)
			return
		}
		if err != nil {
			l.appBroke(a, os.NewSyscallError("write", err.(syscall.Errno)))
			return
		}
	}
	a.out, a.sent = a.out[:0], 0
	l.setEvents(a, syscall.EPOLLIN|syscall.EPOLLRDHUP)
}

// ---- app side ----

func (l *evloop) onApp(a *lsock, ev uint32) {
	c := a.client
	if c == nil {
		// Idle: the app closed it, or sent what nobody asked for.
		l.dropIdle(a)
		return
	}
	if a.connecting {
		if ev&(syscall.EPOLLOUT|syscall.EPOLLERR|syscall.EPOLLHUP) == 0 {
			return
		}
		a.connecting = false
		errno, err := syscall.GetsockoptInt(a.fd, syscall.SOL_SOCKET, syscall.SO_ERROR)
		if err == nil && errno != 0 {
			err = syscall.Errno(errno)
		}
		if err != nil {
			l.closeSock(a)
			c.r.app = nil
			l.appFailed(c, l.dialError(err), true)
			return
		}
		l.writeApp(a)
		return
	}
	if ev&syscall.EPOLLOUT != 0 && len(a.out) > 0 {
		l.writeApp(a)
		if a.closed {
			return
		}
	}
	if ev&(syscall.EPOLLIN|syscall.EPOLLRDHUP|syscall.EPOLLHUP|syscall.EPOLLERR) == 0 {
		return
	}
	n, err := rawRead(a.fd, l.buf[:])
	if errors.Is(err, syscall.EAGAIN) {
		return
	}
	if n < 0 || err != nil {
		l.appBroke(a, os.NewSyscallError("read", err.(syscall.Errno)))
		return
	}
	if n == 0 {
		l.appEOF(a)
		return
	}
	c.r.gotResponse = true
	a.in = append(a.in, l.buf[:n]...)
	l.relay(a, false)
}

func (l *evloop) dropIdle(a *lsock) {
	for i, x := range l.idleApp {
		if x == a {
			l.idleApp = append(l.idleApp[:i], l.idleApp[i+1:]...)
			break
		}
	}
	l.closeSock(a)
}

// appEOF: the app closed its side.
func (l *evloop) appEOF(a *lsock) {
	c := a.client
	r := &c.r
	if r.headSent && r.frame == frameEOF {
		l.relay(a, true)
		return
	}
	if !r.gotResponse {
		l.appBroke(a, errAppClosed)
		return
	}
	if r.headSent {
		l.appBroke(a, io.ErrUnexpectedEOF)
		return
	}
	// A head cut short.
	l.appBroke(a, fmt.Errorf("%w: %v", errBadResponse, io.ErrUnexpectedEOF))
}

// appBroke ends a's exchange with err: sent again once when nothing came
// back (forwardH1's rule), else a 502 before the response started, or a
// cut client connection after.
func (l *evloop) appBroke(a *lsock, err error) {
	c := a.client
	r := &c.r
	l.closeSock(a)
	a.client, r.app = nil, nil
	if c.pausedApp == a {
		c.pausedApp = nil
	}
	if !r.gotResponse && r.attempt == 0 && (r.replayable || r.reused && !r.wrote) {
		r.attempt++
		l.sendToApp(c)
		return
	}
	if r.headSent {
		l.cut(c)
		return
	}
	l.appFailed(c, err, !r.gotResponse && (!r.written || r.replayable))
}

// cut ends a response that started and cannot finish: the client's
// connection closes without ending it.
func (l *evloop) cut(c *lsock) {
	_ = l.flushClient(c)
	l.finish(c)
	l.closeClient(c)
}

// appFailed answers a request whose exchange with the app failed before
// the response started (Handler.appFailed).
func (l *evloop) appFailed(c *lsock, err error, notServed bool) {
	h := l.h
	if h.appRefused != nil && errors.Is(err, syscall.ECONNREFUSED) {
		h.appRefused()
	}
	now := time.Now().UnixNano()
	if last := h.lastProxyErrLog.Load(); now-last > int64(time.Second) && h.lastProxyErrLog.CompareAndSwap(last, now) {
		h.log.Warn("request to the app failed", "app", h.appAddr, "path", c.r.path, "error", err, "not_served", notServed)
	}
	l.sidecarError(c, http.StatusBadGateway, []byte("nomad-serverless: the app on "+h.appAddr+
		" did not answer: "+err.Error()+"\n"), notServed)
}

// relay passes on what the app sent: heads once complete, body bytes as
// they come. eof: the app closed its side (a body framed by that).
func (l *evloop) relay(a *lsock, eof bool) {
	c := a.client
	r := &c.r
	for !r.headSent {
		if !l.responseHead(a) {
			return
		}
	}
	var body []byte
	switch r.frame {
	case frameFixed:
		n := min(int64(len(a.in)), r.left)
		body, r.left = a.in[:n], r.left-n
	case frameEOF:
		body = a.in
	case frameChunked:
		var ok bool
		if body, ok = l.decodeChunks(a); !ok {
			return
		}
	}
	if len(body) > 0 {
		r.bytes += int64(len(body))
		if r.chunkedOut {
			c.out = strconv.AppendInt(c.out, int64(len(body)), 16)
			c.out = append(c.out, "\r\n"...)
			c.out = append(c.out, body...)
			c.out = append(c.out, "\r\n"...)
		} else {
			c.out = append(c.out, body...)
		}
		if l.h.cfg.IdleTimeout > 0 {
			r.lastWrite = time.Now()
		}
	}
	if r.frame != frameChunked {
		// Consumed now that it is copied.
		a.in = a.in[:copy(a.in, a.in[len(body):])]
	}
	complete := r.frame == frameNone || r.frame == frameFixed && r.left == 0 ||
		r.frame == frameChunked && r.chunkState == chunkDone || r.frame == frameEOF && eof
	if complete {
		l.complete(c, a)
		return
	}
	if !l.flushClient(c) {
		return
	}
	if len(c.out) > 0 && c.pausedApp == nil {
		// The client does not keep up: its app waits (back-pressure).
		c.pausedApp = a
		l.setEvents(a, 0)
		l.f.pauses.Add(1)
		if n := int64(len(c.out) - c.sent); n > l.f.maxBacklog.Load() {
			l.f.maxBacklog.Store(n)
		}
	}
}

// responseHead consumes one response head from a.in when complete; false
// while it is not (or the exchange failed).
func (l *evloop) responseHead(a *lsock) bool {
	c := a.client
	r := &c.r
	end := responseHeadEnd(a.in)
	if end < 0 {
		if len(a.in) > maxResponseHead {
			l.appBroke(a, fmt.Errorf("%w: header larger than %d bytes", errBadResponse, maxResponseHead))
		}
		return false
	}
	head := a.in[:end]
	nl := bytes.IndexByte(head, '\n')
	line := head[:nl+1]
	if len(line) < 12 || string(line[:7]) != "HTTP/1." || line[8] != ' ' || (len(line) > 12 && line[12] != ' ' && line[12] != '\r' && line[12] != '\n') {
		l.appBroke(a, fmt.Errorf("%w: status line %q", errBadResponse, trimLine(line)))
		return false
	}
	code := 0
	for _, ch := range line[9:12] {
		if ch < '0' || ch > '9' {
			l.appBroke(a, fmt.Errorf("%w: status line %q", errBadResponse, trimLine(line)))
			return false
		}
		code = code*10 + int(ch-'0')
	}
	if code < 100 {
		l.appBroke(a, fmt.Errorf("%w: status %d", errBadResponse, code))
		return false
	}
	http11 := line[7] == '1'
	block := string(head[nl+1:])
	hd := c.rhdr
	clear(hd)
	info, err := parseResponseHeader(block, hd)
	a.in = a.in[:copy(a.in, a.in[end:])]
	if err != nil {
		clear(hd)
		l.appBroke(a, err)
		return false
	}
	if code >= 100 && code < 200 {
		if code == http.StatusSwitchingProtocols {
			l.appBroke(a, fmt.Errorf("%w: 101 Switching Protocols to a request that asked for no upgrade", errBadResponse))
			return false
		}
		if code != http.StatusContinue {
			writeStatusLine(&c.out, code)
			for k, vv := range hd {
				if k == "Content-Length" || k == "Transfer-Encoding" || strings.HasPrefix(k, http.TrailerPrefix) {
					continue
				}
				writeField(&c.out, k, vv)
			}
			c.out = append(c.out, "\r\n"...)
			if !l.flushClient(c) {
				return false
			}
		}
		return true
	}
	// The final head.
	keep := http11 && !info.close || !http11 && info.keepAlive
	bodyOK := bodyAllowed(code)
	switch {
	case r.isHead || !bodyOK:
		r.frame = frameNone
	case info.chunked:
		r.frame, r.chunkState = frameChunked, chunkSize
	case info.contentLength >= 0:
		r.frame, r.left = frameFixed, info.contentLength
	default:
		r.frame = frameEOF
		keep = false
	}
	a.idleSince = time.Time{}
	if !keep {
		a.idleSince = time.Unix(0, 0) // not reusable: see complete
	}
	r.status, r.headSent = code, true
	if l.h.cfg.IdleTimeout > 0 {
		r.lastWrite = time.Now()
	}
	l.armRequestTimer(c)
	// What the body sniff may look at: the body bytes already here.
	var first []byte
	if bodyOK && !r.isHead && !hasType(hd) {
		first = l.peekBody(a)
	}
	l.writeFinalHead(c, code, hd, first)
	return true
}

// peekBody is the start of the body in a.in (decoded when chunked), at
// most 512 bytes (what http.DetectContentType reads), without consuming it.
func (l *evloop) peekBody(a *lsock) []byte {
	r := &a.client.r
	switch r.frame {
	case frameFixed:
		return a.in[:min(int64(len(a.in)), r.left, 512)]
	case frameEOF:
		return a.in[:min(len(a.in), 512)]
	case frameChunked:
		i := bytes.IndexByte(a.in, '\n')
		if i < 0 {
			return nil
		}
		size, ok := parseChunkSize(a.in[:i+1])
		if !ok {
			return nil
		}
		data := a.in[i+1:]
		return data[:min(int64(len(data)), size, 512)]
	}
	return nil
}

// writeFinalHead writes the response head as the keepalive loop's
// sendHead writes a forwarded one: the app's fields (hop-by-hop ones
// gone), the framing the loop relays with, a sniffed Content-Type when the
// app gave none, Date, and Connection: close when the connection ends
// after it (the client asked, the sidecar drains or shuts down).
func (l *evloop) writeFinalHead(c *lsock, code int, hd http.Header, first []byte) {
	r := &c.r
	bodyOK := bodyAllowed(code)
	if r.close || l.h.state.draining.Load() || l.f.closing.Load() {
		c.closeAfter = true
	}
	dropCL, dropType := false, false
	switch {
	case !bodyOK:
		dropCL, dropType = true, code == http.StatusNotModified
	case r.frame == frameChunked || r.frame == frameEOF:
		r.chunkedOut = true
		dropCL = true
	}
	writeStatusLine(&c.out, code)
	for k, vv := range hd {
		switch {
		case k == "Content-Length" && dropCL, k == "Transfer-Encoding", k == "Content-Type" && dropType,
			k == "Connection" && c.closeAfter, strings.HasPrefix(k, http.TrailerPrefix):
		default:
			writeField(&c.out, k, vv)
		}
	}
	if len(first) > 0 {
		c.out = append(c.out, "Content-Type: "...)
		c.out = append(c.out, http.DetectContentType(first)...)
		c.out = append(c.out, "\r\n"...)
	}
	if r.chunkedOut {
		c.out = append(c.out, "Transfer-Encoding: chunked\r\n"...)
	}
	l.endHead(c, hd)
}

// endHead adds Date (unless given) and Connection: close (when the
// connection ends after this response), and the blank line.
func (l *evloop) endHead(c *lsock, hd http.Header) {
	if _, ok := hd["Date"]; !ok {
		c.out = append(c.out, "Date: "...)
		c.out = append(c.out, l.date()...)
		c.out = append(c.out, "\r\n"...)
	}
	if c.closeAfter {
		c.out = append(c.out, "Connection: close\r\n"...)
	}
	c.out = append(c.out, "\r\n"...)
}

// date is the Date header's value now, formatted once a second.
func (l *evloop) date() []byte {
	now := time.Now()
	if sec := now.Unix(); sec != l.dateSec || l.dateText == nil {
		l.dateSec = sec
		l.dateText = now.UTC().AppendFormat(l.dateText[:0], http.TimeFormat)
	}
	return l.dateText
}

func hasType(hd http.Header) bool {
	_, ok := hd["Content-Type"]
	return ok || len(hd["Content-Encoding"]) > 0
}

func bodyAllowed(code int) bool {
	return !(code >= 100 && code <= 199 || code == http.StatusNoContent || code == http.StatusNotModified)
}

// responseHeadEnd is where the response head at the start of b ends (after
// its blank line, CRLF or bare LF, as readResponseHead reads it), -1 while
// incomplete.
func responseHeadEnd(b []byte) int {
	i := bytes.IndexByte(b, '\n')
	for i >= 0 {
		rest := b[i+1:]
		if len(rest) >= 1 && rest[0] == '\n' {
			return i + 2
		}
		if len(rest) >= 2 && rest[0] == '\r' && rest[1] == '\n' {
			return i + 3
		}
		j := bytes.IndexByte(rest, '\n')
		if j < 0 {
			return -1
		}
		i += 1 + j
	}
	return -1
}

// decodeChunks consumes the chunked body a.in holds and returns the
// chunks' data (in the loop's scratch buffer; the loop chunks it anew
// towards the client, as net/http does), with the trailers kept in
// r.trailers. false: the body is malformed (handled).
func (l *evloop) decodeChunks(a *lsock) ([]byte, bool) {
	r := &a.client.r
	body := l.scratch[:0]
	in := a.in
	defer func() {
		a.in = a.in[:copy(a.in, in)]
		l.scratch = body[:0]
	}()
	for {
		switch r.chunkState {
		case chunkSize:
			i := bytes.IndexByte(in, '\n')
			if i < 0 {
				if len(in) > 4<<10 {
					l.appBroke(a, fmt.Errorf("%w: chunk size line too long", errBadResponse))
					return nil, false
				}
				return body, true
			}
			size, ok := parseChunkSize(in[:i+1])
			if !ok {
				l.appBroke(a, fmt.Errorf("%w: chunk size line %q", errBadResponse, trimLine(in[:i+1])))
				return nil, false
			}
			in = in[i+1:]
			if size == 0 {
				r.chunkState, r.trailers = chunkTrailers, r.trailers[:0]
				continue
			}
			r.chunkState, r.left = chunkData, size
		case chunkData:
			n := min(int64(len(in)), r.left)
			body = append(body, in[:n]...)
			in = in[n:]
			r.left -= n
			if r.left > 0 {
				return body, true
			}
			r.chunkState = chunkDataEnd
		case chunkDataEnd:
			switch {
			case len(in) >= 1 && in[0] == '\n':
				in = in[1:]
			case len(in) >= 2 && in[0] == '\r' && in[1] == '\n':
				in = in[2:]
			case len(in) == 0 || len(in) == 1 && in[0] == '\r':
				return body, true
			default:
				l.appBroke(a, fmt.Errorf("%w: chunk not followed by CRLF", errBadResponse))
				return nil, false
			}
			r.chunkState = chunkSize
		case chunkTrailers:
			i := bytes.IndexByte(in, '\n')
			if i < 0 {
				if len(in)+len(r.trailers) > maxResponseHead {
					l.appBroke(a, fmt.Errorf("%w: trailers larger than %d bytes", errBadResponse, maxResponseHead))
					return nil, false
				}
				return body, true
			}
			line := in[:i+1]
			in = in[i+1:]
			if len(line) == 1 || len(line) == 2 && line[0] == '\r' {
				r.chunkState = chunkDone
				return body, true
			}
			s := strings.TrimRight(string(line), "\r\n")
			k, v, ok := strings.Cut(s, ":")
			if !ok || !httpguts.ValidHeaderFieldName(k) {
				l.appBroke(a, fmt.Errorf("%w: trailers: trailer line %q", errBadResponse, s))
				return nil, false
			}
			writeField(&r.trailers, http.CanonicalHeaderKey(k), []string{strings.Trim(v, " \t")})
		case chunkDone:
			return body, true
		}
	}
}

// complete ends a response the app finished: the app's connection goes
// back to the pool when it can carry another request, the client's waits
// for its next request (or closes).
func (l *evloop) complete(c, a *lsock) {
	r := &c.r
	if r.chunkedOut {
		c.out = append(c.out, "0\r\n"...)
		c.out = append(c.out, r.trailers...)
		c.out = append(c.out, "\r\n"...)
	}
	if c.pausedApp == a {
		c.pausedApp = nil
	}
	a.client, r.app = nil, nil
	if a.idleSince.IsZero() && len(a.in) == 0 && len(l.idleApp) < l.f.maxIdle && !l.f.closing.Load() {
		a.idleSince = time.Now()
		l.idleApp = append(l.idleApp, a)
		l.setEvents(a, syscall.EPOLLIN|syscall.EPOLLRDHUP)
	} else {
		l.closeSock(a)
	}
	l.finish(c)
	l.endRequest(c)
}

// endRequest readies c for its next request, which flushClient starts
// once the response is out (or closes c, when it was the last).
func (l *evloop) endRequest(c *lsock) {
	c.busy = false
	if c.events&syscall.EPOLLIN == 0 && !c.closeAfter {
		l.setEvents(c, c.events|syscall.EPOLLIN)
	}
	l.flushClient(c)
}

// finish ends a request's accounting (Handler.done).
func (l *evloop) finish(c *lsock) {
	h := l.h
	r := &c.r
	if t := r.ticket; t != nil {
		r.ticket = nil
		t.abandoned = true
		if h.breaker.Cancel(t.w) {
			h.breaker.Recycle(t.w) // never granted: it does not come back
		}
	}
	if r.slot {
		r.slot = false
		l.release()
	}
	now := time.Now()
	if r.tracked {
		r.tracked = false
		h.meter.end(now)
	}
	if t := r.expired; t != nil && r.headSent && r.status != http.StatusGatewayTimeout {
		h.metrics.timeouts[t.kind].Inc()
	}
	status := r.status
	if status == 0 {
		status = http.StatusBadGateway
	}
	elapsed := now.Sub(r.start)
	h.metrics.recordResponse(status, elapsed.Seconds(), nil)
	if h.access != nil {
		h.access.LogAttrs(context.Background(), slog.LevelInfo, "request",
			slog.String("method", r.method),
			slog.String("path", r.path),
			slog.Int("status", status),
			slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
			slog.Int64("bytes", r.bytes),
			slog.String("proto", "HTTP/1.1"))
	}
	l.disarm(c)
}

// abandon ends c's request without a response (its client went, or the
// loop is closing): the app's connection, mid-exchange, closes.
func (l *evloop) abandon(c *lsock, status int) {
	r := &c.r
	if a := r.app; a != nil {
		a.client, r.app = nil, nil
		l.closeSock(a)
	}
	if !r.headSent {
		r.status = status
	}
	l.finish(c)
	c.busy = false
}

// sidecarError answers c's request with a response of the sidecar's own
// (Handler.sidecarError) and ends it.
func (l *evloop) sidecarError(c *lsock, code int, body []byte, notServed bool) {
	r := &c.r
	if a := r.app; a != nil {
		a.client, r.app = nil, nil
		l.closeSock(a)
	}
	if r.close || l.h.state.draining.Load() || l.f.closing.Load() {
		c.closeAfter = true
	}
	writeStatusLine(&c.out, code)
	if notServed {
		c.out = append(c.out, notServedKey+": "+spec.NotServedValue+"\r\n"...)
	}
	c.out = append(c.out, "Content-Type: text/plain; charset=utf-8\r\nX-Content-Type-Options: nosniff\r\nContent-Length: "...)
	c.out = strconv.AppendInt(c.out, int64(len(body)), 10)
	c.out = append(c.out, "\r\n"...)
	l.endHead(c, nil)
	if !r.isHead {
		c.out = append(c.out, body...)
	}
	r.status, r.headSent, r.bytes = code, true, int64(len(body))
	l.finish(c)
	l.endRequest(c)
}

// answerProbe answers K-Network-Probe: queue without a wait
// (Handler.serveProbe): 200 "queue" when the app is ready and the sidecar
// is not draining, 503 otherwise. It is not a request for the stats.
func (l *evloop) answerProbe(c *lsock) {
	st := l.h.state
	code, body := http.StatusOK, l.h.probeOK
	switch {
	case st.draining.Load():
		code, body = http.StatusServiceUnavailable, []byte("draining\n")
	case !st.ready.Load():
		code, body = http.StatusServiceUnavailable, []byte("not ready\n")
	}
	c.busy = true
	if c.r.close || l.f.closing.Load() {
		c.closeAfter = true
	}
	writeStatusLine(&c.out, code)
	c.out = append(c.out, "Content-Type: text/plain; charset=utf-8\r\n"+spec.RevisionHeader+": "...)
	c.out = append(c.out, l.h.cfg.Revision...)
	c.out = append(c.out, "\r\nContent-Length: "...)
	c.out = strconv.AppendInt(c.out, int64(len(body)), 10)
	c.out = append(c.out, "\r\n"...)
	l.endHead(c, nil)
	if !c.r.isHead {
		c.out = append(c.out, body...)
	}
	l.endRequest(c)
}

// flushClient writes what c has to write; with the socket full it waits
// for EPOLLOUT. False: c is closed. Once out is empty, an app whose reads
// waited for it is read again.
func (l *evloop) flushClient(c *lsock) bool {
	for c.sent < len(c.out) {
		n, err := rawWrite(c.fd, c.out[c.sent:])
		if n > 0 {
			c.sent += n
		}
		if errors.Is(err, syscall.EAGAIN) {
			l.setEvents(c, c.events|syscall.EPOLLOUT)
			return true
		}
		if err != nil {
			if c.busy {
				l.abandon(c, statusClientClosed)
			}
			l.closeClient(c)
			return false
		}
	}
	c.out, c.sent = c.out[:0], 0
	if c.events&syscall.EPOLLOUT != 0 {
		l.setEvents(c, c.events&^syscall.EPOLLOUT)
	}
	if a := c.pausedApp; a != nil {
		c.pausedApp = nil
		l.setEvents(a, syscall.EPOLLIN|syscall.EPOLLRDHUP)
		// What the app sent meanwhile is in a.in already.
		if len(a.in) > 0 {
			l.relay(a, false)
			return !c.closed
		}
	}
	if !c.busy && !c.closed {
		if c.closeAfter {
			l.closeClient(c)
			return false
		}
		l.nextRequest(c)
	}
	return !c.closed
}

func writeStatusLine(out *[]byte, code int) {
	b := append(*out, "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	b = append(b, text...)
	*out = append(b, "\r\n"...)
}

// writeField writes one header field as net/http's Header.Write does.
func writeField(out *[]byte, k string, vv []string) {
	if !httpguts.ValidHeaderFieldName(k) {
		return
	}
	b := *out
	for _, v := range vv {
		if strings.ContainsAny(v, "\r\n") {
			v = strings.NewReplacer("\n", " ", "\r", " ").Replace(v)
		}
		b = append(b, k...)
		b = append(b, ": "...)
		b = append(b, strings.Trim(v, " \t")...)
		b = append(b, "\r\n"...)
	}
	*out = b
}

// ---- timers ----

// armHeadTimer bounds the wait for c's next head: the idle timeout while
// nothing of it came (none), the header timeout once it started (or for
// the connection's first).
func (l *evloop) armHeadTimer(c *lsock, started bool) {
	d := l.f.idleTimeout
	if started || d == 0 {
		d = l.f.headerTimeout
	}
	if d <= 0 {
		l.disarm(c)
		return
	}
	if started && c.headTimed && c.timerIdx >= 0 {
		return // the head's deadline runs from its first byte
	}
	c.headTimed = started
	l.arm(c, time.Now().Add(d))
}

// armRequestTimer points c's timer at its request's earliest deadline.
func (l *evloop) armRequestTimer(c *lsock) {
	if at, _ := l.deadline(c); !at.IsZero() {
		l.arm(c, at)
	} else {
		l.disarm(c)
	}
}

// deadline is the earliest timeout that applies to c's request now
// (exchange.nextDeadline's rules) and which; kind nil is the dial's.
func (l *evloop) deadline(c *lsock) (at time.Time, kind *timeoutError) {
	cfg := &l.h.cfg
	r := &c.r
	earlier := func(t time.Time, k *timeoutError) {
		if at.IsZero() || t.Before(at) {
			at, kind = t, k
		}
	}
	if !r.headSent {
		if cfg.Timeout > 0 {
			earlier(r.start.Add(cfg.Timeout), &l.h.timeouts.request)
		}
		if !r.dispatched.IsZero() {
			if rst := cfg.ResponseStartTimeout; rst > 0 {
				earlier(r.dispatched.Add(rst), &l.h.timeouts.responseStart)
			}
			if idle := cfg.IdleTimeout; idle > 0 {
				earlier(r.dispatched.Add(idle), &l.h.timeouts.idle)
			}
		}
		if a := r.app; a != nil && a.connecting {
			earlier(a.dialAt.Add(appDialTimeout), nil)
		}
	} else if idle := cfg.IdleTimeout; idle > 0 {
		earlier(r.lastWrite.Add(idle), &l.h.timeouts.idle)
	}
	return at, kind
}

func (l *evloop) arm(s *lsock, at time.Time) {
	s.timerAt = at.UnixNano()
	if s.timerIdx >= 0 {
		heap.Fix(&l.timers, s.timerIdx)
	} else {
		heap.Push(&l.timers, s)
	}
}

func (l *evloop) disarm(s *lsock) {
	if s.timerIdx >= 0 {
		heap.Remove(&l.timers, s.timerIdx)
	}
}

// fireTimers runs the timers that are due.
func (l *evloop) fireTimers() {
	now := time.Now()
	for len(l.timers) > 0 && l.timers[0].timerAt <= now.UnixNano() {
		c := l.timers[0]
		heap.Pop(&l.timers)
		l.onTimer(c, now)
	}
}

func (l *evloop) onTimer(c *lsock, now time.Time) {
	if c.closed {
		return
	}
	if !c.busy {
		// A head that did not come in time, or an idle connection: it
		// closes (net/http's read header and idle timeouts).
		l.closeClient(c)
		return
	}
	at, kind := l.deadline(c)
	if at.IsZero() {
		return
	}
	if at.After(now) {
		l.arm(c, at)
		return
	}
	r := &c.r
	if kind == nil {
		// The app did not accept the connection in time.
		a := r.app
		a.client, r.app = nil, nil
		l.closeSock(a)
		l.appFailed(c, l.dialError(os.ErrDeadlineExceeded), true)
		return
	}
	r.expired = kind
	if r.headSent {
		// Mid-response only idle_timeout applies: the connection is cut.
		l.abandon(c, r.status)
		l.closeClient(c)
		return
	}
	l.h.metrics.timeouts[kind.kind].Inc()
	var msg string
	switch kind.kind {
	case timeoutResponseStart:
		msg = "the app did not start its response within response_start_timeout (" + kind.limit.String() + ")"
	case timeoutIdle:
		msg = "the app sent nothing for idle_timeout (" + kind.limit.String() + ")"
	default:
		msg = "the request did not finish within timeout (" + kind.limit.String() + ")"
	}
	l.sidecarError(c, http.StatusGatewayTimeout, []byte("nomad-serverless: revision "+l.h.cfg.Revision+": "+msg+"\n"), false)
}

// timerHeap orders sockets by their timer, earliest first.
type timerHeap []*lsock

func (t timerHeap) Len() int           { return len(t) }
func (t timerHeap) Less(i, j int) bool { return t[i].timerAt < t[j].timerAt }
func (t timerHeap) Swap(i, j int) {
	t[i], t[j] = t[j], t[i]
	t[i].timerIdx, t[j].timerIdx = i, j
}
func (t *timerHeap) Push(x any) {
	s := x.(*lsock)
	s.timerIdx = len(*t)
	*t = append(*t, s)
}
func (t *timerHeap) Pop() any {
	old := *t
	s := old[len(old)-1]
	old[len(old)-1] = nil
	s.timerIdx = -1
	*t = old[:len(old)-1]
	return s
}

// rawRead, rawWrite and rawEpollWait are system calls on non-blocking
// descriptors that return at once, made without telling the runtime
// (syscall.RawSyscall), as datapath/rawio makes the goroutine path's: the
// runtime need not hand the P on for a call that cannot block. The race
// detector does not see the kernel's writes into the buffers; they are the
// loop's own.
func rawRead(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(n), nil
	}
}

func rawWrite(fd int, p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return -1, e
		}
		return int(n), nil
	}
}

// rawEpollWait collects the events that are ready now, without waiting.
func rawEpollWait(ep int, events []syscall.EpollEvent) (int, error) {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])), uintptr(len(events)), 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			return 0, e
		}
		return int(n), nil
	}
}
