package sidecar

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"github.com/nomad-serverless/nomad-serverless/datapath/h2proxy"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// statusClientClosed is recorded (never sent) for a request whose client
// went away before the response: nginx's 499.
const statusClientClosed = 499

// Handler is the serving port: it answers the K-Network-Probe header
// itself and proxies everything else to the app through the concurrency
// breaker (when the revision sets a limit), enforcing the timeouts and
// recording stats and metrics.
//
// Per request it allocates nothing a pool could hold (the exchange, with its
// writer wrapper and timer, the connection buffers and the copy buffers are
// pooled), its stats and metrics are atomic adds (see meter), and the only
// lock it takes is the app connection pool's, for one pop and one push (see
// appClient). With concurrency = 0 there is no breaker at all on the path.
type Handler struct {
	cfg     spec.SidecarConfig
	log     *slog.Logger
	access  *slog.Logger // nil: access log off
	state   *state
	meter   *meter
	breaker *Breaker // nil: no limit
	metrics *metrics
	tracing *tracing.Provider // nil: off (tracing.go)

	app     *appClient             // HTTP/1.1 requests: the hot path
	appAddr string                 // <app host>:<app port>
	h1, h2  *httputil.ReverseProxy // HTTP/1.1 (upgrades, HTTP/2 clients of an HTTP/1.1 app) and h2c
	h2cApp  bool                   // the app speaks h2c (spec.ProtocolH2C)
	buffers *bufferPool

	pool     sync.Pool
	timeouts struct{ request, responseStart, idle timeoutError }

	queueFullBody, probeOK []byte
	revisionHeader         []string

	lastProxyErrLog atomic.Int64 // unix ns; proxy errors are logged at most once a second

	// appRefused is told of every connection the app refused (the
	// sidecar marks itself not ready); nil in tests of the handler alone.
	appRefused func()
}

// Shared header values; net/http only reads them.
var (
	textPlain        = []string{"text/plain; charset=utf-8"}
	noSniff          = []string{"nosniff"}
	connectionClose  = []string{"close"}
	probeHeader      = http.CanonicalHeaderKey(spec.ProbeHeader)
	probeWaitHeader  = http.CanonicalHeaderKey(spec.ProbeWaitHeader)
	instanceTimesKey = http.CanonicalHeaderKey(spec.InstanceTimesHeader)
	notServedKey     = http.CanonicalHeaderKey(spec.NotServedHeader)
	notServedValue   = []string{spec.NotServedValue}
)

func newHandler(cfg spec.SidecarConfig, log, access *slog.Logger, st *state, m *meter, b *Breaker, mt *metrics, tr *tracing.Provider) *Handler {
	h := &Handler{
		cfg: cfg, log: log, access: access, state: st, meter: m, breaker: b, metrics: mt, tracing: tr,
		h2cApp:         cfg.AppProtocol == spec.ProtocolH2C,
		probeOK:        []byte(spec.ProbeHeaderValue),
		revisionHeader: []string{cfg.Revision},
	}
	h.pool.New = func() any { return newExchange(h) }
	h.timeouts.request = timeoutError{timeoutRequest, cfg.Timeout}
	h.timeouts.responseStart = timeoutError{timeoutResponseStart, cfg.ResponseStartTimeout}
	h.timeouts.idle = timeoutError{timeoutIdle, cfg.IdleTimeout}
	if b != nil {
		h.queueFullBody = []byte("nomad-serverless: revision " + cfg.Revision + " is at its concurrency limit (" +
			strconv.Itoa(b.Capacity()) + " requests in the app) and its queue is full (" + strconv.Itoa(b.QueueDepth()) +
			" waiting); retry, or raise scaling.max so more instances share the load\n")
	}

	app := net.JoinHostPort(appHost(cfg), strconv.Itoa(cfg.AppPort))
	h.appAddr = app
	h.app = newAppClient(app, maxIdleConns(cfg), 90*time.Second)
	director := func(r *http.Request) {
		r.URL.Scheme = "http"
		r.URL.Host = app
		// r is the outgoing copy; its RemoteAddr is the client's. The
		// proxy appends the client to X-Forwarded-For itself.
		r.Header["Forwarded"] = []string{h1.Forwarded(r.Header, h1.ClientIP(r.RemoteAddr), r.Host, "http")}
	}
	errLog := slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	buffers := newBufferPool()
	h.buffers = buffers
	h.h1 = &httputil.ReverseProxy{
		Director:       director,
		Transport:      newAppTransport(cfg, false),
		BufferPool:     buffers,
		ErrorLog:       errLog,
		ErrorHandler:   h.proxyError,
		ModifyResponse: modifyResponse,
	}
	h.h2 = &httputil.ReverseProxy{
		Director:       director,
		Transport:      newAppTransport(cfg, true),
		BufferPool:     buffers,
		ErrorLog:       errLog,
		ErrorHandler:   h.proxyError,
		ModifyResponse: modifyResponse,
	}
	return h
}

