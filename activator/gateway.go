// Package activator is nomad-serverless's gateway and activator: the HTTP
// front door for users without a service mesh, and the buffer that lets a
// revision sleep at zero.
//
// A request is routed by Host (<service>.<namespace>.<domain>, a service's
// own domains, <tag>-<service>.<namespace>.<domain>) to a revision through
// the service's traffic split, then to one of the revision's routable
// instances with a free concurrency slot. When none has a free slot the
// request waits in the revision's bounded FIFO queue (the activator) while
// the autoscaler is asked for an immediate decision, and new allocations are
// probed directly so the queue drains the moment their sidecar answers.
//
// Everything is read from a catalog.Catalog; the routing table is rebuilt
// when it changes and swapped in atomically, so requests take no lock to be
// routed.
//
// Faults (retry.go, ejection.go): a request that provably never reached an
// app (the dial to the sidecar failed, the connection broke before a byte
// was sent, or the sidecar answered with spec.NotServedHeader) goes to
// another instance whatever its method, its body replayed, within the
// revision's retry budget; an instance that failed like that leaves
// balancing at once and comes back only when its probe passes. Every
// request gets exactly one response: one that starts before its body was
// read closes the connection, and Listener screens heads a front proxy
// could frame differently (keepalive.ScreenConn).
//
// Plain HTTP/1.1 requests (no body, no upgrade: most traffic) cross the
// gateway on its own paths at both ends: keep-alive client connections are
// taken from net/http into a loop of the gateway's (keepalive.go, package
// datapath/keepalive) and requests go to sidecars over the gateway's own
// connection pool (forward.go); everything else goes through net/http and
// httputil.ReverseProxy.
package activator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/httputil"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/canary"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/datapath/h2proxy"
	"github.com/nomad-serverless/nomad-serverless/datapath/h2relay"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// Autoscaler is what the activator needs from the autoscaler: somewhere to
// report demand and ask for wakes, and the excess burst capacity that
// decides whether the activator stays in a revision's request path.
type Autoscaler interface {
	autoscaler.DemandSink
	// ExcessBurstCapacity is the spare capacity of a revision in requests
	// beyond its burst capacity; negative keeps the activator in the path.
	// known is false when the autoscaler has not decided for it yet.
	ExcessBurstCapacity(revision string) (ebc float64, known bool)
}

// Config configures a Gateway. Zero values take the defaults noted.
type Config struct {
	Catalog    *catalog.Catalog
	Autoscaler Autoscaler
	// Domain completes service hosts: <service>.<namespace>.<Domain>.
	// Default "localhost" (curl -H 'Host: hello.default.localhost').
	Domain string

	// QueueDepth bounds the requests one revision's queue holds (default
	// 10000); QueueTimeout bounds one request's wait in it (default 60s).
	// Beyond either the request gets 503.
	QueueDepth   int
	QueueTimeout time.Duration

	// MaxHeaderBytes bounds a request's header (default 64 KiB);
	// MaxBodyBytes its body (default 32 MiB; -1 = unlimited).
	MaxHeaderBytes int
	MaxBodyBytes   int64
	// ReadHeaderTimeout (default 10s) and IdleTimeout (default 90s) apply
	// to the listener built by Server; the read and write deadlines of a
	// request follow its revision's timeout plus QueueTimeout.
	ReadHeaderTimeout, IdleTimeout time.Duration

	// Replica names this gateway in demand reports (default: host name).
	Replica    string
	Logger     *slog.Logger
	Registerer prometheus.Registerer // nil: a private registry
	// Transport carries requests with a body, protocol upgrades, HTTP/2
	// requests and probes to sidecars (body-less HTTP/1 requests, the
	// common case, go through the gateway's own connection pool:
	// forward.go); nil is NewTransport.
	Transport http.RoundTripper

	// Policy is the load-balancing policy (default PolicyAuto).
	Policy Policy
	// ProbeInterval is the period of the direct probes of new allocations
	// (default 25ms); ProbeWindow bounds how long one allocation is probed
	// before only its Consul check counts (default 2m).
	ProbeInterval, ProbeWindow time.Duration
	// OnInstanceReady, if set, is called when a direct probe first finds
	// an allocation ready (benchmarks use it for the cold-start split).
	OnInstanceReady func(revision, hostPort string, at time.Time)

	// TLS, when set, answers ACME's HTTP-01 challenges on the plain port
	// and tells which names have a certificate, for services that
	// redirect to HTTPS (tls.go); HTTPSPort is the port redirects name
	// (443 is left out of the URL).
	TLS       TLS
	HTTPSPort int

	// WakeRecorder, if set, keeps the timeline of every wake this gateway
	// held a request for where users look (serve: a Nomad scaling event of
	// the revision). OnWake, if set, is told of each too (tests, the
	// benchmark's cold-start split).
	WakeRecorder WakeRecorder
	OnWake       func(spec.WakeTimeline)

	// Loaded, when set, closes once the catalog holds the whole cluster
	// (serve: Nomad's revisions listed, Consul's routes and ready
	// instances joined). Until then a request the gateway cannot route is
	// not answered 404 or 503 as if the service did not exist: it is held
	// until the catalog is in, for at most LoadingHold (default 10s), and
	// then refused with 503 and Retry-After. nil: the catalog is whole
	// from the start.
	Loaded      <-chan struct{}
	LoadingHold time.Duration

	// Tracing, if set, traces every routed request and every wake
	// (tracing.go); nil, tracing costs the data path nothing.
	Tracing *tracing.Provider
}

