package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

// waitFor polls cond for up to 5 s: the feeders run in goroutines.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testbin.Eventually(t, 20*time.Second, 5*time.Millisecond, what, func() (bool, string) { return cond(), "" })
}

type fakeNomadSource struct {
	mu     sync.Mutex
	asked  []string // revisions whose allocations were listed
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
	f.mu.Lock()
	f.asked = append(f.asked, rev)
	f.mu.Unlock()
	return f.allocs[rev], nil
}

// A listing reads the allocations of the revisions that have instances,
// not of those at rest (count 0, nothing running, starting or queued),
// and a revision at rest keeps no allocation in the catalog.
func TestReconcileReadsAllocationsOnlyOfRevisionsNotAtRest(t *testing.T) {
	rev := func(name string, count, running int) nomadjob.RevisionStatus {
		svc, _, _ := spec.ParseRevisionName(name)
		return nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: name, Service: svc, Count: count}, Running: running}
	}
	src := &fakeNomadSource{
		revs: []nomadjob.RevisionStatus{rev("idle-00001", 0, 0), rev("busy-00001", 1, 1), rev("stopping-00001", 0, 1), rev("waking-00001", 1, 0)},
		allocs: map[string][]nomadjob.Allocation{
			"busy-00001": {{ID: "b1", Revision: "busy-00001", Running: true, ClientStatus: "running", DesiredStatus: "run"}},
		},
	}
	cat := catalog.New()
	cat.SetRevision(catalog.Revision{Name: "idle-00001", Service: "idle"})
	cat.SetAllocation(catalog.Allocation{ID: "i1", Revision: "idle-00001", Running: true}) // stopped since
	reconcileNomad(context.Background(), src, cat, newRevisionTags(), src.revs, quietLog)
	slices.Sort(src.asked)
	if want := []string{"busy-00001", "stopping-00001", "waking-00001"}; !slices.Equal(src.asked, want) {
		t.Errorf("allocations listed of %v, want %v", src.asked, want)
	}
	if a := cat.Allocations("idle-00001"); len(a) != 0 {
		t.Errorf("the revision at rest kept allocations %+v", a)
	}
	if a := cat.Allocations("busy-00001"); len(a) != 1 || a[0].ID != "b1" {
		t.Errorf("busy-00001's allocations %+v, want b1", a)
	}
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
	go func() { _ = feedNomad(ctx, src, cat, newRevisionTags(), nil, nil, quietLog) }()
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

// wakeLog records what the feed tells the wake timelines.
type wakeLog struct{ notes []string }

func (w *wakeLog) NoteScaledFromZero(rev string, at time.Time) {
	w.notes = append(w.notes, fmt.Sprintf("scaled %s %d", rev, at.UnixNano()))
}
func (w *wakeLog) NoteEvaluation(rev, id string, created time.Time) {
	w.notes = append(w.notes, fmt.Sprintf("eval %s %s %d", rev, id, created.UnixNano()))
}
func (w *wakeLog) NoteAllocation(a activator.AllocationTimes) {
	w.notes = append(w.notes, fmt.Sprintf("alloc %s %s %s placed %d received %d sidecar %d app %d", a.Revision, a.ID, a.EvalID,
		a.Placed.UnixNano(), a.Received.UnixNano(), a.SidecarStarted.UnixNano(), a.AppStarted.UnixNano()))
}

// The wake timelines hear of a count raised from zero (not of a first
// registration, nor of a raise from one), with the time Nomad wrote it, of
// evaluations, and of allocations with ports that are not stopping.
func TestNoteWake(t *testing.T) {
	cat := catalog.New()
	wl := &wakeLog{}
	apply := func(ev nomadjob.Event) {
		noteWake(cat, wl, ev)
		applyNomadEvent(cat, newRevisionTags(), ev)
	}
	at := func(ms int64) time.Time { return time.Unix(0, ms*int64(time.Millisecond)) }
	rev := func(count int) nomadjob.RevisionInfo {
		return nomadjob.RevisionInfo{Name: "r-00001", Service: "r", Count: count}
	}
	apply(nomadjob.Event{Kind: nomadjob.EventRevisionRegistered, Revision: rev(1), Submitted: at(1)})
	apply(nomadjob.Event{Kind: nomadjob.EventRevisionUpdated, Revision: rev(0), Submitted: at(2)})
	apply(nomadjob.Event{Kind: nomadjob.EventRevisionUpdated, Revision: rev(1), Submitted: at(3)})
	apply(nomadjob.Event{Kind: nomadjob.EventRevisionUpdated, Revision: rev(2), Submitted: at(4)})
	apply(nomadjob.Event{Kind: nomadjob.EventEvaluationUpdated, Evaluation: nomadjob.EvaluationEvent{ID: "e", Revision: "r-00001", Created: at(5)}})
	apply(nomadjob.Event{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "a", Revision: "r-00001", HTTPPort: 80,
		EvalID: "e", Created: at(6), Received: at(7), SidecarStarted: at(8), AppStarted: at(9)}})
	apply(nomadjob.Event{Kind: nomadjob.EventAllocationUpdated, Allocation: nomadjob.AllocationEvent{ID: "b", Revision: "r-00001", HTTPPort: 80, Stopped: true}})
	want := []string{
		"scaled r-00001 3000000",
		"eval r-00001 e 5000000",
		"alloc r-00001 a e placed 6000000 received 7000000 sidecar 8000000 app 9000000",
	}
	if !slices.Equal(wl.notes, want) {
		t.Errorf("notes:\n%s\nwant\n%s", strings.Join(wl.notes, "\n"), strings.Join(want, "\n"))
	}
}

