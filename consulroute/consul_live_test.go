package consulroute

// Tests against a real Consul agent, run when CONSUL_HTTP_ADDR is set (for
// example by `nomad-serverless dev` or the e2e setup):
// `CONSUL_HTTP_ADDR=127.0.0.1:8500 go test ./consulroute -run TestLive -v`. Each test works on
// service names of its own and removes what it wrote.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"reflect"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// TestLive groups every live case so that without an agent the run says
// so once.
func TestLive(t *testing.T) {
	if os.Getenv("CONSUL_HTTP_ADDR") == "" {
		t.Skip("CONSUL_HTTP_ADDR is not set: skipping the tests against a real Consul agent")
	}
	t.Run("PublishChainIdempotentDelete", livePublishChainIdempotentDelete)
	t.Run("ConsulRefusalIsExplained", liveConsulRefusalIsExplained)
	t.Run("WatchReadyIgnoresStandIn", liveWatchPassingIgnoresStandIn)
	t.Run("StandInsOnCatalogNodes", liveStandInsOnCatalogNodes)
	t.Run("LockTakeover", liveLockTakeover)
	t.Run("LockBoundToCheck", func(t *testing.T) {
		// Consul runs checks at most once a second.
		lockBoundToCheck(t, os.Getenv("CONSUL_HTTP_ADDR"), time.Second, LockDelay)
	})
}