// WakeRecorder keeps a wake's timeline (spec.WakeTimeline).
type WakeRecorder interface {
	RecordWake(ctx context.Context, t spec.WakeTimeline) error
}

// Defaults.
const (
	DefaultDomain            = "localhost"
	DefaultQueueDepth        = 10000
	DefaultQueueTimeout      = 60 * time.Second
	DefaultMaxHeaderBytes    = 64 << 10
	DefaultMaxBodyBytes      = 32 << 20
	DefaultReadHeaderTimeout = 10 * time.Second
	DefaultIdleTimeout       = 90 * time.Second
	DefaultProbeInterval     = 25 * time.Millisecond
	DefaultProbeWindow       = 2 * time.Minute
	DefaultLoadingHold       = 10 * time.Second

	// HealthPath and MetricsPath are served by AdminHandler.
	HealthPath  = "/healthz"
	MetricsPath = "/metrics"

	// demandInterval is how often demand goes to the autoscaler;
	// ebcInterval how often the excess burst capacity is read back;
	// wakeInterval the least time between two wakes of one revision.
	demandInterval = time.Second
	ebcInterval    = 250 * time.Millisecond
	wakeInterval   = time.Second
	sweepInterval  = 100 * time.Millisecond
	// takeOverDrain bounds how long Run waits, when it ends, for requests
	// on taken-over connections (serve's own shutdown allows 30s).
	takeOverDrain = 30 * time.Second
)

// Gateway is the gateway and activator. ServeHTTP is safe for concurrent
// use from the moment New returns; Run drives the background work (table
// rebuilds, probes, demand reports) and must run for instances to be probed
// and the autoscaler to hear from the gateway.
type Gateway struct {
	cfg       Config
	cat       *catalog.Catalog
	as        Autoscaler
	log       *slog.Logger
	domain    string
	replica   string
	policy    Policy
	transport http.RoundTripper
	gatherer  prometheus.Gatherer
	metrics   *metrics
	tls       TLS
	proxy     *httputil.ReverseProxy
	buffers   *bufferPool
	prober    *prober
	wakes     *wakeTracker
	tracing   *tracing.Provider // nil: off

	table atomic.Pointer[table]

	buildMu  sync.Mutex
	revs     map[string]*revision      // by name; guarded by buildMu
	counters map[string]*atomic.Uint64 // split counters by namespace/service; guarded by buildMu
	// conflicts are hosts claimed twice, already logged; guarded by buildMu.
	conflicts map[string]bool
	// state is what the last build left for the next update (update.go);
	// guarded by buildMu.
	state *buildState

	rebuildCh chan struct{} // a probe succeeded: refresh readyRevs
	readyMu   sync.Mutex
	readyRevs map[string]bool // revisions with a probe that succeeded since the last refresh
	// loaded closes once the table is built from a whole catalog
	// (Config.Loaded closed and a rebuild after it).
	loaded chan struct{}
	// active are the revisions that had requests since their last demand
	// report without any (markActive); the periodic passes over
	// revisions (queue sweeps, demand reports, excess burst capacity)
	// visit these and the ones with instances, not every revision: at
	// 10,000 revisions at zero a pass over all cost 5 % of a core at
	// idle (issue 45). Guarded by activeMu.
	activeMu sync.Mutex
	active   map[*revision]struct{}
	// loadingHeld counts the requests awaitLoaded holds now.
	loadingHeld   atomic.Int64
	reportFailing atomic.Bool // the last demand report failed
	running       atomic.Bool
	healthy       atomic.Bool
	bg            sync.WaitGroup // wake goroutines
	runCtx        atomic.Pointer[context.Context]

	takeOversMu sync.Mutex
	takeOvers   []*takeOver // one per Server

	relaysMu sync.Mutex
	relays   []*h2relay.Relay // one per server whose HTTP/2 they serve
}

