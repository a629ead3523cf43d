package sidecar

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// Options are the sidecar's settings beyond spec.SidecarConfig (command
// line flags of `nomad-serverless sidecar`).
type Options struct {
	// Log receives the sidecar's own events; nil discards them.
	Log *slog.Logger
	// AccessLog receives one line per request when cfg.AccessLog is set;
	// nil means JSON lines on Log's handler.
	AccessLog *slog.Logger
	// Started is when the sidecar's process began (the command takes it
	// first thing); zero is when New is called. The gateway's probe gets
	// it for the wake's timeline (spec.InstanceTimesHeader).
	Started time.Time
	// Tracing, if set, traces every request (tracing.go); nil, tracing
	// costs the request path nothing.
	Tracing *tracing.Provider
}

// Sidecar is one instance's queue-proxy: the serving handler, the admin
// handler, the probe loops and the drain.
type Sidecar struct {
	cfg     spec.SidecarConfig
	log     *slog.Logger
	state   *state
	meter   *meter
	breaker *Breaker
	metrics *metrics
	handler *Handler
	admin   *adminHandler

	readiness, liveness *probeLoop

	drainMu sync.Mutex
	drain   *DrainReport
}

// New checks cfg (as spec.ParseSidecarEnv returns it) and builds the
// sidecar; nothing runs until Serve.
func New(cfg spec.SidecarConfig, opts Options) (*Sidecar, error) {
	log := opts.Log
	if log == nil {
		log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	log = log.With("revision", cfg.Revision)
	switch cfg.AppProtocol {
	case "", spec.ProtocolH2C:
	default:
		return nil, fmt.Errorf("app protocol %q: want h2c, or empty for HTTP/1.1", cfg.AppProtocol)
	}
	if cfg.AppPort < 1 || cfg.AppPort > 65535 {
		return nil, fmt.Errorf("app port %d: want 1 to 65535", cfg.AppPort)
	}
	if cfg.Timeout <= 0 {
		return nil, fmt.Errorf("timeout %s: want a positive duration", cfg.Timeout)
	}
	if cfg.Concurrency < 0 || cfg.QueueDepth < 0 {
		return nil, fmt.Errorf("concurrency %d, queue depth %d: want 0 or more", cfg.Concurrency, cfg.QueueDepth)
	}

	now := time.Now()
	s := &Sidecar{cfg: cfg, log: log, state: &state{}, meter: newMeter(now)}
	s.state.live.Store(true)
	s.state.started.Store(cmp.Or(opts.Started, now).UnixNano())
	if cfg.Concurrency > 0 {
		b, err := NewBreaker(cfg.Concurrency, cfg.QueueDepth)
		if err != nil {
			return nil, err
		}
		s.breaker = b
	}
	s.metrics = newMetrics(cfg.Service, cfg.Revision, gauges{
		inFlight:         func() float64 { return float64(s.meter.inFlight()) },
		queued:           func() float64 { return float64(s.queued()) },
		ready:            boolGauge(&s.state.ready),
		live:             boolGauge(&s.state.live),
		draining:         boolGauge(&s.state.draining),
		concurrencyLimit: float64(cfg.Concurrency),
		maxWait:          float64(cfg.QueueDepth),
	})

	readiness := spec.DefaultProbe(spec.ProbeTCP)
	if cfg.Readiness != nil {
		readiness = *cfg.Readiness
	}
	rp, err := newProber(readiness, appHost(cfg), cfg.AppPort, cfg.AppProtocol == spec.ProtocolH2C)
	if err != nil {
		return nil, fmt.Errorf("readiness probe: %w", err)
	}
	s.readiness = newProbeLoop("readiness", rp, newReadinessSchedule(readiness), log,
		func(ok bool, err error) {
			storeErr(&s.state.readyErr, err)
			if ok {
				// Before readiness is set, so a held probe answered at
				// the change carries it.
				s.state.appReady.CompareAndSwap(0, time.Now().UnixNano())
			}
			s.state.setReady(ok)
		},
		func(pass bool) { s.metrics.probes["readiness"][pass].Inc() })
	s.readiness.connected = func() { s.state.appAccepted.CompareAndSwap(0, time.Now().UnixNano()) }
	if cfg.Liveness != nil {
		lp, err := newProber(*cfg.Liveness, appHost(cfg), cfg.AppPort, cfg.AppProtocol == spec.ProtocolH2C)
		if err != nil {
			return nil, fmt.Errorf("liveness probe: %w", err)
		}
		s.liveness = newProbeLoop("liveness", lp, newLivenessSchedule(*cfg.Liveness), log,
			func(ok bool, err error) { s.state.live.Store(ok); storeErr(&s.state.liveErr, err) },
			func(pass bool) { s.metrics.probes["liveness"][pass].Inc() })
	}

	var access *slog.Logger
	if cfg.AccessLog {
		access = opts.AccessLog
		if access == nil {
			access = log
		}
	}
	if opts.Tracing != nil {
		for _, col := range opts.Tracing.Collectors() {
			if err := s.metrics.reg.Register(col); err != nil {
				return nil, fmt.Errorf("registering the tracing metrics: %w", err)
			}
		}
	}
	s.handler = newHandler(cfg, log, access, s.state, s.meter, s.breaker, s.metrics, opts.Tracing)
	s.handler.appRefused = s.appRefused
	s.admin = &adminHandler{s: s, metrics: s.metrics.handler()}
	return s, nil
}

func boolGauge(b interface{ Load() bool }) func() float64 {
	return func() float64 {
		if b.Load() {
			return 1
		}
		return 0
	}
}

func storeErr(p interface{ Store(*string) }, err error) {
	if err == nil {
		p.Store(nil)
		return
	}
	msg := err.Error()
	p.Store(&msg)
}

// appRefused is called by the handler when the app refused a connection:
// the probe answers 503 from now on (the gateway's probe and Consul's
// check see it at their next look), and the readiness loop probes every
// spec.AggressiveProbePeriod until the app is back.
func (s *Sidecar) appRefused() {
	if s.state.setReady(false) {
		storeErr(&s.state.readyErr, errRefused)
	}
	s.readiness.refused()
}

// Handler is the serving port's handler.
func (s *Sidecar) Handler() http.Handler { return s.handler }

// AdminHandler is the admin port's handler.
func (s *Sidecar) AdminHandler() http.Handler { return s.admin }

func (s *Sidecar) queued() int {
	if s.breaker == nil {
		return 0
	}
	return s.breaker.Waiting()
}

// Stats reports the window since the previous call and starts a new one.
func (s *Sidecar) Stats(now time.Time) spec.Stats {
	w := s.meter.report(now)
	st := spec.Stats{
		Service:            s.cfg.Service,
		Revision:           s.cfg.Revision,
		Instance:           s.cfg.Instance,
		IntervalSeconds:    w.Interval.Seconds(),
		AverageConcurrency: w.AverageConcurrency,
		Requests:           float64(w.Requests),
		InFlight:           w.InFlight,
		Queued:             s.queued(),
		Ready:              s.state.ready.Load(),
		Draining:           s.state.draining.Load(),
	}
	if st.IntervalSeconds > 0 {
		st.RPS = st.Requests / st.IntervalSeconds
	}
	return st
}

// Run listens on cfg.Port and cfg.AdminPort (all interfaces: the gateway
// and Consul reach the instance from outside) and calls Serve.
func (s *Sidecar) Run(ctx context.Context) error {
	ln, err := net.Listen("tcp", ":"+strconv.Itoa(s.cfg.Port))
	if err != nil {
		return fmt.Errorf("listen on serving port %d: %w", s.cfg.Port, err)
	}
	admin, err := net.Listen("tcp", ":"+strconv.Itoa(s.cfg.AdminPort))
	if err != nil {
		ln.Close()
		return fmt.Errorf("listen on admin port %d: %w", s.cfg.AdminPort, err)
	}
	return s.Serve(ctx, ln, admin)
}

// Serve serves on the two listeners and probes the app until ctx ends, then
// drains (see drain) and returns. It returns an error only when a listener
// fails.
func (s *Sidecar) Serve(ctx context.Context, serve, admin net.Listener) error {
	errLog := slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)
	front := s.frontDoor(serve, errLog)
	adm := &http.Server{
		Handler:           s.admin,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          errLog,
	}

	probeCtx, stopProbes := context.WithCancel(context.Background())
	defer stopProbes()
	var probes sync.WaitGroup
	for _, l := range []*probeLoop{s.readiness, s.liveness} {
		if l != nil {
			probes.Add(1)
			go func() { defer probes.Done(); l.run(probeCtx) }()
		}
	}

	errc := make(chan error, 2)
	go func() { errc <- fmt.Errorf("serving port: %w", front.serve()) }()
	go func() { errc <- fmt.Errorf("admin port: %w", adm.Serve(admin)) }()
	s.log.Info("sidecar serving", "port", serve.Addr().String(), "admin", admin.Addr().String(),
		"app_host", appHost(s.cfg), "app_port", s.cfg.AppPort, "concurrency", s.cfg.Concurrency, "queue_depth", s.cfg.QueueDepth)

	select {
	case err := <-errc:
		front.close()
		adm.Close()
		stopProbes()
		probes.Wait()
		return err
	case <-ctx.Done():
	}
	rep := s.drainServer(front)
	s.drainMu.Lock()
	s.drain = &rep
	s.drainMu.Unlock()
	actx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	if adm.Shutdown(actx) != nil {
		adm.Close()
	}
	stopProbes()
	probes.Wait()
	s.handler.app.closeIdle()
	return nil
}

