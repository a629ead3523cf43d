//go:build !linux || race

package rawio

import "net"

// Conn is the connection itself here (see the package comment).
type Conn struct{ nc net.Conn }

// New wraps nc.
func New(nc net.Conn) *Conn { return &Conn{nc: nc} }

// Read is nc.Read.
func (c *Conn) Read(p []byte) (int, error) { return c.nc.Read(p) }

// Write is nc.Write.
func (c *Conn) Write(p []byte) (int, error) { return c.nc.Write(p) }