// New checks cfg and returns a gateway that already routes by the
// catalog's current content.
func New(cfg Config) (*Gateway, error) {
	if cfg.Catalog == nil {
		return nil, errors.New("activator: Config.Catalog is nil")
	}
	if cfg.Autoscaler == nil {
		return nil, errors.New("activator: Config.Autoscaler is nil: the activator reports demand and asks for wakes through it")
	}
	if cfg.QueueDepth < 0 || cfg.QueueTimeout < 0 || cfg.MaxHeaderBytes < 0 || cfg.MaxBodyBytes < -1 ||
		cfg.ReadHeaderTimeout < 0 || cfg.IdleTimeout < 0 || cfg.ProbeInterval < 0 || cfg.ProbeWindow < 0 || cfg.LoadingHold < 0 {
		return nil, errors.New("activator: sizes and durations in Config must not be negative")
	}
	if _, err := ParsePolicy(string(cfg.Policy)); err != nil {
		return nil, fmt.Errorf("activator: %w", err)
	}
	domain := strings.Trim(strings.ToLower(cfg.Domain), ".")
	if cfg.Domain == "" {
		domain = DefaultDomain
	}
	if domain == "" || strings.ContainsAny(domain, "/: ") {
		return nil, fmt.Errorf("activator: domain %q is not a DNS name", cfg.Domain)
	}
	setDefault(&cfg.QueueDepth, DefaultQueueDepth)
	setDefault(&cfg.QueueTimeout, DefaultQueueTimeout)
	setDefault(&cfg.MaxHeaderBytes, DefaultMaxHeaderBytes)
	setDefault(&cfg.MaxBodyBytes, DefaultMaxBodyBytes)
	setDefault(&cfg.ReadHeaderTimeout, DefaultReadHeaderTimeout)
	setDefault(&cfg.IdleTimeout, DefaultIdleTimeout)
	setDefault(&cfg.ProbeInterval, DefaultProbeInterval)
	setDefault(&cfg.ProbeWindow, DefaultProbeWindow)
	setDefault(&cfg.LoadingHold, DefaultLoadingHold)
	if cfg.Replica == "" {
		cfg.Replica = defaultReplica()
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = log.With("component", "gateway")
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	gatherer, _ := reg.(prometheus.Gatherer)
	rt := cfg.Transport
	if rt == nil {
		rt = NewTransport()
	}

	g := &Gateway{
		cfg:       cfg,
		cat:       cfg.Catalog,
		as:        cfg.Autoscaler,
		log:       log,
		domain:    domain,
		replica:   cfg.Replica,
		policy:    cfg.Policy,
		transport: rt,
		tls:       cfg.TLS,
		gatherer:  gatherer,
		revs:      map[string]*revision{},
		counters:  map[string]*atomic.Uint64{},
		conflicts: map[string]bool{},
		rebuildCh: make(chan struct{}, 1),
		loaded:    make(chan struct{}),
		active:    map[*revision]struct{}{},
		tracing:   cfg.Tracing,
	}
	if cfg.Loaded == nil {
		close(g.loaded)
	}
	m, err := newMetrics(reg, g)
	if err != nil {
		return nil, fmt.Errorf("activator: register metrics: %w", err)
	}
	g.metrics = m
	g.prober = newProber(rt, cfg.ProbeInterval, cfg.ProbeWindow, log, m)
	g.prober.guard = g.guard
	g.wakes = newWakeTracker(cfg.Replica, cfg.QueueTimeout+wakeSettle, g.wakeDone)
	if g.tracing != nil {
		g.wakes.traced = g.traceWake
	}
	g.prober.onReady = func(rev string, k probeKey, at time.Time, it spec.InstanceTimes) {
		g.readyMu.Lock()
		if g.readyRevs == nil {
			g.readyRevs = map[string]bool{}
		}
		g.readyRevs[rev] = true
		g.readyMu.Unlock()
		g.requestRebuild()
		g.wakes.probeReady(rev, k.Alloc, at, it)
		if cfg.OnInstanceReady != nil {
			cfg.OnInstanceReady(rev, k.HostPort, at)
		}
	}
	g.buffers = newBufferPool()
	g.proxy = g.newProxy()
	g.rebuild()
	return g, nil
}

func setDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// NewTransport returns the default transport to sidecars. A request that
// came over HTTP/2 goes on over HTTP/2 (h2c: the sidecar serves both on
// its port), so a client's streams stay streams to the instance and gRPC's
// trailers, full-duplex bodies and cancellations pass; every other request
// goes over HTTP/1.1.
func NewTransport() http.RoundTripper {
	h2c := newH1Transport()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true) // and not HTTP1: prior knowledge, no upgrade
	h2c.Protocols = &p
	// Streams of many clients share one connection per sidecar; a
	// connection that goes silent is found by a ping, not by the next
	// request's timeout.
	h2c.HTTP2 = &http.HTTP2Config{SendPingTimeout: 15 * time.Second, PingTimeout: 5 * time.Second}
	// The frames the transport writes one system call each go out
	// together (h2proxy.CombinedConn).
	h2c.DialContext = h2proxy.CombineWrites(h2c.DialContext)
	return byProtocol{h1: newH1Transport(), h2c: h2c}
}

