//go:build linux || darwin || freebsd || netbsd || openbsd

package keepalive

import (
	"errors"
	"os"
	"sync"
	"syscall"
	"time"
)

// peekSupported: the loop needs a socket peek (MSG_PEEK) to notice
// departed clients without reading their bytes.
const peekSupported = true

// peekState is what a peek at the client's socket found.
type peekState int

const (
	peekEmpty    peekState = iota // nothing to read: the client is there
	peekData                      // bytes wait (a pipelined request): the client is there
	peekGone                      // end of stream or a socket error: the client left
	peekDeadline                  // the connection's read deadline has passed
)

// peek looks at the client's socket without consuming anything. With wait
// it blocks (in the network poller) until something arrives or the read
// deadline passes.
func (c *conn) peek(wait bool) peekState {
	if c.raw == nil {
		return peekEmpty
	}
	var (
		n    int
		perr error
		buf  [1]byte
	)
	err := c.raw.Read(func(fd uintptr) bool {
		for {
			n, _, perr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
			if perr != syscall.EINTR {
				break
			}
		}
		if c.tlsRecords && perr == nil && n > 0 && peerShutdown(fd) {
			// The records are the client's last (its close_notify):
			// it has shut its side down.
			n = 0
		}
		// Returning false waits for the socket to become readable.
		return !wait || (perr != syscall.EAGAIN && perr != syscall.EWOULDBLOCK)
	})
	switch {
	case errors.Is(err, os.ErrDeadlineExceeded):
		return peekDeadline
	case err != nil:
		return peekGone // the connection was closed under us
	case perr == syscall.EAGAIN || perr == syscall.EWOULDBLOCK:
		return peekEmpty
	case perr != nil || n == 0:
		return peekGone
	}
	return peekData
}

// clientGone reports whether the client closed or reset the connection.
// It never blocks.
func (c *conn) clientGone() bool {
	switch c.peek(false) {
	case peekGone:
		return true
	case peekDeadline:
		// A stale read deadline from an earlier request hides the socket;
		// clear it (the loop sets its own before the next read) and look.
		c.setReadDeadline(time.Time{})
		return c.peek(false) == peekGone
	}
	return false
}

// clientWatcher waits, in a goroutine, for the client to leave during one
// request (net/http's background read, for the requests that wait).
type clientWatcher struct {
	c       *conn
	mu      sync.Mutex // orders stop against the watcher's deadline reset
	stopped bool
	stopCh  chan struct{} // closed by stop
	exited  chan struct{}
}

// tlsRecheck bounds how often a watcher looks again at a TLS client whose
// records wait unread (see run).
const tlsRecheck = 250 * time.Millisecond

// watchClient starts a watcher that calls onGone if the client leaves
// before stop.
func (c *conn) watchClient(onGone func()) *clientWatcher {
	w := &clientWatcher{c: c, stopCh: make(chan struct{}), exited: make(chan struct{})}
	if c.raw == nil {
		close(w.exited)
		return w
	}
	go w.run(onGone)
	return w
}

func (w *clientWatcher) run(onGone func()) {
	defer close(w.exited)
	delay := 5 * time.Millisecond
	for {
		switch w.c.peek(true) {
		case peekGone:
			w.mu.Lock()
			stopped := w.stopped
			w.mu.Unlock()
			if !stopped {
				onGone()
			}
			return
		case peekData, peekEmpty:
			if !w.c.tlsRecords {
				// A pipelined request: the client is there (net/http
				// likewise stops watching).
				return
			}
			// Records wait: a pipelined request, or a close_notify
			// whose FIN is still on its way (net/http reads the alert
			// and so notices it). The socket stays readable, so look
			// again after a while, until the request ends.
			select {
			case <-w.stopCh:
				return
			case <-time.After(delay):
			}
			delay = min(2*delay, tlsRecheck)
		case peekDeadline:
			w.mu.Lock()
			if w.stopped {
				w.mu.Unlock()
				return
			}
			// A stale deadline from an earlier request: wait without one.
			w.c.setReadDeadline(time.Time{})
			w.mu.Unlock()
		}
	}
}

// stop ends the watch and waits for the goroutine; the connection's read
// deadline is cleared afterwards.
func (w *clientWatcher) stop() {
	w.mu.Lock()
	w.stopped = true
	close(w.stopCh)
	w.c.setReadDeadline(pastDeadline)
	w.mu.Unlock()
	<-w.exited
	w.c.setReadDeadline(time.Time{})
}
