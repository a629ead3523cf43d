package activator

import (
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
)

// buildState is what the last build left for the next update: enough to
// change the table for the revisions and services that changed, without
// reading the rest of the catalog. Guarded by buildMu.
//
// A whole rebuild reads every revision and service (412-540 ms at 10,000
// revisions on the third scale run, each replica, paced to a tenth of a
// core: issue 45), for a change that is nearly always one service's
// deploy or one revision's instances. update costs what changed, plus a
// copy of the table's maps (pointers only; about a millisecond at 10,000).
type buildState struct {
	// version is the catalog's Version the table reflects.
	version uint64
	// probes are each revision's part of prober.sync's arguments (only
	// revisions with allocations or probes wanted).
	probes map[string]revProbes
	// withInstances are the revisions whose pool has backends.
	withInstances map[string]*revision
	// services are, by service name, what its routes claimed.
	services map[string]serviceState
	// owners are the service (name) whose route holds each host;
	// contested are the hosts more than one route wanted at the last
	// whole rebuild: which one wins depends on every claimant, so a
	// change that touches one is built whole.
	owners    map[string]string
	contested map[string]bool
	// internal counts the internal services. While there is none the
	// public ports' map is the internal listener's (table.public).
	internal int
	// dirty are revisions refreshed alone (refreshRevision) whose place
	// in the table's lists the next update settles.
	dirty map[string]bool
}

// revProbes are one revision's probes wanted and allocations known.
type revProbes struct {
	want, known []probeKey
}

// serviceState is what one service's routes claimed.
type serviceState struct {
	key      string // namespace/name: its split counter's
	internal bool
	hosts    []string
}

func newBuildState(version uint64) *buildState {
	return &buildState{
		version:       version,
		probes:        map[string]revProbes{},
		withInstances: map[string]*revision{},
		services:      map[string]serviceState{},
		owners:        map[string]string{},
		contested:     map[string]bool{},
	}
}

// noteRevision records a revision's probes and whether it has instances.
func (st *buildState) noteRevision(r *revision, allocs []catalog.Allocation, eps []endpoint) {
	var p revProbes
	for _, a := range allocs {
		p.known = append(p.known, probeKey{HostPort: hostPort(a.Address, a.Port), Alloc: a.ID})
	}
	for _, e := range eps {
		if e.NeedsProbe {
			p.want = append(p.want, probeKey{e.HostPort, e.Alloc, e.Gen})
		}
	}
	if len(p.want) > 0 || len(p.known) > 0 {
		st.probes[r.name] = p
	} else {
		delete(st.probes, r.name)
	}
	if len(r.pool.Load().backends) > 0 {
		st.withInstances[r.name] = r
	} else {
		delete(st.withInstances, r.name)
	}
}

func (st *buildState) forgetRevision(r *revision) {
	delete(st.probes, r.name)
	delete(st.withInstances, r.name)
	delete(st.dirty, r.name)
}

func (st *buildState) markDirty(name string) {
	if st.dirty == nil {
		st.dirty = map[string]bool{}
	}
	st.dirty[name] = true
}

// probeSets are prober.sync's arguments: every probe wanted (to its
// revision) and every allocation known.
func (st *buildState) probeSets() (map[probeKey]string, map[probeKey]bool) {
	want, known := map[probeKey]string{}, map[probeKey]bool{}
	for name, p := range st.probes {
		for _, k := range p.want {
			want[k] = name
		}
		for _, k := range p.known {
			known[k] = true
		}
	}
	return want, known
}

// withInstanceList is table.withInstances, by name.
func (st *buildState) withInstanceList() []*revision {
	out := slices.Collect(maps.Values(st.withInstances))
	slices.SortFunc(out, func(a, b *revision) int { return strings.Compare(a.name, b.name) })
	return out
}

