//go:build unix

package rawio

import (
	"net"
	"syscall"
)

// Quiet reports whether an idle connection is still fit to carry a
// request: its peer has neither closed nor reset it, and sent nothing
// unasked. It looks at the socket without consuming anything and never
// blocks: one MSG_PEEK system call.
//
// A pooled connection whose peer closed it while it sat idle (the peer
// process died, or timed the connection out) cannot be told from a live
// one by writing to it: the write succeeds into the local kernel, and only
// the read that follows fails, when the request may or may not have been
// read. Looking first is how a proxy knows, for a request it must not
// send twice, that nothing of it reached the peer (http.Transport learns
// the same from a read it keeps pending on every idle connection).
//
// A connection without a raw socket is taken as quiet (nothing to look at).
func Quiet(nc net.Conn) bool {
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return true
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	var (
		perr error
		buf  [1]byte
	)
	if err := rc.Read(func(fd uintptr) bool {
		for {
			_, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if perr != syscall.EINTR {
				return true // never wait for readability
			}
		}
	}); err != nil {
		return false // closed under us
	}
	// EAGAIN: nothing to read, the connection is open. Anything else (a
	// byte, end of stream, ECONNRESET) unfits it for a new request.
	return perr == syscall.EAGAIN || perr == syscall.EWOULDBLOCK
}
