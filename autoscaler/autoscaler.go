// Package autoscaler scales every revision between its min and max on
// observed concurrency (or RPS), to and from zero, the way Knative's KPA
// does: a pure Decider per revision, time-bucketed windows fed by scraping
// the sidecars' stats and the activators' queued demand, and an applier that
// sets the count through a Scaler (Nomad's Jobs().Scale in production).
//
// One elected replica runs it (RunWhenLeader); every replica serves its
// state and demand endpoints (RegisterAdmin) and non-leaders reach the
// leader through RemoteSink. A wake does not wait for the leader: every
// replica's Waker raises a revision at zero to its activation scale itself
// when the leader does not take the wake (Raiser's "at least n", guarded
// by the job's modify index), and the leader's next decision takes it from
// there.
package autoscaler

import (
	"context"
	"errors"
	"fmt"
	"github.com/nomad-serverless/nomad-serverless/canary"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// RevisionSource is what the autoscaler reads of the cluster;
// *catalog.Catalog satisfies it.
type RevisionSource interface {
	// Revisions lists every revision with its scaling settings and the
	// job's current count (Revision.Desired).
	Revisions() []catalog.Revision
	// Ready lists a revision's ready instances (activator stand-ins left
	// out).
	Ready(revision string) []consulroute.Instance
}

// revisionLookup is the optional fast path for a wake: one revision instead
// of the whole list. *catalog.Catalog has it.
type revisionLookup interface {
	Revision(name string) (catalog.Revision, bool)
}

// Config configures an Autoscaler. Revisions and Scaler are required; the
// rest have defaults.
type Config struct {
	Revisions RevisionSource
	Scaler    Scaler
	// Scraper reads sidecar stats; nil scrapes them over HTTP.
	Scraper StatsScraper
	// Resources reads the cpu and memory use of revisions scaled on them
	// (nomadjob.UsageReader); nil leaves those revisions without data,
	// so they stay at their count (and at least at min).
	Resources ResourceReader
	// ResourceConcurrency is how many Resources reads run at once;
	// default 8.
	ResourceConcurrency int
	// Tick is how often every revision is decided; default 2s. It is also
	// the windows' bucket size.
	Tick time.Duration
	// ScrapeTimeout bounds one round of scrapes; default half the tick, at
	// most 1s.
	ScrapeTimeout time.Duration
	// ScrapeConcurrency is how many scrapes run at once; default 64.
	ScrapeConcurrency int
	// DemandTTL is how long an activator's report counts; default 5s (they
	// report every second).
	DemandTTL time.Duration
	// RetryAttempts and RetryBackoff govern transient Scaler errors: up to
	// RetryAttempts calls (default 5), waiting RetryBackoff (default 250ms)
	// doubled after each, at most 5s.
	RetryAttempts int
	RetryBackoff  time.Duration
	// Now is the clock; nil is time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// Registerer, when set, gets the autoscaler's Prometheus metrics
	// (nomad_serverless_autoscaler_*, labels service and revision).
	Registerer prometheus.Registerer
	// Tracer, when set (tracing on), makes the scale call of a wake a
	// span in the trace of the request that caused it (tracing.go).
	Tracer trace.Tracer
}

// ErrNotLeader is returned by the demand methods and served by the admin API
// while this replica's autoscaler is not running.
var ErrNotLeader = errors.New("autoscaler: not running on this replica (it is not the leader)")

// Autoscaler decides and applies instance counts for every revision while
// Run runs. Its read side (State, States, ExcessBurstCapacity) and demand
// side (ReportDemand, Wake) are safe for concurrent use; only one Run may
// run at a time. Everything Run learns is dropped when it returns, so a
// replica that regains leadership later starts as fresh as a new one.
type Autoscaler struct {
	cfg     Config
	log     *slog.Logger
	scraper StatsScraper

	running atomic.Bool
	// published maps revision -> shared state for readers. The map itself
	// is immutable: the loop swaps in a new one when revisions come or go,
	// so ExcessBurstCapacity (on every gateway request) takes no lock.
	published atomic.Pointer[map[string]*shared]

	demandMu sync.Mutex
	reports  map[string]replicaReport      // by activator replica
	measured map[string]canary.Measurement // by revision, since TakeMeasurements

	wakeMu sync.Mutex
	// wakes are the revisions waiting for an immediate decision, each
	// with the trace of the request that woke it (invalid: none traced).
	wakes map[string]trace.SpanContext
	kick  chan struct{} // capacity 1: wakes coalesce

	// tickTime observes each periodic tick over every revision: how its
	// cost grows with the revision count (issue 45).
	tickTime prometheus.Histogram
}

type replicaReport struct {
	at     time.Time
	demand map[string]Demand
}

// New validates cfg and returns an Autoscaler that does nothing until Run.
func New(cfg Config) (*Autoscaler, error) {
	if cfg.Revisions == nil {
		return nil, errors.New("autoscaler: Config.Revisions is nil: give it the catalog")
	}
	if cfg.Scaler == nil {
		return nil, errors.New("autoscaler: Config.Scaler is nil: give it the Nomad client (or a test scaler)")
	}
	if cfg.Tick < 0 || cfg.ScrapeTimeout < 0 || cfg.DemandTTL < 0 || cfg.RetryBackoff < 0 {
		return nil, errors.New("autoscaler: Tick, ScrapeTimeout, DemandTTL and RetryBackoff must not be negative")
	}
	if cfg.ScrapeConcurrency < 0 || cfg.ResourceConcurrency < 0 || cfg.RetryAttempts < 0 {
		return nil, errors.New("autoscaler: ScrapeConcurrency, ResourceConcurrency and RetryAttempts must not be negative")
	}
	if cfg.Tick == 0 {
		cfg.Tick = 2 * time.Second
	}
	if cfg.Tick < time.Millisecond {
		return nil, fmt.Errorf("autoscaler: Tick %s is too short: use at least 1ms (2s in production)", cfg.Tick)
	}
	if cfg.ScrapeTimeout == 0 {
		cfg.ScrapeTimeout = min(cfg.Tick/2, time.Second)
	}
	if cfg.ScrapeConcurrency == 0 {
		cfg.ScrapeConcurrency = 64
	}
	if cfg.ResourceConcurrency == 0 {
		cfg.ResourceConcurrency = 8
	}
	if cfg.DemandTTL == 0 {
		cfg.DemandTTL = 5 * time.Second
	}
	if cfg.RetryAttempts == 0 {
		cfg.RetryAttempts = 5
	}
	if cfg.RetryBackoff == 0 {
		cfg.RetryBackoff = 250 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	scraper := cfg.Scraper
	if scraper == nil {
		scraper = NewHTTPScraper(nil)
	}
	a := &Autoscaler{
		cfg:      cfg,
		log:      log.With("component", "autoscaler"),
		scraper:  scraper,
		reports:  map[string]replicaReport{},
		measured: map[string]canary.Measurement{},
		wakes:    map[string]trace.SpanContext{},
		kick:     make(chan struct{}, 1),
		tickTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "nomad_serverless_autoscaler_tick_seconds",
			Help:    "Time of one periodic tick, which decides every revision (on the leader).",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{newMetricsCollector(a), a.tickTime} {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("autoscaler: register metrics: %w", err)
			}
		}
	}
	return a, nil
}

// Leading tells whether Run is running here (this replica is the leader).
func (a *Autoscaler) Leading() bool { return a.running.Load() }

// Run decides every revision each tick, and a woken revision at once, until
// ctx ends; then it waits for scale calls in progress to see the
// cancellation and returns nil. It returns an error only when it is already
// running.
func (a *Autoscaler) Run(ctx context.Context) error {
	if !a.running.CompareAndSwap(false, true) {
		return errors.New("autoscaler: Run is already running")
	}
	l := newLoop(a)
	defer func() {
		l.applies.Wait()
		a.published.Store(nil)
		a.demandMu.Lock()
		clear(a.reports)
		clear(a.measured)
		a.demandMu.Unlock()
		a.wakeMu.Lock()
		clear(a.wakes)
		a.wakeMu.Unlock()
		a.running.Store(false)
	}()
	a.log.Info("autoscaler started", "tick", a.cfg.Tick)
	ticker := time.NewTicker(a.cfg.Tick)
	defer ticker.Stop()
	a.timedTick(ctx, l)
	for {
		select {
		case <-ctx.Done():
			a.log.Info("autoscaler stopped")
			return nil
		case <-ticker.C:
			a.timedTick(ctx, l)
		case <-a.kick:
			l.tickWoken(ctx)
		}
	}
}

// timedTick runs a periodic tick and observes its time.
func (a *Autoscaler) timedTick(ctx context.Context, l *loop) {
	start := time.Now()
	l.tickAll(ctx)
	a.tickTime.Observe(time.Since(start).Seconds())
}

// ReportDemand implements DemandSink: it replaces replica's report.
func (a *Autoscaler) ReportDemand(_ context.Context, replica string, demand []Demand) error {
	if !a.running.Load() {
		return ErrNotLeader
	}
	m := make(map[string]Demand, len(demand))
	for _, d := range demand {
		if d.Revision == "" || d.Queued < 0 || d.InFlight < 0 {
			return fmt.Errorf("report demand from %s: invalid entry %+v", replica, d)
		}
		if err := checkMeasured(d.Measured); err != nil {
			return fmt.Errorf("report demand from %s: revision %s: %w", replica, d.Revision, err)
		}
		m[d.Revision] = d
	}
	a.demandMu.Lock()
	a.reports[replica] = replicaReport{at: a.cfg.Now(), demand: m}
	a.addMeasured(demand)
	a.demandMu.Unlock()
	return nil
}

// Wake implements DemandSink: it records d in replica's report and asks for
// a decision for d.Revision now (as soon as the loop is free: at most one
// round of scrapes, ScrapeTimeout, away). Concurrent wakes coalesce into one
// decision, and a count is applied once, so a burst of requests makes one
// scale call. A sampled trace in ctx (the request that caused the wake)
// gets that call as a span.
func (a *Autoscaler) Wake(ctx context.Context, replica string, d Demand) error {
	if !a.running.Load() {
		return ErrNotLeader
	}
	if d.Revision == "" || d.Queued < 0 || d.InFlight < 0 {
		return fmt.Errorf("wake from %s: invalid demand %+v", replica, d)
	}
	now := a.cfg.Now()
	a.demandMu.Lock()
	// Reports are read only under demandMu, so the entry is updated in
	// place rather than copying a replica's whole report for each wake.
	r := a.reports[replica]
	if r.demand == nil {
		r.demand = map[string]Demand{}
	}
	r.demand[d.Revision] = d
	r.at = now
	a.reports[replica] = r
	a.demandMu.Unlock()

	a.wakeMu.Lock()
	// The first traced wake of the revision stays its cause.
	if tr, ok := a.wakes[d.Revision]; !ok || !tr.IsValid() {
		a.wakes[d.Revision] = wakeTrace(ctx)
	}
	a.wakeMu.Unlock()
	select {
	case a.kick <- struct{}{}:
	default: // a decision is already asked for; it will see this wake
	}
	return nil
}

// ExcessBurstCapacity is the revision's spare capacity beyond its target
// burst capacity as of the last decision; negative means the activator must
// stay in the request path. known is false when this replica does not run
// the autoscaler or the revision has not been decided yet. Lock-free: an
// atomic map load and an atomic read, because the gateway asks on every
// request.
func (a *Autoscaler) ExcessBurstCapacity(revision string) (ebc float64, known bool) {
	m := a.published.Load()
	if m == nil {
		return 0, false
	}
	sh := (*m)[revision]
	if sh == nil {
		return 0, false
	}
	bits := sh.ebc.Load()
	if bits == ebcUnknown {
		return 0, false
	}
	return math.Float64frombits(bits), true
}

// EBCs returns every decided revision's excess burst capacity (what the
// admin API serves to other replicas).
func (a *Autoscaler) EBCs() map[string]float64 {
	m := a.published.Load()
	if m == nil {
		return nil
	}
	out := make(map[string]float64, len(*m))
	for name, sh := range *m {
		if bits := sh.ebc.Load(); bits != ebcUnknown {
			out[name] = math.Float64frombits(bits)
		}
	}
	return out
}

// RevisionState is one revision's scaling state as `nomad-serverless status`
// shows it.
type RevisionState struct {
	Service  string `json:"service"`
	Revision string `json:"revision"`
	// Desired is the count the decider wants; Count the job's count in
	// Nomad; Actual the ready instances.
	Desired int `json:"desired"`
	Count   int `json:"count"`
	Actual  int `json:"actual"`

	Metric spec.Metric `json:"metric"`
	// Target is the per-instance target (target x utilization; for cpu
	// and memory the target percentage itself). Stable and Panic are
	// revision totals (for cpu and memory: percentages of the serving
	// task's reservation, summed over the ready instances).
	Target    float64 `json:"target"`
	Stable    float64 `json:"stable"`
	Panic     float64 `json:"panic"`
	PanicMode bool    `json:"panic_mode"`
	// Queued is the requests the activators hold for it.
	Queued              int     `json:"queued"`
	ExcessBurstCapacity float64 `json:"excess_burst_capacity"`

	Rule   Rule   `json:"rule"`
	Reason string `json:"reason"`
	// LastReason and LastScale describe the last scale call that
	// succeeded; LastError the last that failed.
	LastReason string    `json:"last_reason,omitempty"`
	LastScale  time.Time `json:"last_scale,omitzero"`
	LastError  string    `json:"last_error,omitempty"`
	Decided    time.Time `json:"decided,omitzero"`

	ScaleCalls     uint64 `json:"scale_calls"`
	ScaleFailures  uint64 `json:"scale_failures"`
	ScrapeFailures uint64 `json:"scrape_failures"`
}

// State returns one revision's state; false when this replica does not run
// the autoscaler or does not know the revision.
func (a *Autoscaler) State(revision string) (RevisionState, bool) {
	m := a.published.Load()
	if m == nil {
		return RevisionState{}, false
	}
	sh := (*m)[revision]
	if sh == nil {
		return RevisionState{}, false
	}
	return sh.state(), true
}

// States returns every revision's state, sorted by revision; nil when this
// replica does not run the autoscaler.
func (a *Autoscaler) States() []RevisionState {
	m := a.published.Load()
	if m == nil {
		return nil
	}
	out := make([]RevisionState, 0, len(*m))
	for _, sh := range *m {
		out = append(out, sh.state())
	}
	slices.SortFunc(out, func(x, y RevisionState) int { return strings.Compare(x.Revision, y.Revision) })
	return out
}

// ebcUnknown marks an undecided revision (a NaN bit pattern no decision
// produces).
const ebcUnknown = ^uint64(0)

// shared is what the loop publishes about one revision for readers and what
// the applier goroutines report back. ebc is atomic for the gateway's
// lock-free read; the rest is guarded by mu, which the loop takes once per
// decision and readers once per status request.
type shared struct {
	service, revision string
	ebc               atomic.Uint64

	mu      sync.Mutex
	dec     Decision
	decided time.Time
	// Applier bookkeeping: one scale call in flight at most; applied is
	// the count last set, so the loop does not ask again before the
	// catalog has caught up.
	applying       bool
	applied        int
	appliedAt      time.Time
	lastReason     string
	lastScale      time.Time
	lastError      string
	failedCount    int
	failedAt       time.Time
	scaleCalls     uint64
	scaleFailures  uint64
	scrapeFailures uint64
}

func newShared(service, revision string) *shared {
	sh := &shared{service: service, revision: revision}
	sh.ebc.Store(ebcUnknown)
	return sh
}

func (sh *shared) state() RevisionState {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	d := sh.dec
	st := RevisionState{
		Service:             sh.service,
		Revision:            sh.revision,
		Desired:             d.Desired,
		Count:               d.Count,
		Actual:              d.Ready,
		Metric:              d.Metric,
		Target:              d.Target,
		Stable:              d.Stable,
		Panic:               d.Panic,
		PanicMode:           d.PanicMode,
		Queued:              d.Queued,
		ExcessBurstCapacity: d.ExcessBurstCapacity,
		Rule:                d.Rule,
		LastReason:          sh.lastReason,
		LastScale:           sh.lastScale,
		LastError:           sh.lastError,
		Decided:             sh.decided,
		ScaleCalls:          sh.scaleCalls,
		ScaleFailures:       sh.scaleFailures,
		ScrapeFailures:      sh.scrapeFailures,
	}
	if !sh.decided.IsZero() {
		st.Reason = d.Reason()
	}
	return st
}
