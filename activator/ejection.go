package activator

import (
	"context"
	"time"
)

// Outlier ejection (Envoy's outlier detection, with the probe as the only
// way back): an instance whose attempt failed in a way that proves it
// cannot serve (failure.ejects: its sidecar refused the connection, or
// said its app is unreachable) leaves balancing at once, on the first
// such failure. Without it the dead instance answers fastest, looks least
// loaded, and gets most of the traffic until Consul's check fails (on
// real agents: thousands of 502s in about a second).
//
// It comes back only after its sidecar answers the readiness probe
// (K-Network-Probe: queue), which the gateway sends every ProbeInterval;
// there is no timer that lets it back untested. The sidecar itself marks
// itself not ready at its app's first refused connection and probes the
// app every 25 ms, so the probe passes as soon as the app is back. Consul
// meanwhile sees the sidecar's 503 too and drops the instance; Nomad's
// restart of the task, or its replacement, brings it back through the
// usual path.
//
// There is no floor on how many instances may be out (Envoy's
// max_ejection_percent): only unambiguous failures eject, so an ejected
// instance cannot serve anyway, and with every instance out requests wait
// in the activator's queue (bounded by its timeout) instead of failing,
// until a probe brings one back.
//
// The state is one atomic flag on the backend: the pool's pick reads it
// with one load (the hot path), ejection and return are compare-and-swaps,
// so exactly one caller starts the probe loop and exactly one restores.

// eject takes b out of balancing and reports whether this call did (the
// caller then starts its probe loop).
func (b *backend) eject() bool { return b.ejected.CompareAndSwap(false, true) }

// restore puts an ejected backend back and reports whether this call did.
func (b *backend) restore() bool { return b.ejected.CompareAndSwap(true, false) }

// retired reports whether b left its revision (its connection pool is
// closed for good): its probe loop stops.
func (b *backend) retired() bool {
	b.pool.mu.Lock()
	defer b.pool.mu.Unlock()
	return b.pool.closed
}

// ejectBackend takes b out of r's balancing after failure f and starts
// probing it, unless it is out already.
func (g *Gateway) ejectBackend(r *revision, b *backend, f failure) {
	if !b.eject() {
		return
	}
	r.metrics().ejections.Inc()
	g.log.Warn("instance taken out of balancing until its probe passes", "revision", r.name, "instance", b.hostPort, "alloc", b.alloc, "reason", f.String())
	ctx := context.Background()
	if p := g.runCtx.Load(); p != nil {
		ctx = *p
	}
	g.bg.Add(1)
	go func() {
		defer g.bg.Done()
		defer g.guard("probe of ejected instance " + b.hostPort)
		g.probeEjected(ctx, r, b)
	}()
}

// probeEjected probes b every ProbeInterval until its sidecar answers
// ready (b goes back into balancing and the queue's waiters are served),
// b leaves the revision, or ctx ends.
func (g *Gateway) probeEjected(ctx context.Context, r *revision, b *backend) {
	start := time.Now()
	url := "http://" + b.hostPort + "/"
	t := time.NewTicker(g.cfg.ProbeInterval)
	defer t.Stop()
	for probes := 1; ; probes++ {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if b.retired() {
			return
		}
		// Not held (hold 0): between probes b.retired() is looked at,
		// and an ejected instance's recovery is no cold start.
		res, _ := g.prober.probeOnce(ctx, url, 0)
		g.metrics.probes.WithLabelValues(r.name, res).Inc()
		if res != "ready" {
			continue
		}
		if b.restore() {
			g.log.Info("instance back in balancing: its probe passed", "revision", r.name, "instance", b.hostPort,
				"after", time.Since(start).Round(time.Millisecond).String(), "probes", probes)
			r.dispatch()
		}
		return
	}
}
