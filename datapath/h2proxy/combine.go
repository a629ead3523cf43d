package h2proxy

import (
	"context"
	"net"
	"sync"
	"time"
)

// CombineWrites returns dial with every connection it makes combining
// writes (see CombinedConn): for an HTTP/2 transport's connections, whose
// every frame (HEADERS, each DATA, the empty DATA that ends a request,
// WINDOW_UPDATE, RST_STREAM) is flushed in a write of its own.
func CombineWrites(dial func(ctx context.Context, network, addr string) (net.Conn, error)) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		nc, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return NewCombinedConn(nc), nil
	}
}

// CombinedConn is a connection whose writes are combined: Write copies its
// bytes behind those not yet sent and returns, and one goroutine at a time
// (the flusher, started when there is something to send and none runs)
// sends everything held in one write of the socket, until nothing is.
//
// Why: the HTTP/2 transport writes each frame as its own system call.
// A proxied gRPC unary call is three on the way to the upstream (HEADERS,
// DATA, and an empty DATA that ends the stream), each also a wake-up and
// a read for the upstream, and with many streams on the connection each
// writer waits its turn for the socket. The flusher is started as the
// writer's next goroutine to run (Go's runnext), so it runs when the
// writer blocks or yields: the frames a writer has in hand, and those
// other streams wrote meanwhile, go out together, and a frame never waits
// for another that is not already on its way.
//
// Order is kept: bytes leave in the order their Writes returned. A write
// error is sticky and returned by the Writes after it (the transport
// then fails the connection, as it would have one write later).
// Back-pressure is kept: a Write that would hold more than maxHeld waits
// until the flusher has sent what is held. Close sends what is held
// first, for at most closeGrace, then closes.
type CombinedConn struct {
	net.Conn

	mu       sync.Mutex
	sent     sync.Cond // the flusher sent what it took, or stopped
	held     []byte    // written, not yet taken by the flusher
	spare    []byte    // the buffer the flusher gave back
	flushing bool      // a flusher runs
	err      error     // the first write error (or net.ErrClosed after Close)
	writes   int       // socket writes made, for the tests that count them
}

// NewCombinedConn combines the writes of nc.
func NewCombinedConn(nc net.Conn) *CombinedConn {
	c := &CombinedConn{Conn: nc}
	c.sent.L = &c.mu
	return c
}

const (
	// maxHeld bounds the bytes held for the flusher: a writer past it
	// waits (the socket's back-pressure, a little later).
	maxHeld = 256 << 10
	// keepBuffer is the largest buffer kept between bursts; larger ones
	// (a large body's) go back to the garbage collector.
	keepBuffer = 32 << 10
	// closeGrace bounds Close's wait for what is held to be sent.
	closeGrace = 250 * time.Millisecond
)

// Write holds p to be sent by the flusher and returns at once, unless
// maxHeld bytes are held already.
func (c *CombinedConn) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	c.mu.Lock()
	for c.err == nil && len(c.held) > 0 && len(c.held)+len(p) > maxHeld {
		c.sent.Wait()
	}
	if c.err != nil {
		err := c.err
		c.mu.Unlock()
		return 0, err
	}
	if c.held == nil {
		c.held, c.spare = c.spare, nil
	}
	c.held = append(c.held, p...)
	if !c.flushing {
		c.flushing = true
		go c.flush()
	}
	c.mu.Unlock()
	return len(p), nil
}

// flush sends what is held until nothing is.
func (c *CombinedConn) flush() {
	c.mu.Lock()
	for len(c.held) > 0 && c.err == nil {
		b := c.held
		c.held = nil
		c.mu.Unlock()
		_, err := c.Conn.Write(b)
		c.mu.Lock()
		c.writes++
		if err != nil && c.err == nil {
			c.err = err
		}
		if cap(b) <= keepBuffer {
			c.spare = b[:0]
		}
		c.sent.Broadcast()
	}
	if c.err != nil {
		c.held = nil
	}
	c.flushing = false
	c.sent.Broadcast()
	c.mu.Unlock()
}

// Close sends what is held (waiting at most closeGrace) and closes the
// connection. Writes after it fail with net.ErrClosed.
func (c *CombinedConn) Close() error {
	c.mu.Lock()
	if c.flushing || len(c.held) > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(closeGrace))
		if !c.flushing {
			c.flushing = true
			go c.flush()
		}
		for c.flushing {
			c.sent.Wait()
		}
	}
	if c.err == nil {
		c.err = net.ErrClosed
	}
	c.held, c.spare = nil, nil
	c.mu.Unlock()
	return c.Conn.Close()
}

// NetConn is the connection under the combiner.
func (c *CombinedConn) NetConn() net.Conn { return c.Conn }
