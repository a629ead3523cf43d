package consulroute

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

// blockingReplay serves exchanges, and holds (as Consul does until the wait
// ends) any blocking query whose index the test says has nothing more to
// give. held receives one value per held request.
func blockingReplay(t *testing.T, holdIndex string, ex ...fixtures.Exchange) (*Client, *fixtures.Replay, <-chan struct{}) {
	t.Helper()
	replay := fixtures.NewReplay(t, ex...).IgnoreQuery("wait")
	held := make(chan struct{}, 16)
	var mu sync.Mutex
	seen := 0
	srv := httptest.NewServer(holdingHandler(replay, func(r *http.Request) bool {
		if r.URL.Query().Get("index") != holdIndex {
			return false
		}
		mu.Lock()
		defer mu.Unlock()
		// Let the exchanges recorded for this index answer first.
		want := 0
		for _, e := range ex {
			if e.Request.Path == r.URL.Path && e.Request.Query.Encode() != "" && strings.Contains(e.Request.Query.Encode(), "index="+holdIndex) {
				want++
			}
		}
		seen++
		if seen <= want {
			return false
		}
		held <- struct{}{}
		return true
	}))
	t.Cleanup(srv.Close)
	return testClient(t, srv.URL, WithWaitTime(time.Second)), replay, held
}

func waitHeld(t *testing.T, held <-chan struct{}) {
	t.Helper()
	select {
	case <-held:
	case <-time.After(10 * time.Second):
		t.Fatal("the watch never came back to block on the unchanged index")
	}
}

// One query follows every revision (fixtures 063, 064 from Consul 1.16.1;
// 1.22.7 answers the same): an instance passes when its checks and its
// node's pass; stand-ins (the filter leaves out those on catalog nodes by
// their check's name, the watch an earlier version's agent-held one by its
// tag), the activator and other services are left out; a node in
// maintenance fails all its instances; an unchanged index calls fn no
// more.
func TestWatchPassingFollowsEveryRevisionInOneQuery(t *testing.T) {
	c, replay, held := blockingReplay(t, "26",
		fx(t, "064-health-state-any-filtered-by-name.json"),
		fx(t, "065-health-state-any-filtered-by-name-node-maintenance.json"))
	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	defer cancel()
	var mu sync.Mutex
	var calls []Passing
	done := make(chan error, 1)
	go func() {
		done <- c.WatchPassing(ctx, func(p Passing) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, p)
		})
	}()
	waitHeld(t, held)
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchPassing returned %v after ctx ended", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []Passing{
		{
			"hello-00001": {"_nomad-task-7aeda235-1b1e-8b5c-0b3a-6d0c4d4e3f11-group-app-hello-00001-http"},
			"hello-00002": {"_nomad-task-9c1d2e3f-aaaa-bbbb-cccc-111122223333-group-app-hello-00002-http"},
		},
		{},
	}
	if !reflect.DeepEqual(calls, want) {
		t.Errorf("fn got %+v\nwant %+v", calls, want)
	}
	for _, r := range replay.Received() {
		if f := r.Query.Get("filter"); f != `Name != "nomad-serverless activator stand-in" and ("serverless" in ServiceTags or ServiceID == "")` {
			t.Errorf("query filter = %q", f)
		}
	}
}

// healthEntry builds one /v1/health/service entry like fixture 017's.
func healthEntry(id, revision string, port int, tags []string, meta map[string]string) map[string]any {
	return map[string]any{
		"Node":    map[string]any{"Node": "vm", "Address": "127.0.0.1"},
		"Service": map[string]any{"ID": id, "Service": revision, "Tags": tags, "Address": "", "Port": port, "Meta": meta},
		"Checks":  []any{},
	}
}

