package activator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// revisionHeaderKey is spec.RevisionHeader in canonical form, for direct
// map access on the hot path.
var revisionHeaderKey = http.CanonicalHeaderKey(spec.RevisionHeader)

// forward is one proxied request's state, shared by ServeHTTP, the proxy's
// hooks and the retrying transport through the request's context.
type forward struct {
	g      *Gateway
	rev    *revision
	b      *backend // the slot held now; nil after a failed retry
	body   *guardedBody
	status int   // the instance's status code, 0 if none
	err    error // why the proxy failed, if it did
	tries  int
	// vals backs the values of the response header forwardH1 reads:
	// one allocation with the forward instead of one per header. A forward
	// is never reused, so the header map may keep them after the request.
	vals [12]string
}

type forwardKey struct{}

func forwardOf(r *http.Request) *forward {
	f, _ := r.Context().Value(forwardKey{}).(*forward)
	return f
}

// ServeHTTP routes and proxies one user request. A plain request on a
// keep-alive connection of a server from Gateway.Server moves the
// connection into the gateway's own keep-alive loop (keepalive.go), which
// serves it and the requests that follow.
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if t, ok := r.Context().Value(takeOverKey{}).(*takeOver); ok && t.eligible(r) && t.serve(w, r) {
		return
	}
	g.serveHTTP(w, r)
}

// serveHTTP routes and proxies one request, whichever server read it.
func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	defer g.recoverPanic(w, r)

	rc := http.NewResponseController(w)
	t := g.table.Load()
	rev, rt, tg, res := t.resolve(canonicalHost(r.Host), r.Header[revisionHeaderKey])
	if res != resolved {
		// Deadlines for our own short answer; a kept-alive connection
		// must not inherit an earlier request's.
		_ = rc.SetWriteDeadline(start.Add(g.cfg.ReadHeaderTimeout))
		g.notRouted(w, r, rt, tg, res)
		return
	}
	cfg := rev.cfg.Load()
	m := rev.metrics
	var f *forward
	status := 0
	defer func() {
		if f != nil {
			status = f.status
		}
		m.codes[codeIndex(status)].Inc()
		m.duration.Observe(time.Since(start).Seconds())
	}()

	// The request must end by deadline (the revision's timeout, queue wait
	// included); the connection may be busy for the longest queue wait
	// plus that.
	deadline := start.Add(cfg.timeout)
	connDeadline := start.Add(g.cfg.QueueTimeout + cfg.timeout + time.Second)
	fast := fastPathOK(r)
	if !fast {
		// Only a body is read after the header (whose own timeout the
		// server enforces); a body-less request needs no read deadline.
		_ = rc.SetReadDeadline(connDeadline)
	}
	_ = rc.SetWriteDeadline(connDeadline)

	if g.cfg.MaxBodyBytes > 0 && r.ContentLength > g.cfg.MaxBodyBytes {
		status = http.StatusRequestEntityTooLarge
		writeError(w, status, "request body of %d bytes is larger than the gateway's limit of %d bytes", r.ContentLength, g.cfg.MaxBodyBytes)
		return
	}

	b := rev.tryAcquire()
	if b == nil {
		ctx, cancel := context.WithDeadline(r.Context(), deadline)
		var err error
		b, err = rev.wait(ctx, g.cfg.QueueDepth, g.cfg.QueueTimeout)
		cancel()
		m.queueWait.Observe(time.Since(start).Seconds())
		if err != nil {
			status = g.writeAcquireError(w, r, rev, cfg, err)
			return
		}
	}
	rev.inflight.Add(1)
	f = &forward{g: g, rev: rev, b: b}
	defer func() {
		rev.inflight.Add(-1)
		if f.b != nil {
			rev.release(f.b)
		}
	}()

	if fast {
		g.forwardH1(w, r, f, deadline)
		return
	}

	// Bodies, upgrades, HTTP/2: httputil.ReverseProxy streams both ways.
	if r.Body != nil && r.Body != http.NoBody {
		var body io.ReadCloser = r.Body
		if g.cfg.MaxBodyBytes > 0 {
			body = http.MaxBytesReader(w, body, g.cfg.MaxBodyBytes)
		}
		f.body = &guardedBody{rc: body}
		r.Body = f.body
	}
	ctx, cancel := context.WithDeadline(r.Context(), deadline)
	defer cancel()
	g.proxy.ServeHTTP(w, r.WithContext(context.WithValue(ctx, forwardKey{}, f)))
}

