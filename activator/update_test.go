package activator

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// TestUpdateMatchesWholeRebuild is differential: random catalog changes
// (revisions, allocations, instances, services with splits, tags, domains
// that collide, internal services, deletions), applied by one gateway with
// update after each batch and by another with a whole rebuild; their tables
// must say the same thing, host by host, revision by revision, instance by
// instance, probe by probe.
func TestUpdateMatchesWholeRebuild(t *testing.T) {
	for seed := uint64(1); seed <= 12; seed++ {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 45))
			cat := catalog.New()
			inc := newTestGateway(t, cat)
			whole := newTestGateway(t, cat)
			for step := range 400 {
				var did []string
				for range 1 + rng.IntN(4) {
					did = append(did, randomChange(rng, cat))
				}
				if rng.IntN(5) == 0 {
					// A probe's refresh of one revision, between builds.
					name := randomRevision(rng)
					inc.refreshRevision(name)
					did = append(did, "refresh "+name)
				}
				inc.update()
				whole.rebuild()
				if a, b := snapshotTable(inc), snapshotTable(whole); a != b {
					t.Fatalf("step %d, after %v: update and rebuild differ:\n%s", step, did, diffLines(b, a))
				}
			}
			// Most steps must have been updates, or the test compared
			// two whole rebuilds.
			builds, wholes := testutil.ToFloat64(inc.metrics.rebuilds), testutil.ToFloat64(inc.metrics.wholeRebuilds)
			if builds-wholes < 100 {
				t.Errorf("%v builds, %v of them whole: too few updates to compare", builds, wholes)
			}
			t.Logf("%v builds, %v whole", builds, wholes)
		})
	}
}