// modifyResponse removes spec.NotServedHeader from an app's response (only
// the sidecar may say that the app did not serve a request) and makes the
// response's end close an HTTP/2 client's request body, so that an answer
// that ends while the client still sends does not wait for it
// (h2proxy.EndsRequest).
func modifyResponse(resp *http.Response) error {
	delete(resp.Header, notServedKey)
	if in, ok := resp.Request.Context().Value(inboundBodyKey{}).(io.Closer); ok {
		resp.Body = h2proxy.EndsRequest(resp.Body, in)
	}
	return nil
}

// inboundBodyKey carries, in the context of a request on a ReverseProxy
// path, the request body of an HTTP/2 client (ReverseProxy hands the
// transport, and so modifyResponse, only a wrapper of it).
type inboundBodyKey struct{}

// newAppTransport returns the client side of the proxy: keep-alive
// connections to the app on loopback, no proxy lookup from the environment,
// no compression (the app's bytes pass as they are), and enough idle
// connections that a burst never has to dial.
func newAppTransport(cfg spec.SidecarConfig, h2c bool) *http.Transport {
	idle := maxIdleConns(cfg)
	t := &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: idle,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	var p http.Protocols
	if h2c {
		p.SetUnencryptedHTTP2(true)
	} else {
		p.SetHTTP1(true)
	}
	t.Protocols = &p
	return t
}

// maxIdleConns is how many idle connections to the app are kept: with a
// concurrency limit no more are ever busy at once.
func maxIdleConns(cfg spec.SidecarConfig) int {
	if cfg.Concurrency > 0 {
		return max(cfg.Concurrency, 16)
	}
	return 1024
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The probe header is looked up directly in the map: the key is
	// already canonical, so Header.Get's canonicalisation is waste.
	if v := r.Header[probeHeader]; len(v) == 1 && v[0] == spec.ProbeHeaderValue {
		h.serveProbe(w, r)
		return
	}
	if r.Method == "PRI" && r.ProtoMajor == 2 {
		// An h2c preface whose second line is wrong, read as an HTTP/1
		// request "PRI * HTTP/2.0" (net/http hands such requests to the
		// handler): a connection error for RFC 9113 (§3.4), not a request
		// for the app, which answered it 200.
		w.Header().Set("Connection", "close")
		http.Error(w, "nomad-serverless: invalid HTTP/2 connection preface", http.StatusBadRequest)
		return
	}

	start := time.Now()
	tracked := h.meter.begin(start)
	clientCtx := r.Context()
	x := h.pool.Get().(*exchange)
	x.begin(w, clientCtx, start)
	// Deferred so the accounting also runs when the proxy aborts a started
	// response by panicking with http.ErrAbortHandler.
	defer h.done(x, r, tracked)
	if h.tracing != nil {
		r = h.startSpan(x, r)
	}

	dispatched := start
	if h.breaker != nil {
		// Traced, the time behind the limit is a span even when it is
		// none: the trace says the request did not wait.
		var qs trace.Span
		if x.span != nil {
			qs = h.startQueueSpan(r)
		}
		if !h.breaker.TryAcquire() {
			// Wait in line; the timer cancels the wait on a timeout or
			// when the client has gone.
			err := x.queue(h.breaker)
			if qs != nil {
				endQueueSpan(qs, true, err)
			}
			if err != nil {
				h.refuse(x, err)
				return
			}
			dispatched = time.Now()
		} else if qs != nil {
			endQueueSpan(qs, false, nil)
		}
		defer h.breaker.Release()
	}
	x.dispatch(dispatched)
	if x.span != nil {
		x.appSpan = h.startAppSpan(r)
		defer endAppSpan(x.appSpan, x)
	}

	if r.ProtoMajor == 1 {
		upgrade := r.Header["Upgrade"]
		if len(upgrade) > 0 && isH2CUpgrade(upgrade) {
			// RFC 9113 retired the h2c upgrade; answering in HTTP/1.1 is
			// allowed, and passing it on would turn one request into a
			// tunnel the sidecar cannot count.
			delete(r.Header, "Upgrade")
			upgrade = nil
		}
		if r.ContentLength != 0 {
			// Let the app answer while the client is still sending (a
			// proxy must not force "body first, then response").
			_ = http.NewResponseController(w).EnableFullDuplex()
		}
		switch {
		case len(upgrade) > 0:
			// Websocket and other upgrades: HTTP/1.1 to the app always.
			h.serveReverseProxy(h.h1, x, r)
		case h.h2cApp:
			h.serveReverseProxy(h.h2, x, r)
		default:
			h.forwardH1(x, r, dispatched)
		}
		return
	}
	// HTTP/2 from the client: the app gets the protocol it declared, so an
	// HTTP/1.1 app serves HTTP/2 clients too.
	if h.h2cApp {
		h.serveReverseProxy(h.h2, x, r)
		return
	}
	h.serveReverseProxy(h.h1, x, r)
}

