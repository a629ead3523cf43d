package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// waitFor polls cond for up to 5 s: the feeders run in goroutines.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

type fakeNomadSource struct {
	revs   []nomadjob.RevisionStatus
	allocs map[string][]nomadjob.Allocation
	events []nomadjob.Event
	since  chan uint64
	failN  int
}

func (f *fakeNomadSource) AllRevisions(context.Context) ([]nomadjob.RevisionStatus, uint64, error) {
	if f.failN > 0 {
		f.failN--
		return nil, 0, errors.New("connection refused")
	}
	return f.revs, 42, nil
}

func (f *fakeNomadSource) Allocations(_ context.Context, rev string) ([]nomadjob.Allocation, error) {
	return f.allocs[rev], nil
}

func (f *fakeNomadSource) WatchEvents(ctx context.Context, since uint64, fn func(nomadjob.Event)) error {
	f.since <- since
	for _, ev := range f.events {
		fn(ev)
	}
	<-ctx.Done()
	return ctx.Err()
}

func TestFeedNomadListsThenFollowsFromTheListingIndex(t *testing.T) {
	info := nomadjob.RevisionInfo{Name: "hello-00001", Service: "hello", Namespace: "default", Generation: 1, Concurrency: 10, Timeout: time.Minute, Scaling: spec.DefaultScaling(), Count: 1}
	src := &fakeNomadSource{
		revs: []nomadjob.RevisionStatus{{RevisionInfo: info}, {RevisionInfo: nomadjob.RevisionInfo{Name: "old-00001", Service: "old", Stopped: true}}},
		allocs: map[string][]nomadjob.Allocation{"hello-00001": {
			{ID: "a1", Revision: "hello-00001", Address: "127.0.0.1", HTTPPort: 2000, AdminPort: 2001, Running: true, ClientStatus: "running", DesiredStatus: "run"},
			{ID: "a0", Revision: "hello-00001", ClientStatus: "complete", DesiredStatus: "stop"},
		}},
		events: []nomadjob.Event{
			{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "a2", Revision: "hello-00001", Address: "127.0.0.1", HTTPPort: 3000, Running: true, ClientStatus: "running", DesiredStatus: "run"}},
			{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "a1", Revision: "hello-00001", Address: "127.0.0.1", HTTPPort: 2000, Stopped: true, ClientStatus: "running", DesiredStatus: "stop"}},
		},
		since: make(chan uint64, 1),
		failN: 1,
	}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = feedNomad(ctx, src, cat, quietLog) }()
	select {
	case since := <-src.since:
		if since != 42 {
			t.Fatalf("followed events from %d, want the listing's index 42", since)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("never followed the event stream")
	}
	waitFor(t, "both allocations", func() bool { return len(cat.Allocations("hello-00001")) == 2 })
	rev, ok := cat.Revision("hello-00001")
	if !ok || rev.Concurrency != 10 || rev.Desired != 1 || rev.Timeout != time.Minute {
		t.Fatalf("revision = %+v, %v", rev, ok)
	}
	if _, ok := cat.Revision("old-00001"); ok {
		t.Error("a stopped revision is in the catalog")
	}
	for _, a := range cat.Allocations("hello-00001") {
		if a.ID == "a1" && a.Running {
			t.Error("a1 was told to stop but is still routable")
		}
		if a.ID == "a2" && (!a.Running || a.Port != 3000) {
			t.Errorf("a2 = %+v", a)
		}
	}
}

func TestApplyNomadEventDeletesTerminalAllocationsAndDeregisteredRevisions(t *testing.T) {
	cat := catalog.New()
	applyNomadEvent(cat, nomadjob.Event{Kind: nomadjob.EventRevisionRegistered, Revision: nomadjob.RevisionInfo{Name: "r-00001", Service: "r", Count: 2}})
	applyNomadEvent(cat, nomadjob.Event{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "a", Revision: "r-00001", Running: true}})
	applyNomadEvent(cat, nomadjob.Event{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "a", Revision: "r-00001", Stopped: true, ClientStatus: "complete"}})
	if n := len(cat.Allocations("r-00001")); n != 0 {
		t.Fatalf("%d allocations left after the terminal one", n)
	}
	applyNomadEvent(cat, nomadjob.Event{Kind: nomadjob.EventRevisionUpdated, Revision: nomadjob.RevisionInfo{Name: "r-00001", Service: "r", Count: 5}})
	if r, _ := cat.Revision("r-00001"); r.Desired != 5 {
		t.Fatalf("desired = %d after a scale event, want 5", r.Desired)
	}
	applyNomadEvent(cat, nomadjob.Event{Kind: nomadjob.EventRevisionDeregistered, Revision: nomadjob.RevisionInfo{Name: "r-00001"}})
	if _, ok := cat.Revision("r-00001"); ok {
		t.Fatal("deregistered revision still in the catalog")
	}
}

