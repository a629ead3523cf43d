package sidecar

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/broadcast"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// state is what the probes found and whether the sidecar drains. The
// request path reads it with one atomic load; a probe held until the app is
// ready (spec.ProbeWaitHeader) waits on changed.
type state struct {
	ready, live, draining atomic.Bool
	// Last probe failures, for the admin endpoints' bodies.
	readyErr, liveErr atomic.Pointer[string]

	// changed is notified when ready or draining changes.
	changed broadcast.Signal

	// When the sidecar started, when its app first accepted a connection
	// and when it first answered readiness (unix nanoseconds, 0 until
	// then): the gateway's probe gets them (spec.InstanceTimesHeader) for
	// the wake's timeline.
	started, appAccepted, appReady atomic.Int64
}

// times are the instance's start times known so far.
func (s *state) times() spec.InstanceTimes {
	at := func(n int64) time.Time {
		if n == 0 {
			return time.Time{}
		}
		return time.Unix(0, n)
	}
	return spec.InstanceTimes{Started: at(s.started.Load()), AppAccepted: at(s.appAccepted.Load()), AppReady: at(s.appReady.Load())}
}

// setReady records readiness, wakes the held probes if it changed, and
// reports whether it did.
func (s *state) setReady(ok bool) bool {
	if s.ready.Swap(ok) == ok {
		return false
	}
	s.changed.Notify()
	return true
}

// setDraining marks the sidecar draining and wakes the held probes: they
// answer draining at once rather than at the end of their wait.
func (s *state) setDraining() {
	if !s.draining.Swap(true) {
		s.changed.Notify()
	}
}

// probeSchedule is the pure part of probing: fed each result, it says
// whether the app counts as healthy and how long to wait before the next
// probe. It does no I/O and reads no clock, so its rules are table-tested.
//
// Rules (Kubernetes' thresholds, Knative's aggressive start):
//   - health changes only after SuccessThreshold consecutive passes or
//     FailureThreshold consecutive failures;
//   - readiness starts unhealthy, liveness starts healthy (a liveness probe
//     must fail before it counts against the app);
//   - an aggressive schedule (readiness with period 0) probes every
//     spec.AggressiveProbePeriod until the first time the app is healthy,
//     then every spec.DefaultProbePeriod;
//   - a connection the app refused (refused) makes it unhealthy at once,
//     whatever the thresholds: nothing listens, so no request can be
//     served. From then on it is probed every spec.AggressiveProbePeriod,
//     whatever the period, until it is healthy again (SuccessThreshold
//     passes), so the instance's Consul check, which asks the sidecar,
//     follows within one check interval both ways.
type probeSchedule struct {
	probe         spec.Probe
	aggressive    bool
	period        time.Duration
	healthy       bool
	everHealthy   bool
	recovering    bool // unhealthy since a refused connection
	passes, fails int
	// noListener: the last probe found nothing listening at the app's
	// port (the loop tells it: noListener).
	noListener bool
}

func newReadinessSchedule(p spec.Probe) *probeSchedule {
	s := &probeSchedule{probe: p, period: p.Period}
	if p.Period == 0 {
		s.aggressive = true
		s.period = spec.DefaultProbePeriod
	}
	return s
}

func newLivenessSchedule(p spec.Probe) *probeSchedule {
	s := &probeSchedule{probe: p, period: p.Period, healthy: true, everHealthy: true}
	if p.Period == 0 {
		s.period = spec.DefaultLivenessPeriod
	}
	return s
}

// record takes one probe result and reports whether health changed.
func (s *probeSchedule) record(pass bool) bool {
	if pass {
		s.passes++
		s.fails = 0
		if !s.healthy && s.passes >= max(1, s.probe.SuccessThreshold) {
			s.healthy, s.everHealthy, s.recovering = true, true, false
			return true
		}
		return false
	}
	s.fails++
	s.passes = 0
	if s.healthy && s.fails >= max(1, s.probe.FailureThreshold) {
		s.healthy = false
		return true
	}
	return false
}

// refused records a connection the app refused and reports whether health
// changed (it is unhealthy from here on).
func (s *probeSchedule) refused() bool {
	s.passes = 0
	s.recovering = true
	if !s.healthy {
		return false
	}
	s.healthy = false
	return true
}

