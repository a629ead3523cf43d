package activator

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// prober probes the sidecars of allocations that Nomad reports Running or
// Starting but Consul does not list yet, for at most window, so a new
// instance takes traffic the moment its sidecar answers instead of at the
// next Consul check. Each probe asks the sidecar to hold it until the app is
// ready (probeHold); a refused or unanswered probe is sent again after
// interval. Probes go through the proxy's transport: the connection
// of the successful probe is kept alive and carries the first request.
type prober struct {
	rt       http.RoundTripper
	interval time.Duration
	window   time.Duration
	log      *slog.Logger
	metrics  *metrics
	// onReady is called (from the probing goroutine) after a success is
	// recorded, with the times the sidecar sent (spec.InstanceTimesHeader);
	// the gateway rebuilds its table.
	onReady func(rev string, k probeKey, at time.Time, it spec.InstanceTimes)
	// guard recovers a panic in a probing goroutine (Gateway.guard).
	guard func(what string)

	mu      sync.Mutex
	ctx     context.Context // nil until start
	wg      sync.WaitGroup
	running map[probeKey]context.CancelFunc
	results map[probeKey]bool // successes not yet forgotten
	gaveUp  map[probeKey]bool // window passed without success
}

func newProber(rt http.RoundTripper, interval, window time.Duration, log *slog.Logger, m *metrics) *prober {
	return &prober{
		rt: rt, interval: interval, window: window, log: log, metrics: m,
		running: map[probeKey]context.CancelFunc{},
		results: map[probeKey]bool{},
		gaveUp:  map[probeKey]bool{},
	}
}

// start enables probing under ctx; sync before it only records what to probe.
func (p *prober) start(ctx context.Context) {
	p.mu.Lock()
	p.ctx = ctx
	p.mu.Unlock()
}

// stop cancels every probe and waits for them.
func (p *prober) stop() {
	p.mu.Lock()
	p.ctx = nil
	for k, cancel := range p.running {
		cancel()
		delete(p.running, k)
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// successes returns a copy of the recorded successes.
func (p *prober) successes() map[probeKey]bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make(map[probeKey]bool, len(p.results))
	for k := range p.results {
		out[k] = true
	}
	return out
}

// sync makes the running probes match want (key -> revision): new keys
// start, keys no longer wanted stop, and memory of keys that left (their
// allocation is routable, stopped or gone) is dropped.
func (p *prober) sync(want map[probeKey]string, known map[probeKey]bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, cancel := range p.running {
		if _, ok := want[k]; !ok {
			cancel()
			delete(p.running, k)
		}
	}
	for k := range p.results {
		// known names allocations, whatever the generation.
		if !known[probeKey{HostPort: k.HostPort, Alloc: k.Alloc}] {
			delete(p.results, k)
		}
	}
	for k := range p.gaveUp {
		if _, ok := want[k]; !ok {
			delete(p.gaveUp, k)
		}
	}
	if p.ctx == nil {
		return
	}
	for k, rev := range want {
		if _, ok := p.running[k]; ok || p.results[k] || p.gaveUp[k] {
			continue
		}
		ctx, cancel := context.WithCancel(p.ctx)
		p.running[k] = cancel
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if p.guard != nil {
				defer p.guard("probe " + k.HostPort)
			}
			p.probeUntilReady(ctx, k, rev)
		}()
	}
}

// probeUntilReady probes one allocation until it answers ready, the window
// passes or ctx ends.
func (p *prober) probeUntilReady(ctx context.Context, k probeKey, rev string) {
	start := time.Now()
	deadline := start.Add(p.window)
	url := "http://" + k.HostPort + "/"
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		hold := min(probeHold, time.Until(deadline))
		began := time.Now()
		res, it := p.probeOnce(ctx, url, hold)
		p.metrics.probes.WithLabelValues(rev, res).Inc()
		if res == "ready" {
			now := time.Now()
			p.metrics.probeReady.Observe(now.Sub(start).Seconds())
			p.mu.Lock()
			delete(p.running, k)
			p.results[k] = true
			p.mu.Unlock()
			p.log.Debug("probe ready", "revision", rev, "instance", k.HostPort, "alloc", k.Alloc, "after", now.Sub(start))
			if p.onReady != nil {
				p.onReady(rev, k, now, it)
			}
			return
		}
		if time.Now().After(deadline) {
			p.mu.Lock()
			delete(p.running, k)
			p.gaveUp[k] = true
			p.mu.Unlock()
			p.log.Info("allocation not ready within the probe window; waiting for its Consul check", "revision", rev, "instance", k.HostPort, "window", p.window)
			return
		}
		t.Reset(nextProbe(res, time.Since(began), hold, p.interval))
	}
}

// refusedRetry is the wait after a probe of a new allocation that got no
// answer at once: its sidecar does not listen yet. A refused connection
// costs the node a reset; waiting a whole probe interval for the next one
// put up to 25 ms into every cold start whose sidecar starts after its app
// (a docker app's poststart sidecar), since nothing tells the gateway when
// the sidecar starts listening.
const refusedRetry = 5 * time.Millisecond

// nextProbe is the wait before the next probe of a new allocation after
// one that was not ready (res) and took took: none after a probe the
// sidecar held for its whole hold (it was waiting with us, and the app
// may be ready any moment: a gap would be a gap in our attention),
// refusedRetry after one that failed (no sidecar listening yet), the
// probe interval after a quick "not ready" (a sidecar that does not hold
// probes).
func nextProbe(res string, took, hold, interval time.Duration) time.Duration {
	switch {
	case hold > 0 && took >= hold:
		return 0
	case res == "error":
		return min(interval, refusedRetry)
	}
	return interval
}

// probeHold is how long one probe asks the sidecar to hold it while the
// app is not ready (spec.ProbeWaitHeader). The sidecar answers the moment
// its app passes, so the first request follows readiness by one round trip
// rather than by up to a probe interval; the hold only bounds how long one
// connection waits before the next probe.
const probeHold = 2 * time.Second

// probeOnce sends K-Network-Probe: queue, asking the sidecar to hold it up
// to hold; the sidecar answers 200 "queue" when its app is ready and it is
// not draining, with the instance's times for the wake's timeline.
func (p *prober) probeOnce(ctx context.Context, url string, hold time.Duration) (string, spec.InstanceTimes) {
	hold = max(hold, 0)
	ctx, cancel := context.WithTimeout(ctx, hold+max(4*p.interval, 250*time.Millisecond))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "error", spec.InstanceTimes{}
	}
	req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
	if hold > 0 {
		req.Header.Set(spec.ProbeWaitHeader, hold.String())
	}
	// Requests use the gateway's own connection pool (forward.go), so a
	// probe's connection would only sit idle in the transport's.
	req.Close = true
	resp, err := p.rt.RoundTrip(req)
	if err != nil {
		return "error", spec.InstanceTimes{}
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64))
	resp.Body.Close()
	if resp.StatusCode == http.StatusOK && bytes.Equal(bytes.TrimSpace(body), []byte(spec.ProbeHeaderValue)) {
		return "ready", spec.ParseInstanceTimes(resp.Header.Get(spec.InstanceTimesHeader))
	}
	return "not_ready", spec.InstanceTimes{}
}
