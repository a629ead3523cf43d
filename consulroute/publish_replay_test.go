package consulroute

import (
	"encoding/json"
	"errors"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

const helloKey = "/v1/kv/nomad-serverless/services/default/hello"

func notFoundEntry(kind, name string) fixtures.Exchange {
	return synthetic("read missing "+kind+" "+name, "GET", "/v1/config/"+kind+"/"+name, nil, 404, "49",
		`Config entry not found for "`+kind+`" / "`+name+`"`)
}

// kvRecord is a KV GET answer holding rec at index (shaped like fixture 044).
func kvRecord(t testing.TB, rec Record, index uint64) fixtures.Exchange {
	e := fx(t, "044-kv-get.json")
	e.Name += " (holding a full record)"
	e.Response.Body = mustJSON(t, []api.KVPair{{Key: rec.Key(), Value: mustJSON(t, rec), CreateIndex: 50, ModifyIndex: index}})
	return e
}

// publishedState is what Consul answers, read entry by entry in the order
// Publish reads them, once helloRecord is published: service-defaults for
// hello, both revisions and the activator; a resolver per revision (the
// elements of fixture 036); the router of fixture 032; the splitter of
// fixture 035.
func publishedState(t testing.TB) []fixtures.Exchange {
	return publishedStateFrom(t, consulDir)
}

// publishedStateFrom is publishedState with the recorded resolvers and
// splitter read from dir ("consul-1.22/" for Consul 1.22's answers).
func publishedStateFrom(t testing.TB, dir string) []fixtures.Exchange {
	var out []fixtures.Exchange
	for i, n := range []string{"hello", "hello-00001", "hello-00002", spec.ActivatorServiceName} {
		out = append(out, synthetic("read service-defaults "+n, "GET", "/v1/config/service-defaults/"+n, nil, 200, "47",
			map[string]any{"Kind": "service-defaults", "Name": n, "Protocol": "http",
				"MeshGateway": map[string]any{}, "Expose": map[string]any{}, "CreateIndex": 40 + i, "ModifyIndex": 40 + i}))
	}
	out = append(out, resolverReads(t, dir)...)
	var router map[string]any
	if err := json.Unmarshal(fx(t, "032-config-router.json").Request.Body, &router); err != nil {
		t.Fatal(err)
	}
	router["CreateIndex"], router["ModifyIndex"] = 45, 45
	return append(out,
		synthetic("read service-router hello", "GET", "/v1/config/service-router/hello", nil, 200, "47", router),
		fixtures.Load(t, dir+"035-config-read-splitter.json"),
	)
}

// resolverReads are the reads of each resolver of fixture 036 (a listing),
// each answered with that resolver's recorded bytes, so fields the api
// module does not know (Consul 1.22's Hash) reach the client as recorded.
func resolverReads(t testing.TB, dir string) []fixtures.Exchange {
	list := fixtures.Load(t, dir+"036-config-list-resolvers.json")
	var elems []json.RawMessage
	if err := json.Unmarshal(list.Response.BodyBytes(), &elems); err != nil {
		t.Fatal(err)
	}
	var out []fixtures.Exchange
	for _, raw := range elems {
		var e struct{ Name string }
		if err := json.Unmarshal(raw, &e); err != nil {
			t.Fatal(err)
		}
		x := synthetic("read service-resolver "+e.Name+" (from "+list.Name+")", "GET", "/v1/config/service-resolver/"+e.Name, nil, 200,
			list.Response.Headers["X-Consul-Index"], raw)
		out = append(out, x)
	}
	return out
}

func TestPublishWritesEntriesInSafeOrderAsRecorded(t *testing.T) {
	rec := helloRecord()
	writes := []fixtures.Exchange{
		fx(t, "027-config-service-defaults-hello.json"),
		fx(t, "028-config-service-defaults-hello-00001.json"),
		fx(t, "029-config-service-defaults-hello-00002.json"),
		fx(t, "030-config-service-defaults-nomad-serverless-activator.json"),
		fx(t, "033-config-resolver-hello-00001.json"),
		fx(t, "034-config-resolver-hello-00002.json"),
		fx(t, "032-config-router.json"),
		fx(t, "031-config-splitter.json"),
	}
	kvPut := fx(t, "042-kv-put-cas0-create.json")
	reads := []fixtures.Exchange{
		withPath(fx(t, "048-kv-get-missing.json"), helloKey),
		notFoundEntry("service-defaults", "hello"),
		notFoundEntry("service-defaults", "hello-00001"),
		notFoundEntry("service-defaults", "hello-00002"),
		notFoundEntry("service-defaults", spec.ActivatorServiceName),
		notFoundEntry("service-resolver", "hello-00001"),
		notFoundEntry("service-resolver", "hello-00002"),
		fx(t, "041-config-read-missing.json"),
		notFoundEntry("service-splitter", "hello"),
	}
	all := append(append(append([]fixtures.Exchange{}, reads...), writes...), kvPut)
	c, replay := replayClient(t, all...)

	if err := c.Publish(ctxTimeout(t, 10*time.Second), rec, 0); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := replay.Received()
	if len(got) != len(all) {
		for _, r := range got {
			t.Logf("sent %s %s %s", r.Method, r.Path, r.Body)
		}
		t.Fatalf("sent %d requests, want %d", len(got), len(all))
	}
	for i, e := range all {
		if i == len(all)-1 {
			assertSent(t, got[i], e, mustJSON(t, rec)) // our record, not the recording's sample value
			continue
		}
		assertSent(t, got[i], e)
	}
	replay.AssertAllUsed(t)
}

func TestPublishSameRecordAgainWritesNothing(t *testing.T) {
	rec := helloRecord()
	ex := append([]fixtures.Exchange{kvRecord(t, rec, 50)}, publishedState(t)...)
	c, replay := replayClient(t, ex...)
	// A later UpdatedAt alone is no change either.
	rec.UpdatedAt = rec.UpdatedAt.Add(time.Hour)
	if err := c.Publish(ctxTimeout(t, 10*time.Second), rec, 50); err != nil {
		t.Fatalf("second Publish: %v", err)
	}
	for _, r := range replay.Received() {
		if r.Method != "GET" {
			t.Errorf("an unchanged publish wrote %s %s %s", r.Method, r.Path, r.Body)
		}
	}
	if n := len(replay.Received()); n != len(ex) {
		t.Errorf("sent %d requests, want the %d reads", n, len(ex))
	}
}

// TestPublishSameRecordAgainWritesNothingConsul122: Consul 1.22 adds a
// Hash to every config entry it returns (fixtures consul-1.22/035, 036),
// a field the api module does not know. It must neither fail the read nor
// make an unchanged entry look changed, or every publish would rewrite
// the routing.
func TestPublishSameRecordAgainWritesNothingConsul122(t *testing.T) {
	for _, name := range []string{"035-config-read-splitter.json", "036-config-list-resolvers.json"} {
		if b := fixtures.Load(t, "consul-1.22/"+name).Response.BodyBytes(); !strings.Contains(string(b), `"Hash":`) {
			t.Fatalf("consul-1.22/%s has no Hash: the test no longer covers it", name)
		}
	}
	rec := helloRecord()
	ex := append([]fixtures.Exchange{kvRecord(t, rec, 50)}, publishedStateFrom(t, "consul-1.22/")...)
	c, replay := replayClient(t, ex...)
	if err := c.Publish(ctxTimeout(t, 10*time.Second), rec, 50); err != nil {
		t.Fatalf("Publish against Consul 1.22's entries: %v", err)
	}
	for _, r := range replay.Received() {
		if r.Method != "GET" {
			t.Errorf("an unchanged publish wrote %s %s %s", r.Method, r.Path, r.Body)
		}
	}
	replay.AssertAllUsed(t)
}

func TestPublishTrafficChangeWritesOnlyWhatChanged(t *testing.T) {
	old := helloRecord()
	rec := helloRecord()
	rec.Service.Traffic = nil // all to latest, no tag
	rec.UpdatedAt = old.UpdatedAt.Add(time.Hour)

	deleteRouter := fx(t, "040-config-delete-router.json")
	splitter := synthetic("write splitter 100% hello-00002", "PUT", "/v1/config", nil, 200, "", true)
	kvPut := fx(t, "045-kv-put-cas-ok.json")
	ex := append([]fixtures.Exchange{kvRecord(t, old, 50)}, publishedState(t)...)
	ex = append(ex, deleteRouter, splitter, kvPut)
	c, replay := replayClient(t, ex...)

	if err := c.Publish(ctxTimeout(t, 10*time.Second), rec, 50); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	got := replay.Received()
	if len(got) != len(ex) {
		t.Fatalf("sent %d requests, want %d: %+v", len(got), len(ex), got)
	}
	writes := got[1+len(publishedState(t)):]
	assertSent(t, writes[0], deleteRouter)
	assertSent(t, writes[1], splitter, map[string]any{"Kind": "service-splitter", "Name": "hello", "Splits": []any{
		map[string]any{"Weight": 100, "Service": "hello-00002", "RequestHeaders": map[string]any{"Set": map[string]any{"X-Serverless-Revision": "hello-00002"}}},
	}})
	assertSent(t, writes[2], kvPut, mustJSON(t, rec))
}

func TestPublishStaleIndexChangesNothing(t *testing.T) {
	rec := helloRecord()
	c, replay := replayClient(t, kvRecord(t, rec, 50))
	err := c.Publish(ctxTimeout(t, 10*time.Second), rec, 49)
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("Publish with a stale index: %v, want ErrConflict", err)
	}
	if n := len(replay.Received()); n != 1 {
		t.Errorf("sent %d requests, want only the read of the record", n)
	}
	// Create-only on an existing record is a conflict too.
	c, _ = replayClient(t, kvRecord(t, rec, 50))
	if err := c.Publish(ctxTimeout(t, 10*time.Second), rec, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("Publish create-only over an existing record: %v, want ErrConflict", err)
	}
}

