package activator

import (
	"strings"
	"sync/atomic"
)

// table is an immutable routing table: host -> route, and revision name ->
// revision for requests that carry X-Serverless-Revision. A new one replaces
// the old through an atomic pointer whenever the catalog or an instance's
// state changes, so requests read it without a lock.
//
// Internal services (visibility = "internal", Knative's cluster-local) are
// routed on the internal listener only: hosts holds every name (what the
// internal listener routes), public the names of public services alone
// (what the public HTTP and HTTPS ports route; the very map hosts is while
// no service is internal), and internalRevs the
// revisions of internal services, which X-Serverless-Revision reaches on
// the internal listener only. On a public port an internal service's names
// and revisions are thus looked up exactly as names nobody routes.
type table struct {
	hosts, public map[string]*route
	revisions     map[string]*revision
	internalRevs  map[string]bool // nil when no service is internal
	// withInstances are the revisions whose pool has backends.
	withInstances []*revision
}

// scope is which of the gateway's listeners a request came in on.
type scope uint8

const (
	// publicScope: the public HTTP and HTTPS ports, where only public
	// services are routed.
	publicScope scope = iota
	// internalScope: the internal listener (serve -internal-listen),
	// where every service is routed, as inside a Kubernetes cluster.
	internalScope
)

// route is where one host's requests go: a service's traffic split, or a
// single tagged revision.
type route struct {
	service, namespace string
	tag                string // "" for the service's own split
	redirect           bool   // plain HTTP goes to HTTPS (tls.go)
	internal           bool   // served on the internal listener only
	targets            []target
	// slots assigns each of 100 request slots to a target, in proportion
	// to the percentages; requests walk the slots in a stride order (see
	// pick), so every 100 consecutive requests match the split exactly and
	// the targets interleave instead of coming in runs.
	slots   [100]uint8
	counter *atomic.Uint64 // the service's request counter, shared across rebuilds
}

// target is one revision a route sends requests to; rev is nil when the
// route names a revision the catalog does not know (yet).
type target struct {
	name string
	rev  *revision
}

// slotStride is coprime with 100, so n*slotStride mod 100 visits every slot
// once in any 100 consecutive n.
const slotStride = 37

// pick returns the target for the next request.
func (rt *route) pick() *target {
	if len(rt.targets) == 1 {
		return &rt.targets[0]
	}
	n := rt.counter.Add(1)
	return &rt.targets[rt.slots[(n*slotStride)%100]]
}

// resolution is what routing decided for a request.
type resolution int

const (
	resolved       resolution = iota
	unknownHost               // 404
	unknownTarget             // 503: the route names a revision the catalog lacks
	noTraffic                 // 503: the service's route has no split (tags only)
	unknownHeaderR            // 404: header names a revision the catalog lacks
)

// resolve routes a request that came in on listener sc: by host first; for
// hosts it does not know, by the revision the request already names (mesh
// failover, catalog stand-in). It allocates nothing (see BenchmarkResolve).
func (t *table) resolve(host string, revHeader []string, sc scope) (*revision, *route, *target, resolution) {
	hosts := t.public
	if sc == internalScope {
		hosts = t.hosts
	}
	if rt, ok := hosts[host]; ok {
		if len(rt.targets) == 0 {
			return nil, rt, nil, noTraffic
		}
		tg := rt.pick()
		if tg.rev == nil {
			return nil, rt, tg, unknownTarget
		}
		return tg.rev, rt, tg, resolved
	}
	if len(revHeader) > 0 && revHeader[0] != "" {
		if r, ok := t.revisions[revHeader[0]]; ok && (sc == internalScope || !t.internalRevs[revHeader[0]]) {
			return r, nil, nil, resolved
		}
		return nil, nil, nil, unknownHeaderR
	}
	return nil, nil, nil, unknownHost
}

// canonicalHost lowercases a Host header and strips its port and a trailing
// dot. It allocates only when the host has upper-case letters.
func canonicalHost(h string) string {
	if i := strings.LastIndexByte(h, ':'); i >= 0 && !strings.Contains(h[i:], "]") {
		h = h[:i]
	}
	h = strings.TrimSuffix(h, ".")
	return strings.ToLower(h)
}

// serviceHost is <service>.<namespace>.<domain>.
func serviceHost(service, namespace, domain string) string {
	return service + "." + namespace + "." + domain
}

// tagHost is <tag>-<service>.<namespace>.<domain>.
func tagHost(tag, service, namespace, domain string) string {
	return tag + "-" + serviceHost(service, namespace, domain)
}