func TestReadyInstancesEmptyCases(t *testing.T) {
	c, replay := replayClient(t,
		fx(t, "019-health-service-unknown.json"),
		fx(t, "022-health-service-after-zero.json"),
		fx(t, "025-health-service-critical-passing.json"),
	)
	ctx := ctxTimeout(t, 5*time.Second)
	for _, rev := range []string{"nope-00001", "hello-00001", "broken-00001"} {
		in, err := c.ReadyInstances(ctx, rev)
		if err != nil || len(in) != 0 {
			t.Errorf("%s: %v, %v; want none and no error", rev, in, err)
		}
	}
	replay.AssertAllUsed(t)
}

func TestWatchRecordsCallsOnceWhileIndexUnchanged(t *testing.T) {
	list := fx(t, "047-kv-list-recurse.json")
	list.Request.Query.Set("recurse", "")
	c, replay, held := blockingReplay(t, "52", list)

	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	var mu sync.Mutex
	var calls [][]Record
	done := make(chan error, 1)
	go func() {
		done <- c.WatchRecords(ctx, func(r []Record) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, r)
		})
	}()
	waitHeld(t, held)
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 1 || len(calls[0]) != 1 || calls[0][0].Latest != "hello-00003" {
		t.Fatalf("calls %+v, want one with hello latest hello-00003", calls)
	}
	if n := len(replay.Received()); n != 1 {
		t.Errorf("%d answered queries, want 1", n)
	}
}

func TestWatchRetriesAfterErrorsWithBackoff(t *testing.T) {
	list := fx(t, "047-kv-list-recurse.json")
	list.Request.Query.Set("recurse", "")
	fail := synthetic("no leader", "GET", "/v1/kv/nomad-serverless/services/", map[string]string{"recurse": ""}, 500, "", "No cluster leader")
	c, replay, held := blockingReplay(t, "52", fail, fail, list)

	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	defer cancel()
	got := make(chan []Record, 4)
	go c.WatchRecords(ctx, func(r []Record) { got <- r })
	waitHeld(t, held)
	select {
	case r := <-got:
		if len(r) != 1 {
			t.Errorf("records %+v", r)
		}
	default:
		t.Fatal("fn was not called after Consul recovered")
	}
	if n := len(replay.Received()); n != 3 {
		t.Errorf("%d queries, want 2 failed and 1 answered", n)
	}
}

func TestWatchArgumentsValidated(t *testing.T) {
	c := testClient(t, "127.0.0.1:1")
	ctx := ctxTimeout(t, time.Second)
	if err := c.WatchPassing(ctx, nil); err == nil {
		t.Error("WatchPassing accepted a nil fn")
	}
	if err := c.WatchRecords(ctx, nil); err == nil {
		t.Error("WatchRecords accepted a nil fn")
	}
}

func TestWatchResetsIndexThatWentBackwards(t *testing.T) {
	first := fx(t, "064-health-state-any-filtered-by-name.json") // index 25
	filter := url.Values(first.Request.Query).Get("filter")
	back := synthetic("index went backwards (snapshot restore)", "GET", "/v1/health/state/any",
		map[string]string{"filter": filter, "index": "25"}, 200, "5", []any{})
	fresh := synthetic("re-read without an index", "GET", "/v1/health/state/any",
		map[string]string{"filter": filter}, 200, "6", []any{})
	c, replay, held := blockingReplay(t, "6", first, back, fresh)
	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	defer cancel()
	var mu sync.Mutex
	var calls []Passing
	go c.WatchPassing(ctx, func(p Passing) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, p)
	})
	waitHeld(t, held)
	got := replay.Received()
	if len(got) != 3 || got[2].Query.Has("index") {
		t.Fatalf("after the index went backwards the watch should query without one: %+v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || len(calls[0]) != 2 || len(calls[1]) != 0 {
		t.Errorf("calls %+v, want two revisions' instances, then none", calls)
	}
}