type fakeConsulSource struct {
	records chan []consulroute.Record
	passing chan consulroute.Passing
	// watches counts WatchPassing calls: one, however many revisions.
	watches atomic.Int32
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

func (f *fakeConsulSource) WatchPassing(ctx context.Context, fn func(consulroute.Passing)) error {
	f.watches.Add(1)
	for {
		select {
		case <-ctx.Done():
			return nil
		case p := <-f.passing:
			fn(p)
		}
	}
}

func TestFeedRecordsAddsAndRemovesServices(t *testing.T) {
	src := &fakeConsulSource{records: make(chan []consulroute.Record)}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = feedRecords(ctx, src, cat, nil, quietLog) }()
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

// One watch feeds every revision's ready instances: Consul's passing
// service IDs joined with Nomad's allocations. An instance whose
// allocation Nomad no longer has (lost, complete) is not ready however
// Consul lists it, and one Nomad has not told us of yet waits for it.
func TestFeedReadyJoinsConsulsPassingWithNomadsAllocations(t *testing.T) {
	const (
		a1 = "7aeda235-1b1e-8b5c-0b3a-6d0c4d4e3f11"
		a2 = "060fbdaa-51c1-3d2e-9f5a-2b1c0e9a7d22"
		b1 = "9c1d2e3f-aaaa-bbbb-cccc-111122223333"
	)
	sid := func(alloc, rev string) string { return "_nomad-task-" + alloc + "-group-app-" + rev + "-http" }
	src := &fakeConsulSource{passing: make(chan consulroute.Passing)}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- feedReady(ctx, src, cat, nil, nil, quietLog) }()
	for _, r := range []string{"hello-00001", "hello-00002"} {
		cat.SetRevision(catalog.Revision{Name: r, Service: "hello", Desired: 1})
	}
	cat.SetAllocation(catalog.Allocation{ID: a1, Revision: "hello-00001", Address: "127.0.0.2", Port: 2000, AdminPort: 2001, Running: true})
	cat.SetAllocation(catalog.Allocation{ID: a2, Revision: "hello-00001", Address: "127.0.0.3", Port: 3000, AdminPort: 3001, Running: true})
	src.passing <- consulroute.Passing{
		"hello-00001": {sid(a1, "hello-00001"), sid(a2, "hello-00001")},
		"hello-00002": {sid(b1, "hello-00002"), "not-from-nomad"},
		"other-00001": {sid(b1, "other-00001")},
	}
	want := []consulroute.Instance{
		{ID: sid(a1, "hello-00001"), Revision: "hello-00001", Address: "127.0.0.2", Port: 2000, AdminPort: 2001},
		{ID: sid(a2, "hello-00001"), Revision: "hello-00001", Address: "127.0.0.3", Port: 3000, AdminPort: 3001},
	}
	waitFor(t, "both instances of hello-00001 ready at Nomad's addresses", func() bool {
		return slices.Equal(cat.Ready("hello-00001"), want)
	})
	if r := cat.Ready("hello-00002"); len(r) != 0 {
		t.Errorf("hello-00002 ready %+v before Nomad told of its allocation", r)
	}
	// Nomad tells of b1: ready without a new answer from Consul.
	cat.SetAllocation(catalog.Allocation{ID: b1, Revision: "hello-00002", Address: "127.0.0.2", Port: 4000, Running: true})
	waitFor(t, "hello-00002 ready once Nomad has its allocation", func() bool { return len(cat.Ready("hello-00002")) == 1 })
	// Nomad marks a2 lost (the catalog forgets terminal allocations)
	// while Consul still lists its orphaned task passing.
	cat.DeleteAllocation(a2)
	waitFor(t, "the lost instance out of hello-00001's ready set", func() bool {
		return slices.Equal(cat.Ready("hello-00001"), want[:1])
	})
	src.passing <- consulroute.Passing{}
	waitFor(t, "nothing ready once Consul says so", func() bool {
		return len(cat.Ready("hello-00001")) == 0 && len(cat.Ready("hello-00002")) == 0
	})
	if n := src.watches.Load(); n != 1 {
		t.Errorf("%d Consul watches for two revisions, want 1", n)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("feedReady returned %v after its context ended", err)
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
	go func() { done <- feedNomad(ctx, src, cat, newRevisionTags(), nil, nil, quietLog) }()
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
	if err := feedNomad(ctx, src, catalog.New(), newRevisionTags(), nil, nil, quietLog); !errors.Is(err, nomadjob.ErrPermission) {
		t.Fatalf("feedNomad = %v, want the permission error", err)
	}
}

// A starting serve opens its gateway once the catalog is whole; the
// feeders say when their part is.
func TestFeedRecordsSaysWhenLoaded(t *testing.T) {
	src := &fakeConsulSource{records: make(chan []consulroute.Record)}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var calls atomic.Int32
	servicesAtLoad := make(chan int, 2)
	go func() {
		_ = feedRecords(ctx, src, cat, func() {
			calls.Add(1)
			servicesAtLoad <- len(cat.Services())
		}, quietLog)
	}()
	src.records <- []consulroute.Record{{Service: spec.NewService("hello"), Latest: "hello-00001", Revisions: []string{"hello-00001"}}}
	if n := <-servicesAtLoad; n != 1 {
		t.Errorf("loaded with %d services in the catalog, want the first answer's 1", n)
	}
	src.records <- nil
	waitFor(t, "the second answer", func() bool { return len(cat.Services()) == 0 })
	if n := calls.Load(); n != 1 {
		t.Errorf("loaded called %d times, want once", n)
	}
}

func TestFeedReadyJoinedOnlyAfterNomadsListing(t *testing.T) {
	const a1 = "7aeda235-1b1e-8b5c-0b3a-6d0c4d4e3f11"
	sid := "_nomad-task-" + a1 + "-group-app-hello-00001-http"
	src := &fakeConsulSource{passing: make(chan consulroute.Passing)}
	cat := catalog.New()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listed := make(chan struct{})
	var calls atomic.Int32
	readyAtJoin := make(chan int, 2)
	go func() {
		_ = feedReady(ctx, src, cat, listed, func() {
			calls.Add(1)
			readyAtJoin <- len(cat.Ready("hello-00001"))
		}, quietLog)
	}()
	// Consul answers before Nomad's listing is in: not whole yet.
	src.passing <- consulroute.Passing{"hello-00001": {sid}}
	cat.SetRevision(catalog.Revision{Name: "hello-00001", Service: "hello", Desired: 1})
	cat.SetAllocation(catalog.Allocation{ID: a1, Revision: "hello-00001", Address: "127.0.0.2", Port: 2000, Running: true})
	waitFor(t, "the instance joined", func() bool { return len(cat.Ready("hello-00001")) == 1 })
	select {
	case n := <-readyAtJoin:
		t.Fatalf("joined called before the listing was whole (%d ready)", n)
	case <-time.After(50 * time.Millisecond):
	}
	// The listing is whole, with no further change to the catalog: the
	// feeder joins once more and says so.
	close(listed)
	select {
	case n := <-readyAtJoin:
		if n != 1 {
			t.Errorf("joined with %d ready, want 1", n)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("joined not called after the listing")
	}
	src.passing <- consulroute.Passing{}
	waitFor(t, "the next answer", func() bool { return len(cat.Ready("hello-00001")) == 0 })
	if n := calls.Load(); n != 1 {
		t.Errorf("joined called %d times, want once", n)
	}
}

func TestAwaitCatalog(t *testing.T) {
	returned := func(f func()) <-chan struct{} {
		done := make(chan struct{})
		go func() { f(); close(done) }()
		return done
	}
	a, b := make(chan struct{}), make(chan struct{})
	done := returned(func() { awaitCatalog(context.Background(), time.Minute, quietLog, a, b) })
	close(b)
	select {
	case <-done:
		t.Fatal("returned with one of two parts loaded")
	case <-time.After(50 * time.Millisecond):
	}
	close(a)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("not returned once both parts loaded")
	}

	// Past its bound it returns, and says why the gateway opens anyway.
	var logged testbin.Buffer
	log := slog.New(slog.NewTextHandler(&logged, nil))
	done = returned(func() { awaitCatalog(context.Background(), 20*time.Millisecond, log, make(chan struct{})) })
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("not returned past its bound")
	}
	if !strings.Contains(logged.String(), "before the catalog has loaded") {
		t.Errorf("log %q", logged.String())
	}

	// A serve stopping meanwhile does not wait.
	ctx, cancel := context.WithCancel(context.Background())
	done = returned(func() { awaitCatalog(ctx, time.Minute, quietLog, make(chan struct{})) })
	cancel()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("not returned when its context ended")
	}
}
