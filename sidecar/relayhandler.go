package sidecar

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/http2"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"github.com/nomad-serverless/nomad-serverless/datapath/h2relay"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// relayHandler is the sidecar's policy for the HTTP/2 relay
// (datapath/h2relay), which serves h2c clients of an h2c app (gRPC): per
// stream what Handler does per request on the net/http path, the same
// parts doing it (the breaker, the meter, the metrics, the access log),
// with the same answers: the probe, 503 when the queue is full, 504 at the
// revision's timeouts, 502 (with spec.NotServedHeader when nothing reached
// the app) when the app cannot be reached, DEADLINE_EXCEEDED when the app
// resets a call at its grpc-timeout.
//
// Its callbacks run with the stream's connection locked (Request,
// Response, Expired, Failed) or after (Done); a queued stream is a breaker
// waiter whose grant calls Stream.Grant from the releaser's goroutine, so
// no goroutine waits per stream.
type relayHandler struct {
	h *Handler
}

// rcall is a relayed stream's accounting (Stream.User).
type rcall struct {
	probe   bool
	tracked bool
	waiter  *Waiter
	grpcAt  time.Time // the call's grpc-timeout from arrival (zero: none)
}

func (rh relayHandler) Request(s *h2relay.Stream, now time.Time) h2relay.Decision {
	h := rh.h
	if s.Header("k-network-probe") == spec.ProbeHeaderValue {
		// Answered at once, also with a wait asked for: the gateway
		// probes again (probes that wait come over HTTP/1.1).
		code, body := http.StatusOK, h.probeOK
		switch {
		case h.state.draining.Load():
			code, body = http.StatusServiceUnavailable, []byte("draining\n")
		case !h.state.ready.Load():
			code, body = http.StatusServiceUnavailable, []byte("not ready\n")
		}
		s.User = &rcall{probe: true}
		s.Respond(code, []h2relay.Field{
			{Name: "content-type", Value: textPlain[0]},
			{Name: strings.ToLower(spec.RevisionHeader), Value: h.cfg.Revision},
		}, body)
		return h2relay.Answered
	}
	c := &rcall{tracked: h.meter.begin(now)}
	s.User = c
	rh.forwardHead(s)
	if v := s.Header("grpc-timeout"); v != "" && strings.HasPrefix(s.Header("content-type"), "application/grpc") {
		if d, ok := parseGRPCTimeout(v); ok {
			c.grpcAt = now.Add(d)
		}
	}
	if h.breaker != nil && !h.breaker.TryAcquire() {
		w, err := h.breaker.EnqueueFunc(func() {
			if !s.Grant() {
				// The stream ended while its grant was on the way.
				h.breaker.Release()
			}
		}, nil)
		switch {
		case errors.Is(err, ErrQueueFull):
			h.metrics.rejections.Inc()
			s.Respond(http.StatusServiceUnavailable, sidecarFields(), h.queueFullBody)
			return h2relay.Answered
		case w != nil:
			c.waiter = w
			rh.arm(s, c, now)
			return h2relay.Hold
		}
		// A slot freed meanwhile: it is the stream's.
	}
	rh.arm(s, c, now)
	return h2relay.Proceed
}

// forwardHead adds what the sidecar adds to every request for the app,
// as the net/http path does: the client appended to X-Forwarded-For (one
// field, earlier ones joined as ReverseProxy joins them) and an element
// for this hop appended to Forwarded (h1.WriteForwarded: the request's
// Forwarded, or the elements its X-Forwarded-* imply). The common head
// (the gateway's, with both) costs two strings.
func (rh relayHandler) forwardHead(s *h2relay.Stream) {
	ip := h1.ClientIP(s.RemoteAddr())
	head := s.Head
	var nFwd, nXFF, size, xffSize int
	authority := ""
	for _, f := range head {
		switch f.Name {
		case "forwarded":
			nFwd++
			size += len(f.Value) + 2
		case "x-forwarded-for":
			nXFF++
			xffSize += len(f.Value) + 2
		case ":authority":
			authority = f.Value
		}
	}
	var b strings.Builder
	b.Grow(size + len(ip) + len(authority) + 32)
	switch {
	case nFwd > 0:
		for _, f := range head {
			if f.Name == "forwarded" {
				b.WriteString(f.Value)
				b.WriteString(", ")
			}
		}
		h1.WriteForwarded(&b, nil, ip, authority, "http")
	case nXFF > 0:
		hd := http.Header{}
		for _, f := range head {
			switch f.Name {
			case "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto":
				k := http.CanonicalHeaderKey(f.Name)
				hd[k] = append(hd[k], f.Value)
			}
		}
		h1.WriteForwarded(&b, hd, ip, authority, "http")
	default:
		h1.WriteForwarded(&b, nil, ip, authority, "http")
	}
	fwd := b.String()
	xff := ip
	if nXFF > 0 {
		var x strings.Builder
		x.Grow(xffSize + len(ip))
		for _, f := range head {
			if f.Name == "x-forwarded-for" {
				x.WriteString(f.Value)
				x.WriteString(", ")
			}
		}
		x.WriteString(ip)
		xff = x.String()
	}
	if nFwd > 1 || nXFF > 1 {
		// Repeated fields become one each.
		kept := head[:0]
		for _, f := range head {
			if f.Name != "forwarded" && f.Name != "x-forwarded-for" {
				kept = append(kept, f)
			}
		}
		head, nFwd, nXFF = kept, 0, 0
	}
	for i := range head {
		switch head[i].Name {
		case "forwarded":
			head[i].Value = fwd
		case "x-forwarded-for":
			head[i].Value = xff
		}
	}
	if nFwd == 0 {
		head = append(head, h2relay.Field{Name: "forwarded", Value: fwd})
	}
	if nXFF == 0 {
		head = append(head, h2relay.Field{Name: "x-forwarded-for", Value: xff})
	}
	s.Head = head
}

