package rawio

import (
	"errors"
	"net"
	"syscall"
)

// NetConn is a net.Conn whose Read and Write are a Conn's: for a socket
// that another layer reads and writes (crypto/tls's records, for the
// gateway's HTTPS port), so that its system calls are raw ones too. Its
// deadlines, Close and addresses are the wrapped connection's. As Conn, it
// takes one Read and one Write at a time, which is how tls.Conn uses the
// connection under it (its input and output locks).
type NetConn struct {
	net.Conn
	rw *Conn
}

// NewNetConn wraps nc.
func NewNetConn(nc net.Conn) *NetConn { return &NetConn{Conn: nc, rw: New(nc)} }

// Read reads into p as nc.Read does.
func (c *NetConn) Read(p []byte) (int, error) { return c.rw.Read(p) }

// Write writes p as nc.Write does.
func (c *NetConn) Write(p []byte) (int, error) { return c.rw.Write(p) }

// NetConn returns the wrapped connection (as tls.Conn.NetConn does).
func (c *NetConn) NetConn() net.Conn { return c.Conn }

// SyscallConn is the wrapped connection's, for whoever peeks at the socket.
func (c *NetConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("rawio: the wrapped connection has no socket")
	}
	return sc.SyscallConn()
}
