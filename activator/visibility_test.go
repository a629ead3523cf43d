package activator

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// On a public port an internal service's names and revisions resolve as
// names nobody routes; on the internal listener everything resolves, and a
// public service's domain never loses to an internal one's on the public
// ports.
func TestResolveInternalVisibility(t *testing.T) {
	_, tb := testTable(t,
		catalog.Service{Name: "hello", Namespace: "default", Domains: []string{"shared.example.com"}, Route: consulroute.Route{
			Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 100}},
		}},
		// "billing" sorts before "hello": it would win the shared domain
		// if it claimed it on the public ports.
		catalog.Service{Name: "billing", Namespace: "default", Internal: true,
			Domains: []string{"billing.internal.example.com", "shared.example.com"}, Route: consulroute.Route{
				Splits: []consulroute.Split{{Revision: "billing-00002", Percent: 100}},
				Tags:   map[string]string{"old": "billing-00001"},
			}},
	)
	for _, tc := range []struct {
		host           string
		header         []string
		sc             scope
		wantRev        string
		wantResolution resolution
	}{
		{"billing.default.localhost", nil, publicScope, "", unknownHost},
		{"old-billing.default.localhost", nil, publicScope, "", unknownHost},
		{"billing.internal.example.com", nil, publicScope, "", unknownHost},
		{"10.0.0.1", []string{"billing-00002"}, publicScope, "", unknownHeaderR},
		{"10.0.0.1", []string{"billing-00001"}, publicScope, "", unknownHeaderR},
		// The internal service's host ignores the header on the public
		// port exactly as an unknown host does: the header routes.
		{"billing.default.localhost", []string{"hello-00001"}, publicScope, "hello-00001", resolved},
		{"shared.example.com", nil, publicScope, "hello-00001", resolved},
		{"hello.default.localhost", nil, publicScope, "hello-00001", resolved},

		{"billing.default.localhost", nil, internalScope, "billing-00002", resolved},
		{"old-billing.default.localhost", nil, internalScope, "billing-00001", resolved},
		{"billing.internal.example.com", nil, internalScope, "billing-00002", resolved},
		{"10.0.0.1", []string{"billing-00002"}, internalScope, "billing-00002", resolved},
		{"hello.default.localhost", nil, internalScope, "hello-00001", resolved},
		{"10.0.0.1", []string{"hello-00001"}, internalScope, "hello-00001", resolved},
		{"nope.default.localhost", nil, internalScope, "", unknownHost},
	} {
		rev, _, _, res := tb.resolve(tc.host, tc.header, tc.sc)
		name := ""
		if rev != nil {
			name = rev.name
		}
		if res != tc.wantResolution || name != tc.wantRev {
			t.Errorf("resolve(%q, %v, scope %d) = %q, %v; want %q, %v", tc.host, tc.header, tc.sc, name, res, tc.wantRev, tc.wantResolution)
		}
	}
}

// The names the gateway hands the certificate manager say which are an
// internal service's.
func TestHostsMarkInternalNames(t *testing.T) {
	g, _ := testTable(t,
		catalog.Service{Name: "hello", Namespace: "default", Route: consulroute.Route{
			Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 100}},
		}},
		catalog.Service{Name: "billing", Namespace: "default", Internal: true, Domains: []string{"billing.example.com"}, Route: consulroute.Route{
			Splits: []consulroute.Split{{Revision: "billing-00001", Percent: 100}},
			Tags:   map[string]string{"old": "billing-00001"},
		}},
	)
	var got []string
	for _, h := range g.Hosts() {
		got = append(got, fmt.Sprintf("%s internal=%v", h.Host, h.Internal))
	}
	want := []string{
		"billing.default.localhost internal=true",
		"billing.example.com internal=true",
		"hello.default.localhost internal=false",
		"old-billing.default.localhost internal=true",
	}
	if !slices.Equal(got, want) {
		t.Fatalf("Hosts:\n got  %q\n want %q", got, want)
	}
}

// startInternal serves g's internal listener on 127.0.0.1 until the test
// ends and returns its address.
func startInternal(t *testing.T, g *Gateway) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := g.InternalServer("")
	go func() { _ = srv.Serve(g.Listener(ln)) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
	})
	return ln.Addr().String()
}

// answer is a response as a client sees it, without its Date.
type answer struct {
	status int
	header http.Header
	body   string
}

func (a answer) String() string {
	return fmt.Sprintf("%d %v %q", a.status, a.header, a.body)
}

func doAnswer(t *testing.T, c *http.Client, url, host string, hdr map[string]string) answer {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s (Host %s): %v", url, host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	resp.Header.Del("Date")
	return answer{resp.StatusCode, resp.Header, string(b)}
}