// byProtocol sends a request that came over HTTP/2 through h2c and every
// other one through h1.
type byProtocol struct{ h1, h2c *http.Transport }

func (t byProtocol) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.ProtoMajor == 2 {
		return t.h2c.RoundTrip(r)
	}
	return t.h1.RoundTrip(r)
}

// newH1Transport is the HTTP/1.1 transport to sidecars: keep-alive
// connections in number (every request of a busy revision reuses one),
// short dials (sidecars are near, and a refused dial is retried
// elsewhere), no compression (bytes pass through untouched).
func newH1Transport() *http.Transport {
	return &http.Transport{
		Proxy:                 nil,
		DialContext:           (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   1024,
		IdleConnTimeout:       60 * time.Second,
		ExpectContinueTimeout: time.Second,
		DisableCompression:    true,
		ForceAttemptHTTP2:     false,
		WriteBufferSize:       16 << 10,
		ReadBufferSize:        16 << 10,
	}
}

// rebuildGap is the least time between the end of a rebuild that took d
// and a rebuild for the next catalog change: nine times d, so rebuilds
// for catalog changes take at most a tenth of a core however big the
// catalog, and at most 5 s. At 10,000 revisions on a busy 2-core node a
// rebuild took 412-540 ms (issue 45's third run); a 1 s bound let rebuilds
// take a third of a core on each replica through a bulk deploy. A change
// after a quiet spell is still rebuilt at once, and a wake's probe
// rebuilds at once whatever the pace.
func rebuildGap(d time.Duration) time.Duration {
	return min(9*d, 5*time.Second)
}

// requestRebuild asks Run for a table rebuild without blocking.
func (g *Gateway) requestRebuild() {
	select {
	case g.rebuildCh <- struct{}{}:
	default:
	}
}

// Run rebuilds the routing table when the catalog changes, probes new
// allocations, reports demand every second and reads back the autoscaler's
// excess burst capacity, until ctx ends. Then the queues are failed (503)
// and probes stopped; Run returns nil.
func (g *Gateway) Run(ctx context.Context) error {
	if !g.running.CompareAndSwap(false, true) {
		return errors.New("activator: Run called twice")
	}
	g.runCtx.Store(&ctx)
	g.prober.start(ctx)
	g.refreshEBC()
	// Take the change channel before reading the catalog, here and after
	// every change: a change made while a rebuild reads it then closes the
	// channel held, and is rebuilt next, instead of being missed until
	// some later change.
	changed := g.cat.Changed()
	g.rebuild()
	g.healthy.Store(true)
	// loadedCh is nil (never ready) once the table holds the whole
	// catalog, or when it did from the start.
	var loadedCh <-chan struct{}
	select {
	case <-g.loaded:
	default:
		loadedCh = g.cfg.Loaded
	}

	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); g.reportLoop(ctx) }()
	go func() { defer wg.Done(); g.ebcLoop(ctx) }()

	sweep := time.NewTicker(sweepInterval)
	defer sweep.Stop()
	lastIdleSweep := time.Now()
	// A catalog change is rebuilt at once after a quiet spell, but no
	// sooner than rebuildGap after the last rebuild: a rebuild reads the
	// whole catalog, and a bulk deploy changes it several times per
	// service (issue 45: at 300 services each replica rebuilt about 3
	// times per service deployed).
	var pace *time.Timer
	var paced <-chan time.Time
	var lastEnd time.Time
	var lastTook time.Duration
	timed := func() {
		start := time.Now()
		g.safeUpdate()
		lastEnd = time.Now()
		lastTook = lastEnd.Sub(start)
	}
	onChange := func() {
		if paced != nil {
			return // a rebuild is already due
		}
		if wait := time.Until(lastEnd.Add(rebuildGap(lastTook))); wait > 0 {
			pace = time.NewTimer(wait)
			paced = pace.C
			return
		}
		timed()
	}
	defer func() {
		if pace != nil {
			pace.Stop()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			g.healthy.Store(false)
			g.prober.stop()
			wg.Wait()
			g.buildMu.Lock()
			for _, r := range g.revs {
				r.close(errShutdown)
				for _, b := range r.backends {
					b.closeIdle(time.Time{}, false)
				}
			}
			g.buildMu.Unlock()
			g.bg.Wait()
			g.stopTakeOvers(takeOverDrain)
			g.stopRelays(takeOverDrain)
			return nil
		case <-changed:
			changed = g.cat.Changed()
			onChange()
		case <-paced:
			paced = nil
			timed()
		case <-g.rebuildCh:
			// A probe succeeded: a wake waits for it. Only the probed
			// revisions are refreshed now; the whole table follows at
			// the catalog's pace. A whole rebuild here put 150-650 ms of
			// our own between the app's readiness and the first byte of
			// a wake at 10,000 revisions (issue 45).
			g.readyMu.Lock()
			revs := g.readyRevs
			g.readyRevs = nil
			g.readyMu.Unlock()
			for rev := range revs {
				g.refreshRevision(rev)
			}
			onChange()
		case <-loadedCh:
			// Rebuilt before held requests are let go, so they route by
			// the whole catalog.
			loadedCh = nil
			timed()
			close(g.loaded)
		case <-sweep.C:
			g.sweepQueues()
			if now := time.Now(); now.Sub(lastIdleSweep) >= idleConnTimeout/4 {
				lastIdleSweep = now
				g.closeIdleConns(now.Add(-idleConnTimeout))
			}
		}
	}
}

