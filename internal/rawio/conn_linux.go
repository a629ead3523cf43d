//go:build linux && !race

package rawio

import (
	"io"
	"net"
	"os"
	"syscall"
	"unsafe"
)

// Conn reads and writes a connection with raw system calls. It is not
// safe for concurrent Reads, nor for concurrent Writes (a Read and a Write
// may run at once), as a bufio.Reader or Writer uses it.
type Conn struct {
	nc net.Conn
	rc syscall.RawConn // nil: use nc

	// The call in progress, for readFn and writeFn, which are bound once
	// so that a call allocates nothing.
	rp, wp          []byte
	rn, wn          int
	rerrno, werrno  syscall.Errno
	readFn, writeFn func(fd uintptr) bool

	written int64 // bytes written so far (see Written)
}

// New wraps nc.
func New(nc net.Conn) *Conn {
	c := &Conn{nc: nc}
	if sc, ok := nc.(syscall.Conn); ok {
		if rc, err := sc.SyscallConn(); err == nil {
			c.rc = rc
			c.readFn, c.writeFn = c.read, c.write
		}
	}
	return c
}

// Read reads into p as nc.Read does.
func (c *Conn) Read(p []byte) (int, error) {
	if c.rc == nil {
		return c.nc.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	c.rp, c.rn, c.rerrno = p, 0, 0
	err := c.rc.Read(c.readFn)
	n, errno := c.rn, c.rerrno
	c.rp = nil
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, os.NewSyscallError("read", errno)
	case n == 0:
		return 0, io.EOF
	}
	return n, nil
}

// read is one read attempt; false (EAGAIN) makes RawConn.Read wait for
// the socket to become readable and call it again.
func (c *Conn) read(fd uintptr) bool {
	for {
		n, _, e := syscall.RawSyscall(syscall.SYS_READ, fd, uintptr(unsafe.Pointer(&c.rp[0])), uintptr(len(c.rp)))
		switch e {
		case 0:
			c.rn = int(n)
			return true
		case syscall.EINTR:
			continue
		case syscall.EAGAIN:
			return false
		}
		c.rerrno = e
		return true
	}
}

// Write writes all of p as nc.Write does.
func (c *Conn) Write(p []byte) (int, error) {
	if c.rc == nil {
		n, err := c.nc.Write(p)
		c.written += int64(n)
		return n, err
	}
	if len(p) == 0 {
		return 0, nil
	}
	c.wp, c.wn, c.werrno = p, 0, 0
	err := c.rc.Write(c.writeFn)
	n, errno := c.wn, c.werrno
	c.wp = nil
	c.written += int64(n)
	switch {
	case err != nil:
		return n, err
	case errno != 0:
		return n, os.NewSyscallError("write", errno)
	}
	return n, nil
}

// write writes what is left; false (EAGAIN: the socket buffer is full)
// makes RawConn.Write wait for room and call it again.
func (c *Conn) write(fd uintptr) bool {
	for c.wn < len(c.wp) {
		n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, fd, uintptr(unsafe.Pointer(&c.wp[c.wn])), uintptr(len(c.wp)-c.wn))
		switch e {
		case 0:
			c.wn += int(n)
		case syscall.EINTR:
		case syscall.EAGAIN:
			return false
		default:
			c.werrno = e
			return true
		}
	}
	return true
}

// Written is how many bytes Write has handed to the kernel so far: a
// proxy that sees it unchanged after a failed write knows the peer got
// nothing of what it tried to send.
func (c *Conn) Written() int64 { return c.written }
