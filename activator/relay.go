package activator

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http2"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"github.com/nomad-serverless/nomad-serverless/datapath/h2relay"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// The gateway's HTTP/2 relay (issue 44): HTTP/2 client connections (h2c
// with prior knowledge on the plain ports, ALPN h2 on the HTTPS port) are
// served by datapath/h2relay instead of net/http's HTTP/2 server, and
// their streams go to the sidecars over the relay's pooled h2c
// connections (one pool per instance in each of the relay's groups)
// instead of net/http's HTTP/2 transport. Each stream is a request as
// serve makes it one: routed by :authority (and X-Serverless-Revision),
// split, counted against its revision and instance, held in the
// activator's queue while no instance has a free slot (a waiter with a
// callback, no goroutine), retried on another instance when the dial
// fails or the sidecar answers NotServed (its body kept up to
// replayLimit), bounded by the revision's timeout until its response
// starts and by the stall bound after, measured as serve measures it.
// What keeps net/http: everything while tracing is on (the relay makes no
// spans), `Upgrade: h2c` and websockets (HTTP/1.1), and HTTP/1.1 itself.

// relayHandler is the gateway's policy for one listener's relay.
type relayHandler struct {
	g      *Gateway
	sc     scope
	scheme string // "http" or "https": what the client spoke
}

// rstream is a relayed stream's state (Stream.User).
type rstream struct {
	rev     *revision
	cfg     *revisionConfig
	b       *backend // the slot held, nil if none
	w       *waiter  // in the revision's queue
	wk      *wake
	tries   int
	status  int
	counted bool // rev.inflight counts it
	queued  bool // it waited in the queue
	started time.Time
	rewrote bool
	host    string
}

// newRelay builds the relay of one listener of the gateway.
func (g *Gateway) newRelay(sc scope, scheme string) (*h2relay.Relay, error) {
	d := net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}
	return h2relay.NewRelay(h2relay.RelayConfig{
		Down: h2relay.Config{
			MaxConcurrentStreams: maxConcurrentStreams,
			MaxHeaderListSize:    uint32(g.cfg.MaxHeaderBytes),
			IdleTimeout:          g.cfg.IdleTimeout,
			// Rapid reset: h2reset.go's rule (Envoy's), by streams;
			// a client cancelling many calls a second keeps its
			// connection while fewer than half are cancelled early.
			PrematureResetStreams:  prematureMinStreams,
			PrematureResetLifetime: prematureLifetime,
			MaxResetsPerSecond:     100_000,
			// grpc-go's BDP estimator PINGs once a round trip while
			// answers arrive: thousands a second on one busy
			// connection (make bench-grpc's 32 streams lost their
			// connection to ENHANCE_YOUR_CALM at 1,000). net/http
			// bounds no rate either; an unread flood of answers is cut
			// by the write buffer's limit (MaxBuffered).
			MaxControlPerSecond: 100_000,
		},
		Up: h2relay.Config{
			// Every client's streams to an instance share the pooled
			// connections: a slow reader holds back its own stream
			// (its window), not the connection.
			CreditConnOnReceipt: true,
			IdleTimeout:         idleConnTimeout,
			MaxControlPerSecond: 100_000,
			MaxResetsPerSecond:  100_000,
		},
		Dial: func(ctx context.Context, target string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", target)
		},
		Handler: relayHandler{g: g, sc: sc, scheme: scheme},
		Log:     g.log,
		// net/http's Server.Close closes the client connections it
		// handed over: read by goroutines, they end with it.
		NoEventLoopDown: true,
	})
}

