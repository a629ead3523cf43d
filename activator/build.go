package activator

import (
	"hash/fnv"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// rebuild reads the catalog and the probe results and installs a new
// routing table. Revisions, their backends and the services' split counters
// carry over from the previous build. One rebuild runs at a time.
func (g *Gateway) rebuild() {
	g.buildMu.Lock()
	defer g.buildMu.Unlock()
	g.metrics.rebuilds.Inc()
	start := time.Now()
	defer func() { g.metrics.rebuildTime.Observe(time.Since(start).Seconds()) }()

	probed := g.prober.successes()
	revs := g.cat.Revisions()
	services := g.cat.Services()
	t := &table{
		hosts:     map[string]*route{},
		revisions: make(map[string]*revision, len(revs)),
	}
	// internal are the internal services, by namespace/name. Without any,
	// the public ports' names are all names (one map, below).
	var internal map[string]bool
	for _, s := range services {
		if s.Internal {
			if internal == nil {
				internal = map[string]bool{}
				t.public = map[string]*route{}
			}
			internal[orDefaultNamespace(s.Namespace)+"/"+s.Name] = true
		}
	}
	want := map[probeKey]string{}
	known := map[probeKey]bool{}

	for _, cr := range revs {
		r := g.revs[cr.Name]
		if r == nil {
			ns := cr.Namespace
			if ns == "" {
				ns = spec.DefaultNamespace
			}
			r = newRevision(cr.Name, cr.Service, ns, func() *revisionMetrics { return g.metrics.forRevision(cr.Service, cr.Name) })
			r.wake = g.maybeWake
			r.onActive = g.markActive
			r.wakes = g.wakes
			g.revs[cr.Name] = r
		}
		timeout := cr.Timeout
		if timeout <= 0 {
			timeout = spec.DefaultTimeout
		}
		cfg := revisionConfig{timeout: timeout, concurrency: max(cr.Concurrency, 0), burstCapacity: cr.Scaling.BurstCapacity}
		if *r.cfg.Load() != cfg {
			r.cfg.Store(&cfg)
		}
		allocs, eps := g.updateInstances(r, probed, cfg.concurrency)
		for _, a := range allocs {
			known[probeKey{HostPort: hostPort(a.Address, a.Port), Alloc: a.ID}] = true
		}
		if len(r.pool.Load().backends) > 0 {
			t.withInstances = append(t.withInstances, r)
		}
		for _, e := range eps {
			if e.NeedsProbe {
				want[probeKey{e.HostPort, e.Alloc, e.Gen}] = cr.Name
			}
		}
		t.revisions[cr.Name] = r
		if internal[r.namespace+"/"+r.service] {
			if t.internalRevs == nil {
				t.internalRevs = map[string]bool{}
			}
			t.internalRevs[cr.Name] = true
		}
	}
	for name, r := range g.revs {
		if _, ok := t.revisions[name]; !ok {
			delete(g.revs, name)
			g.forgetActive(r)
			r.close(errRevisionGone)
			for _, b := range r.backends {
				b.closeIdle(time.Time{}, true)
			}
			g.metrics.forget(r.service, r.name)
		}
	}

	counters := map[string]*atomic.Uint64{}
	for _, s := range services {
		ns := orDefaultNamespace(s.Namespace)
		key := ns + "/" + s.Name
		c := g.counters[key]
		if c == nil {
			c = &atomic.Uint64{}
		}
		counters[key] = c
		main := &route{service: s.Name, namespace: ns, counter: c, redirect: s.HTTPSRedirect, internal: s.Internal}
		total := 0
		for _, sp := range s.Route.Splits {
			if sp.Percent > 0 {
				total += sp.Percent
			}
		}
		slot := 0
		for _, sp := range s.Route.Splits {
			if sp.Percent <= 0 || total == 0 {
				continue
			}
			idx := uint8(len(main.targets))
			main.targets = append(main.targets, target{name: sp.Revision, rev: t.revisions[sp.Revision]})
			// Scale to 100 so a route whose splits do not add to 100 (it
			// should not happen) still sends every request somewhere.
			n := sp.Percent * 100 / total
			for i := 0; i < n && slot < 100; i++ {
				main.slots[slot] = idx
				slot++
			}
		}
		for ; slot < 100 && len(main.targets) > 0; slot++ {
			main.slots[slot] = uint8(len(main.targets) - 1)
		}
		g.addHost(t, serviceHost(s.Name, ns, g.domain), main)
		for _, d := range s.Domains {
			g.addHost(t, canonicalHost(d), main)
		}
		tags := make([]string, 0, len(s.Route.Tags))
		for tag := range s.Route.Tags {
			tags = append(tags, tag)
		}
		slices.Sort(tags)
		for _, tag := range tags {
			rev := s.Route.Tags[tag]
			tr := &route{service: s.Name, namespace: ns, tag: tag, counter: c, redirect: s.HTTPSRedirect, internal: s.Internal,
				targets: []target{{name: rev, rev: t.revisions[rev]}}}
			g.addHost(t, tagHost(tag, s.Name, ns, g.domain), tr)
		}
	}
	if t.public == nil {
		t.public = t.hosts
	}
	g.counters = counters
	g.table.Store(t)
	g.prober.sync(want, known)
}

// refreshRevision brings one revision's instances up to date with the
// catalog and the probes, without building a new table: the pool it
// installs is what requests of that revision read, so a wake's held
// requests go to an instance whose probe just passed at the cost of one
// revision, not of the whole catalog. The table's lists (revisions with
// instances) and the probes wanted follow at the next whole rebuild,
// which the caller asks for.
func (g *Gateway) refreshRevision(name string) {
	g.buildMu.Lock()
	defer g.buildMu.Unlock()
	r := g.revs[name]
	if t := g.table.Load(); r == nil || t == nil || t.revisions[name] != r {
		return // not in the table yet, or gone: the whole rebuild decides
	}
	g.updateInstances(r, g.prober.successes(), r.cfg.Load().concurrency)
}

// updateInstances reads a revision's allocations and passing instances from
// the catalog, folds them with the probes' successes into its endpoints and
// installs the routable ones as its pool: the one step a whole rebuild takes
// per revision and refreshRevision takes alone. Call it under buildMu.
func (g *Gateway) updateInstances(r *revision, probed map[probeKey]bool, concurrency int) ([]catalog.Allocation, []endpoint) {
	allocs := g.cat.Allocations(r.name)
	ready := g.cat.Ready(r.name)
	eps := r.tracker.update(allocs, ready, probed)
	if g.wakes.active.Load() > 0 {
		g.wakes.consulPassing(r.name, passingAllocs(allocs, ready))
	}
	g.installPool(r, eps, concurrency)
	return allocs, eps
}

// passingAllocs are the allocations Consul lists passing (the two meet on
// address:port, as in endpointTracker).
func passingAllocs(allocs []catalog.Allocation, ready []consulroute.Instance) []string {
	if len(ready) == 0 {
		return nil
	}
	listed := make(map[string]bool, len(ready))
	for _, in := range ready {
		listed[hostPort(in.Address, in.Port)] = true
	}
	var ids []string
	for _, a := range allocs {
		if listed[hostPort(a.Address, a.Port)] {
			ids = append(ids, a.ID)
		}
	}
	return ids
}

// orDefaultNamespace is ns, or spec.DefaultNamespace when empty.
func orDefaultNamespace(ns string) string {
	if ns == "" {
		return spec.DefaultNamespace
	}
	return ns
}

// addHost adds a host to the internal listener's names, and to the public
// ports' when rt is a public service's (while t.public is nil there is no
// internal service, and rebuild makes the two one map): see claimHost.
func (g *Gateway) addHost(t *table, host string, rt *route) {
	host = strings.ToLower(host)
	g.claimHost(t.hosts, host, rt)
	if t.public != nil && !rt.internal {
		g.claimHost(t.public, host, rt)
	}
}

// claimHost adds a host to hosts unless another route has it: a service's
// own host wins over a tag host that spells the same name (tag "a" of
// service "b" against service "a-b"), and the first service (by name) wins
// between services. On the public ports an internal service claims
// nothing, so a public service's name there never loses to it.
func (g *Gateway) claimHost(hosts map[string]*route, host string, rt *route) {
	if old, ok := hosts[host]; ok {
		kept, other := old, rt
		if old.tag != "" && rt.tag == "" {
			kept, other = rt, old
		}
		hosts[host] = kept
		// Said once per host, not at every rebuild.
		if !g.conflicts[host] {
			g.conflicts[host] = true
			g.log.Warn("two routes claim one host; keeping one", "host", host,
				"kept", describeRoute(kept), "ignored", describeRoute(other))
		}
		return
	}
	hosts[host] = rt
}

func describeRoute(rt *route) string {
	if rt.tag != "" {
		return "tag " + rt.tag + " of " + rt.service
	}
	return "service " + rt.service
}

// installPool gives the revision a new pool when its routable set changed.
// Backends keep their identity (and in-flight count) for as long as the
// tracker knows their address.
func (g *Gateway) installPool(r *revision, eps []endpoint, concurrency int) {
	seen := make(map[string]bool, len(eps))
	routable := make([]*backend, 0, len(eps))
	for _, e := range eps {
		seen[e.HostPort] = true
		b := r.backends[e.HostPort]
		if b == nil || b.alloc != e.Alloc {
			if b != nil {
				b.closeIdle(time.Time{}, true)
			}
			b = &backend{hostPort: e.HostPort, alloc: e.Alloc}
			r.backends[e.HostPort] = b
		}
		if e.Routable {
			routable = append(routable, b)
		}
	}
	for hp, b := range r.backends {
		if !seen[hp] {
			b.closeIdle(time.Time{}, true)
			delete(r.backends, hp)
		}
	}
	// Each replica walks instances in its own order, so first-available
	// on several replicas does not pile onto one instance.
	slices.SortFunc(routable, func(a, b *backend) int {
		ha, hb := g.order(a.hostPort), g.order(b.hostPort)
		switch {
		case ha < hb:
			return -1
		case ha > hb:
			return 1
		}
		return strings.Compare(a.hostPort, b.hostPort)
	})
	old := r.pool.Load()
	policy := g.policy.resolve(concurrency)
	if old.limit == int32(concurrency) && old.policy == policy && slices.Equal(old.backends, routable) {
		return
	}
	r.setPool(&pool{backends: routable, limit: int32(concurrency), policy: policy, rr: &r.rr})
}

// order is this replica's rank of an instance address.
func (g *Gateway) order(hp string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(g.replica))
	h.Write([]byte{0})
	h.Write([]byte(hp))
	return h.Sum64()
}
