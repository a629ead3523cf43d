package controlplane

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Serve's start in two phases (issue 45): the first, one listing with
// meta (and the allocations of revisions with instances), puts every
// revision in the catalog with what routing needs, and the catalog counts
// as listed before any job is read; the second reads the jobs in the
// background, those with instances first, for scaling and tags.
func TestFeedNomadRoutesFromTheListingThenReadsTheJobs(t *testing.T) {
	scaling := spec.DefaultScaling()
	scaling.Min, scaling.Max, scaling.BurstCapacity = 1, 7, 0
	rev := func(name string, count, running int, jmi uint64) nomadjob.RevisionStatus {
		svc, gen, _ := spec.ParseRevisionName(name)
		return nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: name, Service: svc, Namespace: "team", Generation: gen,
			Concurrency: 5, Timeout: 42 * time.Second, Scaling: scaling, Count: count, ServiceTags: []string{"serverless", "urlprefix-/" + svc},
			JobModifyIndex: jmi}, Running: running}
	}
	src := &fakeNomadSource{
		revs: []nomadjob.RevisionStatus{rev("a-00001", 0, 0, 10), rev("b-00002", 0, 0, 11), rev("busy-00001", 2, 2, 12), rev("late-00001", 0, 0, 13)},
		allocs: map[string][]nomadjob.Allocation{"busy-00001": {
			{ID: "x1", Revision: "busy-00001", Address: "127.0.0.1", HTTPPort: 2000, Running: true, ClientStatus: "running", DesiredStatus: "run"},
			{ID: "x2", Revision: "busy-00001", Address: "127.0.0.1", HTTPPort: 2001, Running: true, ClientStatus: "running", DesiredStatus: "run"},
		}},
		// late-00001 is scaled to 3 while its job read waits: the event
		// is newer than what the read will return, and must stay.
		events: []nomadjob.Event{{Kind: nomadjob.EventRevisionUpdated, Revision: func() nomadjob.RevisionInfo {
			r := rev("late-00001", 3, 0, 20).RevisionInfo
			return r
		}()}},
		since:    make(chan uint64, 1),
		readGate: make(chan struct{}),
	}
	cat, tags := catalog.New(), newRevisionTags()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	listed, read := make(chan struct{}), make(chan struct{})
	var readCalls atomic.Int32
	done := make(chan error, 1)
	go func() {
		done <- feedNomad(ctx, src, cat, tags, nil, func() { close(listed) }, func() { readCalls.Add(1); close(read) }, quietLog)
	}()
	select {
	case <-listed:
	case <-time.After(10 * time.Second):
		t.Fatal("not listed while every job read waits: the first phase reads jobs")
	}
	// Phase 1: every revision, partial, with its routing fields.
	for _, name := range []string{"a-00001", "b-00002", "busy-00001"} {
		r, ok := cat.Revision(name)
		svc, gen, _ := spec.ParseRevisionName(name)
		want := catalog.Revision{Name: name, Service: svc, Namespace: "team", Generation: gen, Concurrency: 5, Timeout: 42 * time.Second,
			Scaling: spec.DefaultScaling(), Partial: true}
		if name == "busy-00001" {
			want.Desired = 2
		}
		if !ok || r != want {
			t.Errorf("after the listing %s = %+v, want %+v", name, r, want)
		}
		if tg := tags.get(name); tg != nil {
			t.Errorf("%s has tags %v before its job is read", name, tg)
		}
	}
	if a := cat.Allocations("busy-00001"); len(a) != 2 {
		t.Errorf("busy-00001's allocations %+v, want both: routable at once", a)
	}
	<-src.since
	waitFor(t, "the event applied", func() bool { r, _ := cat.Revision("late-00001"); return r.Desired == 3 && !r.Partial })

	close(src.readGate)
	select {
	case <-read:
	case <-time.After(10 * time.Second):
		t.Fatal("the second phase never said it was done")
	}
	for _, name := range []string{"a-00001", "b-00002", "busy-00001"} {
		r, _ := cat.Revision(name)
		if r.Partial || r.Scaling != scaling || r.Concurrency != 5 {
			t.Errorf("after its job read %s = %+v, want whole with its scaling", name, r)
		}
		if tg := tags.get(name); !slices.Contains(tg, "serverless") {
			t.Errorf("%s's tags %v after its job read", name, tg)
		}
	}
	if r, _ := cat.Revision("busy-00001"); r.Desired != 2 {
		t.Errorf("busy-00001 desired %d, want its job's 2", r.Desired)
	}
	if r, _ := cat.Revision("late-00001"); r.Desired != 3 {
		t.Errorf("late-00001 desired %d: the read of an older job overwrote the newer event", r.Desired)
	}
	cancel()
	<-done
	if n := readCalls.Load(); n != 1 {
		t.Errorf("read called %d times", n)
	}
}