// relayNextProto makes srv hand its HTTP/2 connections to relay: h2c with
// prior knowledge (net/http read the preface) and, when tlsToo, ALPN h2.
func (g *Gateway) relayNextProto(srv *http.Server, relay *h2relay.Relay, tlsToo bool) {
	serveTLS := func(_ *http.Server, c *tls.Conn, _ http.Handler) {
		// ALPN h2: the preface is still to be read.
		var buf [len(http2.ClientPreface)]byte
		_ = c.SetReadDeadline(time.Now().Add(g.cfg.ReadHeaderTimeout))
		if _, err := readFull(c, buf[:]); err != nil || string(buf[:]) != http2.ClientPreface {
			c.Close()
			return
		}
		_ = c.SetReadDeadline(time.Time{})
		relay.ServeConn(c, nil)
	}
	srv.TLSNextProto = map[string]func(*http.Server, *tls.Conn, http.Handler){
		// Set, so that net/http does not configure its own HTTP/2
		// (which would replace the entry below); reached only over TLS.
		"h2": serveTLS,
		"unencrypted_http2": func(_ *http.Server, c *tls.Conn, _ http.Handler) {
			u, ok := c.NetConn().(interface{ UnencryptedNetConn() net.Conn })
			if !ok {
				c.Close()
				return
			}
			// The preface was read (and nothing after it): frames
			// follow, nothing more to screen, and the relay reads the
			// socket itself.
			held, raw := keepalive.Detach(u.UnencryptedNetConn())
			relay.ServeConn(raw, held)
		},
	}
	if !tlsToo {
		srv.TLSNextProto["h2"] = func(_ *http.Server, c *tls.Conn, _ http.Handler) { c.Close() }
	}
	srv.RegisterOnShutdown(relay.Drain)
}

