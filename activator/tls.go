package activator

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
	"github.com/nomad-serverless/nomad-serverless/datapath/rawio"
)

// TLS is what the gateway asks of whatever holds its certificates (package
// certs) on its plain HTTP port.
type TLS interface {
	// ServeChallenge answers an ACME HTTP-01 challenge request and
	// reports whether r was one.
	ServeChallenge(w http.ResponseWriter, r *http.Request) bool
	// HasCertificate reports whether an HTTPS client asking for host
	// would get a certificate valid now.
	HasCertificate(host string) bool
}

// acmeChallengePrefix is where ACME's HTTP-01 challenges are asked (RFC
// 8555, section 8.3). Such a request is answered before routing and is
// never redirected.
const acmeChallengePrefix = "/.well-known/acme-challenge/"

// plainHTTPTLS answers what the plain HTTP port owes to HTTPS: ACME's
// HTTP-01 challenges, and the redirect of a service that asks for it
// (https { redirect = true }) once its name has a certificate. It reports
// whether it answered r.
func (g *Gateway) plainHTTPTLS(w http.ResponseWriter, r *http.Request, t *table, host string) bool {
	// Deadlines for our own short answer: a kept-alive connection must
	// not inherit an earlier request's.
	shortAnswer := func() {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(g.cfg.ReadHeaderTimeout))
	}
	if strings.HasPrefix(r.URL.Path, acmeChallengePrefix) {
		// Never redirected, answered by us or not: a CA validating a
		// token another server ordered must reach whatever serves it.
		if g.tls.ServeChallenge(w, r) {
			shortAnswer()
			return true
		}
		return false
	}
	// The public names only: an internal service's name is redirected
	// no more than a name nobody routes.
	rt := t.public[host]
	if rt == nil || !rt.redirect || !g.tls.HasCertificate(host) {
		return false
	}
	shortAnswer()
	target := "https://" + host
	if p := g.cfg.HTTPSPort; p != 0 && p != 443 {
		target += ":" + strconv.Itoa(p)
	}
	target += r.URL.RequestURI()
	w.Header().Set("Location", target)
	// 308 keeps the method and the body (a POST stays a POST), where 301
	// lets clients turn it into a GET.
	writeError(w, http.StatusPermanentRedirect, "this service is served over HTTPS: %s", target)
	g.metrics.redirects.Inc()
	return true
}

// Host is a name the gateway routes, and what it routes to.
type Host struct {
	Host, Service, Namespace string
	// Tag is the tag the name routes to ("" for the service's split).
	Tag string
	// Internal: the name is an internal service's, routed on the
	// internal listener only.
	Internal bool
}

// Hosts lists the names the gateway routes now on any listener, sorted:
// the names a certificate may be wanted for.
func (g *Gateway) Hosts() []Host {
	t := g.table.Load()
	out := make([]Host, 0, len(t.hosts))
	for h, rt := range t.hosts {
		out = append(out, Host{Host: h, Service: rt.service, Namespace: rt.namespace, Tag: rt.tag, Internal: rt.internal})
	}
	slices.SortFunc(out, func(a, b Host) int { return strings.Compare(a.Host, b.Host) })
	return out
}

// TLSServer returns the http.Server for the HTTPS port, with the limits of
// Server: serve it on TLSListener. HTTP/2 (ALPN h2) and HTTP/1.1 both
// reach the gateway as on the plain port: every request is routed,
// split, counted and held alike, and r.TLS is set (X-Forwarded-Proto and
// Forwarded say https). Its HTTP/1.1 keep-alive connections with plain
// requests move into the gateway's own loop as on the plain port
// (keepalive.go): on net/http they made 0.78x HAProxy's requests a
// second over TLS, for the same per-request machinery as on plain HTTP.
func (g *Gateway) TLSServer(addr string) *http.Server {
	t := newTakeOver(g, g.serveTLS, tlsConnContext)
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetHTTP2(true) // for the *tls.Conn that negotiated h2; no h2c here
	takeOrServe := func(w http.ResponseWriter, r *http.Request) {
		// r.TLS is not set yet (serveTLS sets it): net/http saw the
		// screen, not the *tls.Conn, so Eligible does not refuse it.
		if t.eligible(r) && t.serve(w, r) {
			return
		}
		g.serveTLS(w, r)
	}
	srv := &http.Server{
		Addr:              addr,
		Handler:           h2Guard{g: g, next: takeOrServe}, // rapid reset: h2reset.go
		Protocols:         &protos,
		HTTP2:             http2Limits(),
		ReadHeaderTimeout: g.cfg.ReadHeaderTimeout,
		IdleTimeout:       g.cfg.IdleTimeout,
		MaxHeaderBytes:    g.cfg.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
		ConnContext: func(ctx context.Context, nc net.Conn) context.Context {
			return withH2Conn(tlsConnContext(ctx, nc), nc)
		},
	}
	srv.RegisterOnShutdown(t.shutdown)
	g.useRelay(srv, publicScope, "https", true)
	return srv
}

