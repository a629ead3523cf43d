package consulroute

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/internal/fixtures"
	"github.com/nomad-serverless/nomad-serverless/spec"
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

func TestWatchReadyCallsOnceWhileIndexUnchanged(t *testing.T) {
	first := fx(t, "017-health-service-passing.json")
	timeout := fx(t, "018-health-service-blocking-timeout.json")
	c, replay, held := blockingReplay(t, "29", first, timeout)

	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	var calls [][]Instance
	var mu sync.Mutex
	done := make(chan error, 1)
	go func() {
		done <- c.WatchReady(ctx, "hello-00001", func(in []Instance) {
			mu.Lock()
			defer mu.Unlock()
			calls = append(calls, in)
		})
	}()
	waitHeld(t, held) // 017 answered, 018 timed out with index 29, now blocked again
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchReady returned %v after ctx ended", err)
	}

	mu.Lock()
	defer mu.Unlock()
	want := []Instance{
		{ID: "_nomad-task-060fbdaa-db98-48ce-5f15-9a685488cff6-group-app-hello-00001-http", Revision: "hello-00001", Address: "127.0.0.1", Port: 21508},
		{ID: "_nomad-task-7aeda235-fa62-ed5b-8c3e-46186a5d398b-group-app-hello-00001-http", Revision: "hello-00001", Address: "127.0.0.1", Port: 24721},
	}
	if len(calls) != 1 || !reflect.DeepEqual(calls[0], want) {
		t.Fatalf("fn calls %+v, want exactly one with %+v", calls, want)
	}
	got := replay.Received()
	if len(got) != 2 {
		t.Fatalf("sent %d queries, want 2 answered", len(got))
	}
	first.Request.Query.Set("wait", "1s")
	assertSent(t, got[0], first)
	assertSent(t, got[1], timeout) // index=29&wait=1s&passing=1
}

// healthEntry builds one /v1/health/service entry like fixture 017's.
func healthEntry(id, revision string, port int, tags []string, meta map[string]string) map[string]any {
	return map[string]any{
		"Node":    map[string]any{"Node": "vm", "Address": "127.0.0.1"},
		"Service": map[string]any{"ID": id, "Service": revision, "Tags": tags, "Address": "", "Port": port, "Meta": meta},
		"Checks":  []any{},
	}
}

func TestWatchReadyLeavesOutActivatorStandInsAndDedupes(t *testing.T) {
	first := fx(t, "017-health-service-passing.json")
	// Index moved (a check's output changed) but the instances did not.
	var sameBody any
	if err := json.Unmarshal(first.Response.Body, &sameBody); err != nil {
		t.Fatal(err)
	}
	same := synthetic("same instances, new index", "GET", "/v1/health/service/hello-00001", map[string]string{"passing": "1", "index": "29"}, 200, "30", sameBody)
	// Scaled to zero: only the activator's stand-in remains, plus a new
	// instance with an admin port.
	standIn := healthEntry("hello-00001-activator-r1", "hello-00001", 8080, []string{"serverless", "service=hello", spec.TagActivator}, nil)
	fresh := healthEntry("alloc-new", "hello-00001", 23000, []string{"serverless", "service=hello"}, map[string]string{"admin-port": "23001"})
	changed := synthetic("stand-in and a new instance", "GET", "/v1/health/service/hello-00001", map[string]string{"passing": "1", "index": "30"}, 200, "31", []any{standIn, fresh})
	c, _, held := blockingReplay(t, "31", first, same, changed)

	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	defer cancel()
	var mu sync.Mutex
	var calls [][]Instance
	go c.WatchReady(ctx, "hello-00001", func(in []Instance) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, in)
	})
	waitHeld(t, held)
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 {
		t.Fatalf("fn called %d times, want 2 (start, then the change; not for the same instances at a new index)", len(calls))
	}
	want := []Instance{{ID: "alloc-new", Revision: "hello-00001", Address: "127.0.0.1", Port: 23000, AdminPort: 23001}}
	if !reflect.DeepEqual(calls[1], want) {
		t.Errorf("after the change fn got %+v, want %+v (stand-in left out, node address used, admin port from meta)", calls[1], want)
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
	if err := c.WatchReady(ctx, "hello", func([]Instance) {}); err == nil {
		t.Error("WatchReady accepted a service name as a revision")
	}
	if err := c.WatchReady(ctx, "hello-00001", nil); err == nil {
		t.Error("WatchReady accepted a nil fn")
	}
	if err := c.WatchRecords(ctx, nil); err == nil {
		t.Error("WatchRecords accepted a nil fn")
	}
}

func TestWatchResetsIndexThatWentBackwards(t *testing.T) {
	first := fx(t, "017-health-service-passing.json") // index 29
	back := synthetic("index went backwards (snapshot restore)", "GET", "/v1/health/service/hello-00001",
		map[string]string{"passing": "1", "index": "29"}, 200, "5", []any{})
	fresh := synthetic("re-read without an index", "GET", "/v1/health/service/hello-00001",
		map[string]string{"passing": "1"}, 200, "6", []any{})
	c, replay, held := blockingReplay(t, "6", first, back, fresh)
	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	defer cancel()
	var mu sync.Mutex
	var calls [][]Instance
	go c.WatchReady(ctx, "hello-00001", func(in []Instance) {
		mu.Lock()
		defer mu.Unlock()
		calls = append(calls, in)
	})
	waitHeld(t, held)
	got := replay.Received()
	if len(got) != 3 || got[2].Query.Has("index") {
		t.Fatalf("after the index went backwards the watch should query without one: %+v", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(calls) != 2 || len(calls[1]) != 0 {
		t.Errorf("calls %+v, want the 2 instances then none", calls)
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