// serveReverseProxy runs one of the ReverseProxy paths with a context the
// timer can cancel.
func (h *Handler) serveReverseProxy(rp *httputil.ReverseProxy, x *exchange, r *http.Request) {
	ctx, cancel := context.WithCancelCause(r.Context())
	defer cancel(nil)
	x.setCancel(&cancel)
	if r.ProtoMajor == 2 && r.Body != nil && r.Body != http.NoBody {
		ctx = context.WithValue(ctx, inboundBodyKey{}, r.Body)
	}
	if r.ProtoMajor == 1 && r.ContentLength != 0 && r.Body != nil && r.Body != http.NoBody {
		// Full duplex: the response may start before the body is read
		// (see exchange.WriteHeader).
		b := &eofBody{ReadCloser: r.Body}
		r.Body = b
		x.body = b
	}
	rp.ServeHTTP(x, r.WithContext(ctx))
}

// eofBody records whether a request body was read to its end.
type eofBody struct {
	io.ReadCloser
	eof atomic.Bool
}

func (b *eofBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.eof.Store(true)
	}
	return n, err
}

func (b *eofBody) AtEOF() bool { return b.eof.Load() }

func isH2CUpgrade(v []string) bool {
	for _, s := range v {
		if len(s) == 3 && (s[0]|0x20) == 'h' && s[1] == '2' && (s[2]|0x20) == 'c' {
			return true
		}
	}
	return false
}

// serveProbe answers K-Network-Probe: queue, which Consul's check and the
// activator send: 200 "queue" when the app is ready and the sidecar is not
// draining, 503 otherwise. The app never sees it. A probe that asks to wait
// (spec.ProbeWaitHeader) is held while the app is not ready, and answered
// at the change, the end of its wait or when its caller goes.
//
// A probe that asks to wait is the gateway's, probing a new instance: its
// answer also says when the sidecar started, when the app first accepted
// a connection and when it was first ready (spec.InstanceTimesHeader), for
// the wake's timeline. Consul's check asks no wait and gets none of it.
func (h *Handler) serveProbe(w http.ResponseWriter, r *http.Request) {
	hd := w.Header()
	if v := r.Header[probeWaitHeader]; len(v) == 1 {
		h.holdProbe(r, v[0])
		if t := h.state.times().Header(); t != "" {
			hd[instanceTimesKey] = []string{t}
		}
	}
	hd["Content-Type"] = textPlain
	hd[spec.RevisionHeader] = h.revisionHeader
	switch {
	case h.state.draining.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("draining\n"))
	case !h.state.ready.Load():
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte("not ready\n"))
	default:
		w.Write(h.probeOK)
	}
}

