package controlplane

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
)

// listeners are the control plane's sockets and the HTTP servers on them:
// the gateway's (user traffic) and the admin API's. Every socket Run opens,
// and how each is served and shut down, is here.
type listeners struct {
	listen         string // the gateway's address as configured
	gateway, admin net.Listener
	gatewaySrv     *http.Server
	adminSrv       *http.Server
	// https is the gateway's HTTPS port (nil without one); httpsTLS the
	// listener that completes its handshakes.
	https, httpsTLS net.Listener
	httpsSrv        *http.Server
	// internal is the gateway's internal listener (nil without one),
	// where internal services are served too; plain HTTP, screened as
	// the gateway's port is.
	internal, internalScreened net.Listener
	internalSrv                *http.Server
	// Both sockets screen request heads for smuggling (CL with TE,
	// duplicate CL, obs-fold) before net/http reads them.
	gatewayScreened, adminScreened net.Listener
	// kept are descriptors of sockets taken from a keeper, to stop them
	// listening at shutdown (stopListening); stopping is set once that
	// began, when the servers' failed accepts are the shutdown's doing.
	kept     []*os.File
	stopping atomic.Bool
}

// listen opens both sockets. Run does it first: a port in use is the most
// common start-up failure and should be said before anything registers
// anywhere. With c.Sockets the gateway's sockets come from the keeper
// there (sockets.go); the admin API's is always serve's own, so its health
// check fails the moment serve dies.
func listen(ctx context.Context, c Config) (*listeners, error) {
	admin, err := net.Listen("tcp", c.AdminListen)
	if err != nil {
		return nil, fmt.Errorf("listen for the admin API on %s: %w", c.AdminListen, err)
	}
	l := &listeners{listen: c.Listen, admin: admin}
	if c.Sockets != "" {
		held, err := takeSockets(ctx, c.Sockets)
		if err != nil {
			admin.Close()
			return nil, err
		}
		l.gateway, l.https, l.internal = held[SocketGateway], held[SocketHTTPS], held[SocketInternal]
		for _, hl := range held {
			f, err := hl.(*net.TCPListener).File()
			if err != nil {
				l.close()
				return nil, fmt.Errorf("keep a descriptor of the kept socket %s: %w", hl.Addr(), err)
			}
			l.kept = append(l.kept, f)
		}
		switch {
		case l.gateway == nil:
			l.close()
			return nil, fmt.Errorf("the socket keeper at %s holds no gateway socket (it holds %d): give it -listen", c.Sockets, len(held))
		case c.HTTPS.Listen != "" && l.https == nil:
			l.close()
			return nil, fmt.Errorf("the socket keeper at %s holds no HTTPS socket: give it -https-listen %s", c.Sockets, c.HTTPS.Listen)
		case c.InternalListen != "" && l.internal == nil:
			l.close()
			return nil, fmt.Errorf("the socket keeper at %s holds no internal listener's socket: give it -internal-listen %s", c.Sockets, c.InternalListen)
		}
		return l, nil
	}
	if l.gateway, err = net.Listen("tcp", c.Listen); err != nil {
		admin.Close()
		return nil, fmt.Errorf("listen for the gateway on %s: %w", c.Listen, err)
	}
	if c.HTTPS.Listen != "" {
		if l.https, err = net.Listen("tcp", c.HTTPS.Listen); err != nil {
			l.close()
			return nil, fmt.Errorf("listen for the gateway's HTTPS on %s: %w", c.HTTPS.Listen, err)
		}
	}
	if c.InternalListen != "" {
		if l.internal, err = net.Listen("tcp", c.InternalListen); err != nil {
			l.close()
			return nil, fmt.Errorf("listen for the gateway's internal listener on %s: %w", c.InternalListen, err)
		}
	}
	return l, nil
}

// internalPort is the internal listener's port, 0 without one.
func (l *listeners) internalPort() int {
	if l.internal == nil {
		return 0
	}
	return l.internal.Addr().(*net.TCPAddr).Port
}