func readFull(c net.Conn, p []byte) (int, error) {
	n := 0
	for n < len(p) {
		m, err := c.Read(p[n:])
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (h relayHandler) Request(s *h2relay.Stream, now time.Time) h2relay.Decision {
	g := h.g
	host := s.Header(":authority")
	if host == "" {
		host = s.Header("host")
	}
	c := &rstream{host: host}
	s.User = c
	t := g.table.Load()
	ch := canonicalHost(host)
	if g.tls != nil && h.scheme == "http" && h.sc == publicScope && h.plainTLS(s, t, ch) {
		return h2relay.Answered
	}
	revHeader := h.revisionHeader(s)
	rev, rt, tg, res := t.resolve(ch, revHeader, h.sc)
	if res != resolved && !g.catalogLoaded() {
		// Held until the catalog is in (startup only): a goroutine
		// waits for it, as serve's awaitLoaded does.
		go func() {
			loaded := g.awaitLoaded(context.Background())
			s.Admit(func(now time.Time) bool {
				if !loaded {
					g.metrics.loadingRefused.Inc()
					h.respondText(s, http.StatusServiceUnavailable, []h2relay.Field{{Name: "retry-after", Value: "1"}},
						"the gateway is starting and has not loaded the services of the cluster yet (Nomad or Consul is slow to answer); retry in a moment")
					return false
				}
				return h.route(s, c, g.table.Load(), ch, revHeader, now) == h2relay.Proceed
			})
		}()
		return h2relay.Hold
	}
	if res != resolved {
		h.notRouted(s, host, revHeader, rt, tg, res)
		return h2relay.Answered
	}
	return h.admit(s, c, rev, now)
}

// route resolves a held stream again (the catalog came in) and admits it.
func (h relayHandler) route(s *h2relay.Stream, c *rstream, t *table, ch string, revHeader []string, now time.Time) h2relay.Decision {
	rev, rt, tg, res := t.resolve(ch, revHeader, h.sc)
	if res != resolved {
		h.notRouted(s, c.host, revHeader, rt, tg, res)
		return h2relay.Answered
	}
	return h.admit(s, c, rev, now)
}

// admit takes a slot of rev for the stream, or puts it in the queue.
func (h relayHandler) admit(s *h2relay.Stream, c *rstream, rev *revision, now time.Time) h2relay.Decision {
	g := h.g
	c.rev = rev
	c.cfg = rev.cfg.Load()
	c.started = now
	if g.cfg.MaxBodyBytes > 0 {
		if v := s.Header("content-length"); v != "" {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n > g.cfg.MaxBodyBytes {
				c.status = http.StatusRequestEntityTooLarge
				h.respondText(s, c.status, nil, "request body of %d bytes is larger than the gateway's limit of %d bytes", n, g.cfg.MaxBodyBytes)
				return h2relay.Answered
			}
		}
	}
	b := rev.tryAcquire()
	if b == nil {
		var err error
		b, c.w, err = rev.enqueue(g.cfg.QueueDepth, h.granted(s, c))
		if err != nil {
			c.status = h.acquireError(s, c, err)
			return h2relay.Answered
		}
		if b == nil {
			c.queued = true
			h.arm(s, c)
			return h2relay.Hold
		}
	}
	h.dispatched(s, c, b, now)
	return h2relay.Proceed
}

// granted is the queue's callback for a waiting stream: its slot, from
// whichever goroutine freed it.
func (h relayHandler) granted(s *h2relay.Stream, c *rstream) func(*backend) {
	return func(b *backend) {
		ok := s.Admit(func(now time.Time) bool {
			c.w = nil
			c.rev.metrics().queueWait.Observe(now.Sub(c.started).Seconds())
			if b == nil {
				c.status = h.acquireError(s, c, c.rev.closedErr())
				return false
			}
			h.dispatched(s, c, b, now)
			return true
		})
		if !ok && b != nil {
			// The stream ended while its slot was on the way.
			c.rev.release(b)
		}
	}
}

// dispatched gives the stream slot b: it goes to b's instance.
func (h relayHandler) dispatched(s *h2relay.Stream, c *rstream, b *backend, now time.Time) {
	rev := c.rev
	c.b = b
	if !c.counted {
		c.counted = true
		rev.inflight.Add(1)
		h.g.markActive(rev)
		rev.budget.deposit()
		if c.queued {
			c.wk = rev.openWake.Load()
		}
	}
	s.Target = b.hostPort
	s.KeepBody = replayLimit
	if !c.rewrote {
		c.rewrote = true
		h.rewrite(s, c)
	}
	if c.wk != nil {
		c.wk.sending()
	}
	h.arm(s, c)
}

// rewrite makes the request head the sidecar gets, as rewrite does on the
// net/http path: the revision chosen, X-Forwarded-* and Forwarded with
// this hop, :scheme http (the sidecar is spoken to in h2c).
func (h relayHandler) rewrite(s *h2relay.Stream, c *rstream) {
	ip := h1.ClientIP(s.RemoteAddr())
	head := s.Head
	var hd http.Header // the client's forwarding fields, if any
	out := make([]h2relay.Field, 0, len(head)+5)
	for _, f := range head {
		switch f.Name {
		case ":scheme":
			f.Value = "http"
		case "x-serverless-revision":
			continue
		case "forwarded", "x-forwarded-for", "x-forwarded-host", "x-forwarded-proto":
			if hd == nil {
				hd = http.Header{}
			}
			k := http.CanonicalHeaderKey(f.Name)
			hd[k] = append(hd[k], f.Value)
			continue
		}
		out = append(out, f)
	}
	xff := ip
	if v := hd[headerXFF]; len(v) > 0 {
		xff = strings.Join(v, ", ") + ", " + ip
	}
	xfh := c.host
	if v := hd[headerXFH]; len(v) > 0 {
		xfh = v[0]
	}
	xfp := h.scheme
	if v := hd[headerXFP]; len(v) > 0 {
		xfp = v[0]
	}
	var b strings.Builder
	h1.WriteForwarded(&b, hd, ip, c.host, h.scheme)
	out = append(out,
		h2relay.Field{Name: "x-serverless-revision", Value: c.rev.name},
		h2relay.Field{Name: "x-forwarded-for", Value: xff},
		h2relay.Field{Name: "x-forwarded-host", Value: xfh},
		h2relay.Field{Name: "x-forwarded-proto", Value: xfp},
		h2relay.Field{Name: "forwarded", Value: b.String()},
	)
	s.Head = out
}

// revisionHeader is the request's X-Serverless-Revision values (nil: none).
func (h relayHandler) revisionHeader(s *h2relay.Stream) []string {
	var out []string
	for _, f := range s.Head {
		if f.Name == "x-serverless-revision" {
			out = append(out, f.Value)
		}
	}
	return out
}

// arm sets the stream's deadline: while it waits, the queue timeout and
// the revision's timeout from arrival; once dispatched, the timeout until
// the response starts; after, the stall bound from the last bytes sent.
func (h relayHandler) arm(s *h2relay.Stream, c *rstream) {
	at, _ := h.deadline(s, c)
	s.SetDeadline(at)
}

// deadline kinds.
const (
	dlNone = iota
	dlQueue
	dlTimeout
	dlStall
)

func (h relayHandler) deadline(s *h2relay.Stream, c *rstream) (time.Time, int) {
	if c.rev == nil || c.cfg == nil {
		return time.Time{}, dlNone
	}
	return streamDeadline(streamClock{
		arrived: c.started, granted: s.GrantedAt(), lastSent: s.LastSent(),
		waiting: c.w != nil, started: s.Started(),
	}, c.cfg.timeout, h.g.cfg.QueueTimeout)
}

// streamClock is what a relayed stream's deadline depends on.
type streamClock struct {
	arrived, granted, lastSent time.Time
	waiting                    bool // in the revision's queue
	started                    bool // its response started
}

// streamDeadline is a relayed stream's next deadline and its kind, as
// serve bounds a request: in the queue, the queue timeout or the
// revision's timeout from arrival, whichever comes first; dispatched, the
// timeout from arrival until the response starts (504 then); once it
// started, the stall bound (timeout plus stallSlack) from the last body
// bytes sent, or from the dispatch (the stream is cut then).
func streamDeadline(c streamClock, timeout, queueTimeout time.Duration) (time.Time, int) {
	if c.started {
		last := c.lastSent
		if last.IsZero() {
			last = c.granted
		}
		return last.Add(timeout + stallSlack), dlStall
	}
	at, kind := c.arrived.Add(timeout), dlTimeout
	if c.waiting {
		if q := c.arrived.Add(queueTimeout); q.Before(at) {
			at, kind = q, dlQueue
		}
	}
	return at, kind
}

func (h relayHandler) Timer(s *h2relay.Stream, now time.Time) {
	c, _ := s.User.(*rstream)
	if c == nil {
		return
	}
	at, kind := h.deadline(s, c)
	if at.IsZero() {
		return
	}
	if now.Before(at) {
		s.SetDeadline(at)
		return
	}
	rev := c.rev
	if c.w != nil {
		if !rev.withdraw(c.w) {
			// Its slot is on the way: Admit calls Timer again.
			return
		}
		c.w = nil
		rev.metrics().queueWait.Observe(now.Sub(c.started).Seconds())
		err := errQueueTimeout
		if kind == dlTimeout {
			err = context.DeadlineExceeded
		}
		c.status = h.acquireError(s, c, err)
		return
	}
	if kind == dlStall {
		s.Cancel(http2.ErrCodeCancel)
		return
	}
	c.status = http.StatusGatewayTimeout
	h.respondText(s, c.status, nil, "revision %s did not answer within its timeout of %s", rev.name, c.cfg.timeout)
}

func (h relayHandler) Response(s *h2relay.Stream, head []h2relay.Field) []h2relay.Field {
	c := s.User.(*rstream)
	notServed := -1
	for i, f := range head {
		if f.Name == notServedField {
			notServed = i
			break
		}
	}
	if notServed >= 0 && (len(head) > 0 && head[0].Name == ":status" && head[0].Value == "502") {
		h.retry(s, c, failNotServed, errNotServed)
		return nil
	}
	if notServed >= 0 {
		head = append(head[:notServed:notServed], head[notServed+1:]...)
	}
	if st, ok := strconv.Atoi(head[0].Value); ok == nil && head[0].Name == ":status" {
		c.status = st
	}
	if c.wk != nil && c.b != nil {
		c.wk.answered(c.b.alloc)
	}
	// The deadline set fires into Timer, which moves to the stall bound.
	return head
}

// notServedField is spec.NotServedHeader as HTTP/2 spells it.
var notServedField = strings.ToLower(spec.NotServedHeader)

func (h relayHandler) Failed(s *h2relay.Stream, err error) {
	c := s.User.(*rstream)
	var de *h2relay.DialError
	var re *h2relay.ResetError
	switch {
	case errors.As(err, &de):
		h.retry(s, c, classifyDial(de.Err), err)
	case errors.As(err, &re) && !re.Refused():
		// The app (through its sidecar) reset the call: the client gets
		// the reset, as it gets the app's status.
	default:
		c.status = http.StatusBadGateway
		addr := ""
		if c.b != nil {
			addr = c.b.hostPort
		}
		h.g.log.Warn("proxy to instance failed", "revision", c.rev.name, "instance", addr, "err", err)
		h.respondText(s, c.status, nil, "instance %s of revision %s failed to answer: %v", addr, c.rev.name, err)
	}
}

// retry sends a stream that never reached an app to another instance,
// within its tries and the revision's budget, or answers it (503: the
// client may send it again), as retryTransport does.
func (h relayHandler) retry(s *h2relay.Stream, c *rstream, fl failure, err error) {
	g := h.g
	rev := c.rev
	old := c.b
	if fl.ejects() && old != nil {
		g.ejectBackend(rev, old, fl)
	}
	why := ""
	switch {
	case !fl.retryable():
		why = "the failure may have reached the app"
	case c.tries >= maxRetries:
		rev.metrics().triesExhausted.Inc()
		why = fmt.Sprintf("it was tried %d times", c.tries+1)
	case !rev.budget.withdraw(time.Now()):
		rev.metrics().budgetDenied.Inc()
		why = "the revision's retry budget is spent (many of its requests fail this way at once)"
	case !s.Rewind():
		why = fmt.Sprintf("its body is larger than the %d bytes the gateway keeps for a retry", replayLimit)
	}
	if why != "" {
		addr := ""
		if old != nil {
			addr = old.hostPort
		}
		if !fl.retryable() {
			c.status = http.StatusBadGateway
			g.log.Warn("proxy to instance failed", "revision", rev.name, "instance", addr, "err", err)
			h.respondText(s, c.status, nil, "instance %s of revision %s failed to answer: %v", addr, rev.name, err)
			return
		}
		g.log.Warn("request not retried", "revision", rev.name, "instance", addr, "reason", fl.String(), "why", why, "err", err)
		c.status = http.StatusServiceUnavailable
		h.respondText(s, c.status, []h2relay.Field{{Name: "retry-after", Value: "1"}},
			"instance %s of revision %s could not serve the request (%s; it did not reach the app) and it is not retried here: %s; retry",
			addr, rev.name, fl, why)
		return
	}
	c.tries++
	rev.metrics().retries.Inc()
	if old != nil {
		g.log.Debug("instance could not serve the request; retrying on another", "revision", rev.name, "instance", old.hostPort)
		c.b = nil
		// Released outside the relay's lock: a slot freed here may go
		// to a waiting stream of this very group.
		go rev.release(old)
	}
	b := rev.tryAcquire()
	if b == nil {
		var qerr error
		b, c.w, qerr = rev.enqueue(g.cfg.QueueDepth, h.granted(s, c))
		if qerr != nil {
			c.status = h.acquireError(s, c, qerr)
			return
		}
		if b == nil {
			c.queued = true
			h.arm(s, c)
			return
		}
	}
	h.dispatched(s, c, b, time.Now())
	s.Open()
}

func (h relayHandler) Done(s *h2relay.Stream, now time.Time) {
	c, _ := s.User.(*rstream)
	if c == nil || c.rev == nil {
		return
	}
	rev := c.rev
	if c.w != nil && !rev.withdraw(c.w) {
		// Its slot is on the way: the callback's Admit fails and gives
		// it back.
		c.w = nil
	}
	if c.b != nil {
		rev.release(c.b)
		c.b = nil
	}
	if c.counted {
		rev.inflight.Add(-1)
	}
	// What went to the client (the app's status or the gateway's
	// answer); 0: the client left before any.
	status := s.Status()
	m := rev.metrics()
	took := now.Sub(s.Arrived)
	m.codes[codeIndex(status)].Inc()
	m.duration.Observe(took.Seconds())
	rev.measure.observe(status, took)
	h.g.markActive(rev)
}

// respondText answers the stream with the gateway's plain-text error.
func (h relayHandler) respondText(s *h2relay.Stream, status int, extra []h2relay.Field, format string, args ...any) {
	fields := append([]h2relay.Field{
		{Name: "content-type", Value: "text/plain; charset=utf-8"},
		{Name: "x-content-type-options", Value: "nosniff"},
		{Name: "cache-control", Value: "no-store"},
	}, extra...)
	s.Respond(status, fields, fmt.Appendf(nil, "nomad-serverless: "+format+"\n", args...))
}

// respondRecorded answers the stream with what rec recorded.
func (h relayHandler) respondRecorded(s *h2relay.Stream, rec *recorder) int {
	if rec.status == 0 {
		rec.status = http.StatusOK
	}
	var fields []h2relay.Field
	for k, vv := range rec.h {
		k = strings.ToLower(k)
		if k == "connection" || k == "content-length" {
			continue
		}
		for _, v := range vv {
			fields = append(fields, h2relay.Field{Name: k, Value: v})
		}
	}
	s.Respond(rec.status, fields, rec.body.Bytes())
	return rec.status
}

// request is the stream as an *http.Request for the answers shared with
// the net/http path (headers read: the revision's).
func (h relayHandler) request(s *h2relay.Stream, host string, revHeader []string) *http.Request {
	r := &http.Request{Method: s.Header(":method"), Host: host, Header: http.Header{}, ProtoMajor: 2, Proto: "HTTP/2.0"}
	r.URL, _ = url.ParseRequestURI(s.Header(":path"))
	if r.URL == nil {
		r.URL = &url.URL{Path: "/"}
	}
	if len(revHeader) > 0 {
		r.Header[revisionHeaderKey] = revHeader
	}
	return r
}

func (h relayHandler) notRouted(s *h2relay.Stream, host string, revHeader []string, rt *route, tg *target, res resolution) {
	rec := newRecorder()
	h.g.notRouted(rec, h.request(s, host, revHeader), rt, tg, res)
	h.respondRecorded(s, rec)
}

// acquireError answers a stream that got no instance (writeAcquireError).
func (h relayHandler) acquireError(s *h2relay.Stream, c *rstream, err error) int {
	rec := newRecorder()
	status := h.g.writeAcquireError(rec, h.request(s, c.host, nil), c.rev, c.cfg, err)
	if status == 0 {
		s.Cancel(http2.ErrCodeCancel)
		return 0
	}
	return h.respondRecorded(s, rec)
}

// plainTLS answers what the plain port owes to HTTPS (plainHTTPTLS): ACME
// challenges and redirects.
func (h relayHandler) plainTLS(s *h2relay.Stream, t *table, host string) bool {
	path := s.Header(":path")
	if !strings.HasPrefix(path, acmeChallengePrefix) {
		if rt := t.public[host]; rt == nil || !rt.redirect {
			return false
		}
	}
	rec := newRecorder()
	if !h.g.plainHTTPTLS(rec, h.request(s, host, nil), t, host) {
		return false
	}
	h.respondRecorded(s, rec)
	return true
}

// recorder is an http.ResponseWriter that keeps an answer for the relay.
type recorder struct {
	h      http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{h: http.Header{}} }

func (r *recorder) Header() http.Header { return r.h }
func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
}
func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	return r.body.Write(p)
}