// sweepQueues is a safety net for waiters: every release, new pool and
// restored instance dispatches already.
func (g *Gateway) sweepQueues() {
	for _, r := range g.activeRevisions() {
		r.dispatch()
	}
}

// markActive puts r in the set of revisions with requests. Call it after
// the request's count (queued, inflight, measured) changed: a demand
// report that retires r meanwhile then sees the change and keeps it.
func (g *Gateway) markActive(r *revision) {
	if r.active.Load() || !r.active.CompareAndSwap(false, true) {
		return
	}
	g.activeMu.Lock()
	g.active[r] = struct{}{}
	g.activeMu.Unlock()
}

// activeRevisions lists the revisions with requests.
func (g *Gateway) activeRevisions() []*revision {
	g.activeMu.Lock()
	defer g.activeMu.Unlock()
	out := make([]*revision, 0, len(g.active))
	for r := range g.active {
		out = append(out, r)
	}
	return out
}

// retire takes r out of the active set, and puts it back if a request
// came meanwhile (markActive's order makes that visible here).
func (g *Gateway) retire(r *revision) {
	g.activeMu.Lock()
	delete(g.active, r)
	g.activeMu.Unlock()
	r.active.Store(false)
	if r.queued.Load() > 0 || r.inflight.Load() > 0 || r.measure.pending() {
		g.markActive(r)
	}
}

// forgetActive takes a revision that left the table out of the set.
func (g *Gateway) forgetActive(r *revision) {
	g.activeMu.Lock()
	delete(g.active, r)
	g.activeMu.Unlock()
}

func (g *Gateway) reportLoop(ctx context.Context) {
	t := time.NewTicker(demandInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		func() {
			defer g.guard("demand report")
			g.reportDemand(ctx)
		}()
	}
}

// reportDemand sends every revision that has requests queued or in flight,
// or requests that ended since the last report that reached the leader
// (their measurements, for rollouts: measure.go); the report replaces the
// previous one, so a revision that went quiet drops out of it.
func (g *Gateway) reportDemand(ctx context.Context) {
	var demand []autoscaler.Demand
	type sentMark struct {
		r    *revision
		sent canary.Measurement
	}
	var sent []sentMark
	for _, r := range g.activeRevisions() {
		d, s, ok := r.withMeasured(r.demand())
		if !ok {
			g.retire(r)
			continue
		}
		demand = append(demand, d)
		if d.Measured != nil {
			sent = append(sent, sentMark{r, s})
		}
	}
	ctx, cancel := context.WithTimeout(ctx, demandInterval)
	defer cancel()
	if err := g.as.ReportDemand(ctx, g.replica, demand); err != nil {
		g.metrics.reports.WithLabelValues("error").Inc()
		// Said once per outage, not every second.
		lvl := slog.LevelDebug
		if g.reportFailing.CompareAndSwap(false, true) {
			lvl = slog.LevelWarn
		}
		g.log.Log(ctx, lvl, "report demand to the autoscaler (retrying every second)", "err", err)
		return
	}
	for _, m := range sent {
		m.r.measure.sent = m.sent
	}
	if g.reportFailing.CompareAndSwap(true, false) {
		g.log.Info("demand reports reach the autoscaler again")
	}
	g.metrics.reports.WithLabelValues("ok").Inc()
}

