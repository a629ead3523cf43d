package activator

import (
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync"

	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
)

// takeOver moves the keep-alive connections of a server from
// Gateway.Server (or InternalServer, or TLSServer) into the gateway's own HTTP/1.1 loop (package keepalive):
// net/http's per-request machinery cost the gateway as much CPU as the
// sidecar and the app together on a plain request.
//
// The first plain request on a connection reaches the server's handler
// through net/http as usual; the handler hijacks the connection and the loop serves
// that request and the ones after it. A request the loop does not take (a
// body, an upgrade, HTTP/1.0, anything odd) hands the connection, unread
// bytes included, to a second net/http server with the same limits
// (fallback), which serves it and the rest of that connection as net/http
// always would (its handler is the listener's serve function: no takeover
// there). Shutdown on
// the public server reaches both (a RegisterOnShutdown hook); Run, when it
// ends, waits for the loop's connections, which net/http no longer tracks.
type takeOver struct {
	g    *Gateway
	loop keepalive.Server
	// handler serves the requests of both the loop and the fallback
	// server; connContext, when not nil, is the fallback server's
	// ConnContext (the HTTPS port's: it finds the TLS state under the
	// connection's wrappers).
	handler     http.HandlerFunc
	connContext func(context.Context, net.Conn) context.Context

	mu         sync.Mutex
	fallback   *http.Server // made on first use
	fallbackLn *keepalive.ConnQueue
}

func newTakeOver(g *Gateway, handler http.HandlerFunc, connContext func(context.Context, net.Conn) context.Context) *takeOver {
	t := &takeOver{g: g, handler: handler, connContext: connContext}
	g.takeOversMu.Lock()
	g.takeOvers = append(g.takeOvers, t)
	g.takeOversMu.Unlock()
	t.loop = keepalive.Server{
		Handler:           handler,
		HandOff:           t.handOff,
		IdleTimeout:       g.cfg.IdleTimeout,
		ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
		Log:               g.log,
	}
	return t
}

// eligible tells whether r may move its connection into the loop.
func (t *takeOver) eligible(r *http.Request) bool {
	return !t.loop.Closing() && keepalive.Eligible(r)
}

// serve hijacks w's connection and serves r and what follows on it. It
// reports false when the connection could not be hijacked (r is then still
// to be served).
func (t *takeOver) serve(w http.ResponseWriter, r *http.Request) bool {
	nc, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return false
	}
	t.loop.ServeConn(nc, brw.Reader, brw.Writer, r)
	return true
}

// handOff gives a connection the loop does not serve to the fallback
// server.
func (t *takeOver) handOff(nc net.Conn) {
	t.mu.Lock()
	if t.fallback == nil {
		t.fallbackLn = keepalive.NewConnQueue(nc.LocalAddr())
		g := t.g
		t.fallback = &http.Server{
			Handler:           t.handler,
			ConnContext:       t.connContext,
			ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
			IdleTimeout:       g.cfg.IdleTimeout,
			MaxHeaderBytes:    g.cfg.MaxHeaderBytes,
			ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		}
		go func(s *http.Server, ln net.Listener) { _ = s.Serve(ln) }(t.fallback, t.fallbackLn)
		if t.loop.Closing() {
			go shutdownFallback(t.fallback)
		}
	}
	ln := t.fallbackLn
	t.mu.Unlock()
	ln.Push(nc)
}

// shutdown closes the loop's idle connections and the others after their
// response, and shuts the fallback server down.
func (t *takeOver) shutdown() {
	t.loop.Shutdown()
	t.mu.Lock()
	fb := t.fallback
	t.mu.Unlock()
	if fb != nil {
		go shutdownFallback(fb)
	}
}

// shutdownFallback gives the fallback server's requests as long as serve's
// own shutdown gives the public server's.
func shutdownFallback(s *http.Server) {
	ctx, cancel := context.WithTimeout(context.Background(), takeOverDrain)
	defer cancel()
	_ = s.Shutdown(ctx)
}
