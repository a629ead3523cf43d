package activator

import (
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// A deterministic, virtual-time comparison of the load-balancing policies,
// free of the noise of a shared 2-core machine (the real-process comparison
// is in `make bench-gateway`). Instances are processor-sharing servers (a
// CPU-bound app: k requests in flight each progress at 1/k of the speed);
// clients are closed loops; the gateway is the real pool.acquire plus a FIFO
// queue, as in revision.wait.

type simInstance struct {
	b     *backend
	speed float64 // work per millisecond
	jobs  []simJob
}

type simJob struct {
	client int
	start  float64 // ms
	left   float64 // work
}

type simResult struct {
	p50, p99, p999, mean float64 // ms
}

// simulate runs every rotation of speeds (the slow instance at each place
// in the gateway's order: first-available depends on it) and merges the
// latencies.
func simulate(policy Policy, limit int, speeds []float64, clients, n int) simResult {
	var lat []float64
	for rot := range speeds {
		sp := append(slices.Clone(speeds[rot:]), speeds[:rot]...)
		lat = append(lat, simulateOrder(policy, limit, sp, clients, n/len(speeds))...)
	}
	slices.Sort(lat)
	sum := 0.0
	for _, l := range lat {
		sum += l
	}
	q := func(f float64) float64 { return lat[int(f*float64(len(lat)-1))] }
	return simResult{p50: q(.5), p99: q(.99), p999: q(.999), mean: sum / float64(len(lat))}
}

// simulateOrder runs clients closed-loop requests of one unit of work over
// instances of the given speeds, in that order, until n responses were
// recorded after a warm-up of n/10, and returns their latencies (ms).
func simulateOrder(policy Policy, limit int, speeds []float64, clients, n int) []float64 {
	p := &pool{limit: int32(limit), policy: policy.resolve(limit), rr: &atomic.Uint32{}}
	insts := make([]*simInstance, len(speeds))
	byBackend := map[*backend]*simInstance{}
	for i, s := range speeds {
		b := &backend{hostPort: fmt.Sprintf("i%d", i)}
		p.backends = append(p.backends, b)
		insts[i] = &simInstance{b: b, speed: s}
		byBackend[b] = insts[i]
	}
	var queue []simJob
	now := 0.0
	send := func(client int, start float64) {
		if b := p.acquire(); b != nil {
			in := byBackend[b]
			in.jobs = append(in.jobs, simJob{client: client, start: start, left: 1})
			return
		}
		queue = append(queue, simJob{client: client, start: start, left: 1})
	}
	for c := range clients {
		send(c, 0)
	}
	var lat []float64
	warm := n / 10
	done := 0
	for len(lat) < n {
		// Next completion under processor sharing.
		dt := -1.0
		for _, in := range insts {
			k := float64(len(in.jobs))
			for _, j := range in.jobs {
				if t := j.left * k / in.speed; dt < 0 || t < dt {
					dt = t
				}
			}
		}
		now += dt
		var finished []simJob
		for _, in := range insts {
			k := float64(len(in.jobs))
			kept := in.jobs[:0]
			for _, j := range in.jobs {
				j.left -= dt * in.speed / k
				if j.left <= 1e-9 {
					finished = append(finished, j)
					in.b.inflight.Add(-1)
				} else {
					kept = append(kept, j)
				}
			}
			in.jobs = kept
		}
		// Freed slots go to the queue first, in arrival order.
		for len(queue) > 0 {
			b := p.acquire()
			if b == nil {
				break
			}
			j := queue[0]
			queue = queue[1:]
			in := byBackend[b]
			in.jobs = append(in.jobs, j)
		}
		for _, j := range finished {
			done++
			if done > warm {
				lat = append(lat, now-j.start)
			}
			send(j.client, now)
		}
	}
	return lat
}

func TestPolicyTailLatencySimulation(t *testing.T) {
	// Three instances take 1 ms of CPU per request, one (a noisy
	// neighbour) 5 ms.
	speeds := []float64{1, 1, 1, 0.2}
	n := 24000
	if testing.Short() {
		n = 10000
	}
	type level struct{ limit, clients int }
	levels := []level{{1, 8}, {3, 8}, {10, 24}, {0, 24}}
	policies := []Policy{PolicyFirstAvailable, PolicyRoundRobin, PolicyPowerOfTwo, PolicyLeastLoaded}
	knative := func(limit int) Policy {
		switch {
		case limit == 0:
			return PolicyPowerOfTwo
		case limit <= 3:
			return PolicyFirstAvailable
		}
		return PolicyRoundRobin
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%-12s %-8s %-16s %9s %9s %9s %9s\n", "concurrency", "clients", "policy", "mean", "p50", "p99", "p99.9")
	for _, lv := range levels {
		res := map[Policy]simResult{}
		for _, pol := range policies {
			r := simulate(pol, lv.limit, speeds, lv.clients, n)
			res[pol] = r
			fmt.Fprintf(&b, "%-12d %-8d %-16s %8.2fms %8.2fms %8.2fms %8.2fms\n", lv.limit, lv.clients, pol, r.mean, r.p50, r.p99, r.p999)
		}
		ours, theirs := res[PolicyAuto.resolve(lv.limit)], res[knative(lv.limit)]
		// "At least as well as Knative": our choice's tail within 5 % of
		// Knative's choice, or better.
		if ours.p99 > theirs.p99*1.05 || ours.mean > theirs.mean*1.05 {
			t.Errorf("concurrency %d: auto (%s) p99 %.2fms mean %.2fms, Knative's %s p99 %.2fms mean %.2fms",
				lv.limit, PolicyAuto.resolve(lv.limit), ours.p99, ours.mean, knative(lv.limit), theirs.p99, theirs.mean)
		}
	}
	t.Logf("simulated tail latency, 4 instances (3 x 1ms, 1 x 5ms of CPU per request, processor sharing):\n%s", b.String())
}