func TestPublishLostCASRestoresWinnerAndReportsConflict(t *testing.T) {
	ours := helloRecord()
	ours.Service.Scaling.Max = 7 // a change outside the route: entries stay, the record changes
	winner := helloRecord()
	winner.Service.Scaling.Max = 9

	stale := fx(t, "046-kv-put-cas-stale.json")
	ex := []fixtures.Exchange{kvRecord(t, helloRecord(), 50)}
	ex = append(ex, publishedState(t)...)
	ex = append(ex, stale, kvRecord(t, winner, 51))
	ex = append(ex, publishedState(t)...)
	c, replay := replayClient(t, ex...)

	err := c.Publish(ctxTimeout(t, 10*time.Second), ours, 50)
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("Publish losing the CAS: %v, want ErrConflict", err)
	}
	got := replay.Received()
	if len(got) != len(ex) {
		t.Fatalf("sent %d requests, want %d", len(got), len(ex))
	}
	n := 1 + len(publishedState(t)) // the record, then the entries
	assertSent(t, got[n], stale, mustJSON(t, ours))
	if got[n+1].Method != "GET" || got[n+1].Path != helloKey {
		t.Errorf("after the lost CAS Publish should read the winner, sent %s %s", got[n+1].Method, got[n+1].Path)
	}
	for _, r := range got[n+2:] {
		if r.Method != "GET" {
			t.Errorf("restoring identical entries wrote %s %s", r.Method, r.Path)
		}
	}
}

