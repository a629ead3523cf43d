package sidecar

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/nomad-serverless/nomad-serverless/datapath/h2relay"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
)

// frontDoor serves the serving port. Plain HTTP/1.1 requests (no body, no
// upgrade: what the app mostly gets) are read and answered by the keepalive
// loop, which costs a fraction of net/http's per-request work (see package
// keepalive); at the first request on a connection that the loop does not
// take (h2c, websockets and other upgrades, request bodies, HTTP/1.0,
// anything odd) the connection, with what was read of it, goes to net/http
// (srv) for good. Both call the same Handler.
//
// Where the loop is not supported (no socket peek) net/http serves every
// connection.
type frontDoor struct {
	ln    net.Listener
	srv   *http.Server
	ev    *loopFront        // the event loops; nil: the keepalive loop or net/http
	loop  *keepalive.Server // nil: net/http serves all (or the event loops)
	queue *keepalive.ConnQueue
	// relay serves the h2c connections of an h2c app's clients (gRPC)
	// when not tracing; nil: net/http serves them.
	relay           *h2relay.Relay
	readHeadTimeout time.Duration
	closed          atomic.Bool
}

// othersInFlight, when not nil, tells whether requests other than the
// one being answered are in flight (keepalive.Server.YieldFirst).
func newFrontDoor(ln net.Listener, srv *http.Server, log *slog.Logger, othersInFlight func() bool) *frontDoor {
	f := &frontDoor{ln: ln, srv: srv}
	screenHeads := maxHeaderBytes(srv) + 4<<10
	if h, ok := srv.Handler.(*Handler); ok {
		queue := keepalive.NewConnQueue(ln.Addr())
		handOff := func(nc net.Conn, prefix []byte) {
			// As the keepalive loop hands off: every head net/http reads
			// is screened (request smuggling; see ScreenConn).
			queue.Push(keepalive.NewScreenConn(keepalive.PrefixConn(nc, prefix), screenHeads))
		}
		ev, err := newLoopFront(ln, h, srv, log, handOff)
		switch {
		case err == nil:
			f.ev, f.queue = ev, queue
			return f
		case !errors.Is(err, errNoLoop):
			log.Warn("serving without event loops", "error", err)
		}
	}
	if keepalive.Supported {
		f.queue = keepalive.NewConnQueue(ln.Addr())
		handOff := f.queue.Push
		if h, ok := srv.Handler.(*Handler); ok && h.h2cApp && h.tracing == nil {
			relay, err := h.newRelay(log)
			if err != nil {
				log.Warn("serving HTTP/2 with net/http", "error", err)
			} else {
				f.relay, f.readHeadTimeout = relay, srv.ReadHeaderTimeout
				handOff = func(nc net.Conn) { go f.serveH2(nc) }
			}
		}
		f.loop = &keepalive.Server{
			Handler:           srv.Handler,
			HandOff:           handOff,
			IdleTimeout:       srv.IdleTimeout,
			ReadHeaderTimeout: srv.ReadHeaderTimeout,
			Log:               log,
			// Every connection starts in the loop, so every head net/http
			// reads is screened (request smuggling; see ScreenConn).
			ScreenHeads: screenHeads,
			YieldFirst:  othersInFlight,
		}
	}
	return f
}

// serveH2 takes a connection the keepalive loop handed off: one that
// opens with HTTP/2's client preface goes to the relay, any other to
// net/http with what was read of it. The preface is compared as it
// arrives, so a shorter HTTP/1 request is not waited on.
func (f *frontDoor) serveH2(nc net.Conn) {
	preface := []byte(http2.ClientPreface)
	var buf [len(http2.ClientPreface)]byte
	n := 0
	if f.readHeadTimeout > 0 {
		_ = nc.SetReadDeadline(time.Now().Add(f.readHeadTimeout))
	}
	for n < len(buf) {
		m, err := nc.Read(buf[n:])
		n += m
		if !bytes.Equal(buf[:n], preface[:n]) {
			break
		}
		if err != nil {
			if n == 0 {
				nc.Close()
				return
			}
			break
		}
	}
	_ = nc.SetReadDeadline(time.Time{})
	if n < len(buf) || !bytes.Equal(buf[:], preface) {
		f.queue.Push(keepalive.PrefixConn(nc, bytes.Clone(buf[:n])))
		return
	}
	// Frames follow: nothing more to screen, and the relay reads the
	// socket itself.
	held, raw := keepalive.Detach(nc)
	f.relay.ServeConn(raw, held)
}

// maxHeaderBytes is the server's limit on a request head.
func maxHeaderBytes(srv *http.Server) int {
	if srv.MaxHeaderBytes > 0 {
		return srv.MaxHeaderBytes
	}
	return http.DefaultMaxHeaderBytes
}

// serve accepts connections until the listener fails or shutdown/close;
// then it returns http.ErrServerClosed, as http.Server.Serve does.
func (f *frontDoor) serve() error {
	if f.ev != nil {
		go func() { _ = f.srv.Serve(f.queue) }()
		f.ev.serve()
		return http.ErrServerClosed
	}
	if f.loop == nil {
		return f.srv.Serve(f.ln)
	}
	go func() { _ = f.srv.Serve(f.queue) }()
	var delay time.Duration
	for {
		nc, err := f.ln.Accept()
		if err != nil {
			if f.closed.Load() {
				return http.ErrServerClosed
			}
			// Out of file descriptors and the like: wait and retry, as
			// net/http does.
			var te interface{ Temporary() bool }
			if errors.As(err, &te) && te.Temporary() {
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			return err
		}
		delay = 0
		go f.loop.ServeConn(nc, nil, nil, nil)
	}
}

// shutdown stops accepting, closes idle connections and waits, until
// deadline, for the others to finish their request and close (both
// servers); context.DeadlineExceeded says some did not.
func (f *frontDoor) shutdown(deadline time.Time) error {
	f.closed.Store(true)
	_ = f.ln.Close()
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if f.ev != nil {
		f.ev.shutdown()
		_ = f.queue.Close()
		err := f.srv.Shutdown(ctx)
		if !f.ev.wait(time.Until(deadline)) && err == nil {
			err = context.DeadlineExceeded
		}
		return err
	}
	if f.loop == nil {
		return f.srv.Shutdown(ctx)
	}
	f.loop.Shutdown()
	_ = f.queue.Close()
	if f.relay != nil {
		f.relay.Drain()
	}
	err := f.srv.Shutdown(ctx)
	if !f.loop.Wait(time.Until(deadline)) && err == nil {
		err = context.DeadlineExceeded
	}
	if f.relay != nil && !f.relay.Wait(time.Until(deadline)) && err == nil {
		err = context.DeadlineExceeded
	}
	return err
}

// close cuts every connection.
func (f *frontDoor) close() {
	f.closed.Store(true)
	_ = f.ln.Close()
	_ = f.srv.Close()
	if f.ev != nil {
		_ = f.queue.Close()
		f.ev.close()
	}
	if f.loop != nil {
		_ = f.queue.Close()
		f.loop.Close()
	}
	if f.relay != nil {
		f.relay.Close()
	}
}