// sidecarFields are the head of an answer the sidecar makes itself.
func sidecarFields() []h2relay.Field {
	return []h2relay.Field{
		{Name: "content-type", Value: textPlain[0]},
		{Name: "x-content-type-options", Value: noSniff[0]},
	}
}

// arm sets the stream's next deadline: before its response starts the
// revision's timeout from arrival, response_start_timeout and idle_timeout
// from dispatch (exchange.nextDeadline's rules), and the call's
// grpc-timeout; after, idle_timeout from the last body bytes sent.
func (rh relayHandler) arm(s *h2relay.Stream, c *rcall, now time.Time) {
	at, _ := rh.deadline(s, c)
	s.SetDeadline(at)
}

// deadline is the stream's earliest deadline and the timeout it is (nil:
// the grpc-timeout).
func (rh relayHandler) deadline(s *h2relay.Stream, c *rcall) (time.Time, *timeoutError) {
	h := rh.h
	var at time.Time
	var kind *timeoutError
	earlier := func(t time.Time, k *timeoutError) {
		if !t.IsZero() && (at.IsZero() || t.Before(at)) {
			at, kind = t, k
		}
	}
	dispatched := s.GrantedAt()
	if !s.Started() {
		earlier(s.Arrived.Add(h.cfg.Timeout), &h.timeouts.request)
		if !dispatched.IsZero() && h.cfg.ResponseStartTimeout > 0 {
			earlier(dispatched.Add(h.cfg.ResponseStartTimeout), &h.timeouts.responseStart)
		}
		if !dispatched.IsZero() && h.cfg.IdleTimeout > 0 {
			earlier(dispatched.Add(h.cfg.IdleTimeout), &h.timeouts.idle)
		}
		earlier(c.grpcAt, nil)
		return at, kind
	}
	if h.cfg.IdleTimeout > 0 {
		last := s.LastSent()
		if last.IsZero() {
			last = dispatched
		}
		earlier(last.Add(h.cfg.IdleTimeout), &h.timeouts.idle)
	}
	return at, kind
}

// Timer is called when the stream's deadline passed, and when a queued
// stream leaves the queue (deadlines from dispatch start then).
func (rh relayHandler) Timer(s *h2relay.Stream, now time.Time) {
	c := s.User.(*rcall)
	h := rh.h
	at, kind := rh.deadline(s, c)
	if at.IsZero() {
		return
	}
	if now.Before(at) {
		s.SetDeadline(at) // the response started or sent since
		return
	}
	if kind == nil {
		// The call's grpc-timeout: answered as its server would.
		s.Respond(http.StatusOK, grpcDeadlineFields(), nil)
		return
	}
	h.metrics.timeouts[kind.kind].Inc()
	if s.Started() {
		// Mid-response: cut, as the net/http path aborts it.
		s.Cancel(http2.ErrCodeCancel)
		return
	}
	var msg string
	switch kind.kind {
	case timeoutResponseStart:
		msg = "the app did not start its response within response_start_timeout (" + kind.limit.String() + ")"
	case timeoutIdle:
		msg = "the app sent nothing for idle_timeout (" + kind.limit.String() + ")"
	default:
		msg = "the request did not finish within timeout (" + kind.limit.String() + ")"
	}
	s.Respond(http.StatusGatewayTimeout, sidecarFields(), []byte("nomad-serverless: revision "+h.cfg.Revision+": "+msg+"\n"))
}

// grpcDeadlineFields are a trailers-only DEADLINE_EXCEEDED.
func grpcDeadlineFields() []h2relay.Field {
	return []h2relay.Field{
		{Name: "content-type", Value: "application/grpc"},
		{Name: "grpc-status", Value: grpcDeadlineStatus},
		{Name: "grpc-message", Value: "deadline exceeded (the app ended the call at its grpc-timeout)"},
	}
}