// next is the wait between the starts of two probes. An aggressive
// schedule that has never been healthy probes every spec.ListenProbePeriod
// while nothing listens at the app's port.
func (s *probeSchedule) next() time.Duration {
	if s.aggressive && !s.everHealthy && s.noListener {
		return min(spec.ListenProbePeriod, s.period)
	}
	if s.recovering || s.aggressive && !s.everHealthy {
		return min(spec.AggressiveProbePeriod, s.period)
	}
	return s.period
}

// noListenerAt tells whether a probe's failure says that nothing
// listens at the app's port: the connection was refused, or closed or
// reset before any answer (what a proxy in front of a port nobody
// listens behind does: docker's userland proxy of a published port).
//
// A connection closed before net/http wrote the probe on it is reported
// as "server closed idle connection" (an unexported error, so matched by
// its text): on a busy node the proxy's close can beat the probe's write.
func noListenerAt(err error) bool {
	return err != nil && (errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		strings.Contains(err.Error(), "server closed idle connection"))
}

// probeLoop runs a prober on its schedule until ctx ends, calling set when
// health changes and count after every probe. The schedule is the loop's
// alone: other goroutines tell it of a refused connection through refused,
// which never blocks.
type probeLoop struct {
	name   string // "readiness" or "liveness"
	prober prober
	sched  *probeSchedule
	log    *slog.Logger
	set    func(healthy bool, err error)
	count  func(pass bool)
	// connected, when set, is told of every connection a probe made to
	// the app (the app accepted it), through the probe's context
	// (httptrace's ConnectDone, which http probes call and tcp probes
	// call themselves).
	connected func()
	// refusals carries refused connections to the loop; one pending
	// is as good as many.
	refusals chan struct{}
}

func newProbeLoop(name string, p prober, sched *probeSchedule, log *slog.Logger, set func(bool, error), count func(bool)) *probeLoop {
	return &probeLoop{name: name, prober: p, sched: sched, log: log, set: set, count: count, refusals: make(chan struct{}, 1)}
}

// refused tells the loop that the app refused a connection; the loop
// applies it after the probe in progress, if any (whose pass may predate
// the refusal), and probes aggressively from then on.
func (l *probeLoop) refused() {
	select {
	case l.refusals <- struct{}{}:
	default:
	}
}

// errRefused is the readiness error a refused connection leaves.
var errRefused = errors.New("the app refused a connection from the sidecar")

func (l *probeLoop) run(ctx context.Context) {
	start := time.Now()
	if d := l.sched.probe.InitialDelay; d > 0 && !sleepCtx(ctx, d) {
		return
	}
	var probes int
	for {
		began := time.Now()
		pctx, cancel := context.WithTimeout(ctx, l.sched.probe.Timeout)
		if l.connected != nil {
			pctx = httptrace.WithClientTrace(pctx, &httptrace.ClientTrace{ConnectDone: func(_, _ string, err error) {
				if err == nil {
					l.connected()
				}
			}})
		}
		err := l.prober.probe(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		probes++
		l.count(err == nil)
		l.sched.noListener = noListenerAt(err)
		if l.sched.record(err == nil) {
			l.set(l.sched.healthy, err)
			if l.sched.healthy {
				l.log.Info("app "+l.name+" probe passes", "probes", probes, "since_start", time.Since(start).Round(time.Millisecond).String())
			} else {
				l.log.Warn("app "+l.name+" probe fails", "error", err, "failures", l.sched.fails)
			}
		}
		// Periods count from probe start; a slow probe is followed at once.
		if !l.sleep(ctx, began) {
			return
		}
	}
}

// sleep waits until the next probe is due (counted from began) and
// reports whether ctx is still live. A refusal meanwhile makes the app
// unhealthy at once and shortens the wait to the aggressive period.
func (l *probeLoop) sleep(ctx context.Context, began time.Time) bool {
	for {
		if d := l.sched.next() - time.Since(began); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-l.refusals:
				t.Stop()
				l.applyRefusal()
				continue // the wait may be shorter now
			case <-ctx.Done():
				t.Stop()
				return false
			}
		}
		// Due. A refusal that came meanwhile, or during the probe just
		// made, counts before the next probe.
		select {
		case <-l.refusals:
			l.applyRefusal()
		default:
		}
		return ctx.Err() == nil
	}
}

func (l *probeLoop) applyRefusal() {
	if l.sched.refused() {
		l.set(false, errRefused)
		l.log.Warn("app "+l.name+": connection refused; not ready until the probe passes", "probe_every", l.sched.next().String())
	}
}

// sleepCtx waits d (nothing if d <= 0) and reports whether ctx is still live.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