type fakeConsulSource struct {
	mu       sync.Mutex
	records  chan []consulroute.Record
	watching map[string]bool
	ready    map[string][]consulroute.Instance
}

func (f *fakeConsulSource) WatchRecords(ctx context.Context, fn func([]consulroute.Record)) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case recs := <-f.records:
			fn(recs)
		}
	}
}

func (f *fakeConsulSource) WatchReady(ctx context.Context, rev string, fn func([]consulroute.Instance)) error {
	f.mu.Lock()
	f.watching[rev] = true
	in := f.ready[rev]
	f.mu.Unlock()
	fn(in)
	<-ctx.Done()
	f.mu.Lock()
	delete(f.watching, rev)
	f.mu.Unlock()
	return nil
}

func (f *fakeConsulSource) isWatching(rev string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.watching[rev]
}

func TestFeedRecordsAddsAndRemovesServices(t *testing.T) {
	src := &fakeConsulSource{records: make(chan []consulroute.Record)}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = feedRecords(ctx, src, cat, quietLog) }()
	svc := spec.NewService("hello")
	svc.Domains = []string{"hello.example.com"}
	src.records <- []consulroute.Record{{Service: svc, Latest: "hello-00002", Revisions: []string{"hello-00002"}}}
	waitFor(t, "the service", func() bool { return len(cat.Services()) == 1 })
	s := cat.Services()[0]
	if s.Route.Splits[0].Revision != "hello-00002" || s.Domains[0] != "hello.example.com" {
		t.Fatalf("service = %+v", s)
	}
	src.records <- nil
	waitFor(t, "the service to go", func() bool { return len(cat.Services()) == 0 })
}

func TestReadyWatchersFollowTheCatalogsRevisions(t *testing.T) {
	src := &fakeConsulSource{watching: map[string]bool{}, ready: map[string][]consulroute.Instance{
		"hello-00001": {{ID: "i1", Revision: "hello-00001", Address: "127.0.0.1", Port: 1}},
	}}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	w := &readyWatchers{src: src, cat: cat, log: quietLog}
	done := make(chan struct{})
	go func() { w.run(ctx); close(done) }()
	cat.SetRevision(catalog.Revision{Name: "hello-00001"})
	waitFor(t, "ready instances", func() bool { return len(cat.Ready("hello-00001")) == 1 })
	cat.DeleteRevision("hello-00001")
	waitFor(t, "the watcher to stop", func() bool { return !src.isWatching("hello-00001") })
	cat.SetRevision(catalog.Revision{Name: "hello-00002"})
	waitFor(t, "a watcher for hello-00002", func() bool { return src.isWatching("hello-00002") })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("watchers did not stop")
	}
	if src.isWatching("hello-00002") {
		t.Fatal("a watcher outlived its context")
	}
}

type fakeStandIns struct {
	mu  sync.Mutex
	reg map[string]string
}

func (f *fakeStandIns) RegisterStandIn(_ context.Context, rev, svc, addr string, port int) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reg[rev] = svc
	return nil
}

func (f *fakeStandIns) DeregisterStandIn(_ context.Context, rev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reg, rev)
	return nil
}

func (f *fakeStandIns) names() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for r := range f.reg {
		out = append(out, r)
	}
	slices.Sort(out)
	return out
}

func TestStandInsExistOnlyWhileARevisionHasNoReadyInstance(t *testing.T) {
	f := &fakeStandIns{reg: map[string]string{}}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { keepStandIns(ctx, f, cat, "127.0.0.1", 8080, quietLog); close(done) }()
	cat.SetRevision(catalog.Revision{Name: "hello-00001", Service: "hello"})
	waitFor(t, "a stand-in", func() bool { return slices.Equal(f.names(), []string{"hello-00001"}) })
	cat.SetReady("hello-00001", []consulroute.Instance{{ID: "i1", Revision: "hello-00001"}})
	waitFor(t, "the stand-in to go", func() bool { return len(f.names()) == 0 })
	cat.SetReady("hello-00001", nil)
	waitFor(t, "the stand-in to come back at zero", func() bool { return len(f.names()) == 1 })
	cancel()
	<-done
	if len(f.names()) != 0 {
		t.Fatalf("stand-ins left registered after shutdown: %v", f.names())
	}
}
