package consulroute

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// noDanglingRoutes fails the test when, after any single write, a splitter
// or router of ours names a revision without its resolver (failover to the
// activator) or without protocol http: the state Publish's order must never
// pass through.
func noDanglingRoutes(t *testing.T, service string) func(f *fakeConsul) {
	return func(f *fakeConsul) {
		for _, kind := range []string{"service-splitter", "service-router"} {
			e := f.entry(kind, service)
			if e == nil {
				continue
			}
			for _, rev := range targets(kind, e.body) {
				if f.entry("service-resolver", rev) == nil {
					t.Errorf("after %q: %s %s names %s, which has no resolver", f.writes[len(f.writes)-1], kind, service, rev)
				}
				if f.protocol(rev) != "http" {
					t.Errorf("after %q: %s %s names %s, whose protocol is %s", f.writes[len(f.writes)-1], kind, service, rev, f.protocol(rev))
				}
			}
		}
	}
}

func recordWith(traffic []spec.TrafficTarget, latest string, revs, deleting []string) Record {
	s := spec.NewService("hello")
	s.Traffic = traffic
	return Record{Service: s, Latest: latest, Revisions: revs, Deleting: deleting, UpdatedAt: time.Unix(1700000000, 0).UTC()}
}

// publish reads the record's index and publishes, as deploy does.
func publish(t *testing.T, c *Client, rec Record) {
	t.Helper()
	ctx := ctxTimeout(t, 10*time.Second)
	_, idx, err := c.ReadRecord(ctx, rec.Service.Namespace, rec.Service.Name)
	if err != nil && !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
	if err := c.Publish(ctx, rec, idx); err != nil {
		t.Fatalf("Publish: %v", err)
	}
	route, err := c.ReadRoute(ctx, rec.Service.Name)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := rec.Route()
	want.Namespace = ""
	if !reflect.DeepEqual(route, want) {
		t.Fatalf("Consul routes %+v, record says %+v", route, want)
	}
}

func TestPublishLifecycleAgainstFakeConsul(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	ctx := ctxTimeout(t, 20*time.Second)
	f.afterWrite = noDanglingRoutes(t, "hello")

	// Someone else's entries, and a service-defaults of ours someone tuned.
	f.mu.Lock()
	f.entries["service-defaults"] = map[string]*fakeEntry{
		"other":       {body: map[string]any{"Kind": "service-defaults", "Name": "other", "Protocol": "grpc"}, create: 1, modify: 1},
		"hello-00001": {body: map[string]any{"Kind": "service-defaults", "Name": "hello-00001", "Protocol": "tcp", "MaxInboundConnections": 10.0}, create: 1, modify: 1},
	}
	f.entries["service-resolver"] = map[string]*fakeEntry{
		"other": {body: map[string]any{"Kind": "service-resolver", "Name": "other", "ConnectTimeout": "9s"}, create: 1, modify: 1},
	}
	f.mu.Unlock()

	// 1: first revision takes everything.
	v1 := recordWith(nil, "hello-00001", []string{"hello-00001"}, nil)
	publish(t, c, v1)
	f.mu.Lock()
	tuned := f.entry("service-defaults", "hello-00001").body
	f.mu.Unlock()
	if tuned["Protocol"] != "http" || tuned["MaxInboundConnections"] != 10.0 {
		t.Errorf("service-defaults hello-00001 = %v: want protocol http and the other settings kept", tuned)
	}

	// The same record again (a later UpdatedAt only): no write at all.
	f.resetWriteLog()
	again := v1
	again.UpdatedAt = again.UpdatedAt.Add(time.Hour)
	publish(t, c, again)
	if w := f.writeLog(); len(w) != 0 {
		t.Errorf("republishing the same record wrote %v", w)
	}

	// 2: a second revision, 30/70 with a tag on the old one.
	v2 := recordWith([]spec.TrafficTarget{{Revision: "hello-00001", Percent: 30, Tag: "old"}, {Latest: true, Percent: 70}},
		"hello-00002", []string{"hello-00001", "hello-00002"}, nil)
	f.resetWriteLog()
	publish(t, c, v2)
	wantWrites := []string{
		"PUT config service-defaults hello-00002",
		"PUT config service-resolver hello-00002",
		"PUT config service-router hello",
		"PUT config service-splitter hello",
		"PUT kv nomad-serverless/services/default/hello",
	}
	if w := f.writeLog(); !reflect.DeepEqual(w, wantWrites) {
		t.Errorf("writes for the new revision:\n got  %v\n want %v", w, wantWrites)
	}

	// 3: all to the latest, the old revision marked for garbage
	// collection (still listed until its job is purged, as gc does).
	v3 := recordWith(nil, "hello-00002", []string{"hello-00001", "hello-00002"}, []string{"hello-00001"})
	f.resetWriteLog()
	publish(t, c, v3)
	wantWrites = []string{
		"DELETE config service-router hello",
		"PUT config service-splitter hello",
		"DELETE config service-resolver hello-00001",
		"DELETE config service-defaults hello-00001",
		"PUT kv nomad-serverless/services/default/hello",
	}
	if w := f.writeLog(); !reflect.DeepEqual(w, wantWrites) {
		t.Errorf("writes for the rollout and GC:\n got  %v\n want %v", w, wantWrites)
	}
	// Finishing the GC (Deleting emptied once the job is purged) only
	// rewrites the record.
	v4 := recordWith(nil, "hello-00002", []string{"hello-00002"}, nil)
	f.resetWriteLog()
	publish(t, c, v4)
	if w := f.writeLog(); !reflect.DeepEqual(w, []string{"PUT kv nomad-serverless/services/default/hello"}) {
		t.Errorf("writes after the GC finished: %v", w)
	}

	// Delete removes exactly what was written; others' entries and the
	// shared activator defaults stay.
	if err := c.Delete(ctx, "default", "hello"); err != nil {
		t.Fatal(err)
	}
	want := []string{
		"service-defaults/nomad-serverless-activator",
		"service-defaults/other",
		"service-resolver/other",
	}
	if got := f.entryNames(); !reflect.DeepEqual(got, want) {
		t.Errorf("entries after Delete %v, want %v", got, want)
	}
	if _, _, err := c.ReadRecord(ctx, "default", "hello"); !errors.Is(err, ErrNotFound) {
		t.Errorf("record after Delete: %v", err)
	}
	if err := c.Delete(ctx, "default", "hello"); !errors.Is(err, ErrNotFound) {
		t.Errorf("second Delete: %v, want ErrNotFound", err)
	}
}