// serveInternal serves the internal listener until shutdown (nothing
// without one); call serveWith first.
func (l *listeners) serveInternal() error {
	if l.internalSrv == nil {
		return nil
	}
	return l.served(l.internalSrv.Serve(l.internalScreened))
}

// httpsPort is the HTTPS port, 0 without one.
func (l *listeners) httpsPort() int {
	if l.https == nil {
		return 0
	}
	return l.https.Addr().(*net.TCPAddr).Port
}

// serveHTTPSWith sets up the HTTPS server with the certificates' TLS
// configuration; without an HTTPS port it does nothing.
func (l *listeners) serveHTTPSWith(gw *activator.Gateway, cfg *tls.Config) {
	if l.https == nil {
		return
	}
	l.httpsSrv = gw.TLSServer(l.https.Addr().String())
	l.httpsTLS = gw.TLSListener(l.https, cfg)
}

// serveHTTPS serves until shutdown (nothing without an HTTPS port).
func (l *listeners) serveHTTPS() error {
	if l.httpsSrv == nil {
		return nil
	}
	return l.served(l.httpsSrv.Serve(l.httpsTLS))
}

func (l *listeners) gatewayPort() int { return l.gateway.Addr().(*net.TCPAddr).Port }
func (l *listeners) adminPort() int   { return l.admin.Addr().(*net.TCPAddr).Port }

// serveWith sets up the servers: the gateway's own (tuned by the activator)
// and the admin API's around handler.
func (l *listeners) serveWith(gw *activator.Gateway, admin http.Handler) {
	l.gatewaySrv = gw.Server(l.listen)
	l.gatewayScreened = gw.Listener(l.gateway)
	if l.internal != nil {
		l.internalSrv = gw.InternalServer(l.internal.Addr().String())
		l.internalScreened = gw.Listener(l.internal)
	}
	l.adminSrv = &http.Server{Handler: admin, ReadHeaderTimeout: 10 * time.Second}
	l.adminScreened = keepalive.ScreenListener{Listener: l.admin, MaxHead: http.DefaultMaxHeaderBytes + 4<<10}
}

// serveGateway and serveAdmin serve until shutdown; call serveWith first.
func (l *listeners) serveGateway() error { return l.served(l.gatewaySrv.Serve(l.gatewayScreened)) }
func (l *listeners) serveAdmin() error   { return ignoreClosed(l.adminSrv.Serve(l.adminScreened)) }

// served is what a server's Serve returned, nil when it is the shutdown's
// doing.
func (l *listeners) served(err error) error {
	if l.stopping.Load() {
		return nil
	}
	return ignoreClosed(err)
}

// shutdown stops taking requests and lets in-flight ones finish until ctx
// ends. Sockets taken from a keeper stop listening first, for the keeper
// too, so the port refuses new connections while in-flight ones drain.
func (l *listeners) shutdown(ctx context.Context) {
	l.stopping.Store(true)
	l.stopKept()
	if l.httpsSrv != nil {
		go func() { _ = l.httpsSrv.Shutdown(ctx) }()
	}
	if l.internalSrv != nil {
		go func() { _ = l.internalSrv.Shutdown(ctx) }()
	}
	_ = l.gatewaySrv.Shutdown(ctx)
	_ = l.adminSrv.Shutdown(ctx)
}

// stopKept stops the sockets taken from a keeper listening, for the keeper
// too: serve is leaving on purpose, so the port refuses as it would
// without a keeper.
func (l *listeners) stopKept() {
	for _, f := range l.kept {
		stopListening(f)
	}
	l.kept = nil
}

// close closes both sockets (after shutdown, a no-op).
func (l *listeners) close() {
	l.stopping.Store(true)
	if l.gateway != nil {
		l.gateway.Close()
	}
	l.admin.Close()
	l.stopKept()
	if l.https != nil {
		l.https.Close()
	}
	if l.internal != nil {
		l.internal.Close()
	}
	if l.httpsTLS != nil {
		l.httpsTLS.Close()
	}
}

func ignoreClosed(err error) error {
	if errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}
