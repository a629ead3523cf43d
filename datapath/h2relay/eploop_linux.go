//go:build linux

package h2relay

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/net/http2"
)

// eploop reads a group's TCP sockets with one epoll instance and one
// goroutine, as HAProxy's event loop does, instead of a reader goroutine
// per socket: under load a round of the loop finds many sockets ready,
// reads each once, steps their frames in one turn and writes what the
// turn produced, one system call per socket, where reader goroutines
// were each woken through Go's poller and each read again until EAGAIN
// before parking (make bench-grpc's sidecar at 32 connections spent 1.4
// to 1.6x HAProxy's CPU a call that way).
//
// The loop does not block in epoll_wait: it looks without waiting (a raw
// system call), and when nothing is ready parks in Go's poller, which
// watches the epoll descriptor itself (readable while it has events), as
// sidecar/evloop_linux.go does and for the same reasons. Sockets are
// level-triggered: one read per ready socket a round (at most the scratch
// buffer), the rest is seen in the next round.
//
// Writes the loop claims are tried once without blocking; what the socket
// does not take goes on in a goroutine of its own (g.write), so a peer
// that reads slowly never holds the loop.
//
// A socket the relay wants closed while the loop reads it is shut down
// (shutdown(2)) rather than closed: the loop reads its EOF, ends it, and
// closes it then, so a descriptor is never closed under the loop.
//
// Everything but the wait runs under the group's lock. The loop runs
// while the group has sockets in it and is started again by the next.
type eploop struct {
	g       *group
	ep      int
	epf     *os.File
	epc     syscall.RawConn
	running bool
	socks   map[int32]*esock
	events  [128]syscall.EpollEvent
	pollN   int
	pollErr error
	pollFn  func(uintptr) bool
	scratch []byte
}

// esock is a socket the loop reads.
type esock struct {
	fd    int
	rc    syscall.RawConn
	sd    *side
	fr    *http2.Framer
	src   frameSrc
	rest  []byte // the start of a frame not yet whole
	limit int    // the most rest may hold before the frame is read anyway
	ended bool
	done  chan struct{} // closed when the loop ended it (a session's ServeConn waits)
}

// frameSrc is what a socket's Framer reads: the bytes of whole frames.
type frameSrc struct {
	b   []byte
	off int
}

func (s *frameSrc) Read(p []byte) (int, error) {
	if s.off >= len(s.b) {
		return 0, io.ErrUnexpectedEOF
	}
	n := copy(p, s.b[s.off:])
	s.off += n
	return n, nil
}

func newEploop(g *group) *eploop {
	l := &eploop{g: g, ep: -1, socks: map[int32]*esock{}}
	l.pollFn = l.poll
	return l
}

// start makes the epoll instance and the loop's goroutine (group locked).
func (l *eploop) start() error {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create: %w", err)
	}
	if err := syscall.SetNonblock(ep, true); err != nil {
		syscall.Close(ep)
		return fmt.Errorf("epoll instance: %w", err)
	}
	epf := os.NewFile(uintptr(ep), "h2relay-eploop")
	epc, err := epf.SyscallConn()
	if err != nil {
		epf.Close()
		return fmt.Errorf("epoll instance: %w", err)
	}
	l.ep, l.epf, l.epc, l.running = ep, epf, epc, true
	if l.scratch == nil {
		l.scratch = make([]byte, 64<<10)
	}
	go l.run()
	return nil
}

// stop closes the epoll instance (group locked; the loop's goroutine
// returns after it).
func (l *eploop) stop() {
	l.running = false
	if l.epf != nil {
		_ = l.epf.Close()
	}
	l.ep, l.epf, l.epc = -1, nil, nil
}