func TestPublishRefusedByConsulSurfacesItsWords(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	// Another tool pinned the activator to tcp after we checked: simulate
	// by refusing from the fake's own chain check on a foreign splitter.
	f.mu.Lock()
	f.entries["service-defaults"] = map[string]*fakeEntry{}
	f.mu.Unlock()
	err := c.setEntry(ctxTimeout(t, 5*time.Second), splitterFor(Route{Service: "plain", Splits: []Split{{Revision: "plain-00001", Percent: 100}}}))
	if err == nil || !strings.Contains(err.Error(), `uses a protocol \"tcp\"`) || !strings.Contains(err.Error(), "set it back to http") {
		t.Fatalf("err %v", err)
	}
}

func TestConcurrentPublishesLeaveConsulMatchingTheRecord(t *testing.T) {
	for round := range 10 {
		_, addr := newFakeConsul(t)
		c := testClient(t, addr)
		ctx := ctxTimeout(t, 20*time.Second)
		base := recordWith(nil, "hello-00001", []string{"hello-00001"}, nil)
		if err := c.Publish(ctx, base, 0); err != nil {
			t.Fatal(err)
		}
		_, idx, err := c.ReadRecord(ctx, "default", "hello")
		if err != nil {
			t.Fatal(err)
		}
		a := recordWith([]spec.TrafficTarget{{Revision: "hello-00001", Percent: 50}, {Latest: true, Percent: 50}},
			"hello-00002", []string{"hello-00001", "hello-00002"}, nil)
		b := recordWith([]spec.TrafficTarget{{Revision: "hello-00001", Percent: 10, Tag: "old"}, {Latest: true, Percent: 90}},
			"hello-00003", []string{"hello-00001", "hello-00003"}, nil)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i, rec := range []Record{a, b} {
			wg.Go(func() { errs[i] = c.Publish(ctx, rec, idx) })
		}
		wg.Wait()
		wins := 0
		for _, err := range errs {
			switch {
			case err == nil:
				wins++
			case !errors.Is(err, ErrConflict):
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if wins != 1 {
			t.Fatalf("round %d: %d publishes won with the same index, want 1 (%v)", round, wins, errs)
		}
		stored, _, err := c.ReadRecord(ctx, "default", "hello")
		if err != nil {
			t.Fatal(err)
		}
		want, _ := stored.Route()
		want.Namespace = ""
		got, err := c.ReadRoute(ctx, "hello")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("round %d: Consul routes %+v but the record says %+v", round, got, want)
		}
	}
}

// A deploy whose entries land after the winner's, but whose record loses
// the check-and-set, must not leave its route in Consul.
func TestLosingPublishPutsBackTheWinnersRoute(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	ctx := ctxTimeout(t, 20*time.Second)
	if err := c.Publish(ctx, recordWith(nil, "hello-00001", []string{"hello-00001"}, nil), 0); err != nil {
		t.Fatal(err)
	}
	_, idx, err := c.ReadRecord(ctx, "default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	loser := recordWith([]spec.TrafficTarget{{Revision: "hello-00001", Percent: 50}, {Latest: true, Percent: 50}},
		"hello-00002", []string{"hello-00001", "hello-00002"}, nil)
	winner := recordWith([]spec.TrafficTarget{{Revision: "hello-00001", Percent: 10, Tag: "old"}, {Latest: true, Percent: 90}},
		"hello-00003", []string{"hello-00001", "hello-00003"}, nil)

	// The loser stops right before its record write; the winner runs
	// start to finish; then the loser goes on.
	atKV, goOn := make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	f.beforeKVPut = func(string) {
		if first.CompareAndSwap(false, true) {
			close(atKV)
			<-goOn
		}
	}
	loserErr := make(chan error, 1)
	go func() { loserErr <- c.Publish(ctx, loser, idx) }()
	<-atKV
	if err := c.Publish(ctx, winner, idx); err != nil {
		t.Fatalf("winner: %v", err)
	}
	// Now overwrite the winner's splitter with the loser's, as a loser whose
	// entry writes landed last would have.
	if err := c.setEntry(ctx, splitterFor(mustRoute(t, loser))); err != nil {
		t.Fatal(err)
	}
	close(goOn)
	if err := <-loserErr; !errors.Is(err, ErrConflict) {
		t.Fatalf("loser: %v, want ErrConflict", err)
	}
	got, err := c.ReadRoute(ctx, "hello")
	if err != nil {
		t.Fatal(err)
	}
	want := mustRoute(t, winner)
	want.Namespace = ""
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Consul routes %+v after the race, want the winner's %+v", got, want)
	}
}