// holdProbe returns once the app is ready, the sidecar drains, wait (a Go
// duration, capped at spec.MaxProbeWait; unreadable means no wait) is over
// or the caller has gone.
func (h *Handler) holdProbe(r *http.Request, wait string) {
	d, err := time.ParseDuration(wait)
	if err != nil || d <= 0 {
		return
	}
	t := time.NewTimer(min(d, spec.MaxProbeWait))
	defer t.Stop()
	for {
		// The channel is taken before the state is read, so a change
		// between the two closes it (broadcast.Signal).
		changed := h.state.changed.Changed()
		if h.state.ready.Load() || h.state.draining.Load() {
			return
		}
		select {
		case <-changed:
		case <-t.C:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// refuse answers a request that never reached the app.
func (h *Handler) refuse(x *exchange, err error) {
	switch {
	case errors.Is(err, ErrQueueFull):
		h.metrics.rejections.Inc()
		x.sidecarError(http.StatusServiceUnavailable, h.queueFullBody)
	case x.timedOut() != nil:
		h.answerTimeout(x)
	default:
		// The client went away while queued.
		x.status = statusClientClosed
	}
}

// proxyError is the ReverseProxy's error handler.
func (h *Handler) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	x, ok := w.(*exchange)
	if !ok {
		w.WriteHeader(http.StatusBadGateway)
		return
	}
	// The transport dials before it writes: a dial error sent nothing.
	h.appFailed(x, r, err, unreached(err))
}

// appFailed answers a request whose exchange with the app failed before
// the response started: a timeout (504), a client that left (nothing to
// answer; recorded as 499), a request body that could not be read (400),
// or an app that could not be reached or broke the connection (502).
// notServed says that the app did not serve the request and another
// instance may be given it (spec.NotServedHeader); a refused connection
// also marks the sidecar not ready.
func (h *Handler) appFailed(x *exchange, r *http.Request, err error, notServed bool) {
	if h.appRefused != nil && errors.Is(err, syscall.ECONNREFUSED) {
		h.appRefused()
	}
	switch {
	case x.timedOut() != nil:
		h.answerTimeout(x)
	case x.clientGone.Load() || x.clientCtx.Err() != nil:
		x.status = statusClientClosed
	case grpcDeadlinePassed(r, x.start, time.Now()):
		// The app reset the call at its deadline (grpcdeadline.go).
		x.grpcDeadlineExceeded()
	case errors.Is(err, errClientBody):
		// The client's connection is not fit for another request after
		// a broken body: the answer closes it (exchange.WriteHeader).
		x.sidecarError(http.StatusBadRequest, []byte("nomad-serverless: the request body could not be read: "+err.Error()+"\n"))
	default:
		now := time.Now().UnixNano()
		if last := h.lastProxyErrLog.Load(); now-last > int64(time.Second) && h.lastProxyErrLog.CompareAndSwap(last, now) {
			h.log.Warn("request to the app failed", "app", h.appAddr, "path", r.URL.Path, "error", err, "not_served", notServed)
		}
		if notServed {
			x.w.Header()[notServedKey] = notServedValue
		}
		x.sidecarError(http.StatusBadGateway, []byte("nomad-serverless: the app on "+h.appAddr+
			" did not answer: "+err.Error()+"\n"))
	}
}

func (h *Handler) answerTimeout(x *exchange) {
	t := x.timedOut()
	h.metrics.timeouts[t.kind].Inc()
	if x.wroteHeader {
		return
	}
	var msg string
	switch t.kind {
	case timeoutResponseStart:
		msg = "the app did not start its response within response_start_timeout (" + t.limit.String() + ")"
	case timeoutIdle:
		msg = "the app sent nothing for idle_timeout (" + t.limit.String() + ")"
	default:
		msg = "the request did not finish within timeout (" + t.limit.String() + ")"
	}
	x.sidecarError(http.StatusGatewayTimeout, []byte("nomad-serverless: revision "+h.cfg.Revision+": "+msg+"\n"))
}

// sidecarError writes a response the sidecar made itself; headers set on
// x.w.Header() before the call other than the app's (cleared) stay.
func (x *exchange) sidecarError(code int, body []byte) {
	if x.wroteHeader {
		return
	}
	hd := x.w.Header()
	ns := hd[notServedKey]
	clear(hd)
	if ns != nil {
		hd[notServedKey] = ns
	}
	hd["Content-Type"] = textPlain
	hd["X-Content-Type-Options"] = noSniff
	hd["Content-Length"] = []string{strconv.Itoa(len(body))}
	x.WriteHeader(code)
	x.Write(body)
}

// done ends a request's accounting; it runs deferred, also on a panic.
func (h *Handler) done(x *exchange, r *http.Request, tracked bool) {
	now := time.Now()
	if tracked {
		h.meter.end(now)
	}
	if t := x.timedOut(); t != nil && x.wroteHeader && x.status != http.StatusGatewayTimeout {
		// Timed out mid-response: the proxy aborted the connection.
		h.metrics.timeouts[t.kind].Inc()
	}
	if x.body != nil && !x.body.AtEOF() && r.ProtoMajor == 1 {
		// The response said Connection: close; the body's reader, maybe
		// blocked on the client, must give up now rather than hold the
		// connection (net/http closes it once it can read no more).
		_ = http.NewResponseController(x.w).SetReadDeadline(pastDeadline)
	}
	status := x.status
	if status == 0 {
		// The proxy panicked before writing anything.
		status = http.StatusBadGateway
	}
	elapsed := now.Sub(x.start)
	h.metrics.recordResponse(status, elapsed.Seconds(), x.span)
	if x.span != nil {
		tracing.EndHTTP(x.span, status)
	}
	if h.access != nil {
		h.access.LogAttrs(context.Background(), slog.LevelInfo, "request",
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", status),
			slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
			slog.Int64("bytes", x.bytes),
			slog.String("proto", r.Proto))
	}
	if x.finish() {
		h.pool.Put(x)
	}
}

// copyBufferSize is the size of the proxy's copy buffers.
const copyBufferSize = 32 << 10

// bufferPool lends ReverseProxy its copy buffers. It pools array pointers:
// putting a []byte into a sync.Pool would allocate its slice header every
// time.
type bufferPool struct{ p sync.Pool }

func newBufferPool() *bufferPool {
	b := &bufferPool{}
	b.p.New = func() any { return new([copyBufferSize]byte) }
	return b
}

func (b *bufferPool) Get() []byte { return b.p.Get().(*[copyBufferSize]byte)[:] }

func (b *bufferPool) Put(s []byte) {
	if cap(s) >= copyBufferSize {
		b.p.Put((*[copyBufferSize]byte)(s[:copyBufferSize]))
	}
}
