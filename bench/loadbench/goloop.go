package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"runtime"
	"strconv"
	"sync/atomic"
	"syscall"
)

// goloop is one thread of the reference data path (see goloopPeer): an
// epoll loop of its own on a locked OS thread, with its own listening socket
// (SO_REUSEPORT: the kernel spreads connections over the loops) and its own
// connections to the upstream, so no work moves between threads and the Go
// scheduler has nothing to do while it runs. It is level-triggered and
// proxies plain HTTP/1.1: a request head with no body, X-Forwarded-For
// appended, one request at a time per client connection, each client
// connection with an upstream connection of its own, responses framed by
// Content-Length (HEAD, 204 and 304 without a body). Anything else is
// answered 501 or 502 and closed: the benchmark sends nothing else, and the
// loop is a yardstick for our proxies' thread model, not a proxy.
type goloop struct {
	ep, ln   int
	stop     int // read end of a pipe; readable = stop
	upstream syscall.SockaddrInet4
	conns    map[int]*gconn
	events   [256]syscall.EpollEvent
	buf      [64 << 10]byte
}

// gconn is one side of a proxied pair.
type gconn struct {
	fd   int
	peer *gconn // the client's upstream connection, or its client
	// upstream: this is the connection to the upstream.
	upstream bool
	// xff is the client's address, X-Forwarded-For's value.
	xff string
	in  []byte // read, not yet used
	out []byte // to write; out[sent:] is not written yet (the fd waits for EPOLLOUT)
	// sent is how much of out is written: a partial write moves it on
	// instead of moving the rest of out down (which made a response many
	// times the socket buffers quadratic to pass on).
	sent int
	// busy (client): its request is at the upstream; head (upstream): that
	// request is a HEAD, so its response has no body.
	busy, head bool
	// writable: the fd is watched for EPOLLOUT (out did not fit).
	writable bool
}

// maxGoloopHead bounds a request or response head.
const maxGoloopHead = 64 << 10

// goloopDrainWaits counts the times a loop found a socket full and waited
// for EPOLLOUT: its test's proof that it took that path.
var goloopDrainWaits atomic.Int64

// startGoloops starts loops threads serving listen, forwarding to upstream
// (both IPv4 host:port). stop ends them and closes every socket they hold,
// and returns once they have.
func startGoloops(listen, upstream string, loops int) (stop func(), err error) {
	la, err := sockaddr4(listen)
	if err != nil {
		return nil, fmt.Errorf("listen address: %w", err)
	}
	ua, err := sockaddr4(upstream)
	if err != nil {
		return nil, fmt.Errorf("upstream address: %w", err)
	}
	var ls []*goloop
	var stopW []int
	done := make(chan struct{}, loops)
	closeAll := func() {
		for _, w := range stopW {
			syscall.Close(w)
		}
		for range ls {
			<-done
		}
	}
	for range loops {
		l, w, err := newGoloop(la, ua)
		if err != nil {
			closeAll()
			return nil, err
		}
		ls, stopW = append(ls, l), append(stopW, w)
		go func() { l.run(); done <- struct{}{} }()
	}
	return closeAll, nil
}

func sockaddr4(hostport string) (*syscall.SockaddrInet4, error) {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return nil, err
	}
	ip := net.ParseIP(host).To4()
	p, err := strconv.Atoi(port)
	if ip == nil || err != nil {
		return nil, fmt.Errorf("%q: want IPv4 host:port", hostport)
	}
	sa := &syscall.SockaddrInet4{Port: p}
	copy(sa.Addr[:], ip)
	return sa, nil
}