func liveClient(t *testing.T, opts ...Option) *Client {
	t.Helper()
	opts = append([]Option{WithLogger(quietLogger()), WithBackoff(50*time.Millisecond, time.Second), WithWaitTime(5 * time.Second)}, opts...)
	c, err := NewClient(api.DefaultConfig(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// liveName is a service name no other run uses ("live" + 8 hex digits).
func liveName(t *testing.T) string {
	b := make([]byte, 4)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return "live" + hex.EncodeToString(b)
}

func liveRecord(name string) Record {
	s := spec.NewService(name)
	s.Traffic = []spec.TrafficTarget{
		{Revision: spec.RevisionName(name, 1), Percent: 30, Tag: "old"},
		{Latest: true, Percent: 70},
	}
	return Record{Service: s, Latest: spec.RevisionName(name, 2),
		Revisions: []string{spec.RevisionName(name, 1), spec.RevisionName(name, 2)}, UpdatedAt: time.Now().UTC()}
}

func entryIndexes(t *testing.T, c *Client, name string) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, k := range []struct{ kind, name string }{
		{api.ServiceDefaults, name}, {api.ServiceDefaults, name + "-00001"}, {api.ServiceDefaults, name + "-00002"},
		{api.ServiceResolver, name + "-00001"}, {api.ServiceResolver, name + "-00002"},
		{api.ServiceRouter, name}, {api.ServiceSplitter, name},
	} {
		e, _, err := c.api.ConfigEntries().Get(k.kind, k.name, nil)
		if err != nil {
			t.Fatalf("read %s %s: %v", k.kind, k.name, err)
		}
		out[k.kind+"/"+k.name] = e.GetModifyIndex()
	}
	return out
}

func livePublishChainIdempotentDelete(t *testing.T) {
	c := liveClient(t)
	ctx := ctxTimeout(t, 60*time.Second)
	name := liveName(t)
	rec := liveRecord(name)
	t.Cleanup(func() { _ = c.Delete(context.Background(), "default", name) })

	if err := c.Publish(ctx, rec, 0); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	ch, err := c.DiscoveryChain(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	r1, r2 := spec.RevisionName(name, 1), spec.RevisionName(name, 2)
	wantSplits := []ChainSplit{
		{Service: r1, Weight: 30, SetHeaders: map[string]string{spec.RevisionHeader: r1}},
		{Service: r2, Weight: 70, SetHeaders: map[string]string{spec.RevisionHeader: r2}},
	}
	if !reflect.DeepEqual(ch.Splits, wantSplits) {
		t.Errorf("compiled splits %+v, want %+v", ch.Splits, wantSplits)
	}
	if len(ch.Routes) < 2 || ch.Routes[0].Header != spec.TagHeader || ch.Routes[0].Exact != "old" || ch.Routes[0].Service != r1 {
		t.Errorf("compiled routes %+v, want the old tag to %s first", ch.Routes, r1)
	}
	for _, rev := range []string{r1, r2} {
		if got := ch.Resolvers[rev].Failover; !reflect.DeepEqual(got, []string{spec.ActivatorServiceName}) {
			t.Errorf("%s fails over to %v, want the activator", rev, got)
		}
	}
	want, _ := rec.Route()
	want.Namespace = ""
	if got := ch.Route(); !reflect.DeepEqual(got, want) {
		t.Errorf("chain route %+v, want %+v", got, want)
	}

	// Idempotent: a second publish changes no entry's ModifyIndex.
	before := entryIndexes(t, c, name)
	got, idx, err := c.ReadRecord(ctx, "default", name)
	if err != nil {
		t.Fatal(err)
	}
	if got.Latest != rec.Latest {
		t.Errorf("record latest %s", got.Latest)
	}
	if err := c.Publish(ctx, rec, idx); err != nil {
		t.Fatal(err)
	}
	if after := entryIndexes(t, c, name); !reflect.DeepEqual(before, after) {
		t.Errorf("second publish rewrote entries: before %v after %v", before, after)
	}
	if _, idx2, _ := c.ReadRecord(ctx, "default", name); idx2 != idx {
		t.Errorf("second publish rewrote the record (index %d -> %d)", idx, idx2)
	}
	if err := c.Publish(ctx, rec, idx-1); !errors.Is(err, ErrConflict) {
		t.Errorf("stale index: %v, want ErrConflict", err)
	}

	if err := c.Delete(ctx, "default", name); err != nil {
		t.Fatal(err)
	}
	for k := range before {
		kind, n, _ := strings.Cut(k, "/")
		if _, _, err := c.api.ConfigEntries().Get(kind, n, nil); err == nil {
			t.Errorf("%s still exists after Delete", k)
		}
	}
	if _, _, err := c.ReadRecord(ctx, "default", name); !errors.Is(err, ErrNotFound) {
		t.Errorf("record after Delete: %v", err)
	}
}

func liveConsulRefusalIsExplained(t *testing.T) {
	c := liveClient(t)
	name := liveName(t)
	err := c.setEntry(ctxTimeout(t, 10*time.Second), splitterFor(Route{Service: name, Splits: []Split{{Revision: name + "-00001", Percent: 100}}}))
	if err == nil {
		_ = c.deleteEntry(context.Background(), api.ServiceSplitter, name)
		t.Fatal("Consul accepted a splitter for a tcp service (is a proxy-defaults setting protocol http?)")
	}
	if !strings.Contains(err.Error(), "does not permit advanced routing") || !strings.Contains(err.Error(), "set it back to http") {
		t.Errorf("error %q", err)
	}
}

func liveWatchPassingIgnoresStandIn(t *testing.T) {
	c := liveClient(t, WithReplica("live"))
	ctx, cancel := context.WithCancel(ctxTimeout(t, 60*time.Second))
	defer cancel()
	name := liveName(t)
	rev := spec.RevisionName(name, 1)
	inst := &api.AgentServiceRegistration{ID: rev + "-inst", Name: rev, Port: 20001, Address: "127.0.0.1",
		Tags: []string{spec.TagServerless}, Meta: map[string]string{spec.ServiceMetaAdminPort: "20002"},
		Check: &api.AgentServiceCheck{TTL: "1m", Status: api.HealthPassing}}
	if err := c.api.Agent().ServiceRegister(inst); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.api.Agent().ServiceDeregister(inst.ID) })
	if err := c.RegisterStandIn(ctx, rev, name, "127.0.0.1", 20001); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.DeregisterStandIn(context.Background(), rev) })

	seen := make(chan Passing, 8)
	go c.WatchPassing(ctx, func(p Passing) { seen <- p })
	deadline := time.After(30 * time.Second)
	for {
		select {
		case p := <-seen:
			// The stand-in passes; it must never be listed.
			if slices.Contains(p[rev], c.StandInID(rev)) {
				t.Fatalf("stand-in listed: %+v", p[rev])
			}
			if slices.Equal(p[rev], []string{inst.ID}) {
				return
			}
		case <-deadline:
			t.Fatal("the passing instance never showed up")
		}
	}
}

