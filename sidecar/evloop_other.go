//go:build !linux

package sidecar

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// loopFront is the Linux event-loop front door (evloop_linux.go); other
// platforms serve through the keepalive loop.
type loopFront struct{}

var errNoLoop = errors.New("event loops not available")

func newLoopFront(net.Listener, *Handler, *http.Server, *slog.Logger, func(net.Conn, []byte)) (*loopFront, error) {
	return nil, errNoLoop
}

func (*loopFront) serve()                  {}
func (*loopFront) shutdown()               {}
func (*loopFront) close()                  {}
func (*loopFront) wait(time.Duration) bool { return true }