func mustRoute(t *testing.T, r Record) Route {
	t.Helper()
	route, err := r.Route()
	if err != nil {
		t.Fatal(err)
	}
	return route
}

func TestPublishNeverLeavesDanglingRouteAcrossManyRollouts(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	f.afterWrite = noDanglingRoutes(t, "hello")
	var revs []string
	for gen := 1; gen <= 6; gen++ {
		rev := spec.RevisionName("hello", gen)
		revs = append(revs, rev)
		var deleting []string
		if len(revs) > 2 { // keep two, GC the rest
			deleting = []string{revs[0]}
			revs = revs[1:]
		}
		traffic := []spec.TrafficTarget{{Revision: revs[0], Percent: 20, Tag: fmt.Sprintf("g%d", gen)}, {Latest: true, Percent: 80}}
		if len(revs) == 1 {
			traffic = nil
		}
		publish(t, c, recordWith(traffic, rev, slices.Clone(revs), deleting))
	}
	if err := c.Delete(context.Background(), "default", "hello"); err != nil {
		t.Fatal(err)
	}
	for _, n := range f.entryNames() {
		if strings.Contains(n, "hello") {
			t.Errorf("left behind %s", n)
		}
	}
}

// TestPublishReadsOnlyTheServicesEntries: a publish reads the entries of
// its own service, never a listing of every service's, so what it reads
// does not grow with the cluster (issue 45: listing every resolver made a
// deploy of N services quadratic).
func TestPublishReadsOnlyTheServicesEntries(t *testing.T) {
	reads := func(others int) []string {
		f, addr := newFakeConsul(t)
		c := testClient(t, addr)
		f.mu.Lock()
		for _, kind := range []string{"service-defaults", "service-resolver"} {
			f.entries[kind] = map[string]*fakeEntry{}
			for i := range others {
				name := fmt.Sprintf("other%d-00001", i)
				f.entries[kind][name] = &fakeEntry{body: map[string]any{"Kind": kind, "Name": name, "Protocol": "http"}, create: 1, modify: 1}
			}
		}
		f.mu.Unlock()
		rec := recordWith([]spec.TrafficTarget{{Revision: "hello-00001", Percent: 50}, {Revision: "hello-00002", Percent: 50}},
			"hello-00002", []string{"hello-00001", "hello-00002"}, nil)
		publish(t, c, rec)
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Clone(f.configReads)
	}
	alone, crowded := reads(0), reads(2000)
	for _, r := range crowded {
		if strings.Count(r, " ") < 2 {
			t.Errorf("publish listed every entry of a kind: %s", r)
		}
		if strings.Contains(r, "other") {
			t.Errorf("publish read another service's entry: %s", r)
		}
	}
	if !slices.Equal(alone, crowded) {
		t.Errorf("publish read %d entries beside 2,000 other services and %d alone:\n%v\n%v", len(crowded), len(alone), crowded, alone)
	}
	if len(crowded) == 0 {
		t.Error("publish read nothing: it cannot have compared what Consul holds")
	}
}