// notRouted answers a request that has no revision.
func (g *Gateway) notRouted(w http.ResponseWriter, r *http.Request, rt *route, tg *target, res resolution) {
	switch res {
	case unknownHost:
		g.metrics.unknownHost.Inc()
		writeError(w, http.StatusNotFound,
			"no service answers on host %q. Services answer on <service>.<namespace>.%s, on the domains they declare, and on <tag>-<service>.<namespace>.%s for tagged revisions; `nomad-serverless list` shows them",
			r.Host, g.domain, g.domain)
	case unknownHeaderR:
		g.metrics.unknownHost.Inc()
		writeError(w, http.StatusNotFound, "no service answers on host %q, and revision %q named by %s is not known to the gateway",
			r.Host, r.Header.Get(spec.RevisionHeader), spec.RevisionHeader)
	case noTraffic:
		writeError(w, http.StatusServiceUnavailable, "service %s in namespace %s routes no traffic (its traffic list has only tags); use a tag host or set a percent", rt.service, rt.namespace)
	case unknownTarget:
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "service %s routes to revision %s, which the gateway does not know yet; retry in a moment", rt.service, tg.name)
	}
}

// writeAcquireError answers a request that got no instance and returns the
// status it wrote (0 when the client is gone).
func (g *Gateway) writeAcquireError(w http.ResponseWriter, r *http.Request, rev *revision, cfg *revisionConfig, err error) int {
	m := rev.metrics
	switch {
	case errors.Is(err, errQueueFull):
		m.rejectedFull.Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable,
			"revision %s has no free capacity and %d requests already wait for it (the gateway's queue limit); retry shortly",
			rev.name, g.cfg.QueueDepth)
		return http.StatusServiceUnavailable
	case errors.Is(err, errQueueTimeout):
		m.rejectedTimeout.Inc()
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable,
			"revision %s had no free capacity for %s (the gateway's queue timeout); it may be starting or overloaded, retry later",
			rev.name, g.cfg.QueueTimeout)
		return http.StatusServiceUnavailable
	case errors.Is(err, errRevisionGone), errors.Is(err, errShutdown):
		w.Header().Set("Retry-After", "1")
		writeError(w, http.StatusServiceUnavailable, "request for revision %s not served: %v; retry", rev.name, err)
		return http.StatusServiceUnavailable
	case r.Context().Err() != nil:
		return 0 // the client went away while waiting; its slot is freed
	case errors.Is(err, context.DeadlineExceeded):
		writeError(w, http.StatusGatewayTimeout, "revision %s did not answer within its timeout of %s (no instance became free in time)", rev.name, cfg.timeout)
		return http.StatusGatewayTimeout
	}
	writeError(w, http.StatusBadGateway, "revision %s: %v", rev.name, err)
	return http.StatusBadGateway
}

// writeError writes a plain-text error that says what happened and what to
// do, prefixed with the product's name so it is not mistaken for the app's.
func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	fmt.Fprintf(w, "nomad-serverless: "+format+"\n", args...)
}

// recoverPanic keeps a panic in one request from taking the process down.
// http.ErrAbortHandler (the proxy aborting a response it cannot finish) is
// passed on: net/http closes the connection quietly.
func (g *Gateway) recoverPanic(w http.ResponseWriter, r *http.Request) {
	p := recover()
	if p == nil {
		return
	}
	if p == http.ErrAbortHandler {
		panic(p)
	}
	g.metrics.panics.Inc()
	g.log.Error("panic while serving a request", "host", r.Host, "path", r.URL.Path, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	writeError(w, http.StatusInternalServerError, "internal error while serving this request (logged as a bug); retry")
}

// newProxy builds the reverse proxy: Rewrite points the request at the
// reserved instance, the transport retries refused connections elsewhere.
func (g *Gateway) newProxy() *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      &retryTransport{g: g},
		BufferPool:     g.buffers,
		ModifyResponse: modifyResponse,
		ErrorHandler:   g.proxyError,
		ErrorLog:       slog.NewLogLogger(g.log.Handler(), slog.LevelDebug),
	}
}

var (
	headerXFF = http.CanonicalHeaderKey("X-Forwarded-For")
	headerXFH = http.CanonicalHeaderKey("X-Forwarded-Host")
	headerXFP = http.CanonicalHeaderKey("X-Forwarded-Proto")
)