// Stand-ins on catalog nodes without an agent: they pass in Consul's
// health answers (no serfHealth on their node), each replica lists its own
// back, and removing a replica's nodes removes its stand-ins; absent
// stand-ins and nodes are not errors.
func liveStandInsOnCatalogNodes(t *testing.T) {
	name := liveName(t)
	rev := spec.RevisionName(name, 1)
	a, b := liveClient(t, WithReplica(name+"-a")), liveClient(t, WithReplica(name+"-b"))
	ctx := ctxTimeout(t, 30*time.Second)
	t.Cleanup(func() {
		_, _ = a.RemoveStandInsOf(context.Background(), name+"-a")
		_, _ = b.RemoveStandInsOf(context.Background(), name+"-b")
	})
	for _, c := range []*Client{a, b} {
		if err := c.RegisterStandIn(ctx, rev, name, "127.0.0.1", 20001, "urlprefix-"+name+"/"); err != nil {
			t.Fatal(err)
		}
	}
	entries, _, err := a.api.Health().Service(rev, spec.TagActivator, true, nil)
	if err != nil || len(entries) != 2 {
		t.Fatalf("passing stand-ins of %s: %d, %v; want 2", rev, len(entries), err)
	}
	for _, e := range entries {
		if !strings.HasPrefix(e.Node.Node, StandInNodePrefix) || len(e.Checks) != 1 || e.Checks[0].Status != api.HealthPassing {
			t.Errorf("stand-in %s on node %s with checks %+v", e.Service.ID, e.Node.Node, e.Checks)
		}
	}
	nodes, err := a.StandInNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if own, err := b.OwnStandIns(ctx, nodes); err != nil || !slices.Equal(own, []string{rev}) {
		t.Fatalf("b's OwnStandIns = %v, %v", own, err)
	}
	removed, err := a.RemoveStandInsOf(ctx, name+"-b")
	if err != nil || !slices.Equal(removed, []string{b.StandInNode(rev)}) {
		t.Fatalf("RemoveStandInsOf(b) = %v, %v; want %s", removed, err, b.StandInNode(rev))
	}
	if own, err := b.OwnStandIns(ctx, nodes); err != nil || len(own) != 0 {
		t.Errorf("b's OwnStandIns after its node went = %v, %v", own, err)
	}
	if err := b.DeregisterStandIn(ctx, rev); err != nil {
		t.Errorf("deregister a stand-in whose node is gone: %v", err)
	}
	if err := b.RemoveStandInNode(ctx, removed[0]); err != nil {
		t.Errorf("remove an absent node: %v", err)
	}
	if err := a.DeregisterStandIn(ctx, rev); err != nil {
		t.Fatal(err)
	}
	if entries, _, err := a.api.Health().Service(rev, "", false, nil); err != nil || len(entries) != 0 {
		t.Errorf("instances of %s left: %d, %v", rev, len(entries), err)
	}
}

func liveLockTakeover(t *testing.T) {
	ca := liveClient(t, WithReplica("a"))
	cb := liveClient(t, WithReplica("b"))
	key := LeaderKeyPrefix + liveName(t)
	t.Cleanup(func() { _, _ = ca.api.KV().Delete(key, nil) })
	la, lb := ca.NewLock(key, "a", 10*time.Second), cb.NewLock(key, "b", 10*time.Second)

	var leaders atomic.Int32
	started := make(chan string, 4)
	lead := func(n string) func(context.Context) {
		return func(ctx context.Context) {
			if leaders.Add(1) > 1 {
				t.Error("two leaders at once")
			}
			started <- n
			<-ctx.Done()
			leaders.Add(-1)
		}
	}
	ctxA, cancelA := context.WithCancel(ctxTimeout(t, 60*time.Second))
	ctxB, cancelB := context.WithCancel(ctxTimeout(t, 60*time.Second))
	defer cancelB()
	doneA := make(chan error, 1)
	go func() { doneA <- la.Run(ctxA, lead("a")) }()
	select {
	case n := <-started:
		if n != "a" {
			t.Fatal(n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a never led")
	}
	doneB := make(chan error, 1)
	go func() { doneB <- lb.Run(ctxB, lead("b")) }()
	if h, ok, err := cb.Leader(ctxB, key); err != nil || !ok || h != "a" {
		t.Errorf("Leader = %q %v %v", h, ok, err)
	}
	cancelA()
	<-doneA
	select {
	case n := <-started:
		if n != "b" {
			t.Fatal(n)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("b did not take over within 20s")
	}
	cancelB()
	<-doneB
}