func TestPublishCreateRaceLost(t *testing.T) {
	rec := helloRecord()
	exists := fx(t, "043-kv-put-cas0-exists.json")
	ex := []fixtures.Exchange{withPath(fx(t, "048-kv-get-missing.json"), helloKey)}
	ex = append(ex, publishedState(t)...)
	ex = append(ex, exists, kvRecord(t, rec, 50))
	ex = append(ex, publishedState(t)...)
	c, replay := replayClient(t, ex...)
	if err := c.Publish(ctxTimeout(t, 10*time.Second), rec, 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("Publish: %v, want ErrConflict", err)
	}
	assertSent(t, replay.Received()[1+len(publishedState(t))], exists, mustJSON(t, rec))
}

func TestPublishRefusesBadRecordBeforeWriting(t *testing.T) {
	cases := map[string]func(*Record){
		"weights not 100": func(r *Record) {
			r.Service.Traffic = []spec.TrafficTarget{{Revision: "hello-00001", Percent: 30}}
		},
		"route names an unpublished revision": func(r *Record) { r.Revisions = []string{"hello-00002"} },
		"routed revision being deleted": func(r *Record) {
			r.Revisions = []string{"hello-00002"}
			r.Deleting = []string{"hello-00001"}
		},
		"foreign revision":      func(r *Record) { r.Revisions = append(r.Revisions, "other-00001") },
		"latest not published":  func(r *Record) { r.Latest = "hello-00003" },
		"reserved service name": func(r *Record) { r.Service.Name = "nomad-serverless-x" },
		"latest being deleted": func(r *Record) {
			r.Service.Traffic = []spec.TrafficTarget{{Revision: "hello-00001", Percent: 100}}
			r.Deleting = []string{"hello-00002"}
		},
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			c, replay := replayClient(t)
			rec := helloRecord()
			mutate(&rec)
			if err := c.Publish(ctxTimeout(t, 5*time.Second), rec, 0); err == nil {
				t.Fatal("Publish accepted a bad record")
			} else {
				t.Log(err)
			}
			if n := len(replay.Received()); n != 0 {
				t.Errorf("a refused publish sent %d requests", n)
			}
		})
	}
}