// A listing after the event stream broke keeps the revisions whose job has
// not changed (the same job modify index) as they are, and reads only the
// jobs that changed or are new.
func TestFeedNomadListingAgainReadsOnlyChangedJobs(t *testing.T) {
	rev := func(name string, count int, jmi uint64) nomadjob.RevisionStatus {
		svc, _, _ := spec.ParseRevisionName(name)
		return nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: name, Service: svc, Count: count, Scaling: spec.DefaultScaling(), JobModifyIndex: jmi}, Running: count}
	}
	src := &fakeNomadSource{revs: []nomadjob.RevisionStatus{rev("same-00001", 1, 10), rev("scaled-00001", 1, 11)}, allocs: map[string][]nomadjob.Allocation{}}
	cat, tags, known := catalog.New(), newRevisionTags(), newJobReads()
	ctx := context.Background()
	pending, err := reconcileNomad(ctx, src, cat, tags, known, stubsOf(src.revs), quietLog)
	if err != nil {
		t.Fatal(err)
	}
	readJobs(ctx, src, cat, tags, known, pending, quietLog)
	src.read = nil
	// The second phase reads the jobs of revisions with instances first.
	src.revs = []nomadjob.RevisionStatus{rev("same-00001", 1, 10), rev("scaled-00001", 4, 30), rev("new-00001", 0, 31)}
	pending, err = reconcileNomad(ctx, src, catalog.New(), tags, newJobReads(), stubsOf(append([]nomadjob.RevisionStatus{rev("idle-00001", 0, 9)}, src.revs...)), quietLog)
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, p := range pending {
		order = append(order, p.name)
	}
	if want := []string{"same-00001", "scaled-00001", "idle-00001", "new-00001"}; !slices.Equal(order, want) {
		t.Errorf("read order %v, want those with instances first %v", order, want)
	}
	pending, err = reconcileNomad(ctx, src, cat, tags, known, stubsOf(src.revs), quietLog)
	if err != nil {
		t.Fatal(err)
	}
	if r, _ := cat.Revision("same-00001"); r.Partial {
		t.Error("an unchanged job's revision was made partial again")
	}
	if r, _ := cat.Revision("scaled-00001"); !r.Partial || r.Desired != 4 {
		t.Errorf("scaled-00001 = %+v, want partial with the summary's 4", r)
	}
	readJobs(ctx, src, cat, tags, known, pending, quietLog)
	slices.Sort(src.read)
	if want := []string{"new-00001", "scaled-00001"}; !slices.Equal(src.read, want) {
		t.Errorf("jobs read on the second listing %v, want %v", src.read, want)
	}
	for _, r := range cat.Revisions() {
		if r.Partial {
			t.Errorf("%s still partial", r.Name)
		}
	}
}

// A Nomad older than 1.6 answers the listing without meta: those jobs are
// read in the first phase, as before, so the catalog is whole when listed.
func TestFeedNomadReadsJobsTheListingHasNoMetaOf(t *testing.T) {
	r := nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: "old-00001", Service: "old", Count: 1, Concurrency: 3, Scaling: spec.DefaultScaling()}}
	src := &fakeNomadSource{revs: []nomadjob.RevisionStatus{r}, allocs: map[string][]nomadjob.Allocation{}}
	stubs := []nomadjob.RevisionStub{{RevisionInfo: nomadjob.RevisionInfo{Name: "old-00001", Namespace: "default"}}}
	cat, known := catalog.New(), newJobReads()
	pending, err := reconcileNomad(context.Background(), src, cat, newRevisionTags(), known, stubs, quietLog)
	if err != nil {
		t.Fatal(err)
	}
	if len(pending) != 0 {
		t.Errorf("pending %v, want none", pending)
	}
	if got, ok := cat.Revision("old-00001"); !ok || got.Partial || got.Concurrency != 3 || got.Desired != 1 {
		t.Errorf("old-00001 = %+v, %v: want it whole from its job", got, ok)
	}
}
