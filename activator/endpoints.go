package activator

import (
	"net"
	"slices"
	"strconv"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// endpointTracker decides which of a revision's instances may receive
// requests, merging the two sources that describe them:
//
//   - Nomad (allocations: Running or Starting, address and port) knows
//     first that an instance starts and that it stops;
//   - Consul (passing instances) knows that it is healthy, but only at its
//     check interval.
//
// The rule: an instance is routable when Consul lists it passing, or when
// the activator's own probe of its Running or Starting allocation (placed,
// ports assigned, its client has not reported it running yet) succeeded.
// It stops being routable at once when Nomad reports the allocation told to
// stop or gone (or
// forgets it: Nomad knows before Consul's deregistration lands), or when
// Consul drops it after having listed it (a failing check is not overridden
// by an older probe). A running allocation that Consul dropped is probed
// again, with a probe of its own (a new generation of its probe key): when
// Consul lost it without its check failing (its node's Consul agent
// restarted: the agent leaves the cluster, which deregisters every
// instance on the node, and comes back with its checks critical until
// they run) the probe finds it ready within a round trip, where waiting
// for Consul held every request of every revision on the node for
// seconds (the soak, issue 45); when its check did fail, the probe fails
// too (it is the same question, asked of the same sidecar). The two
// sources meet on address:port.
//
// It is pure state: the caller feeds it snapshots and probe results and uses
// what update returns. It is not safe for concurrent use (one table builder
// owns it).
type endpointTracker struct {
	mem map[string]*endpointMemory // by host:port
}

// endpointMemory is what the tracker remembers of one address between
// updates.
type endpointMemory struct {
	alloc   string // allocation last seen at this address ("" = only Consul knows it)
	listed  bool   // Consul lists it now
	probed  bool   // our probe of the current allocation succeeded
	stopped bool   // Nomad said the allocation is not running, or forgot it
	// drops counts Consul's drops of this allocation: the generation of
	// its probe key, so only a probe sent after the last drop counts.
	drops int
}

// endpoint is one address of a revision after an update.
type endpoint struct {
	HostPort  string
	Alloc     string // "" when only Consul knows it
	AdminPort int
	Routable  bool
	// NeedsProbe is true for a Running or Starting allocation that is not
	// routable yet: the activator probes it directly, with the key's
	// generation Gen (how often Consul dropped it).
	NeedsProbe bool
	Gen        int
}

func newEndpointTracker() *endpointTracker {
	return &endpointTracker{mem: map[string]*endpointMemory{}}
}

// probeKey identifies a probe result: an address and the allocation probed
// there, so a result never applies to a later allocation at the same port,
// and the generation (endpointMemory.drops), so a result from before Consul
// dropped the allocation never applies after.
type probeKey struct {
	HostPort string
	Alloc    string
	Gen      int
}

// live reports whether Nomad runs the allocation or is starting it.
func live(a catalog.Allocation) bool { return a.Running || a.Starting }

// hostPort is the dial address of addr and port (an IPv6 address in
// brackets).
func hostPort(addr string, port int) string {
	return net.JoinHostPort(addr, strconv.Itoa(port))
}

// update applies the current allocations and passing instances of one
// revision, and the probe successes so far, and returns every address either
// source mentions, sorted by address.
func (t *endpointTracker) update(allocs []catalog.Allocation, ready []consulroute.Instance, probed map[probeKey]bool) []endpoint {
	byHP := make(map[string]catalog.Allocation, len(allocs))
	for _, a := range allocs {
		hp := hostPort(a.Address, a.Port)
		// Two allocations on one address (an old one stopping, a new one
		// starting): the running one describes the address.
		if old, ok := byHP[hp]; ok && live(old) && !live(a) {
			continue
		}
		byHP[hp] = a
	}
	readyBy := make(map[string]consulroute.Instance, len(ready))
	for _, in := range ready {
		readyBy[hostPort(in.Address, in.Port)] = in
	}

	keys := make([]string, 0, len(byHP)+len(readyBy)+len(t.mem))
	for hp := range byHP {
		keys = append(keys, hp)
	}
	for hp := range readyBy {
		keys = append(keys, hp)
	}
	for hp := range t.mem {
		keys = append(keys, hp)
	}
	slices.Sort(keys)
	keys = slices.Compact(keys)

	out := make([]endpoint, 0, len(keys))
	for _, hp := range keys {
		a, hasAlloc := byHP[hp]
		in, inReady := readyBy[hp]
		m := t.mem[hp]
		if !hasAlloc && !inReady {
			// Neither source mentions it any more: forget it, so a later
			// allocation on the same port starts with a clean record.
			delete(t.mem, hp)
			continue
		}
		if m == nil {
			m = &endpointMemory{}
			t.mem[hp] = m
		}
		if hasAlloc {
			// A different allocation at this address, or the same one
			// running again after Nomad stopped it: start over, it must be
			// probed or listed anew.
			if (m.alloc != "" && m.alloc != a.ID) || (live(a) && m.stopped) {
				*m = endpointMemory{}
			}
			m.alloc = a.ID
			if !live(a) {
				m.stopped = true
			}
		} else if m.alloc != "" {
			// Nomad forgot an allocation it told us about: it is gone,
			// whatever Consul still says.
			m.stopped = true
		}
		switch {
		case inReady:
			m.listed = true
		case m.listed:
			m.listed, m.probed = false, false
			m.drops++
		}
		if !m.stopped && m.alloc != "" && probed[probeKey{hp, m.alloc, m.drops}] {
			m.probed = true
		}
		// A starting allocation (placed, not yet reported running) is
		// probed like a running one: its sidecar answers as soon as its
		// app is ready, and Nomad hears that it runs only at its client's
		// next batched update.
		running := hasAlloc && live(a) && a.Port != 0
		e := endpoint{
			HostPort:   hp,
			Alloc:      m.alloc,
			Routable:   !m.stopped && (inReady || (m.probed && running)),
			NeedsProbe: running && !m.stopped && !inReady && !m.probed,
			Gen:        m.drops,
		}
		switch {
		case inReady && in.AdminPort != 0:
			e.AdminPort = in.AdminPort
		case hasAlloc:
			e.AdminPort = a.AdminPort
		}
		out = append(out, e)
	}
	return out
}