// frontDoor serves the serving port on ln: the keepalive loop for plain
// HTTP/1.1 requests, net/http (HTTP/1.1 and h2c) for the rest.
func (s *Sidecar) frontDoor(ln net.Listener, errLog *log.Logger) *frontDoor {
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{
		Handler:   s.handler,
		Protocols: &protos,
		// Slow headers are an attack or a bug; slow bodies and long
		// responses are governed by the revision's timeouts instead.
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          errLog,
	}
	return newFrontDoor(ln, srv, s.log, s.othersInFlight)
}

// othersInFlight tells the front door whether a response about to be
// written has company: the answered request has left the meter already
// (Handler.done runs before the loop's last write). One P (GOMAXPROCS
// follows the task's cpu) shares the node's cores with its app; in paired
// make bench-sidecar runs, yielding then took the limited sidecar
// (concurrency = 10) from 0.871 to 0.937 of HAProxy's throughput, and the
// unlimited one stayed (0.912, 0.908): a released slot's waiter sends its
// request before the releaser's answer wakes its client.
func (s *Sidecar) othersInFlight() bool { return s.meter.inFlight() > 0 }

// DrainReport is what a drain did; the sidecar logs it before exiting.
type DrainReport struct {
	// Waited is from SIGTERM to the end of the drain.
	Waited time.Duration
	// InFlightAtStart were in the app or queued when the drain began.
	InFlightAtStart int
	// Arrived during the drain (they were served).
	Arrived uint64
	// Completed during the drain: InFlightAtStart + Arrived − Abandoned.
	Completed uint64
	// Abandoned were still running when DrainTimeout ran out and were cut.
	Abandoned int
}

