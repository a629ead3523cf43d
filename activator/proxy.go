package activator

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httputil"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"github.com/nomad-serverless/nomad-serverless/datapath/h2proxy"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// revisionHeaderKey is spec.RevisionHeader in canonical form, for direct
// map access on the hot path.
var revisionHeaderKey = http.CanonicalHeaderKey(spec.RevisionHeader)

// notServedKey is spec.NotServedHeader in canonical form: the sidecar's
// word to the gateway, removed from everything passed on.
var notServedKey = http.CanonicalHeaderKey(spec.NotServedHeader)

// forward is one proxied request's state, shared by ServeHTTP, the proxy's
// hooks and the retrying transport through the request's context.
type forward struct {
	g    *Gateway
	rev  *revision
	b    *backend // the slot held now; nil after a failed retry
	body *replayBody
	// deadline ends the wait for the response (start plus the revision's
	// timeout); start and out carry it on the ReverseProxy path.
	deadline time.Time
	start    responseStart
	rc       *http.ResponseController
	out      *stallWriter
	stall    time.Duration // the stall bound once started: the revision's timeout plus stallSlack
	// h2: the request is an HTTP/2 stream, which has no deadline until
	// its response starts; connDeadline then bounds an answer of the
	// gateway's own (errorDeadline).
	h2           bool
	connDeadline time.Time
	status       int   // the instance's status code, 0 if none
	err          error // why the proxy failed, if it did
	tries        int
	// wake is the wake from zero this request waited through, whose
	// timeline it stamps (sent, first byte); nil for every other request.
	wake *wake
	// spans are a sampled request's server and forward spans, for a
	// protocol switch to end at its 101 (tracing.go); nil otherwise. One
	// pointer, not the two spans: the forward of every request, traced or
	// not, keeps its allocation size.
	spans *forwardSpans
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

// ServeHTTP routes and proxies one user request as the public HTTP port
// does. The servers from Server and InternalServer wrap it (or its
// internal twin) with the keep-alive loop (keepalive.go).
func (g *Gateway) ServeHTTP(w http.ResponseWriter, r *http.Request) { g.serveHTTP(w, r) }

// serveHTTP routes and proxies one request of a public port (HTTP or
// HTTPS), whichever server read it.
func (g *Gateway) serveHTTP(w http.ResponseWriter, r *http.Request) { g.serve(w, r, publicScope) }

// serveInternal routes and proxies one request of the internal listener.
func (g *Gateway) serveInternal(w http.ResponseWriter, r *http.Request) {
	g.serve(w, r, internalScope)
}

// serve routes and proxies one request that came in on listener sc. Both
// kinds of listener share everything past routing: the split, the queue
// and wake from zero, balancing, retries.
func (g *Gateway) serve(w http.ResponseWriter, r *http.Request, sc scope) {
	start := time.Now()
	defer g.recoverPanic(w, r)

	rc := http.NewResponseController(w)
	t := g.table.Load()
	host := canonicalHost(r.Host)
	// ACME's challenges and the redirects to HTTPS belong to the public
	// HTTP port: the internal listener has no HTTPS to send anyone to.
	if g.tls != nil && r.TLS == nil && sc == publicScope && g.plainHTTPTLS(w, r, t, host) {
		return
	}
	rev, rt, tg, res := t.resolve(host, r.Header[revisionHeaderKey], sc)
	if res != resolved && !g.catalogLoaded() {
		if !g.awaitLoaded(r.Context()) {
			_ = rc.SetWriteDeadline(time.Now().Add(g.cfg.ReadHeaderTimeout))
			g.metrics.loadingRefused.Inc()
			w.Header().Set("Retry-After", "1")
			writeError(w, http.StatusServiceUnavailable,
				"the gateway is starting and has not loaded the services of the cluster yet (Nomad or Consul is slow to answer); retry in a moment")
			return
		}
		t = g.table.Load()
		rev, rt, tg, res = t.resolve(host, r.Header[revisionHeaderKey], sc)
	}
	if res != resolved {
		// Deadlines for our own short answer; a kept-alive connection
		// must not inherit an earlier request's.
		_ = rc.SetWriteDeadline(start.Add(g.cfg.ReadHeaderTimeout))
		g.notRouted(w, r, rt, tg, res)
		return
	}
	cfg := rev.cfg.Load()
	m := rev.metrics()
	var f *forward
	status := 0
	var sp trace.Span          // the request's server span; nil: tracing off
	var tp tracing.Traceparent // a root's not-sampled decision, for the instance
	if g.tracing != nil {
		r, sp, tp = g.startRequestSpan(r, rev, rt)
	}
	defer func() {
		if f != nil {
			status = f.status
		}
		took := time.Since(start)
		m.codes[codeIndex(status)].Inc()
		if sp != nil {
			tracing.Observe(m.duration, took.Seconds(), sp.SpanContext())
			endRequestSpan(sp, f, status)
		} else {
			m.duration.Observe(took.Seconds())
		}
		rev.measure.observe(status, took)
		g.markActive(rev) // after observe: its delta is reported
	}()

	// The request must end by deadline (the revision's timeout, queue wait
	// included); the connection may be busy for the longest queue wait
	// plus that.
	deadline := start.Add(cfg.timeout)
	connDeadline := start.Add(g.cfg.QueueTimeout + cfg.timeout + time.Second)
	fast := fastPathOK(r)
	// An HTTP/2 stream's deadlines are its own (no earlier request's to
	// replace), and each change is a message to the connection's serving
	// goroutine and a timer. Until its response starts the stream is
	// bounded without them: the queue wait and the wait for the response
	// head end at deadline (rev.wait's context, responseStart), and
	// started sets the stall bounds. So a stream gets a deadline here only
	// for an answer of the gateway's own (errorDeadline), which a client
	// that grants no flow-control window would otherwise hold.
	h2 := r.ProtoMajor == 2
	if !fast && !h2 {
		// Only a body is read after the header (whose own timeout the
		// server enforces); a body-less request needs no read deadline.
		_ = rc.SetReadDeadline(connDeadline)
	}
	if !h2 {
		_ = rc.SetWriteDeadline(connDeadline)
	}
	errorDeadline := func() {
		if h2 {
			_ = rc.SetWriteDeadline(connDeadline)
		}
	}

	if g.cfg.MaxBodyBytes > 0 && r.ContentLength > g.cfg.MaxBodyBytes {
		errorDeadline()
		status = http.StatusRequestEntityTooLarge
		writeError(w, status, "request body of %d bytes is larger than the gateway's limit of %d bytes", r.ContentLength, g.cfg.MaxBodyBytes)
		return
	}

	b := rev.tryAcquire()
	var wk *wake
	if b == nil {
		ctx, cancel := context.WithDeadline(r.Context(), deadline)
		var hold trace.Span
		if sp != nil {
			ctx, hold = g.startHold(ctx)
		}
		var err error
		b, err = rev.wait(ctx, g.cfg.QueueDepth, g.cfg.QueueTimeout)
		cancel()
		if hold != nil {
			endHold(hold, err)
		}
		m.queueWait.Observe(time.Since(start).Seconds())
		if err != nil {
			errorDeadline()
			status = g.writeAcquireError(w, r, rev, cfg, err)
			return
		}
		wk = rev.openWake.Load()
	}
	rev.inflight.Add(1)
	g.markActive(rev)
	rev.budget.deposit()
	f = &forward{g: g, rev: rev, b: b, deadline: deadline, stall: cfg.timeout + stallSlack, wake: wk, h2: h2, connDeadline: connDeadline}
	defer func() {
		rev.inflight.Add(-1)
		if f.b != nil {
			rev.release(f.b)
		}
	}()

	if sp != nil {
		f.spans = &forwardSpans{server: sp, forward: g.startForward(r, f)}
		defer endForward(f.spans.forward, f)
	}
	if fast {
		g.forwardH1(w, r, f, deadline, tp)
		return
	}
	tp.SetHeader(r.Header)

	// Bodies, upgrades, HTTP/2: httputil.ReverseProxy streams both ways.
	if r.Body != nil && r.Body != http.NoBody {
		// The limit is the body's own, not http.MaxBytesReader's: that
		// one sets headers on w from whichever goroutine reads the body
		// (the transport's), racing the handler's writes.
		f.body = &replayBody{src: r.Body, limit: max(g.cfg.MaxBodyBytes, 0)}
		r.Body = f.body
		if r.ProtoMajor == 1 {
			// Full duplex: when a response starts before the body is in,
			// net/http would otherwise read the rest of the body (up to
			// 256 KiB) itself and close it, under the transport that is
			// still sending it: the instance got a cut request and its
			// answer was cut too. The rule net/http applied is then ours
			// (closeUnlessBodyRead).
			f.body.h1 = true
			_ = rc.EnableFullDuplex()
		}
	}
	// The timeout ends the wait for the response head, not the response
	// (deadlines.go).
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	f.start.arm(deadline, cancel)
	defer f.start.stop()
	f.rc = rc
	f.out = &stallWriter{ResponseWriter: w}
	g.proxy.ServeHTTP(f.out, r.WithContext(context.WithValue(ctx, forwardKey{}, f)))
	if f.body != nil && f.body.h1 && !f.body.AtEOF() {
		// The answer said Connection: close; the body, perhaps still
		// being read from the client, must stop holding the connection.
		_ = rc.SetReadDeadline(pastDeadline)
	}
}

// closeUnlessBodyRead makes a response that starts before the request
// body was read to its end close the client's connection: the rest of the
// body will not be read, so what follows it cannot be taken for the next
// request (exactly one response per request).
//
// A body already sent in full is usually read within microseconds of the
// request head; an answer that overtakes it (an app that answers first,
// then reads) waits up to bodyGrace for it rather than lose the
// connection. A full-duplex stream pays that once, at its start.
func (f *forward) closeUnlessBodyRead(h http.Header) {
	if f.body != nil && f.body.h1 && !h1.AwaitEOF(f.body, bodyGrace) {
		h["Connection"] = connectionClose
	}
}

// bodyGrace is how long a response's head waits for the rest of its
// request body (see closeUnlessBodyRead).
const bodyGrace = 5 * time.Millisecond

var (
	connectionClose = []string{"close"}
	// pastDeadline makes a blocked read return at once.
	pastDeadline = time.Unix(1, 0)
)

// catalogLoaded reports whether the table holds the whole catalog.
func (g *Gateway) catalogLoaded() bool {
	select {
	case <-g.loaded:
		return true
	default:
		return false
	}
}

// awaitLoaded holds a request the gateway cannot route while the catalog
// loads, until it is in (true) or for at most LoadingHold, or until the
// client leaves (false).
func (g *Gateway) awaitLoaded(ctx context.Context) bool {
	g.loadingHeld.Add(1)
	defer g.loadingHeld.Add(-1)
	t := time.NewTimer(g.cfg.LoadingHold)
	defer t.Stop()
	select {
	case <-g.loaded:
		return true
	case <-t.C:
	case <-ctx.Done():
	}
	return false
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
	m := rev.metrics()
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
	// After a bug nothing says where the request body was left: end the
	// connection with this answer, so the client does not reuse a
	// connection net/http may close under it.
	w.Header().Set("Connection", "close")
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

	headerForwarded = "Forwarded"
)

func rewrite(pr *httputil.ProxyRequest) {
	f := forwardOf(pr.In)
	out := pr.Out
	out.URL.Scheme = "http"
	out.URL.Host = f.b.hostPort
	out.Host = pr.In.Host
	if f.wake != nil {
		f.wake.sending()
	}
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
	out.Header[headerForwarded] = []string{h1.Forwarded(in, h1.ClientIP(pr.In.RemoteAddr), pr.In.Host, schemeOf(pr.In))}
}

func modifyResponse(resp *http.Response) error {
	if f := forwardOf(resp.Request); f != nil {
		if !f.start.start() {
			return errStartedLate // proxyError answers 504
		}
		f.status = resp.StatusCode
		if f.wake != nil && f.b != nil {
			f.wake.answered(f.b.alloc)
		}
		f.closeUnlessBodyRead(resp.Header)
		if f.body != nil && !f.body.h1 {
			// An answer that ends while the client still sends must not
			// wait for it (h2proxy.EndsRequest).
			resp.Body = h2proxy.EndsRequest(resp.Body, f.body.src)
		}
		upgrade := resp.StatusCode == http.StatusSwitchingProtocols
		if upgrade && f.spans != nil {
			f.endSpansAtUpgrade()
		}
		f.started(upgrade)
	}
	delete(resp.Header, notServedKey)
	return nil
}

// started turns the client connection's deadlines, which bounded the wait
// for the response, into stall bounds for the response's life (see
// deadlines.go). A protocol switch has none: the tunnel is the two ends'
// to keep or close (and the sidecar's drain ends it).
func (f *forward) started(upgrade bool) {
	if upgrade {
		_ = f.rc.SetReadDeadline(time.Time{})
		_ = f.rc.SetWriteDeadline(time.Time{})
		return
	}
	now := time.Now()
	_ = f.rc.SetWriteDeadline(now.Add(f.stall))
	f.out.guard.Store(newStallGuard(f.rc.SetWriteDeadline, f.stall))
	if f.body != nil && !f.body.AtEOF() {
		_ = f.rc.SetReadDeadline(now.Add(f.stall))
		f.body.guard.Store(newStallGuard(f.rc.SetReadDeadline, f.stall))
	}
}

// proxyError answers a request the proxy could not complete.
func (g *Gateway) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	f := forwardOf(r)
	rev := f.rev
	if f.h2 {
		_ = f.rc.SetWriteDeadline(f.connDeadline)
	}
	f.closeUnlessBodyRead(w.Header())
	switch {
	case f.body != nil && f.body.tooLarge.Load():
		f.status = http.StatusRequestEntityTooLarge
		writeError(w, f.status, "request body is larger than the gateway's limit of %d bytes", g.cfg.MaxBodyBytes)
	case f.body != nil && f.body.broken.Load() && !clientGone(r):
		// The client's body, not the instance, failed; net/http closes
		// the connection after this answer (the rest of it is unread).
		f.status = http.StatusBadRequest
		writeError(w, f.status, "the request body could not be read: %v", f.body.srcErr())
	case errors.As(err, new(*notRetriedError)):
		var nr *notRetriedError
		errors.As(err, &nr)
		f.status = g.notRetried(w, f, nr.f, nr.err, nr.why)
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

// retryTransport sends a request to its reserved instance and, when the
// attempt failed in a way that proves the app never saw it (retry.go: the
// dial failed, or the sidecar answered NotServed), ejects the instance if
// the failure says so, reserves another and sends it again, body
// included (replayBody), within the request's tries and the revision's
// budget. http.Transport itself replaces a kept-alive connection that
// broke before the request was written when it can rewind the body.
type retryTransport struct{ g *Gateway }

func (t *retryTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	f := forwardOf(req)
	if f == nil {
		return nil, errors.New("activator: request without routing state")
	}
	out := req
	if f.body != nil {
		out.Body = f.body.first()
	}
	for {
		resp, err := t.g.transport.RoundTrip(out)
		fl := failOther
		switch {
		case err == nil && resp.StatusCode == http.StatusBadGateway && resp.Header[notServedKey] != nil:
			fl = failNotServed
		case err == nil:
			return resp, nil
		default:
			fl = classifyDial(err)
		}
		if !fl.retryable() {
			return nil, err
		}
		if fl.ejects() {
			t.g.ejectBackend(f.rev, f.b, fl)
		}
		var body io.ReadCloser
		why := ""
		if f.body != nil {
			var ok bool
			if body, ok = f.body.rewind(); !ok {
				why = fmt.Sprintf("its body is larger than the %d bytes the gateway keeps for a retry", replayLimit)
			}
		}
		if why == "" {
			why = f.mayRetry()
		}
		if resp != nil {
			// The sidecar's 502 goes no further.
			_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
			resp.Body.Close()
			if err == nil {
				err = errNotServed
			}
		}
		if why != "" {
			return nil, &notRetriedError{f: fl, err: err, why: why}
		}
		if !f.reacquire(req, f.deadline) {
			return nil, f.err
		}
		out = req.Clone(req.Context())
		out.URL.Host = f.b.hostPort
		if body != nil {
			out.Body = body
		}
	}
}

// notRetriedError is a retryable failure that was not retried, and why.
type notRetriedError struct {
	f   failure
	err error
	why string
}

func (e *notRetriedError) Error() string {
	return e.f.String() + ": " + e.err.Error() + "; not retried: " + e.why
}
func (e *notRetriedError) Unwrap() error { return e.err }

// replayLimit is the most of a request body the gateway keeps so that it
// can send the request again (Envoy likewise retries only requests whose
// body fits its buffer). Most bodies that a retry matters for (API calls,
// form posts) are far smaller; a bigger one streams as before and is not
// retried.
const replayLimit = 64 << 10

// replayBody is a request body that the retrying transport may send
// again: what it has handed out is kept, up to replayLimit bytes, so that
// a request an instance did not serve goes to another with the same
// bytes. Every attempt reads through a view of its own; a view whose
// attempt was superseded fails, so a transport still writing the last
// attempt's body cannot take bytes from the next. It also tells proxyError
// why a body failed (too large, or broken by the client).
//
// Reads hold the mutex, a read from the client included: only one attempt
// reads at a time anyway, and a rewind waits for a read in progress to
// keep what it gets.
type replayBody struct {
	mu       sync.Mutex
	src      io.ReadCloser
	h1       bool   // an HTTP/1 request's, read full duplex (set before use)
	limit    int64  // the most src may give (0: no limit)
	given    int64  // what it gave so far
	kept     []byte // what src gave so far, while within replayLimit
	overflow bool   // more than replayLimit was read: no replay
	err      error  // src's error, sticky (io.EOF at the end)
	gen      int    // the current attempt's view

	// guard moves the client's read deadline ahead as the body arrives,
	// once the response started (nil before).
	guard atomic.Pointer[stallGuard]

	tooLarge atomic.Bool // the gateway's MaxBodyBytes cut it
	broken   atomic.Bool // the client's body failed (not EOF, not too large)
	eof      atomic.Bool // read to its end
}

// atEOF reports whether the body was read from the client to its end.
func (b *replayBody) AtEOF() bool { return b.eof.Load() }

// Read and Close make a replayBody the request's Body, which the proxy
// hands to the transport; the transport reads only the views from first
// and rewind.
func (b *replayBody) Read([]byte) (int, error) { return 0, errReadThroughView }

var errReadThroughView = errors.New("activator: a request body with retries is read through its attempts' views")

// Close is a no-op: net/http closes the real body when the handler returns.
func (b *replayBody) Close() error { return nil }

// first returns the view of the first attempt.
func (b *replayBody) first() io.ReadCloser {
	b.mu.Lock()
	defer b.mu.Unlock()
	return &bodyView{b: b, gen: b.gen}
}

// rewind starts a new attempt: its view reads the body from the start.
// false: the body can no longer be replayed.
func (b *replayBody) rewind() (io.ReadCloser, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.overflow {
		return nil, false
	}
	b.gen++
	return &bodyView{b: b, gen: b.gen}, true
}

func (b *replayBody) srcErr() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.err
}

var errBodyTooLarge = errors.New("request body larger than the gateway's limit")

var errAttemptOver = errors.New("request body: this attempt was superseded by a retry")

func (b *replayBody) read(gen int, off *int, p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if gen != b.gen {
		return 0, errAttemptOver
	}
	if *off < len(b.kept) {
		n := copy(p, b.kept[*off:])
		*off += n
		return n, nil
	}
	if b.err != nil {
		return 0, b.err
	}
	if b.limit > 0 && int64(len(p)) > b.limit-b.given+1 {
		p = p[:b.limit-b.given+1] // one byte more tells the limit is passed
	}
	n, err := b.src.Read(p)
	if g := b.guard.Load(); g != nil && n > 0 {
		g.flowed() // reads hold the mutex: one goroutine at a time
	}
	b.given += int64(n)
	if b.limit > 0 && b.given > b.limit {
		n -= int(b.given - b.limit)
		b.given = b.limit
		err = errBodyTooLarge
	}
	if n > 0 && !b.overflow {
		if len(b.kept)+n <= replayLimit {
			b.kept = append(b.kept, p[:n]...)
			*off += n
		} else {
			b.overflow, b.kept = true, nil
		}
	}
	if err != nil {
		b.err = err
		switch {
		case err == io.EOF:
			b.eof.Store(true)
		case err == errBodyTooLarge:
			b.tooLarge.Store(true)
		default:
			b.broken.Store(true)
		}
	}
	return n, err
}

// bodyView is one attempt's reading of a replayBody.
type bodyView struct {
	b   *replayBody
	gen int
	off int
}

func (v *bodyView) Read(p []byte) (int, error) { return v.b.read(v.gen, &v.off, p) }

// Close is a no-op: the transport closes a body when it is done with it,
// and a retry needs it again.
func (v *bodyView) Close() error { return nil }

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