func (rh relayHandler) Response(s *h2relay.Stream, head []h2relay.Field) []h2relay.Field {
	c := s.User.(*rcall)
	if h := rh.h; h.cfg.IdleTimeout > 0 {
		defer func() { rh.arm(s, c, time.Now()) }()
	}
	// Only the sidecar may say that the app did not serve a request.
	for i, f := range head {
		if f.Name == notServedField {
			return append(head[:i:i], head[i+1:]...)
		}
	}
	return head
}

// notServedField is spec.NotServedHeader as HTTP/2 spells it.
var notServedField = strings.ToLower(spec.NotServedHeader)

func (rh relayHandler) Failed(s *h2relay.Stream, err error) {
	h := rh.h
	c := s.User.(*rcall)
	var de *h2relay.DialError
	var re *h2relay.ResetError
	notServed := false
	switch {
	case errors.As(err, &de):
		if h.appRefused != nil && errors.Is(err, syscall.ECONNREFUSED) {
			h.appRefused()
		}
		notServed = true
	case errors.As(err, &re):
		if !c.grpcAt.IsZero() && !time.Now().Before(c.grpcAt) {
			s.Respond(http.StatusOK, grpcDeadlineFields(), nil)
			return
		}
		if !re.Refused() {
			return // passed on: the client gets the app's reset
		}
		notServed = true
	}
	now := time.Now().UnixNano()
	if last := h.lastProxyErrLog.Load(); now-last > int64(time.Second) && h.lastProxyErrLog.CompareAndSwap(last, now) {
		h.log.Warn("request to the app failed", "app", h.appAddr, "path", s.Header(":path"), "error", err, "not_served", notServed)
	}
	fields := sidecarFields()
	if notServed {
		fields = append(fields, h2relay.Field{Name: notServedField, Value: spec.NotServedValue})
	}
	s.Respond(http.StatusBadGateway, fields, []byte("nomad-serverless: the app on "+h.appAddr+" did not answer: "+err.Error()+"\n"))
}

func (rh relayHandler) Done(s *h2relay.Stream, now time.Time) {
	h := rh.h
	c, _ := s.User.(*rcall)
	if c == nil || c.probe {
		return
	}
	if h.breaker != nil {
		switch {
		case s.Granted():
			h.breaker.Release()
		case c.waiter != nil:
			// Out of line; if a grant is on its way, its Grant fails
			// and the granter releases the slot.
			h.breaker.Cancel(c.waiter)
		}
	}
	if c.tracked {
		h.meter.end(now)
	}
	status := s.Status()
	if status == 0 {
		status = http.StatusBadGateway
		if s.ClientReset() {
			status = statusClientClosed
		}
	}
	elapsed := now.Sub(s.Arrived)
	h.metrics.recordResponse(status, elapsed.Seconds(), nil)
	if h.access != nil {
		h.access.LogAttrs(context.Background(), slog.LevelInfo, "request",
			slog.String("method", s.Header(":method")),
			slog.String("path", pathOnly(s.Header(":path"))),
			slog.Int("status", status),
			slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
			slog.Int64("bytes", s.Bytes()),
			slog.String("proto", "HTTP/2.0"))
	}
}

// pathOnly is a request target without its query.
func pathOnly(p string) string {
	if i := strings.IndexByte(p, '?'); i >= 0 {
		return p[:i]
	}
	return p
}

// newRelay builds the HTTP/2 relay of an h2c app's sidecar: net/http's
// server limits downstream (250 streams, a 1 MiB header list, 2 minutes
// idle), pooled connections to the app upstream (one pool per P, shared by
// every client connection of the P's group).
func (h *Handler) newRelay(log *slog.Logger) (*h2relay.Relay, error) {
	d := net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	addr := h.appAddr
	return h2relay.NewRelay(h2relay.RelayConfig{
		Down: h2relay.Config{
			MaxConcurrentStreams: 250,
			MaxHeaderListSize:    http.DefaultMaxHeaderBytes,
			IdleTimeout:          2 * time.Minute,
			// Its client is the gateway, whose connections carry many
			// clients' calls: their PINGs (grpc-go's window estimates)
			// and cancellations must not cost the others the
			// connection. Floods are bounded by the write buffer's
			// limit instead (an unread flood of answers cuts it).
			MaxControlPerSecond: 100_000,
			MaxResetsPerSecond:  5_000,
		},
		Up: h2relay.Config{
			// The streams of every client share the pooled connections:
			// one slow reader holds back its own stream (its window), not
			// the connection.
			CreditConnOnReceipt: true,
			MaxHeaderListSize:   maxResponseHead,
			IdleTimeout:         90 * time.Second,
			MaxControlPerSecond: 100_000,
			MaxResetsPerSecond:  100_000,
		},
		Dial: func(ctx context.Context, _ string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		},
		Handler: relayHandler{h: h},
		Log:     log,
	})
}