// add makes the loop read sd's socket (group locked); false: it cannot
// (not a socket with a descriptor, or epoll failed), and a reader
// goroutine reads it as before. held is what was read of it already.
func (l *eploop) add(sd *side, held []byte, cfg *Config) (*esock, bool) {
	if _, ok := sd.nc.(*net.TCPConn); !ok {
		return nil, false
	}
	sc, ok := sd.nc.(syscall.Conn)
	if !ok {
		return nil, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return nil, false
	}
	fd := -1
	if rc.Control(func(f uintptr) { fd = int(f) }) != nil || fd < 0 {
		return nil, false
	}
	if !l.running {
		if err := l.start(); err != nil {
			l.g.r.log.Warn("h2 relay: reading sockets with a goroutine each", "error", err)
			return nil, false
		}
	}
	es := &esock{fd: fd, rc: rc, sd: sd, done: make(chan struct{}),
		limit: int(cfg.MaxHeaderListSize) + 2*int(cfg.MaxFrameSize) + 9}
	es.fr = newFramer(&es.src, cfg)
	ev := syscall.EpollEvent{Events: syscall.EPOLLIN | syscall.EPOLLRDHUP, Fd: int32(fd)}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		l.g.r.log.Warn("h2 relay: reading a socket with a goroutine", "error", err)
		if len(l.socks) == 0 {
			l.stop()
		}
		return nil, false
	}
	l.socks[int32(fd)] = es
	sd.ep = es
	if len(held) > 0 {
		es.rest = append(es.rest, held...)
	}
	return es, true
}

// remove ends es (group locked): out of epoll, and closed if the relay
// asked for that meanwhile.
func (l *eploop) remove(es *esock) {
	if es.ended {
		return
	}
	es.ended = true
	if l.ep >= 0 {
		_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_DEL, es.fd, nil)
	}
	if l.socks[int32(es.fd)] == es {
		delete(l.socks, int32(es.fd))
	}
	es.rest = nil
	if es.sd.shut {
		es.sd.nc.Close()
	}
	close(es.done)
}

// run is the loop.
func (l *eploop) run() {
	g := l.g
	for {
		n, err := l.wait()
		now := g.lock()
		if err != nil && l.running {
			g.r.log.Error("h2 relay: event loop", "error", err)
			for _, es := range l.socks {
				es.sd.shut = true
				l.readEnded(es, err, now)
			}
		}
		for i := range max(n, 0) {
			es := l.socks[l.events[i].Fd]
			if es == nil || es.ended {
				continue
			}
			l.read(es, now)
		}
		stop := len(l.socks) == 0 || !l.running
		if stop && l.running {
			l.stop()
		}
		g.turn(now)
		g.openAdmitted(now)
		g.claimAndUnlock(now, true)
		if stop {
			return
		}
	}
}

// wait returns the events ready now; when none is, it parks the
// goroutine in Go's poller until one is.
func (l *eploop) wait() (int, error) {
	l.g.mu.Lock()
	epc := l.epc
	l.g.mu.Unlock()
	if epc == nil {
		return 0, nil
	}
	l.pollN, l.pollErr = 0, nil
	err := epc.Read(l.pollFn)
	if l.pollErr != nil {
		return 0, l.pollErr
	}
	if err != nil {
		if errors.Is(err, os.ErrClosed) {
			return 0, nil
		}
		return 0, err
	}
	return l.pollN, nil
}

func (l *eploop) poll(uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_PWAIT, uintptr(l.ep), uintptr(unsafe.Pointer(&l.events[0])), uintptr(len(l.events)), 0, 0, 0)
		if e == syscall.EINTR {
			continue
		}
		if e != 0 {
			l.pollErr = e
			return true
		}
		l.pollN = int(n)
		return n > 0
	}
}

// read reads es once and steps the whole frames read (group locked).
func (l *eploop) read(es *esock, now time.Time) {
	var buf []byte
	if len(es.rest) > 0 {
		if cap(es.rest)-len(es.rest) < 16<<10 {
			nb := make([]byte, len(es.rest), len(es.rest)+32<<10)
			copy(nb, es.rest)
			es.rest = nb
		}
		buf = es.rest[len(es.rest):cap(es.rest)]
	} else {
		buf = l.scratch
	}
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(es.fd), uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)))
	switch {
	case e == syscall.EAGAIN || e == syscall.EINTR:
		return
	case e != 0:
		l.readEnded(es, os.NewSyscallError("read", e), now)
		return
	case n == 0:
		l.readEnded(es, io.EOF, now)
		return
	}
	if len(es.rest) > 0 {
		es.rest = es.rest[:len(es.rest)+int(n)]
		l.steps(es, es.rest, true, now)
		return
	}
	l.steps(es, l.scratch[:n], false, now)
}