func TestConsulRefusalsAreExplained(t *testing.T) {
	for _, tc := range []struct {
		fixture string
		entry   api.ConfigEntry
		consul  string
		ours    string
	}{
		{"038-config-splitter-bad-weights.json",
			&api.ServiceSplitterConfigEntry{Kind: api.ServiceSplitter, Name: "hello", Splits: []api.ServiceSplit{{Weight: 30, Service: "hello-00001"}}},
			"the sum of all split weights must be 100, not 30.000000", "must add up to exactly 100"},
		{"039-config-splitter-no-protocol.json",
			&api.ServiceSplitterConfigEntry{Kind: api.ServiceSplitter, Name: "plain", Splits: []api.ServiceSplit{{Weight: 100, Service: "plain-00001"}}},
			`uses a protocol \"tcp\" that does not permit advanced routing`, `protocol "http"`},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			e := fx(t, tc.fixture)
			c, replay := replayClient(t, e)
			err := c.setEntry(ctxTimeout(t, 5*time.Second), tc.entry)
			if err == nil {
				t.Fatal("no error")
			}
			assertSent(t, replay.Received()[0], e)
			msg := err.Error()
			for _, want := range []string{tc.consul, tc.ours, "write service-splitter", "500", c.Addr()} {
				if !strings.Contains(msg, want) {
					t.Errorf("error %q does not contain %q", msg, want)
				}
			}
		})
	}
}