// tlsConnContext carries the TLS state of an HTTPS connection that net/http
// does not see as a *tls.Conn (it reads HTTP/1.1 through the head screen,
// and the fallback server reads what the loop handed off) to serveTLS.
func tlsConnContext(ctx context.Context, c net.Conn) context.Context {
	for c != nil {
		switch x := c.(type) {
		case *tls.Conn:
			st := x.ConnectionState()
			return context.WithValue(ctx, tlsStateKey{}, &st)
		case interface{ NetConn() net.Conn }:
			c = x.NetConn()
		default:
			return ctx
		}
	}
	return ctx
}

type tlsStateKey struct{}

// serveTLS serves a request of the HTTPS port. An HTTP/1.1 connection
// reaches net/http through the head screen (TLSListener), which hides the
// *tls.Conn from it, so its state comes from the connection's context.
func (g *Gateway) serveTLS(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil {
		st, ok := r.Context().Value(tlsStateKey{}).(*tls.ConnectionState)
		if !ok {
			// Not from TLSListener: nothing says it was encrypted.
			writeError(w, http.StatusMisdirectedRequest, "this port serves HTTPS only")
			return
		}
		r.TLS = st
	}
	g.serveHTTP(w, r)
}

// TLSListener accepts TLS connections on ln with cfg: it completes each
// handshake itself (at most the read-header timeout, each in its own
// goroutine, so a slow client holds up nobody else), then hands the
// connection to the server from TLSServer. One that negotiated h2 goes as
// the *tls.Conn, which net/http's HTTP/2 server needs; an HTTP/1.1 one
// goes through the same head screen as the plain port
// (keepalive.ScreenConn), so heads a front proxy could frame differently
// are refused over TLS too. An ACME server's TLS-ALPN-01 validation ends
// with its handshake.
func (g *Gateway) TLSListener(ln net.Listener, cfg *tls.Config) net.Listener {
	l := &tlsListener{
		Listener: ln, cfg: cfg, maxHead: g.cfg.MaxHeaderBytes + 4<<10,
		timeout: g.cfg.ReadHeaderTimeout, log: g.log,
		ch: make(chan net.Conn), done: make(chan struct{}),
	}
	go l.acceptLoop()
	return l
}

type tlsListener struct {
	net.Listener
	cfg     *tls.Config
	maxHead int
	timeout time.Duration
	log     *slog.Logger

	ch        chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
	errMu     sync.Mutex
	err       error // why accepting stopped
}

func (l *tlsListener) acceptLoop() {
	var delay time.Duration
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				// Out of file descriptors and the like: back off as
				// net/http does, rather than spin.
				delay = min(max(2*delay, 5*time.Millisecond), time.Second)
				time.Sleep(delay)
				continue
			}
			l.errMu.Lock()
			l.err = err
			l.errMu.Unlock()
			l.Close()
			return
		}
		delay = 0
		go l.handshake(c)
	}
}

func (l *tlsListener) handshake(c net.Conn) {
	// Its records are read and written with raw system calls, as the
	// plain port's requests are (package rawio says why).
	tc := tls.Server(rawio.NewNetConn(c), l.cfg)
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	go func() {
		// The handshake ends with the listener too.
		select {
		case <-l.done:
			cancel()
		case <-ctx.Done():
		}
	}()
	if err := tc.HandshakeContext(ctx); err != nil {
		l.log.Debug("TLS handshake failed", "remote", c.RemoteAddr().String(), "err", err)
		_ = c.Close()
		return
	}
	var out net.Conn
	switch tc.ConnectionState().NegotiatedProtocol {
	case "h2":
		out = tc
	case "", "http/1.1":
		out = keepalive.NewScreenConn(tc, l.maxHead)
	default: // acme-tls/1: the validation is the handshake
		_ = tc.Close()
		return
	}
	select {
	case l.ch <- out:
	case <-l.done:
		_ = out.Close()
	}
}

// Accept returns the next connection whose handshake completed.
func (l *tlsListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.ch:
		return c, nil
	case <-l.done:
		l.errMu.Lock()
		defer l.errMu.Unlock()
		if l.err != nil {
			return nil, l.err
		}
		return nil, net.ErrClosed
	}
}

// Close stops accepting; handshakes under way are abandoned.
func (l *tlsListener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		err = l.Listener.Close()
	})
	return err
}