func TestHealthListsFailingInstancesWithTheirOutput(t *testing.T) {
	critical := fx(t, "024-health-service-critical-all.json")
	passing := withPath(fx(t, "017-health-service-passing.json"), "/v1/health/service/hello-00001")
	passing.Request.Query = fixtures.Query{}
	c, replay := replayClient(t, critical, passing)
	ctx := ctxTimeout(t, 5*time.Second)

	h, err := c.Health(ctx, "broken-00001")
	if err != nil {
		t.Fatal(err)
	}
	assertSent(t, replay.Received()[0], critical)
	if len(h) != 1 || h[0].ID != "broken-00001-a" || h[0].Passing || h[0].Status != "critical" || h[0].Port != 1 {
		t.Errorf("health %+v, want broken-00001-a critical", h)
	}
	h, err = c.Health(ctx, "hello-00001")
	if err != nil {
		t.Fatal(err)
	}
	if len(h) != 2 || !h[0].Passing || !h[1].Passing || h[0].Output != "HTTP GET http://127.0.0.1:21508/: 200 OK Output: queue" {
		t.Errorf("health %+v, want two passing with the sidecar's check output", h)
	}
}

func TestGatewaysFromActivatorRegistrations(t *testing.T) {
	a := healthEntry("nomad-serverless-activator-b", spec.ActivatorServiceName, 8080, []string{"serverless"},
		map[string]string{"admin-port": "9091", "domain": "example.com", "replica": "b"})
	b := healthEntry("nomad-serverless-activator-a", spec.ActivatorServiceName, 8080, []string{"serverless"},
		map[string]string{"domain": "example.com", "replica": "a"})
	c, _ := replayClient(t, synthetic("activators", "GET", "/v1/health/service/"+spec.ActivatorServiceName, map[string]string{"passing": "1"}, 200, "60", []any{a, b}))
	gws, err := c.Gateways(ctxTimeout(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(gws) != 2 || gws[0].Replica != "a" || gws[1].AdminPort != 9091 || gws[0].Domain != "example.com" || gws[0].HostPort() != "127.0.0.1:8080" {
		t.Errorf("gateways %+v", gws)
	}
}

func TestLeaderGatewayIsTheLockHoldersRegistration(t *testing.T) {
	activators := func(entries ...any) fixtures.Exchange {
		return synthetic("activators", "GET", "/v1/health/service/"+spec.ActivatorServiceName, map[string]string{"passing": "1"}, 200, "60", entries)
	}
	other := healthEntry("nomad-serverless-activator-replica-2", spec.ActivatorServiceName, 8080, []string{"serverless"},
		map[string]string{"admin-port": "9092", "replica": "replica-2"})
	noAdmin := healthEntry("nomad-serverless-activator-replica-1", spec.ActivatorServiceName, 8080, []string{"serverless"},
		map[string]string{"replica": "replica-1"})
	leader := healthEntry("nomad-serverless-activator-replica-1", spec.ActivatorServiceName, 8080, []string{"serverless"},
		map[string]string{"admin-port": "9091", "replica": "replica-1"})
	// Fixture 053: the lock is held, its value names replica-1.
	c, replay := replayClient(t,
		fx(t, "053-lock-read.json"), activators(other, noAdmin),
		fx(t, "053-lock-read.json"), activators(other, leader),
	)
	ctx := ctxTimeout(t, 5*time.Second)
	if g, ok, err := c.LeaderGateway(ctx, leaderKey); err != nil || ok {
		t.Errorf("LeaderGateway = %+v, %v, %v; want none while the holder has no admin port", g, ok, err)
	}
	g, ok, err := c.LeaderGateway(ctx, leaderKey)
	if err != nil || !ok || g.Replica != "replica-1" || g.AdminHostPort() != "127.0.0.1:9091" {
		t.Errorf("LeaderGateway = %+v, %v, %v; want replica-1 with admin 127.0.0.1:9091", g, ok, err)
	}
	replay.AssertAllUsed(t)

	free := synthetic("lock key never taken", "GET", "/v1/kv/"+leaderKey, nil, 404, "56", nil)
	c, replay = replayClient(t, free)
	if g, ok, err := c.LeaderGateway(ctx, leaderKey); err != nil || ok {
		t.Errorf("LeaderGateway of a free lock = %+v, %v, %v; want none", g, ok, err)
	}
	if n := len(replay.Received()); n != 1 {
		t.Errorf("sent %d requests for a free lock, want only the read of the key", n)
	}
}