// LastDrain returns the report of the drain, once Serve has drained.
func (s *Sidecar) LastDrain() (DrainReport, bool) {
	s.drainMu.Lock()
	defer s.drainMu.Unlock()
	if s.drain == nil {
		return DrainReport{}, false
	}
	return *s.drain, true
}

// drainServer is the lame-duck sequence:
//  1. the probe answers 503 at once, so Consul marks the instance critical
//     and the gateway stops choosing it; every response from now on closes
//     its connection, so clients reconnect (elsewhere, once Consul has
//     caught up);
//  2. requests that still arrive are served for DrainGrace;
//  3. the listener closes; requests in flight and queued run to the end;
//  4. at DrainTimeout (before Nomad's kill_timeout) whatever is left is cut.
func (s *Sidecar) drainServer(front *frontDoor) DrainReport {
	start := time.Now()
	// From here every HTTP/1 response says Connection: close (see
	// exchange.WriteHeader). Idle keep-alive connections stay open until the
	// grace ends, so a request already on its way over one is served
	// instead of meeting a closed socket.
	s.state.setDraining()
	inFlight0 := s.meter.inFlight()
	arrivals0 := s.meter.requests()
	deadline := start.Add(s.cfg.DrainTimeout)
	s.log.Info("draining: probe now fails, still serving", "grace", s.cfg.DrainGrace.String(),
		"drain_timeout", s.cfg.DrainTimeout.String(), "in_flight", inFlight0)

	sleepCtx(context.Background(), min(s.cfg.DrainGrace, time.Until(deadline)))

	err := front.shutdown(deadline)
	// Shutdown does not wait for hijacked connections (websockets); their
	// handlers are still counted in flight.
	for s.meter.inFlight() > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	abandoned := s.meter.inFlight()
	if errors.Is(err, context.DeadlineExceeded) || abandoned > 0 {
		front.close()
	}
	arrived := s.meter.requests() - arrivals0
	completed := int64(inFlight0) + int64(arrived) - int64(abandoned)
	rep := DrainReport{
		Waited:          time.Since(start),
		InFlightAtStart: inFlight0,
		Arrived:         arrived,
		Completed:       uint64(max(completed, 0)),
		Abandoned:       abandoned,
	}
	s.log.Info("drained", "waited", rep.Waited.Round(time.Millisecond).String(), "in_flight_at_start", rep.InFlightAtStart,
		"arrived_during_drain", rep.Arrived, "completed_during_drain", rep.Completed, "abandoned", rep.Abandoned)
	return rep
}

// appHost is where the app listens: the configured host, else loopback.
func appHost(cfg spec.SidecarConfig) string {
	if cfg.AppHost == "" {
		return spec.DefaultAppHost
	}
	return cfg.AppHost
}