func (r *revision) demand() autoscaler.Demand {
	return autoscaler.Demand{Revision: r.name, Queued: int(max(r.queued.Load(), 0)), InFlight: int(r.inflight.Load())}
}

func (g *Gateway) ebcLoop(ctx context.Context) {
	t := time.NewTicker(ebcInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		func() {
			defer g.guard("excess burst capacity")
			g.refreshEBC()
		}()
	}
}

// refreshEBC reads the autoscaler's excess burst capacity of every revision.
func (g *Gateway) refreshEBC() {
	t := g.table.Load()
	// A revision without instances nor requests needs none: its first
	// request queues whatever the capacity, and marks it active.
	for _, r := range slices.Concat(t.withInstances, g.activeRevisions()) {
		ebc, known := g.as.ExcessBurstCapacity(r.name)
		if math.IsNaN(ebc) {
			known = false
		}
		r.ebc.Store(math.Float64bits(ebc))
		r.ebcKnown.Store(known)
	}
}

// maybeWake asks the autoscaler for an immediate decision for a revision
// that has a request waiting, at most once per wakeInterval per revision.
// The call runs in the background: a request never waits on the autoscaler.
func (g *Gateway) maybeWake(r *revision) {
	now := time.Now().UnixNano()
	last := r.lastWake.Load()
	if last != 0 && now-last < int64(wakeInterval) || !r.lastWake.CompareAndSwap(last, now) {
		return
	}
	ctxp := g.runCtx.Load()
	if ctxp == nil {
		// Not running: nobody would wait for the goroutine; ask anyway.
		bg := context.Background()
		ctxp = &bg
	}
	r.metrics().wakes.Inc()
	g.bg.Add(1)
	go func() {
		defer g.bg.Done()
		defer g.guard("wake")
		ctx, cancel := context.WithTimeout(*ctxp, 5*time.Second)
		defer cancel()
		if g.tracing != nil {
			// The scale call this wake leads to goes into the trace of
			// the request that caused it (autoscaler/tracing.go).
			ctx = r.wakeCause(ctx)
		}
		if err := g.as.Wake(ctx, g.replica, r.demand()); err != nil {
			g.log.Warn("ask the autoscaler to wake a revision", "revision", r.name, "err", err)
		}
	}()
}

// Server returns an http.Server for user traffic with the gateway's limits:
// header size, read-header and idle timeouts. Per-request read and write
// deadlines are set by ServeHTTP from the revision's timeout.
//
// Serve it on Listener(ln): heads net/http would take but a front proxy
// could frame differently are refused there (the keep-alive loop screens
// the connections it takes over itself).
//
// Its keep-alive connections with plain requests are served by the
// gateway's own loop (keepalive.go). Shutdown closes them as it closes its
// own (idle ones at once, busy ones after their response), but it does
// not wait for them: Run does, when its context ends, so stop both.
func (g *Gateway) Server(addr string) *http.Server {
	return g.plainServer(addr, g.serveHTTP, publicScope)
}

// InternalServer is Server for the internal listener (serve
// -internal-listen): the same limits, protocols and keep-alive loop, and
// the same routing, split, queue and wake from zero, for every service,
// internal and public alike (Knative's cluster-local: inside the cluster
// everything is reachable). It has no HTTPS, no ACME challenges and no
// redirects. Serve it on Listener(ln) as well.
func (g *Gateway) InternalServer(addr string) *http.Server {
	return g.plainServer(addr, g.serveInternal, internalScope)
}

// plainServer is the server of a plain (h1 and h2c) listener whose
// requests serve handles.
func (g *Gateway) plainServer(addr string, serve http.HandlerFunc, sc scope) *http.Server {
	t := newTakeOver(g, serve, nil)
	// HTTP/1.1, and HTTP/2 with prior knowledge (h2c: what gRPC clients
	// without TLS speak). Every HTTP/2 stream is a request like any other:
	// routed, split, counted and held at zero on its own.
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	takeOrServe := func(w http.ResponseWriter, r *http.Request) {
		if t.eligible(r) && t.serve(w, r) {
			return
		}
		serve(w, r)
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
		ConnContext:       withH2Conn,
	}
	srv.RegisterOnShutdown(t.shutdown)
	g.useRelay(srv, sc, "http", false)
	return srv
}