// update brings the table up to date with the catalog's changes since the
// last build: the revisions that changed (job, allocations, instances,
// probes) and the services whose record changed or whose revisions came
// or went. It builds the whole table instead when it cannot tell what
// changed (the first build, a change log overrun) or when the answer
// depends on more than the change (an internal service, whose names move
// between the listeners' maps; a host that two routes want).
func (g *Gateway) update() {
	g.buildMu.Lock()
	defer g.buildMu.Unlock()
	st := g.state
	if st == nil {
		g.rebuildLocked()
		return
	}
	revNames, svcNames, version, complete := g.cat.ChangedSince(st.version)
	if !complete {
		g.rebuildLocked()
		return
	}
	if len(revNames) == 0 && len(svcNames) == 0 && len(st.dirty) == 0 {
		return
	}
	start := time.Now()
	old := g.table.Load()
	t := &table{
		hosts:        maps.Clone(old.hosts),
		revisions:    maps.Clone(old.revisions),
		internalRevs: maps.Clone(old.internalRevs),
	}
	if st.internal > 0 {
		t.public = maps.Clone(old.public)
	}
	probed := g.prober.successes()
	dirtySvcs := map[string]bool{}
	for _, name := range svcNames {
		dirtySvcs[name] = true
	}
	for name := range st.dirty {
		revNames = append(revNames, name)
	}
	st.dirty = nil
	for _, name := range revNames {
		r := g.revs[name]
		cr, ok := g.cat.Revision(name)
		if !ok {
			if r != nil {
				delete(t.revisions, name)
				delete(t.internalRevs, name)
				g.dropRevision(st, r)
				dirtySvcs[r.service] = true // its routes name it no more
			}
			continue
		}
		if r == nil {
			dirtySvcs[cr.Service] = true // its routes can name it now
		}
		g.syncRevision(t, st, cr, probed, st.services[cr.Service].internal)
	}
	for name := range dirtySvcs {
		if !g.updateService(t, st, name) {
			g.rebuildLocked()
			return
		}
	}
	if t.public == nil {
		t.public = t.hosts
	}
	st.version = version
	t.withInstances = st.withInstanceList()
	g.table.Store(t)
	g.prober.sync(st.probeSets())
	g.metrics.rebuilds.Inc()
	g.metrics.rebuildTime.Observe(time.Since(start).Seconds())
}

// updateService replaces one service's routes in t. It returns false, having
// changed nothing of the hosts, when the whole table must be built instead:
// the service is or was internal, or a host it had or wants is another
// route's too.
func (g *Gateway) updateService(t *table, st *buildState, name string) bool {
	old, had := st.services[name]
	s, ok := g.cat.Service(name)
	if (had && old.internal) || (ok && s.Internal) {
		return false
	}
	for _, h := range old.hosts {
		if st.contested[h] {
			return false
		}
	}
	var key string
	var routes []hostRoute
	var c *atomic.Uint64
	if ok {
		key = orDefaultNamespace(s.Namespace) + "/" + s.Name
		c = g.counters[key]
		if c == nil {
			c = &atomic.Uint64{}
		}
		routes = serviceRoutes(s, t.revisions, c, g.domain)
		seen := make(map[string]bool, len(routes))
		for _, hr := range routes {
			if owner, taken := st.owners[hr.host]; (taken && owner != name) || seen[hr.host] {
				return false
			}
			seen[hr.host] = true
		}
	}
	for _, h := range old.hosts {
		if st.owners[h] == name {
			delete(t.hosts, h)
			if st.internal > 0 {
				delete(t.public, h)
			}
			delete(st.owners, h)
		}
	}
	if had && old.key != key {
		delete(g.counters, old.key)
	}
	if !ok {
		delete(st.services, name)
		return true
	}
	g.counters[key] = c
	ss := serviceState{key: key, hosts: make([]string, 0, len(routes))}
	for _, hr := range routes {
		t.hosts[hr.host] = hr.route
		if st.internal > 0 {
			t.public[hr.host] = hr.route
		}
		st.owners[hr.host] = name
		ss.hosts = append(ss.hosts, hr.host)
	}
	st.services[name] = ss
	return true
}
