package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/internal/testbin"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// waitFor polls cond for up to 5 s: the feeders run in goroutines.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testbin.Eventually(t, 5*time.Second, 5*time.Millisecond, what, func() (bool, string) { return cond(), "" })
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

func (f *fakeNomadSource) StreamEvents(ctx context.Context, since uint64, fn func(nomadjob.Event)) (uint64, error) {
	f.since <- since
	for _, ev := range f.events {
		fn(ev)
	}
	<-ctx.Done()
	return since, ctx.Err()
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
	go func() { _ = feedNomad(ctx, src, cat, newRevisionTags(), nil, quietLog) }()
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
	applyNomadEvent(cat, newRevisionTags(), nomadjob.Event{Kind: nomadjob.EventRevisionRegistered, Revision: nomadjob.RevisionInfo{Name: "r-00001", Service: "r", Count: 2}})
	applyNomadEvent(cat, newRevisionTags(), nomadjob.Event{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "a", Revision: "r-00001", Running: true}})
	applyNomadEvent(cat, newRevisionTags(), nomadjob.Event{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "a", Revision: "r-00001", Stopped: true, ClientStatus: "complete"}})
	if n := len(cat.Allocations("r-00001")); n != 0 {
		t.Fatalf("%d allocations left after the terminal one", n)
	}
	applyNomadEvent(cat, newRevisionTags(), nomadjob.Event{Kind: nomadjob.EventRevisionUpdated, Revision: nomadjob.RevisionInfo{Name: "r-00001", Service: "r", Count: 5}})
	if r, _ := cat.Revision("r-00001"); r.Desired != 5 {
		t.Fatalf("desired = %d after a scale event, want 5", r.Desired)
	}
	applyNomadEvent(cat, newRevisionTags(), nomadjob.Event{Kind: nomadjob.EventRevisionDeregistered, Revision: nomadjob.RevisionInfo{Name: "r-00001"}})
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

// scriptedNomadSource answers a different listing each time and ends each
// stream with the error of its turn.
type scriptedNomadSource struct {
	mu       sync.Mutex
	listings [][]nomadjob.RevisionStatus
	allocs   []map[string][]nomadjob.Allocation
	ends     []error
	lists    int
	streams  int
}

func (f *scriptedNomadSource) AllRevisions(context.Context) ([]nomadjob.RevisionStatus, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := min(f.lists, len(f.listings)-1)
	f.lists++
	return f.listings[i], uint64(100 * f.lists), nil
}

func (f *scriptedNomadSource) Allocations(_ context.Context, rev string) ([]nomadjob.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.allocs[min(f.lists-1, len(f.allocs)-1)][rev], nil
}

func (f *scriptedNomadSource) StreamEvents(ctx context.Context, since uint64, _ func(nomadjob.Event)) (uint64, error) {
	f.mu.Lock()
	i := f.streams
	f.streams++
	f.mu.Unlock()
	if i < len(f.ends) {
		return since, f.ends[i]
	}
	<-ctx.Done()
	return since, ctx.Err()
}

func TestFeedNomadListsAgainWhenTheStreamEnds(t *testing.T) {
	rev := func(name string, count int) nomadjob.RevisionStatus {
		svc, _, _ := spec.ParseRevisionName(name)
		return nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: name, Service: svc, Count: count}}
	}
	running := func(id, rev string) nomadjob.Allocation {
		return nomadjob.Allocation{ID: id, Revision: rev, Running: true, ClientStatus: "running", DesiredStatus: "run"}
	}
	src := &scriptedNomadSource{
		listings: [][]nomadjob.RevisionStatus{
			{rev("gone-00001", 1), rev("kept-00001", 2)},
			{rev("kept-00001", 1), rev("new-00001", 1)},
		},
		allocs: []map[string][]nomadjob.Allocation{
			{"gone-00001": {running("g1", "gone-00001")}, "kept-00001": {running("k1", "kept-00001"), running("k2", "kept-00001")}},
			{"kept-00001": {running("k1", "kept-00001"), {ID: "k2", Revision: "kept-00001", ClientStatus: "complete", DesiredStatus: "stop"}}, "new-00001": {running("n1", "new-00001")}},
		},
		ends: []error{fmt.Errorf("%w at index 100: %w", nomadjob.ErrStreamEnded, io.EOF)},
	}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- feedNomad(ctx, src, cat, newRevisionTags(), nil, quietLog) }()
	waitFor(t, "the second listing in the catalog", func() bool {
		_, gone := cat.Revision("gone-00001")
		k, _ := cat.Revision("kept-00001")
		_, isNew := cat.Revision("new-00001")
		return !gone && isNew && k.Desired == 1 && len(cat.Allocations("kept-00001")) == 1 && len(cat.Allocations("gone-00001")) == 0
	})
	if a := cat.Allocations("kept-00001"); len(a) != 1 || a[0].ID != "k1" {
		t.Errorf("kept-00001's allocations %+v, want only k1", a)
	}
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("feedNomad returned %v after its context ended", err)
	}
}

func TestFeedNomadReturnsAPermanentStreamError(t *testing.T) {
	denied := &nomadjob.Error{Op: "watch Nomad events", Kind: nomadjob.ErrPermission, Status: 403}
	src := &scriptedNomadSource{listings: [][]nomadjob.RevisionStatus{nil}, allocs: []map[string][]nomadjob.Allocation{nil}, ends: []error{denied}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := feedNomad(ctx, src, catalog.New(), newRevisionTags(), nil, quietLog); !errors.Is(err, nomadjob.ErrPermission) {
		t.Fatalf("feedNomad = %v, want the permission error", err)
	}
}