// useRelay serves srv's HTTP/2 connections with the gateway's relay
// (relay.go) unless tracing is on (the relay makes no spans): net/http's
// HTTP/2 then serves them, as before.
func (g *Gateway) useRelay(srv *http.Server, sc scope, scheme string, tlsToo bool) {
	if g.tracing != nil {
		return
	}
	relay, err := g.newRelay(sc, scheme)
	if err != nil {
		g.log.Warn("serving HTTP/2 with net/http", "error", err)
		return
	}
	g.relaysMu.Lock()
	g.relays = append(g.relays, relay)
	g.relaysMu.Unlock()
	g.relayNextProto(srv, relay, tlsToo)
}

// Listener screens the connections ln accepts for a server from Server
// (serve it with srv.Serve(g.Listener(ln))): request heads that net/http
// would take but a front proxy could frame differently (Content-Length
// with Transfer-Encoding, duplicate Content-Length, obs-fold, chunked
// HTTP/1.0) are answered 400 and close the connection, and nothing of
// them reaches an instance. Connections the keep-alive loop takes over
// are screened by the loop from then on. See keepalive.ScreenConn.
func (g *Gateway) Listener(ln net.Listener) net.Listener {
	return keepalive.ScreenListener{Listener: ln, MaxHead: g.cfg.MaxHeaderBytes + 4<<10}
}

// maxConcurrentStreams bounds the HTTP/2 streams one client connection may
// have open (net/http's default, said here because it is a limit users
// meet): a stream beyond it is refused (REFUSED_STREAM) and the client
// retries it, so one connection cannot hold more of the gateway's handlers
// than this.
const maxConcurrentStreams = 250

// http2Limits are the HTTP/2 settings of the public server. The rest are
// net/http's defaults, which already bound what a hostile peer can cost:
// header lists by MaxHeaderBytes, control frames queued for one
// connection, and rapid resets (a reset stream's handler still counts
// against the stream limit until it returns).
func http2Limits() *http.HTTP2Config {
	return &http.HTTP2Config{MaxConcurrentStreams: maxConcurrentStreams}
}

// stopTakeOvers closes the taken-over connections (idle ones at once, busy
// ones after their response) and waits up to d for them.
func (g *Gateway) stopTakeOvers(d time.Duration) {
	g.takeOversMu.Lock()
	ts := slices.Clone(g.takeOvers)
	g.takeOversMu.Unlock()
	for _, t := range ts {
		t.shutdown()
	}
	deadline := time.Now().Add(d)
	for _, t := range ts {
		t.loop.Wait(time.Until(deadline))
	}
}

// stopRelays drains the relays' connections (GOAWAY: open streams
// finish), waits up to d for them, and cuts what is left.
func (g *Gateway) stopRelays(d time.Duration) {
	g.relaysMu.Lock()
	rs := slices.Clone(g.relays)
	g.relaysMu.Unlock()
	for _, r := range rs {
		r.Drain()
	}
	deadline := time.Now().Add(d)
	for _, r := range rs {
		r.Wait(time.Until(deadline))
		r.Close()
	}
}

// AdminHandler serves HealthPath (200 while Run is running, for the Consul
// check that lets several replicas sit behind a load balancer) and
// MetricsPath (when the Registerer is also a Gatherer, as the default is).
func (g *Gateway) AdminHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc(HealthPath, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		if !g.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprintln(w, "not ready: the gateway is not running")
			return
		}
		fmt.Fprintln(w, "ok")
	})
	if g.gatherer != nil {
		mux.Handle(MetricsPath, promhttp.HandlerFor(g.gatherer, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(g.log.Handler(), slog.LevelWarn),
			// OpenMetrics carries the latency histograms' exemplars
			// (trace ids) to a scraper that asks for it.
			EnableOpenMetrics: true}))
	}
	return mux
}

// RevisionState is one revision as the gateway sees it now.
type RevisionState struct {
	Revision string  `json:"revision"`
	Service  string  `json:"service"`
	Queued   int     `json:"queued"`
	InFlight int     `json:"in_flight"`
	InPath   bool    `json:"activator_in_path"`
	EBC      float64 `json:"excess_burst_capacity"`
	EBCKnown bool    `json:"excess_burst_capacity_known"`
	Policy   Policy  `json:"policy"`
	// Concurrency is the per-instance limit (0 = none).
	Concurrency int `json:"concurrency"`
	// Instances are the routable instances.
	Instances []InstanceState `json:"instances"`
}

