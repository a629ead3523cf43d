//go:build !linux || race

package rawio

import "net"

// Conn is the connection itself here (see the package comment).
type Conn struct {
	nc      net.Conn
	written int64
}

// New wraps nc.
func New(nc net.Conn) *Conn { return &Conn{nc: nc} }

// Read is nc.Read.
func (c *Conn) Read(p []byte) (int, error) { return c.nc.Read(p) }

// Write is nc.Write.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.nc.Write(p)
	c.written += int64(n)
	return n, err
}

// AwaitReply does nothing here: the Read after the next Write tries at once.
func (c *Conn) AwaitReply() {}

// Written is how many bytes Write has handed to the kernel so far: a
// proxy that sees it unchanged after a failed write knows the peer got
// nothing of what it tried to send.
func (c *Conn) Written() int64 { return c.written }