func rewrite(pr *httputil.ProxyRequest) {
	f := forwardOf(pr.In)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = f.b.hostPort
	out.Host = pr.In.Host
	// The revision the gateway chose, whatever the client sent.
	out.Header[revisionHeaderKey] = f.rev.header
	// X-Forwarded-*: keep what a load balancer in front of us set, and
	// add this hop.
	in := pr.In.Header
	if v, ok := in[headerXFF]; ok {
		out.Header[headerXFF] = v
	}
	pr.SetXForwarded()
	if v, ok := in[headerXFH]; ok {
		out.Header[headerXFH] = v
	}
	if v, ok := in[headerXFP]; ok {
		out.Header[headerXFP] = v
	}
}

func modifyResponse(resp *http.Response) error {
	if f := forwardOf(resp.Request); f != nil {
		f.status = resp.StatusCode
	}
	return nil
}

// proxyError answers a request the proxy could not complete.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	f := forwardOf(r)
	rev := f.rev
	switch {
	case f.body != nil && f.body.tooLarge.Load():
		f.status = http.StatusRequestEntityTooLarge
		writeError(w, f.status, "request body is larger than the gateway's limit of %d bytes", g.cfg.MaxBodyBytes)
	case f.err != nil:
		// A retry found no instance.
		f.status = g.writeAcquireError(w, r, rev, rev.cfg.Load(), f.err)
	case r.Context().Err() != nil && errors.Is(context.Cause(r.Context()), context.DeadlineExceeded) && !clientGone(r):
		f.status = http.StatusGatewayTimeout
		writeError(w, f.status, "revision %s did not answer within its timeout of %s", rev.name, rev.cfg.Load().timeout)
	case clientGone(r):
		f.status = 0
	default:
		f.status = http.StatusBadGateway
		addr := ""
		if f.b != nil {
			addr = f.b.hostPort
		}
		g.log.Warn("proxy to instance failed", "revision", rev.name, "instance", addr, "err", err)
		writeError(w, f.status, "instance %s of revision %s failed to answer: %v", addr, rev.name, err)
	}
}

// clientGone reports whether the request's client went away (as opposed to
// the request's own timeout).
func clientGone(r *http.Request) bool {
	ctx := r.Context()
	return ctx.Err() != nil && errors.Is(context.Cause(ctx), context.Canceled)
}

// retryTransport sends a request to its reserved instance and, when that
// instance refused the connection before any byte of the request was sent
// (so the app provably never saw it), reserves another instance and tries
// again, up to maxRetries times.
type retryTransport struct{ g *Gateway }

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f := forwardOf(req)
	if f == nil {
		return nil, errors.New("activator: request without routing state")
	}
	for {
		resp, err := t.g.transport.RoundTrip(req)
		if err == nil {
			return resp, nil
		}
		if !refusedBeforeSend(err) || (f.body != nil && f.body.touched.Load()) || f.tries >= maxRetries {
			return nil, err
		}
		deadline, _ := req.Context().Deadline()
		if !f.reacquire(req, deadline) {
			return nil, f.err
		}
		req.URL.Host = f.b.hostPort
	}
}

// refusedBeforeSend is true for a dial that was refused: no connection, so
// nothing of the request left this process.
func refusedBeforeSend(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial" && errors.Is(err, syscall.ECONNREFUSED)
}

// guardedBody wraps a request body so the retrying transport can tell
// whether any of it was read (then a retry could duplicate it) and so the
// transport's Close on a failed dial does not end the body a retry needs.
type guardedBody struct {
	rc       io.ReadCloser
	touched  atomic.Bool
	tooLarge atomic.Bool
}

func (b *guardedBody) Read(p []byte) (int, error) {
	b.touched.Store(true)
	n, err := b.rc.Read(p)
	var mbe *http.MaxBytesError
	if err != nil && errors.As(err, &mbe) {
		b.tooLarge.Store(true)
	}
	return n, err
}

// Close is a no-op: net/http closes the real body when the handler returns.
func (b *guardedBody) Close() error { return nil }

// copyBufferSize is the size of the copy buffers of both forwarding paths.
const copyBufferSize = 32 << 10

// bufferPool recycles the copy buffers of ReverseProxy and forwardH1. It
// pools array pointers: putting a []byte (or a pointer to a fresh slice
// header) into a sync.Pool would allocate at every Put.
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	bp := &bufferPool{}
	bp.p.New = func() any { return new([copyBufferSize]byte) }
	return bp
}

func (bp *bufferPool) Get() []byte { return bp.p.Get().(*[copyBufferSize]byte)[:] }

func (bp *bufferPool) Put(b []byte) {
	if cap(b) >= copyBufferSize {
		bp.p.Put((*[copyBufferSize]byte)(b[:copyBufferSize]))
	}
}