func TestPermissionDeniedNamesTheToken(t *testing.T) {
	c, _ := replayClient(t, synthetic("ACL denied", "GET", helloKey, nil, 403, "", "Permission denied: token with AccessorID '00000000-0000-0000-0000-000000000002' lacks permission 'key:read' on \"nomad-serverless/services/default/hello\""))
	_, _, err := c.ReadRecord(ctxTimeout(t, 5*time.Second), "default", "hello")
	if !errors.Is(err, ErrPermissionDenied) {
		t.Fatalf("err %v, want ErrPermissionDenied", err)
	}
	for _, want := range []string{"CONSUL_HTTP_TOKEN", "403", "lacks permission 'key:read'"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestUnreachableConsulNamesAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	c := testClient(t, addr)
	_, _, err = c.ReadRecord(ctxTimeout(t, 5*time.Second), "default", "hello")
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err %v, want ErrUnreachable", err)
	}
	for _, want := range []string{addr, "CONSUL_HTTP_ADDR", "cannot reach Consul", "read the record of default/hello"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}

func TestReadRecordFromKV(t *testing.T) {
	c, replay := replayClient(t, fx(t, "044-kv-get.json"), fx(t, "048-kv-get-missing.json"))
	ctx := ctxTimeout(t, 5*time.Second)
	rec, idx, err := c.ReadRecord(ctx, "default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	// The recorded value is a sample ({"name","namespace","latest"}): the
	// key names the service.
	if idx != 50 || rec.Latest != "hello-00002" || rec.Service.Name != "hello" || rec.Namespace() != "default" {
		t.Errorf("record %+v at %d, want hello latest hello-00002 at 50", rec, idx)
	}
	if _, _, err := c.ReadRecord(ctx, "default", "nope"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing record: %v, want ErrNotFound", err)
	}
	assertSent(t, replay.Received()[0], fx(t, "044-kv-get.json"))
	assertSent(t, replay.Received()[1], fx(t, "048-kv-get-missing.json"))
}

func TestRecordsListsEveryService(t *testing.T) {
	// The recorder sent recurse=1; the Go client sends a bare recurse
	// (recurse=), which Consul reads the same.
	list := fx(t, "047-kv-list-recurse.json")
	list.Request.Query.Set("recurse", "")
	c, replay := replayClient(t, list)
	recs, err := c.Records(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Service.Name != "hello" || recs[0].Latest != "hello-00003" {
		t.Fatalf("records %+v", recs)
	}
	assertSent(t, replay.Received()[0], list)
}

func TestDeleteRemovesWhatPublishWroteInReverseOrder(t *testing.T) {
	rec := helloRecord()
	rec.Revisions = []string{"hello-00002"}
	rec.Deleting = []string{"hello-00001"}
	rec.Service.Traffic = nil
	del := func(kind, name string) fixtures.Exchange {
		return synthetic("delete "+kind+" "+name, "DELETE", "/v1/config/"+kind+"/"+name, nil, 200, "", map[string]any{})
	}
	ex := []fixtures.Exchange{
		kvRecord(t, rec, 50),
		fx(t, "040-config-delete-router.json"),
		del("service-splitter", "hello"),
		del("service-resolver", "hello-00001"),
		del("service-resolver", "hello-00002"),
		del("service-defaults", "hello-00001"),
		del("service-defaults", "hello-00002"),
		del("service-defaults", "hello"),
		synthetic("delete the record", "DELETE", helloKey, map[string]string{"cas": "50"}, 200, "", true),
	}
	c, replay := replayClient(t, ex...)
	if err := c.Delete(ctxTimeout(t, 10*time.Second), "default", "hello"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	got := replay.Received()
	if len(got) != len(ex) {
		t.Fatalf("sent %d requests, want %d", len(got), len(ex))
	}
	for i := range ex {
		assertSent(t, got[i], ex[i])
	}
	for _, r := range got {
		if strings.Contains(r.Path, spec.ActivatorServiceName) {
			t.Errorf("Delete touched the shared activator entry: %s %s", r.Method, r.Path)
		}
	}
}

func TestDeleteMissingServiceIsNotFound(t *testing.T) {
	c, replay := replayClient(t, withPath(fx(t, "048-kv-get-missing.json"), helloKey))
	if err := c.Delete(ctxTimeout(t, 5*time.Second), "default", "hello"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Delete: %v, want ErrNotFound", err)
	}
	if n := len(replay.Received()); n != 1 {
		t.Errorf("sent %d requests, want only the read", n)
	}
}

func TestReadRouteFromSplitterAndRouter(t *testing.T) {
	state := publishedState(t)
	c, _ := replayClient(t, state[len(state)-1], state[len(state)-2]) // splitter 035, router (032's body)
	got, err := c.ReadRoute(ctxTimeout(t, 5*time.Second), "hello")
	if err != nil {
		t.Fatal(err)
	}
	want, _ := helloRecord().Route()
	want.Namespace = ""
	if !reflect.DeepEqual(got, want) {
		t.Errorf("route %+v, want %+v", got, want)
	}

	c, _ = replayClient(t, notFoundEntry("service-splitter", "hello"), fx(t, "041-config-read-missing.json"))
	if _, err := c.ReadRoute(ctxTimeout(t, 5*time.Second), "hello"); !errors.Is(err, ErrNotFound) {
		t.Errorf("no entries: %v, want ErrNotFound", err)
	}
}

func TestDiscoveryChainOfRecordedRoute(t *testing.T) {
	c, replay := replayClient(t, fx(t, "037-discovery-chain.json"))
	ch, err := c.DiscoveryChain(ctxTimeout(t, 5*time.Second), "hello")
	if err != nil {
		t.Fatal(err)
	}
	assertSent(t, replay.Received()[0], fx(t, "037-discovery-chain.json"))
	if ch.Service != "hello" || ch.Protocol != "http" || ch.Default {
		t.Errorf("chain %s protocol %s default %v", ch.Service, ch.Protocol, ch.Default)
	}
	wantSplits := []ChainSplit{
		{Service: "hello-00001", Weight: 30, SetHeaders: map[string]string{"X-Serverless-Revision": "hello-00001"}},
		{Service: "hello-00002", Weight: 70, SetHeaders: map[string]string{"X-Serverless-Revision": "hello-00002"}},
	}
	if !reflect.DeepEqual(ch.Splits, wantSplits) {
		t.Errorf("splits %+v, want %+v", ch.Splits, wantSplits)
	}
	wantRoutes := []ChainRoute{
		{Header: "X-Serverless-Tag", Exact: "old", Service: "hello-00001", SetHeaders: map[string]string{"X-Serverless-Revision": "hello-00001"}},
		{PathPrefix: "/", Service: "hello", ToSplitter: true},
	}
	if !reflect.DeepEqual(ch.Routes, wantRoutes) {
		t.Errorf("routes %+v, want %+v", ch.Routes, wantRoutes)
	}
	for _, rev := range []string{"hello-00001", "hello-00002"} {
		r := ch.Resolvers[rev]
		if r.ConnectTimeout != 2*time.Second || !reflect.DeepEqual(r.Failover, []string{spec.ActivatorServiceName}) {
			t.Errorf("resolver %s: %+v, want 2s and failover to the activator", rev, r)
		}
	}
	// The compiled chain routes exactly as the record says.
	want, _ := helloRecord().Route()
	want.Namespace = ""
	if got := ch.Route(); !reflect.DeepEqual(got, want) {
		t.Errorf("chain route %+v, want %+v", got, want)
	}
}