// newGoloop makes a loop's epoll instance and listening socket; closing w
// stops it.
func newGoloop(listen, upstream *syscall.SockaddrInet4) (l *goloop, w int, err error) {
	l = &goloop{upstream: *upstream, conns: map[int]*gconn{}, ep: -1, ln: -1, stop: -1}
	defer func() {
		if err != nil {
			l.closeFDs()
		}
	}()
	if l.ep, err = syscall.EpollCreate1(syscall.EPOLL_CLOEXEC); err != nil {
		return nil, -1, fmt.Errorf("epoll_create: %w", err)
	}
	if l.ln, err = syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0); err != nil {
		return nil, -1, fmt.Errorf("socket: %w", err)
	}
	const soReusePort = 0xf // SO_REUSEPORT, which package syscall does not name
	for _, opt := range []int{syscall.SO_REUSEADDR, soReusePort} {
		if err = syscall.SetsockoptInt(l.ln, syscall.SOL_SOCKET, opt, 1); err != nil {
			return nil, -1, fmt.Errorf("setsockopt: %w", err)
		}
	}
	if err = syscall.Bind(l.ln, listen); err != nil {
		return nil, -1, fmt.Errorf("bind: %w", err)
	}
	if err = syscall.Listen(l.ln, 1024); err != nil {
		return nil, -1, fmt.Errorf("listen: %w", err)
	}
	var p [2]int
	if err = syscall.Pipe2(p[:], syscall.O_CLOEXEC|syscall.O_NONBLOCK); err != nil {
		return nil, -1, fmt.Errorf("pipe: %w", err)
	}
	l.stop = p[0]
	for _, fd := range []int{l.ln, l.stop} {
		if err = l.watch(syscall.EPOLL_CTL_ADD, fd, syscall.EPOLLIN); err != nil {
			syscall.Close(p[1])
			return nil, -1, err
		}
	}
	return l, p[1], nil
}

func (l *goloop) watch(op, fd int, events uint32) error {
	if err := syscall.EpollCtl(l.ep, op, fd, &syscall.EpollEvent{Events: events, Fd: int32(fd)}); err != nil {
		return fmt.Errorf("epoll_ctl: %w", err)
	}
	return nil
}

func (l *goloop) closeFDs() {
	for fd := range l.conns {
		syscall.Close(fd)
	}
	for _, fd := range []int{l.ln, l.stop, l.ep} {
		if fd >= 0 {
			syscall.Close(fd)
		}
	}
}

// run serves until the stop pipe's write end is closed.
func (l *goloop) run() {
	// The loop is this thread's only work: it blocks in epoll_wait and
	// never hands a connection to another thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	defer l.closeFDs()
	for {
		n, err := syscall.EpollWait(l.ep, l.events[:], -1)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for i := range n {
			ev := l.events[i]
			fd := int(ev.Fd)
			switch {
			case fd == l.stop:
				return
			case fd == l.ln:
				l.accept()
			default:
				if c := l.conns[fd]; c != nil {
					l.serve(c, ev.Events)
				}
			}
		}
	}
}