// steps steps the whole frames at the start of data (es.rest itself when
// inRest), keeping what follows them in es.rest for the next read.
func (l *eploop) steps(es *esock, data []byte, inRest bool, now time.Time) {
	g := l.g
	sd := es.sd
	es.src.b, es.src.off = data, 0
	for !sd.c.Closed() {
		rest := data[es.src.off:]
		if !frameWhole(rest, int(sd.c.cfg.MaxFrameSize)) && len(rest) < es.limit {
			break
		}
		f, err := es.fr.ReadFrame()
		g.mark(sd)
		if err != nil {
			var se http2.StreamError
			var ce http2.ConnectionError
			if sd.up != nil && !errors.As(err, &se) && !errors.As(err, &ce) {
				sd.up.lost = true
			}
			sd.c.ReadError(now, err)
		} else {
			sd.c.Step(now, f)
		}
		// The frame's deliveries are carried out before the next frame
		// is read (a DATA frame's bytes are the Framer's buffer).
		g.turn(now)
	}
	left := data[min(es.src.off, len(data)):]
	es.src.b = nil
	switch {
	case sd.c.Closed():
		l.closed(es, now)
	case len(left) == 0:
		// Nothing held: an idle socket keeps no buffer.
		es.rest = nil
	case inRest:
		es.rest = es.rest[:copy(es.rest, left)]
	default:
		es.rest = append(es.rest[:0], left...)
	}
}

// readEnded ends es's reading with err (EOF, a failed read).
func (l *eploop) readEnded(es *esock, err error, now time.Time) {
	sd := es.sd
	l.g.mark(sd)
	if sd.up != nil {
		sd.up.lost = true
	}
	sd.c.ReadError(now, err)
	l.g.turn(now)
	l.closed(es, now)
}

// closed ends a socket whose connection closed: a session leaves its
// group as readDown's end does; an upstream is the pool's to close.
func (l *eploop) closed(es *esock, now time.Time) {
	g := l.g
	if s := es.sd.down; s != nil {
		g.openAdmitted(now)
		s.ended = true
		delete(g.sessions, s)
		if len(g.sessions) == 0 && g.r.isDraining() {
			g.retire(now)
		}
	}
	l.remove(es)
}

// shutdown makes the loop end es (its EOF), for a close asked while the
// loop reads it.
func (es *esock) shutdown() {
	_ = es.rc.Control(func(fd uintptr) { _ = syscall.Shutdown(int(fd), syscall.SHUT_RDWR) })
}

// tryWrite writes p without blocking; n < len(p) with a nil error: the
// socket took no more now.
func (es *esock) tryWrite(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(es.fd), uintptr(unsafe.Pointer(&p[n])), uintptr(len(p)-n))
		switch e {
		case 0:
			n += int(m)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return n, nil
		default:
			return n, os.NewSyscallError("write", e)
		}
	}
	return n, nil
}

// frameWhole reports whether b starts with a whole frame (a header block
// with all its CONTINUATION frames), or one the Framer refuses by its
// header alone (too large): reading it cannot want more bytes.
func frameWhole(b []byte, maxFrame int) bool {
	if len(b) < 9 {
		return false
	}
	n := int(b[0])<<16 | int(b[1])<<8 | int(b[2])
	if n > maxFrame {
		return true
	}
	if len(b) < 9+n {
		return false
	}
	typ, flags := http2.FrameType(b[3]), http2.Flags(b[4])
	if (typ != http2.FrameHeaders && typ != http2.FramePushPromise) || flags&http2.FlagHeadersEndHeaders != 0 {
		return true
	}
	off := 9 + n
	for {
		if len(b) < off+9 {
			return false
		}
		m := int(b[off])<<16 | int(b[off+1])<<8 | int(b[off+2])
		if http2.FrameType(b[off+3]) != http2.FrameContinuation || m > maxFrame {
			return true // the Framer's error to find
		}
		if len(b) < off+9+m {
			return false
		}
		if http2.Flags(b[off+4])&http2.FlagContinuationEndHeaders != 0 {
			return true
		}
		off += 9 + m
	}
}
