package activator

import (
	"context"
	"net"
	"net/http"
	"sync/atomic"
	"time"
)

// HTTP/2 rapid reset (CVE-2023-44487): a client opens streams and resets
// each at once. net/http bounds what that costs the gateway itself (a
// reset stream's handler holds its place among the connection's 250 until
// it returns; a stream reset before its handler started never gets one),
// but a handler that started may pass its request on before the reset is
// read: the instance then gets the request and its cancellation. In the
// hostile-input test, 10,000 open-then-reset streams on one connection
// put 100 to 170 requests on the instance in plain runs and 1,000 to
// 1,500 under the race detector, and an attacker can go on for as long as
// the connection lasts.
//
// So the gateway closes a client connection on which premature resets
// dominate, as Envoy does (its overload.premature_reset_* settings, whose
// defaults these are): once the connection has had prematureMinStreams
// streams, if at least half of them were reset by the client within
// prematureLifetime of their start, the connection is closed, and a
// stream that starts on it after that is not passed on. Requests passed
// on per connection are then bounded (a few hundred) whatever the
// attacker's speed. Clients that cancel a few calls (a gRPC deadline, a
// user leaving) stay far below half.
const (
	prematureMinStreams = 500
	prematureLifetime   = time.Second
)

// h2Conn counts one client connection's HTTP/2 streams and premature
// resets. Every connection of Server and TLSServer gets one (ConnContext): which
// protocol it speaks is known only later.
type h2Conn struct {
	nc      net.Conn
	streams atomic.Int64
	resets  atomic.Int64
	closed  atomic.Bool
}

type h2ConnKey struct{}

func withH2Conn(ctx context.Context, nc net.Conn) context.Context {
	return context.WithValue(ctx, h2ConnKey{}, &h2Conn{nc: nc})
}

// h2Guard is the handler of Server and TLSServer: the gateway, with the
// premature resets of HTTP/2 streams counted per connection.
// next serves what the guard passes on: the plain port's ServeHTTP, or
// the HTTPS port's serveTLS.
type h2Guard struct {
	g    *Gateway
	next http.HandlerFunc
}

func (h h2Guard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor != 2 {
		h.next(w, r)
		return
	}
	if r.Method == "PRI" {
		// An h2c preface whose second line is wrong, read as an HTTP/1
		// request "PRI * HTTP/2.0" (net/http hands such requests to the
		// handler): a connection error for RFC 9113 (§3.4). Said as such,
		// rather than "no service answers on host \"\"".
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusBadRequest, "invalid HTTP/2 connection preface")
		return
	}
	c, _ := r.Context().Value(h2ConnKey{}).(*h2Conn)
	if c == nil {
		h.next(w, r)
		return
	}
	if c.closed.Load() {
		// Closed for rapid resets: its streams still queued go nowhere.
		return
	}
	c.streams.Add(1)
	start := time.Now()
	defer func() {
		// The stream's context ends before its handler returns only when
		// the client reset it (or the connection died).
		if r.Context().Err() == nil || time.Since(start) >= prematureLifetime {
			return
		}
		resets, streams := c.resets.Add(1), c.streams.Load()
		if streams >= prematureMinStreams && 2*resets >= streams && c.closed.CompareAndSwap(false, true) {
			h.g.log.Warn("closing an HTTP/2 client connection that reset most of its streams at once (rapid reset, CVE-2023-44487)",
				"remote", r.RemoteAddr, "streams", streams, "premature_resets", resets)
			_ = c.nc.Close()
		}
	}()
	h.next(w, r)
}
