package sidecar

import (
	"bufio"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/rawio"
)

// appConn is one keep-alive HTTP/1.1 connection to the app; it lives in
// appClient's idle stack between requests. Its buffers are lent from pools
// only while it serves a request, so a thousand idle connections after a
// burst cost no buffer memory.
type appConn struct {
	nc      net.Conn
	rw      *rawio.Conn   // nc's reads and writes
	br      *bufio.Reader // nil while idle
	bw      *bufio.Writer // nil while idle
	scratch []byte        // header block of the response being read
	idleAt  time.Time
}

// appClient holds the idle connections to the app.
//
// The pool is a LIFO stack behind a mutex held for a slice push or pop
// (tens of nanoseconds): the most recently used connection goes out first,
// so spare ones age out instead of being kept barely alive, and a stale
// one is rarely picked. It is the request path's only lock; a lock-free
// stack would have to solve ABA for connections that are pushed again and
// again, for no measurable gain at two pool operations per request.
type appClient struct {
	addr        string
	dialer      net.Dialer
	maxIdle     int
	idleTimeout time.Duration

	mu   sync.Mutex
	idle []*appConn

	readers, writers sync.Pool
}

// Sizes of a connection's buffers: responses up to readBufferSize arrive
// in one read; the request head is written in one write.
const (
	readBufferSize  = 16 << 10
	writeBufferSize = 4 << 10
	// maxResponseHead bounds a response's status line and headers, as
	// net/http's default MaxResponseHeaderBytes.
	maxResponseHead = 1 << 20
)

func newAppClient(addr string, maxIdle int, idleTimeout time.Duration) *appClient {
	c := &appClient{
		addr:        addr,
		dialer:      net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second},
		maxIdle:     maxIdle,
		idleTimeout: idleTimeout,
	}
	c.readers.New = func() any { return bufio.NewReaderSize(nil, readBufferSize) }
	c.writers.New = func() any { return bufio.NewWriterSize(nil, writeBufferSize) }
	return c
}

// lend gives ac its buffers for one request.
func (c *appClient) lend(ac *appConn) *appConn {
	ac.br = c.readers.Get().(*bufio.Reader)
	ac.br.Reset(ac.rw)
	ac.bw = c.writers.Get().(*bufio.Writer)
	ac.bw.Reset(ac.rw)
	return ac
}

// release takes the buffers back. Only for a connection whose exchange
// ended cleanly: no goroutine may still use them, and nothing is left
// unread or unwritten.
func (c *appClient) release(ac *appConn) {
	ac.br.Reset(nil)
	c.readers.Put(ac.br)
	ac.bw.Reset(nil)
	c.writers.Put(ac.bw)
	ac.br, ac.bw = nil, nil
}

// get returns a connection idle for less than idleTimeout at now (reused =
// true) or dials a new one; with fresh it always dials. now is the
// caller's recent clock reading: a connection put back since then counts
// as fresh. With check, an idle connection is looked at before it is
// handed out (rawio.Quiet, one system call), and one the app closed or
// reset meanwhile is dropped: for a request that must not be sent twice,
// which then either goes out on a live connection or, not at all.
func (c *appClient) get(now time.Time, fresh, check bool) (ac *appConn, reused bool, err error) {
	for !fresh {
		var stale []*appConn
		c.mu.Lock()
		for n := len(c.idle); n > 0; n = len(c.idle) {
			ac = c.idle[n-1]
			c.idle[n-1] = nil
			c.idle = c.idle[:n-1]
			if now.Sub(ac.idleAt) < c.idleTimeout {
				break
			}
			stale = append(stale, ac)
			ac = nil
		}
		c.mu.Unlock()
		for _, s := range stale {
			s.nc.Close()
		}
		if ac == nil {
			break
		}
		if !check || rawio.Quiet(ac.nc) {
			return c.lend(ac), true, nil
		}
		ac.nc.Close()
		ac = nil
	}
	ac, err = c.dial()
	if err != nil {
		return nil, false, err
	}
	return c.lend(ac), false, nil
}

func (c *appClient) dial() (*appConn, error) {
	nc, err := c.dialer.Dial("tcp", c.addr)
	if err != nil {
		return nil, err
	}
	return &appConn{nc: nc, rw: rawio.New(nc)}, nil
}

// put returns a connection whose last exchange completed cleanly.
func (c *appClient) put(ac *appConn) {
	c.release(ac)
	ac.idleAt = time.Now()
	if cap(ac.scratch) > 64<<10 {
		ac.scratch = nil // do not keep a huge header buffer per connection
	}
	c.mu.Lock()
	if len(c.idle) < c.maxIdle {
		c.idle = append(c.idle, ac)
		c.mu.Unlock()
		return
	}
	c.mu.Unlock()
	ac.nc.Close()
}

// closeIdle closes every idle connection (at shutdown).
func (c *appClient) closeIdle() {
	c.mu.Lock()
	idle := c.idle
	c.idle = nil
	c.mu.Unlock()
	for _, ac := range idle {
		ac.nc.Close()
	}
}

// errAppClosed is a connection the app closed before answering.
var errAppClosed = errors.New("the app closed the connection before answering")
