package activator

import (
	"fmt"
	"math/rand/v2"
	"sync/atomic"
)

// Policy is how the gateway picks one of a revision's routable instances.
type Policy string

const (
	// PolicyAuto picks by the revision's concurrency limit: least-loaded
	// with a limit, power-of-two-choices without. Knative's activator
	// uses first-available up to 3 and round-robin above; least-loaded is
	// as good at 1 and better above (first-available packs requests onto
	// the first instances, round-robin keeps feeding a slow instance its
	// share until it is full), in the simulation of
	// TestPolicyTailLatencySimulation and in make bench-gateway.
	PolicyAuto Policy = ""
	// PolicyFirstAvailable takes the first instance (in this replica's
	// order) with a free slot: instances fill one after the other, which
	// suits tiny limits where any free slot is as good as another.
	PolicyFirstAvailable Policy = "first-available"
	// PolicyRoundRobin starts each search one instance further than the
	// last and takes the first with a free slot.
	PolicyRoundRobin Policy = "round-robin"
	// PolicyPowerOfTwo samples two instances and takes the less loaded
	// with a free slot (any free one when both are full).
	PolicyPowerOfTwo Policy = "p2c"
	// PolicyLeastLoaded takes the instance with the fewest requests in
	// flight among those with a free slot.
	PolicyLeastLoaded Policy = "least-loaded"
)

// ParsePolicy checks a policy name ("auto" or "" for PolicyAuto).
func ParsePolicy(s string) (Policy, error) {
	switch p := Policy(s); p {
	case PolicyAuto, PolicyFirstAvailable, PolicyRoundRobin, PolicyPowerOfTwo, PolicyLeastLoaded:
		return p, nil
	case "auto":
		return PolicyAuto, nil
	}
	return "", fmt.Errorf("load-balancing policy %q: want auto, first-available, round-robin, p2c or least-loaded", s)
}

// resolve turns PolicyAuto into the policy for a concurrency limit.
func (p Policy) resolve(limit int) Policy {
	if p != PolicyAuto {
		return p
	}
	if limit == 0 {
		return PolicyPowerOfTwo
	}
	return PolicyLeastLoaded
}

// backend is one instance address of a revision. It lives as long as the
// address is known (across routing-table rebuilds), so its in-flight count
// stays exact while the table changes around it.
type backend struct {
	hostPort string
	alloc    string
	// inflight is the number of requests this replica has sent and not yet
	// finished; reservations use CAS so the limit is never exceeded.
	inflight atomic.Int32
	// ejected marks an instance out of balancing until its probe passes
	// (ejection.go); false is the common case and costs one load.
	ejected atomic.Bool
	// pad keeps two backends' hot counters off one cache line.
	_ [40]byte
	// pool holds kept-alive connections to the instance (forward.go).
	pool connPool
}

// tryReserve takes a slot if fewer than limit (0 = unlimited) are in use.
func (b *backend) tryReserve(limit int32) bool {
	if limit == 0 {
		b.inflight.Add(1)
		return true
	}
	for {
		n := b.inflight.Load()
		if n >= limit {
			return false
		}
		if b.inflight.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// usable reports whether b is in balancing (not ejected).
func (b *backend) usable() bool { return !b.ejected.Load() }

// pool is an immutable set of routable backends with the policy that picks
// among them. A new pool is built when the set changes; the backends (and
// their counters) carry over.
type pool struct {
	backends []*backend
	limit    int32 // per-backend concurrency, 0 = unlimited
	policy   Policy
	rr       *atomic.Uint32 // the revision's round-robin cursor
}

// acquire reserves a slot on some backend, or returns nil when every
// backend is full (or there is none). It takes no lock: the hot path of
// every request (see Knative's pkg/activator/net/lb_policy.go).
func (p *pool) acquire() *backend {
	n := len(p.backends)
	if n == 0 {
		return nil
	}
	switch p.policy {
	case PolicyFirstAvailable:
		for _, b := range p.backends {
			if b.usable() && b.tryReserve(p.limit) {
				return b
			}
		}
		return nil
	case PolicyRoundRobin:
		start := int(p.rr.Add(1) % uint32(n))
		for k := range n {
			b := p.backends[(start+k)%n]
			if b.usable() && b.tryReserve(p.limit) {
				return b
			}
		}
		return nil
	case PolicyPowerOfTwo:
		if n > 1 {
			i := rand.IntN(n)
			j := rand.IntN(n - 1)
			if j >= i {
				j++
			}
			a, b := p.backends[i], p.backends[j]
			if b.inflight.Load() < a.inflight.Load() {
				a, b = b, a
			}
			if a.usable() && a.tryReserve(p.limit) {
				return a
			}
			if b.usable() && b.tryReserve(p.limit) {
				return b
			}
		}
		return p.leastLoaded()
	default: // PolicyLeastLoaded
		return p.leastLoaded()
	}
}

// leastLoaded scans every backend; a lost CAS race rescans, at most n times.
func (p *pool) leastLoaded() *backend {
	for range len(p.backends) {
		var best *backend
		bestN := int32(-1)
		for _, b := range p.backends {
			c := b.inflight.Load()
			if (p.limit != 0 && c >= p.limit) || !b.usable() {
				continue
			}
			if best == nil || c < bestN {
				best, bestN = b, c
			}
		}
		if best == nil {
			return nil
		}
		if best.tryReserve(p.limit) {
			return best
		}
	}
	return nil
}

// free reports whether some backend has a free slot now.
func (p *pool) free() bool {
	for _, b := range p.backends {
		if (p.limit == 0 || b.inflight.Load() < p.limit) && b.usable() {
			return true
		}
	}
	return false
}