// An internal service's every name (its own, its tag's, its domain) gets
// on the public HTTP port and on HTTPS (HTTP/1.1 and h2) exactly the
// answer those names get once no service has them, even though the
// service redirects to HTTPS and its names have certificates; its
// revision named by X-Serverless-Revision too. The internal listener
// serves them all.
func TestInternalServiceHiddenOnPublicPortsServedOnInternal(t *testing.T) {
	cat := oneRevision(0, time.Minute)
	svc := cat.Services()[0]
	svc.Internal, svc.HTTPSRedirect = true, true
	cat.SetService(svc)
	sc := newFakeSidecar(t, true, nil)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startTLSGateway(t, cat, nil)
	internal := startInternal(t, tg.g)
	waitFor(t, "the internal route", func() bool { return tg.g.table.Load().internalRevs["hello-00001"] })

	names := []string{"hello.default.localhost", "canary-hello.default.localhost", "hello.example.com"}
	header := map[string]string{spec.RevisionHeader: "hello-00001"}
	plain := &http.Client{Timeout: 30 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	publicAnswers := func() []answer {
		var out []answer
		for _, n := range names {
			out = append(out, doAnswer(t, plain, tg.srv.URL+"/x", n, nil))
			for _, h2 := range []bool{false, true} {
				out = append(out, doAnswer(t, tg.client(h2), "https://"+n+"/x", n, nil))
			}
		}
		out = append(out, doAnswer(t, plain, tg.srv.URL+"/x", "10.1.2.3", header))
		return out
	}
	hidden := publicAnswers()

	for _, n := range names {
		a := doAnswer(t, plain, "http://"+internal+"/x", n, nil)
		if a.status != http.StatusOK || !strings.HasPrefix(a.body, "ok from "+n) {
			t.Errorf("internal listener, Host %s: %v", n, a)
		}
	}
	if a := doAnswer(t, plain, "http://"+internal+"/x", "10.1.2.3", header); a.status != http.StatusOK {
		t.Errorf("internal listener, revision header: %v", a)
	}

	// Now nobody routes these names: the public answers must not change.
	cat.DeleteService("hello")
	cat.DeleteRevision("hello-00001")
	waitFor(t, "the route gone", func() bool { return len(tg.g.table.Load().hosts) == 0 })
	gone := publicAnswers()
	for i := range hidden {
		if hidden[i].String() != gone[i].String() {
			t.Errorf("answer %d differs from an unknown name's:\n internal service: %v\n nobody's name:    %v", i, hidden[i], gone[i])
		}
		if hidden[i].status != http.StatusNotFound {
			t.Errorf("answer %d: %v, want 404", i, hidden[i])
		}
	}
}

// Wake from zero, the split and tags work on the internal listener as on
// the public port: one handler past routing.
func TestInternalListenerWakesSplitsAndTags(t *testing.T) {
	cat := catalog.New()
	for _, rev := range []string{"billing-00001", "billing-00002"} {
		cat.SetRevision(catalog.Revision{Name: rev, Service: "billing", Namespace: "default", Timeout: time.Minute, Scaling: spec.DefaultScaling()})
	}
	cat.SetService(catalog.Service{Name: "billing", Namespace: "default", Internal: true, Route: consulroute.Route{
		Service: "billing", Namespace: "default",
		Splits: []consulroute.Split{{Revision: "billing-00001", Percent: 50}, {Revision: "billing-00002", Percent: 50}},
		Tags:   map[string]string{"old": "billing-00001"},
	}})
	as := &fakeAutoscaler{}
	one := newFakeSidecar(t, false, nil)
	two := newFakeSidecar(t, true, nil)
	cat.SetReady("billing-00002", []consulroute.Instance{two.instance("billing-00002")})
	tg := startGateway(t, cat, as, nil)
	internal := "http://" + startInternal(t, tg.g)
	c := &http.Client{Timeout: 30 * time.Second}

	// billing-00001 is at zero: the tag's request waits for its wake.
	held := make(chan answer, 1)
	go func() { held <- doAnswer(t, c, internal+"/", "old-billing.default.localhost", nil) }()
	waitFor(t, "a wake", func() bool { return as.wakeCount() >= 1 })
	cat.SetAllocation(one.allocation("billing-00001", "a1", true))
	one.ready.Store(true)
	if a := <-held; a.status != http.StatusOK || a.header.Get("X-Got-Revision") != "billing-00001" {
		t.Fatalf("held request on the internal listener: %v", a)
	}
	got := map[string]int{}
	for range 10 {
		a := doAnswer(t, c, internal+"/", "billing.default.localhost", nil)
		got[a.header.Get("X-Got-Revision")]++
	}
	if got["billing-00001"] != 5 || got["billing-00002"] != 5 {
		t.Fatalf("split on the internal listener: %v, want 5 and 5", got)
	}
	if a := doAnswer(t, c, tg.srv.URL+"/", "billing.default.localhost", nil); a.status != http.StatusNotFound {
		t.Fatalf("public port: %v, want 404", a)
	}
}