func newTestGateway(t *testing.T, cat *catalog.Catalog) *Gateway {
	t.Helper()
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// Names are few, so changes meet: "b" and "a-b" with tag "a" want one
// host, and domains are shared among services.
var (
	testServiceNames = []string{"a", "b", "a-b", "c"}
	testDomains      = []string{"x.example", "y.example", "Z.example"}
	testTags         = []string{"a", "old", "canary"}
)

func randomRevision(rng *rand.Rand) string {
	return fmt.Sprintf("%s-%05d", testServiceNames[rng.IntN(len(testServiceNames))], 1+rng.IntN(3))
}

func randomChange(rng *rand.Rand, cat *catalog.Catalog) string {
	switch rng.IntN(9) {
	case 0, 1:
		name := randomRevision(rng)
		svc, gen, _ := spec.ParseRevisionName(name)
		cat.SetRevision(catalog.Revision{Name: name, Service: svc, Namespace: "default", Generation: gen,
			Concurrency: rng.IntN(3), Timeout: time.Duration(rng.IntN(3)) * time.Minute, Scaling: spec.DefaultScaling()})
		return "set revision " + name
	case 2:
		name := randomRevision(rng)
		cat.DeleteRevision(name)
		return "delete revision " + name
	case 3, 4:
		a := catalog.Allocation{ID: fmt.Sprintf("alloc%d", rng.IntN(8)), Revision: randomRevision(rng),
			Address: "127.0.0.1", Port: 1000 + rng.IntN(6), AdminPort: 2000, Running: rng.IntN(3) > 0}
		a.Starting = !a.Running && rng.IntN(2) == 0
		cat.SetAllocation(a)
		return fmt.Sprintf("set allocation %s of %s at %d", a.ID, a.Revision, a.Port)
	case 5:
		id := fmt.Sprintf("alloc%d", rng.IntN(8))
		cat.DeleteAllocation(id)
		return "delete allocation " + id
	case 6:
		name := randomRevision(rng)
		var ready []consulroute.Instance
		for p := range 6 {
			if rng.IntN(3) == 0 {
				ready = append(ready, consulroute.Instance{ID: fmt.Sprint("i", p), Address: "127.0.0.1", Port: 1000 + p})
			}
		}
		cat.SetReady(name, ready)
		return fmt.Sprintf("set ready of %s: %d", name, len(ready))
	case 7:
		svc := testServiceNames[rng.IntN(len(testServiceNames))]
		s := catalog.Service{Name: svc, Namespace: "default", HTTPSRedirect: rng.IntN(4) == 0, Internal: rng.IntN(6) == 0}
		if rng.IntN(4) == 0 {
			s.Namespace = ""
		}
		left := 100
		for gen := 1; gen <= 3 && left > 0; gen++ {
			if rng.IntN(2) == 0 {
				continue
			}
			p := left
			if gen < 3 && rng.IntN(2) == 0 {
				p = 1 + rng.IntN(left)
			}
			s.Route.Splits = append(s.Route.Splits, consulroute.Split{Revision: fmt.Sprintf("%s-%05d", svc, gen), Percent: p})
			left -= p
		}
		for _, tag := range testTags {
			if rng.IntN(3) == 0 {
				if s.Route.Tags == nil {
					s.Route.Tags = map[string]string{}
				}
				s.Route.Tags[tag] = fmt.Sprintf("%s-%05d", svc, 1+rng.IntN(3))
			}
		}
		for _, d := range testDomains {
			if rng.IntN(4) == 0 {
				s.Domains = append(s.Domains, d)
			}
		}
		cat.SetService(s)
		return fmt.Sprintf("set service %s (internal %v, %d splits, %d tags, domains %v)", svc, s.Internal, len(s.Route.Splits), len(s.Route.Tags), s.Domains)
	default:
		svc := testServiceNames[rng.IntN(len(testServiceNames))]
		cat.DeleteService(svc)
		return "delete service " + svc
	}
}

// snapshotTable says what a gateway's table routes, in text: hosts on both
// listeners, revisions, internal revisions, revisions with instances, each
// revision's pool, the probes wanted and allocations known, the split
// counters. Pointers are checked (a route's target is the table's revision)
// and left out.
func snapshotTable(g *Gateway) string {
	g.buildMu.Lock()
	defer g.buildMu.Unlock()
	t := g.table.Load()
	var b strings.Builder
	hosts := func(label string, m map[string]*route) {
		for _, h := range sortedKeys(m) {
			rt := m[h]
			fmt.Fprintf(&b, "%s %s: %s/%s tag=%q redirect=%v internal=%v targets=", label, h, rt.namespace, rt.service, rt.tag, rt.redirect, rt.internal)
			for _, tg := range rt.targets {
				if tg.rev != t.revisions[tg.name] {
					fmt.Fprintf(&b, "[%s: STALE POINTER]", tg.name)
				}
				fmt.Fprintf(&b, "[%s known=%v]", tg.name, tg.rev != nil)
			}
			fmt.Fprintf(&b, " slots=%v counter=%v\n", rt.slots, rt.counter == g.counters[rt.namespace+"/"+rt.service])
		}
	}
	hosts("host", t.hosts)
	hosts("public", t.public)
	fmt.Fprintf(&b, "public is hosts: %v\n", samePointerMap(t.public, t.hosts))
	for _, name := range sortedKeys(t.revisions) {
		r := t.revisions[name]
		if g.revs[name] != r {
			fmt.Fprintf(&b, "revision %s: not the gateway's\n", name)
		}
		p := r.pool.Load()
		var bs []string
		for _, be := range p.backends {
			bs = append(bs, be.hostPort+"="+be.alloc)
		}
		fmt.Fprintf(&b, "revision %s internal=%v cfg=%+v limit=%d pool=%v\n", name, t.internalRevs[name], *r.cfg.Load(), p.limit, bs)
	}
	if len(g.revs) != len(t.revisions) {
		fmt.Fprintf(&b, "gateway holds %d revisions, table %d\n", len(g.revs), len(t.revisions))
	}
	var with []string
	for _, r := range t.withInstances {
		with = append(with, r.name)
	}
	fmt.Fprintf(&b, "with instances: %v\n", with)
	want, known := g.state.probeSets()
	var ws, ks []string
	for k, rev := range want {
		ws = append(ws, fmt.Sprintf("%v->%s", k, rev))
	}
	for k := range known {
		ks = append(ks, fmt.Sprint(k))
	}
	slices.Sort(ws)
	slices.Sort(ks)
	fmt.Fprintf(&b, "probes wanted: %v\nallocations known: %v\ncounters: %v\n", ws, ks, sortedKeys(g.counters))
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

// samePointerMap: whether two maps are one (both nil counts).
func samePointerMap(a, b map[string]*route) bool {
	return fmt.Sprintf("%p", a) == fmt.Sprintf("%p", b)
}

func diffLines(want, got string) string {
	w, g := strings.Split(want, "\n"), strings.Split(got, "\n")
	var out []string
	for _, l := range w {
		if !slices.Contains(g, l) {
			out = append(out, "- "+l)
		}
	}
	for _, l := range g {
		if !slices.Contains(w, l) {
			out = append(out, "+ "+l)
		}
	}
	return strings.Join(out, "\n")
}
