package activator

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// While the catalog loads, a request for a service the gateway has not
// learned of yet is held and served once the catalog is in: a starting
// replica (a failover) never answers 404 for a service that exists
// (issue 45).
func TestRequestHeldWhileTheCatalogLoadsIsServedOnceItIsIn(t *testing.T) {
	cat := catalog.New()
	loaded := make(chan struct{})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Loaded, c.LoadingHold = loaded, time.Minute })

	type answer struct {
		code int
		body string
	}
	got := make(chan answer, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodGet, tg.srv.URL+"/", nil)
		req.Host = "hello.default.localhost"
		resp, err := tg.srv.Client().Do(req)
		if err != nil {
			got <- answer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, _ = io.Copy(&b, resp.Body)
		got <- answer{resp.StatusCode, b.String()}
	}()
	// The request is in the gateway, held, before the catalog fills.
	waitFor(t, "the request held", func() bool { return tg.g.loadingHeld.Load() == 1 })
	select {
	case a := <-got:
		t.Fatalf("answered before the catalog loaded: %d %q", a.code, a.body)
	default:
	}

	sc := newFakeSidecar(t, true, nil)
	full := oneRevision(0, time.Minute)
	copyCatalog(cat, full)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	close(loaded)
	select {
	case a := <-got:
		if a.code != 200 || !strings.HasPrefix(a.body, "ok from") {
			t.Fatalf("held request answered %d %q, want the service's answer", a.code, a.body)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the held request was not answered within 30s of the catalog loading")
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_unknown_host_total", nil); n != 0 {
		t.Errorf("%v requests answered 404 while the catalog loaded", n)
	}
}

// A catalog that does not load within the hold: the request is refused
// with 503 and Retry-After, saying why, never 404; unknown hosts are 404
// again once the catalog is in.
func TestCatalogNotLoadedInTimeIsRetryAfterNot404(t *testing.T) {
	cat := catalog.New()
	loaded := make(chan struct{})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Loaded, c.LoadingHold = loaded, time.Millisecond })
	code, body, h := tg.get(t, "hello.default.localhost", "/", nil)
	if code != http.StatusServiceUnavailable || h.Get("Retry-After") == "" || !strings.Contains(body, "has not loaded the services") {
		t.Fatalf("before the catalog loaded: %d %q Retry-After %q, want 503 with Retry-After", code, body, h.Get("Retry-After"))
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_catalog_loading_refused_total", nil); n != 1 {
		t.Errorf("catalog_loading_refused_total %v, want 1", n)
	}
	close(loaded)
	waitFor(t, "the catalog loaded", tg.g.catalogLoaded)
	if code, body, _ := tg.get(t, "nope.default.localhost", "/", nil); code != http.StatusNotFound {
		t.Fatalf("unknown host after the catalog loaded: %d %q, want 404", code, body)
	}
}

// copyCatalog puts src's revisions and services in dst.
func copyCatalog(dst, src *catalog.Catalog) {
	for _, r := range src.Revisions() {
		dst.SetRevision(r)
	}
	for _, s := range src.Services() {
		dst.SetService(s)
	}
}

// A revision's metric series are made on its first request: a revision at
// zero that gets none costs the gateway no series (issue 45: they were
// most of what it held per revision).
func TestRevisionSeriesMadeOnFirstRequest(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	sc := newFakeSidecar(t, true, nil)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)
	series := func() int {
		mfs, err := tg.reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, mf := range mfs {
			if mf.GetName() == "nomad_serverless_gateway_routable_instances" {
				continue // a state read at each scrape, not a series held
			}
			for _, m := range mf.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "revision" && l.GetValue() == "hello-00001" && strings.HasPrefix(mf.GetName(), "nomad_serverless_gateway_") {
						n++
					}
				}
			}
		}
		return n
	}
	if n := series(); n != 0 {
		t.Errorf("%d series of hello-00001 before any request, want none", n)
	}
	if code, body, _ := tg.get(t, "hello.default.localhost", "/", nil); code != 200 {
		t.Fatalf("request: %d %q", code, body)
	}
	if n := series(); n == 0 {
		t.Error("no series of hello-00001 after a request")
	}
	if n := counter(t, tg.reg, "nomad_serverless_gateway_requests_total", map[string]string{"revision": "hello-00001"}); n != 1 {
		t.Errorf("requests_total %v, want 1", n)
	}
}