func (l *goloop) accept() {
	for {
		fd, sa, err := syscall.Accept4(l.ln, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
		if err != nil {
			return // EAGAIN, or out of descriptors: the next event retries
		}
		c := &gconn{fd: fd, xff: "unknown"}
		if a, ok := sa.(*syscall.SockaddrInet4); ok {
			c.xff = net.IP(a.Addr[:]).String()
		}
		_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
		if l.watch(syscall.EPOLL_CTL_ADD, fd, syscall.EPOLLIN) != nil {
			syscall.Close(fd)
			continue
		}
		l.conns[fd] = c
	}
}

// serve handles one event on c.
func (l *goloop) serve(c *gconn, events uint32) {
	if events&syscall.EPOLLOUT != 0 && !l.flush(c) {
		return
	}
	if events&(syscall.EPOLLIN|syscall.EPOLLHUP|syscall.EPOLLERR) == 0 {
		return
	}
	n, err := syscall.Read(c.fd, l.buf[:])
	if errors.Is(err, syscall.EAGAIN) {
		return
	}
	if n <= 0 {
		l.gone(c)
		return
	}
	c.in = append(c.in, l.buf[:n]...)
	if c.upstream {
		l.response(c)
	} else {
		l.request(c)
	}
}

// gone handles an end of c's stream or an error on it. An upstream
// connection always has its client (request dials it for one).
func (l *goloop) gone(c *gconn) {
	if c.upstream && c.peer.busy {
		l.fail(c.peer, "502 Bad Gateway")
		return
	}
	if c.upstream {
		c.peer.peer = nil
		l.close(c)
		return
	}
	l.closePair(c)
}

// request sends c's next request to the upstream, if its head is complete
// and none is at the upstream.
func (l *goloop) request(c *gconn) {
	if c.busy {
		return
	}
	end := l.headEnd(c.in, c, "431 Request Header Fields Too Large")
	if end < 0 {
		return
	}
	head := c.in[:end+2]
	length, hasLength := headerValue(head, "Content-Length")
	if _, hasCoding := headerValue(head, "Transfer-Encoding"); hasLength && length != "0" || hasCoding {
		l.fail(c, "501 Not Implemented") // a body: not the loop's
		return
	}
	if c.peer == nil {
		a, err := l.dial()
		if err != nil {
			l.fail(c, "502 Bad Gateway")
			return
		}
		a.peer, c.peer = c, a
	}
	a := c.peer
	a.head = bytes.HasPrefix(head, []byte("HEAD "))
	out := append(a.out, head...)
	out = append(out, "X-Forwarded-For: "...)
	out = append(out, c.xff...)
	out = append(out, "\r\n\r\n"...)
	a.out = out
	c.in = c.in[:copy(c.in, c.in[end+4:])]
	c.busy = true
	l.flush(a)
}

// response passes the upstream's response on to its client once it is all
// there.
func (l *goloop) response(a *gconn) {
	c := a.peer
	end := l.headEnd(a.in, c, "502 Bad Gateway")
	if end < 0 {
		return
	}
	head := a.in[:end+2]
	size := 0
	if !a.head && !bytes.HasPrefix(head[min(len(head), 9):], []byte("204")) && !bytes.HasPrefix(head[min(len(head), 9):], []byte("304")) {
		v, ok := headerValue(head, "Content-Length")
		n, err := strconv.Atoi(v)
		if !ok || err != nil || n < 0 {
			l.fail(c, "502 Bad Gateway")
			return
		}
		size = n
	}
	total := end + 4 + size
	if len(a.in) < total {
		return
	}
	c.out = append(c.out, a.in[:total]...)
	a.in = a.in[:copy(a.in, a.in[total:])]
	c.busy = false
	if !l.flush(c) {
		return
	}
	l.request(c) // a request that arrived meanwhile
}

// headEnd is where the head at the start of in ends (its blank line), -1
// while it is incomplete; a head that outgrows maxGoloopHead fails client
// with status.
func (l *goloop) headEnd(in []byte, client *gconn, status string) int {
	end := bytes.Index(in, []byte("\r\n\r\n"))
	if end < 0 && len(in) > maxGoloopHead {
		l.fail(client, status)
	}
	return end
}

// dial opens an upstream connection. A blocking connect is fine for a
// yardstick whose upstream is on loopback: it completes at once.
func (l *goloop) dial() (*gconn, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, &l.upstream); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	_ = syscall.SetNonblock(fd, true)
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	if err := l.watch(syscall.EPOLL_CTL_ADD, fd, syscall.EPOLLIN); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	a := &gconn{fd: fd, upstream: true}
	l.conns[fd] = a
	return a, nil
}

// flush writes what c has to write; when the socket is full it watches
// for EPOLLOUT until it is not (the only epoll_ctl calls after a
// connection's first, so a request costs its four reads and writes and a
// share of an epoll_wait, as in our proxies). It reports whether c is
// still open.
func (l *goloop) flush(c *gconn) bool {
	for c.sent < len(c.out) {
		n, err := syscall.Write(c.fd, c.out[c.sent:])
		if errors.Is(err, syscall.EAGAIN) {
			if !c.writable {
				if l.watch(syscall.EPOLL_CTL_MOD, c.fd, syscall.EPOLLIN|syscall.EPOLLOUT) != nil {
					l.closePair(c)
					return false
				}
				c.writable = true
				goloopDrainWaits.Add(1)
			}
			return true
		}
		if err != nil {
			l.gone(c)
			return false
		}
		c.sent += n
	}
	c.out, c.sent = c.out[:0], 0
	if c.writable {
		_ = l.watch(syscall.EPOLL_CTL_MOD, c.fd, syscall.EPOLLIN)
		c.writable = false
	}
	return true
}

// fail answers client c with status (no body) and closes it and its
// upstream connection.
func (l *goloop) fail(c *gconn, status string) {
	_, _ = syscall.Write(c.fd, []byte("HTTP/1.1 "+status+"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"))
	l.closePair(c)
}

func (l *goloop) closePair(c *gconn) {
	if c.peer != nil {
		l.close(c.peer)
	}
	l.close(c)
}

func (l *goloop) close(c *gconn) {
	if l.conns[c.fd] == c {
		delete(l.conns, c.fd)
		syscall.Close(c.fd)
	}
}

// headerValue is the value of the first field called name in a head
// (request or status line first, lines ending in CRLF), trimmed.
func headerValue(head []byte, name string) (string, bool) {
	for line := range bytes.SplitSeq(head, []byte("\r\n")) {
		k, v, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(k), []byte(name)) {
			return string(bytes.TrimSpace(v)), true
		}
	}
	return "", false
}