// InstanceState is one routable instance.
type InstanceState struct {
	Address  string `json:"address"`
	Alloc    string `json:"alloc,omitempty"`
	InFlight int    `json:"in_flight"`
}

// Revisions reports every revision's routing state, sorted by name.
func (g *Gateway) Revisions() []RevisionState {
	t := g.table.Load()
	out := make([]RevisionState, 0, len(t.revisions))
	for _, r := range t.revisions {
		p := r.pool.Load()
		s := RevisionState{
			Revision: r.name, Service: r.service,
			Queued: int(max(r.queued.Load(), 0)), InFlight: int(r.inflight.Load()),
			InPath: r.inPath(p), EBC: math.Float64frombits(r.ebc.Load()), EBCKnown: r.ebcKnown.Load(),
			Policy: p.policy, Concurrency: int(p.limit),
		}
		for _, b := range p.backends {
			s.Instances = append(s.Instances, InstanceState{Address: b.hostPort, Alloc: b.alloc, InFlight: int(b.inflight.Load())})
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b RevisionState) int { return strings.Compare(a.Revision, b.Revision) })
	return out
}

// defaultReplica names this process in demand reports.
func defaultReplica() string {
	h, err := os.Hostname()
	if err != nil || h == "" {
		h = "gateway"
	}
	return fmt.Sprintf("%s-%d", h, os.Getpid())
}

// closeIdleConns closes connections to instances unused since cutoff.
func (g *Gateway) closeIdleConns(cutoff time.Time) {
	g.buildMu.Lock()
	defer g.buildMu.Unlock()
	for _, r := range g.revs {
		for _, b := range r.backends {
			b.closeIdle(cutoff, false)
		}
	}
}

// guard, deferred at the top of a background goroutine, keeps a panic
// there (a bug, ours or the autoscaler's) from taking the process down: it
// is logged and counted like a panic while serving a request.
func (g *Gateway) guard(what string) {
	if p := recover(); p != nil {
		g.metrics.panics.Inc()
		g.log.Error("panic in background work", "work", what, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	}
}

// safeUpdate updates the table with the catalog's changes; after a panic
// the previous table stays, and the next build is a whole one.
func (g *Gateway) safeUpdate() {
	defer g.guard("routing table update")
	defer func() {
		if p := recover(); p != nil {
			g.buildMu.Lock()
			g.state = nil
			g.buildMu.Unlock()
			panic(p)
		}
	}()
	g.update()
}

// wakeDone takes a finished wake's timeline: its steps go to the
// histograms, a line to the log, and the timeline to OnWake and the
// WakeRecorder (in the background: a request never waits for it).
func (g *Gateway) wakeDone(t spec.WakeTimeline) {
	g.metrics.observeWake(t)
	g.log.Info("wake timed", "revision", t.Revision, "alloc", t.Alloc, "summary", t.Summary())
	if g.cfg.OnWake != nil {
		g.cfg.OnWake(t)
	}
	rec := g.cfg.WakeRecorder
	ctxp := g.runCtx.Load()
	if rec == nil || ctxp == nil || (*ctxp).Err() != nil {
		return
	}
	g.bg.Add(1)
	go func() {
		defer g.bg.Done()
		defer g.guard("record a wake's timeline")
		ctx, cancel := context.WithTimeout(*ctxp, 10*time.Second)
		defer cancel()
		if err := rec.RecordWake(ctx, t); err != nil {
			g.log.Warn("record a wake's timeline", "revision", t.Revision, "err", err)
		}
	}()
}

// NoteScaledFromZero tells the gateway that Nomad's job of revision now
// has a count above zero where it had none, written at at (the job's
// submit time, from Nomad's event stream): the scale-up a wake waits for.
func (g *Gateway) NoteScaledFromZero(revision string, at time.Time) {
	if r := g.table.Load().revisions[revision]; r != nil {
		g.wakes.scaledFromZero(r, at)
	}
}

// NoteEvaluation tells the gateway that Nomad created an evaluation of
// revision's job (from its event stream), for the wake timelines.
func (g *Gateway) NoteEvaluation(revision, id string, created time.Time) {
	if g.wakes.active.Load() > 0 {
		g.wakes.evaluation(revision, id, created)
	}
}

// NoteAllocation tells the gateway what Nomad's event stream says of an
// allocation, for the wake timelines. Cheap when no wake is timed.
func (g *Gateway) NoteAllocation(a AllocationTimes) {
	if g.wakes.active.Load() > 0 {
		g.wakes.allocation(a)
	}
}
