package activator

import (
	"sync/atomic"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

func TestCanonicalHost(t *testing.T) {
	for in, want := range map[string]string{
		"hello.default.localhost":          "hello.default.localhost",
		"Hello.Default.LOCALHOST:8080":     "hello.default.localhost",
		"hello.default.localhost.":         "hello.default.localhost",
		"hello.default.localhost.:80":      "hello.default.localhost",
		"[::1]":                            "[::1]",
		"[::1]:8080":                       "[::1]",
		"":                                 "",
		"api.example.com":                  "api.example.com",
		"canary-hello.default.localhost:1": "canary-hello.default.localhost",
	} {
		if got := canonicalHost(in); got != want {
			t.Errorf("canonicalHost(%q) = %q, want %q", in, got, want)
		}
	}
}

// testTable builds a table the way the gateway does, from a catalog, with a
// no-op autoscaler.
func testTable(t testing.TB, services ...catalog.Service) (*Gateway, *table) {
	t.Helper()
	cat := catalog.New()
	for _, s := range services {
		for _, rev := range s.Route.Revisions() {
			cat.SetRevision(catalog.Revision{Name: rev, Service: s.Name, Namespace: s.Namespace})
		}
		cat.SetService(s)
	}
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{}})
	if err != nil {
		t.Fatal(err)
	}
	return g, g.table.Load()
}

func TestSplitIsExactAndInterleaved(t *testing.T) {
	_, tb := testTable(t, catalog.Service{Name: "hello", Namespace: "default", Route: consulroute.Route{
		Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 30}, {Revision: "hello-00002", Percent: 70}},
	}})
	counts := map[string]int{}
	longestRun, run, last := 0, 0, ""
	for range 1000 {
		rev, _, _, res := tb.resolve("hello.default.localhost", nil, publicScope)
		if res != resolved {
			t.Fatalf("resolution %v", res)
		}
		counts[rev.name]++
		if rev.name == last {
			run++
		} else {
			run, last = 1, rev.name
		}
		longestRun = max(longestRun, run)
	}
	if counts["hello-00001"] != 300 || counts["hello-00002"] != 700 {
		t.Fatalf("split %v, want exactly 300/700", counts)
	}
	// 70 % can not avoid runs of 3, but must not come in long blocks.
	if longestRun > 4 {
		t.Fatalf("longest run of one revision %d: the split is not interleaved", longestRun)
	}
}

func TestResolveHostsTagsDomainsAndHeader(t *testing.T) {
	_, tb := testTable(t,
		catalog.Service{Name: "hello", Namespace: "default", Domains: []string{"API.example.com"}, Route: consulroute.Route{
			Splits: []consulroute.Split{{Revision: "hello-00002", Percent: 100}},
			Tags:   map[string]string{"canary": "hello-00003", "old": "hello-00001"},
		}},
		catalog.Service{Name: "shop", Namespace: "prod", Route: consulroute.Route{
			Splits: []consulroute.Split{{Revision: "shop-00001", Percent: 100}},
		}},
		catalog.Service{Name: "quiet", Namespace: "default", Route: consulroute.Route{
			Tags: map[string]string{"t": "quiet-00001"},
		}},
	)
	for _, tc := range []struct {
		host   string
		header []string
		rev    string
		res    resolution
	}{
		{"hello.default.localhost", nil, "hello-00002", resolved},
		{"api.example.com", nil, "hello-00002", resolved},
		{"canary-hello.default.localhost", nil, "hello-00003", resolved},
		{"old-hello.default.localhost", nil, "hello-00001", resolved},
		{"shop.prod.localhost", nil, "shop-00001", resolved},
		{"shop.default.localhost", nil, "", unknownHost},
		{"nope.default.localhost", nil, "", unknownHost},
		{"10.0.0.5", []string{"shop-00001"}, "shop-00001", resolved},
		{"10.0.0.5", []string{"shop-00009"}, "", unknownHeaderR},
		// A known host ignores the header: clients can not pick revisions.
		{"hello.default.localhost", []string{"hello-00001"}, "hello-00002", resolved},
		{"quiet.default.localhost", nil, "", noTraffic},
		{"t-quiet.default.localhost", nil, "quiet-00001", resolved},
	} {
		rev, _, _, res := tb.resolve(tc.host, tc.header, publicScope)
		name := ""
		if rev != nil {
			name = rev.name
		}
		if res != tc.res || name != tc.rev {
			t.Errorf("resolve(%q, %v) = %q, %v; want %q, %v", tc.host, tc.header, name, res, tc.rev, tc.res)
		}
	}
}

func TestRouteToUnknownRevision(t *testing.T) {
	cat := catalog.New()
	cat.SetService(catalog.Service{Name: "hello", Namespace: "default", Route: consulroute.Route{
		Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 100}},
	}})
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{}})
	if err != nil {
		t.Fatal(err)
	}
	_, _, tg, res := g.table.Load().resolve("hello.default.localhost", nil, publicScope)
	if res != unknownTarget || tg.name != "hello-00001" {
		t.Fatalf("got %v %+v, want unknownTarget hello-00001", res, tg)
	}
}

func TestServiceHostWinsOverTagHost(t *testing.T) {
	_, tb := testTable(t,
		catalog.Service{Name: "b", Namespace: "default", Route: consulroute.Route{
			Splits: []consulroute.Split{{Revision: "b-00001", Percent: 100}},
			Tags:   map[string]string{"a": "b-00001"},
		}},
		catalog.Service{Name: "a-b", Namespace: "default", Route: consulroute.Route{
			Splits: []consulroute.Split{{Revision: "a-b-00001", Percent: 100}},
		}},
	)
	rev, _, _, _ := tb.resolve("a-b.default.localhost", nil, publicScope)
	if rev == nil || rev.name != "a-b-00001" {
		t.Fatalf("a-b.default.localhost routed to %v, want service a-b", rev)
	}
}

// The routing decision (host, split, revision) allocates nothing.
func BenchmarkResolve(b *testing.B) {
	_, tb := testTable(b, catalog.Service{Name: "hello", Namespace: "default", Route: consulroute.Route{
		Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 30}, {Revision: "hello-00002", Percent: 70}},
		Tags:   map[string]string{"canary": "hello-00002"},
	}})
	hosts := []string{"hello.default.localhost:8080", "canary-hello.default.localhost", "nope.default.localhost"}
	var sink atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		rev, _, _, _ := tb.resolve(canonicalHost(hosts[i%len(hosts)]), nil, publicScope)
		if rev != nil {
			sink.Add(1)
		}
	}
}

func TestResolveAllocatesNothing(t *testing.T) {
	_, tb := testTable(t, catalog.Service{Name: "hello", Namespace: "default", Route: consulroute.Route{
		Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 30}, {Revision: "hello-00002", Percent: 70}},
	}})
	hdr := []string{"hello-00001"}
	allocs := testing.AllocsPerRun(1000, func() {
		tb.resolve(canonicalHost("hello.default.localhost:8080"), nil, publicScope)
		tb.resolve(canonicalHost("10.1.1.1"), hdr, publicScope)
	})
	if allocs != 0 {
		t.Fatalf("routing allocates %.1f times per request, want 0", allocs)
	}
}
