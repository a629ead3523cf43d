package controlplane

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/canary"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// rolloutConsulFake is Consul's KV and records in memory, with the
// check-and-set rules of the real ones; every record it publishes reaches
// the catalog at once, as feedRecords would.
type rolloutConsulFake struct {
	mu      sync.Mutex
	index   uint64
	kv      map[string]consulroute.KVEntry
	records map[string]consulroute.Record
	recIdx  map[string]uint64
	cat     *catalog.Catalog
}

func newRolloutConsulFake(cat *catalog.Catalog) *rolloutConsulFake {
	return &rolloutConsulFake{kv: map[string]consulroute.KVEntry{}, records: map[string]consulroute.Record{}, recIdx: map[string]uint64{}, cat: cat}
}

func (f *rolloutConsulFake) ReadRecord(_ context.Context, ns, svc string) (consulroute.Record, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := consulroute.RecordKey(ns, svc)
	r, ok := f.records[k]
	if !ok {
		return consulroute.Record{}, 0, consulroute.ErrNotFound
	}
	// A deep copy, as a decode from Consul would be.
	b, _ := json.Marshal(r)
	var out consulroute.Record
	_ = json.Unmarshal(b, &out)
	return out, f.recIdx[k], nil
}

func (f *rolloutConsulFake) Publish(_ context.Context, rec consulroute.Record, idx uint64) error {
	if _, err := rec.Route(); err != nil {
		return err
	}
	f.mu.Lock()
	k := rec.Key()
	if f.recIdx[k] != idx {
		f.mu.Unlock()
		return fmt.Errorf("publish: %w", consulroute.ErrConflict)
	}
	f.index++
	f.records[k], f.recIdx[k] = rec, f.index
	f.mu.Unlock()
	route, _ := rec.Route()
	f.cat.SetService(catalog.Service{Name: rec.Service.Name, Namespace: rec.Namespace(), Route: route, Rollout: rec.Rollout})
	return nil
}

func (f *rolloutConsulFake) KVGet(_ context.Context, key string) (consulroute.KVEntry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.kv[key]
	if !ok {
		return e, consulroute.ErrNotFound
	}
	return e, nil
}

func (f *rolloutConsulFake) KVKeys(_ context.Context, prefix, _ string) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k := range f.kv {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out, nil
}

func (f *rolloutConsulFake) CASKV(_ context.Context, key string, v []byte, idx uint64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.kv[key].ModifyIndex != idx {
		return false, nil
	}
	f.index++
	f.kv[key] = consulroute.KVEntry{Key: key, Value: v, ModifyIndex: f.index}
	return true, nil
}

func (f *rolloutConsulFake) route(t *testing.T) map[string]int {
	t.Helper()
	rec, _, err := f.ReadRecord(context.Background(), "", "hello")
	if err != nil {
		t.Fatal(err)
	}
	route, err := rec.Route()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int{}
	for _, s := range route.Splits {
		out[s.Revision] = s.Percent
	}
	return out
}

type rolloutNomadFake struct {
	mu     sync.Mutex
	events []string
	wakes  []string
}

func (n *rolloutNomadFake) ScaleAtLeast(_ context.Context, rev string, _ int, _ string, _ map[string]string) (bool, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.wakes = append(n.wakes, rev)
	return true, nil
}

func (n *rolloutNomadFake) RecordScalingEvent(_ context.Context, rev, msg string, _ map[string]string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.events = append(n.events, rev+": "+msg)
	return nil
}

// rolloutWorld is a leader's surroundings: Consul, Nomad, the catalog, a
// fake clock and what the gateways measure next.
type rolloutWorld struct {
	t      *testing.T
	consul *rolloutConsulFake
	nomad  *rolloutNomadFake
	cat    *catalog.Catalog
	now    time.Time
	meas   map[string]canary.Measurement
}

func newRolloutWorld(t *testing.T) *rolloutWorld {
	cat := catalog.New()
	w := &rolloutWorld{t: t, consul: newRolloutConsulFake(cat), nomad: &rolloutNomadFake{}, cat: cat,
		now: time.Date(2026, 12, 7, 14, 0, 0, 0, time.UTC)}
	svc := spec.NewService("hello")
	svc.Rollout = &spec.Rollout{Steps: []int{10, 50}, Analysis: spec.Analysis{Interval: 10 * time.Second, MinRequests: 5, MaxErrorRate: 2}}
	// Deploy's record: the new revision is latest, its rollout pending.
	rec := consulroute.Record{Service: svc, Latest: "hello-00002", Revisions: []string{"hello-00001", "hello-00002"},
		Rollout: &consulroute.RolloutRoute{ID: "hello-00002@1", New: "hello-00002", Previous: "hello-00001", Phase: consulroute.RolloutPending}}
	if err := w.consul.Publish(context.Background(), rec, 0); err != nil {
		t.Fatal(err)
	}
	cat.SetReady("hello-00002", []consulroute.Instance{{ID: "a", Revision: "hello-00002", Address: "127.0.0.1", Port: 1}})
	return w
}

// leader is a new leader's driver.
func (w *rolloutWorld) leader() *rolloutDriver {
	d, err := newRolloutDriver(rolloutDriverConfig{Consul: w.consul, Nomad: w.nomad, Catalog: w.cat,
		Measure: func() (map[string]canary.Measurement, error) {
			m := w.meas
			w.meas = nil
			return m, nil
		},
		Now: func() time.Time { return w.now }})
	if err != nil {
		w.t.Fatal(err)
	}
	return d
}

// serve has the gateways measure n requests of rev, errs failed, each
// taking lat.
func (w *rolloutWorld) serve(rev string, n, errs uint64, lat time.Duration) {
	if w.meas == nil {
		w.meas = map[string]canary.Measurement{}
	}
	m := w.meas[rev]
	m.Requests += n
	m.Errors += errs
	for range n {
		m.Latency.Observe(lat)
	}
	w.meas[rev] = m
}

func (w *rolloutWorld) record() consulroute.Record {
	rec, _, err := w.consul.ReadRecord(context.Background(), "", "hello")
	if err != nil {
		w.t.Fatal(err)
	}
	return rec
}

func (w *rolloutWorld) wantRoute(want map[string]int) {
	w.t.Helper()
	got := w.consul.route(w.t)
	if fmt.Sprint(got) != fmt.Sprint(want) {
		w.t.Fatalf("route = %v, want %v (rollout %+v)", got, want, w.record().Rollout)
	}
}

func TestRolloutDriverCompletesAGoodRevision(t *testing.T) {
	w := newRolloutWorld(t)
	d := w.leader()
	ctx := context.Background()
	d.tick(ctx) // starts it; the new revision is ready, so step 1 at once
	w.wantRoute(map[string]int{"hello-00002": 10, "hello-00001": 90})
	for range 2 {
		w.now = w.now.Add(10 * time.Second)
		w.serve("hello-00002", 20, 0, 10*time.Millisecond)
		w.serve("hello-00001", 180, 0, 10*time.Millisecond)
		d.tick(ctx)
	}
	w.wantRoute(map[string]int{"hello-00002": 100})
	rec := w.record()
	if rec.Rollout.Phase != consulroute.RolloutCompleted || rec.Latest != "hello-00002" {
		t.Fatalf("record: phase %s latest %s, want completed and hello-00002", rec.Rollout.Phase, rec.Latest)
	}
	var judged int
	for _, h := range rec.Rollout.History {
		if h.Kind == string(canary.EventJudged) {
			judged++
			if !strings.Contains(h.Message, "hello-00002 20 req 0% errors") || !strings.Contains(h.Message, "| hello-00001 180 req") {
				t.Errorf("a judgment line lacks both revisions' figures: %q", h.Message)
			}
		}
	}
	if judged != 2 {
		t.Errorf("%d judgments in the record's history, want 2", judged)
	}
	evs := strings.Join(w.nomad.events, "\n")
	for _, want := range []string{"step 1 of 2", "step 2 of 2", "completed"} {
		if !strings.Contains(evs, want) {
			t.Errorf("scaling events lack %q:\n%s", want, evs)
		}
	}
	// Nothing more happens once it ended.
	w.now = w.now.Add(time.Minute)
	d.tick(ctx)
	if len(d.runs) != 0 {
		t.Errorf("%d rollouts still driven after completion", len(d.runs))
	}
}

func TestRolloutDriverRollsBackOnErrors(t *testing.T) {
	w := newRolloutWorld(t)
	d := w.leader()
	ctx := context.Background()
	d.tick(ctx)
	w.now = w.now.Add(10 * time.Second)
	w.serve("hello-00002", 47, 15, 10*time.Millisecond)
	w.serve("hello-00001", 400, 0, 10*time.Millisecond)
	d.tick(ctx)
	w.wantRoute(map[string]int{"hello-00001": 100})
	rec := w.record()
	if rec.Rollout.Phase != consulroute.RolloutRolledBack || !strings.Contains(rec.Rollout.Reason, "error rate 31.9% > 2% over 47 requests at step 10%") {
		t.Fatalf("record's rollout: phase %s reason %q", rec.Rollout.Phase, rec.Rollout.Reason)
	}
	if rec.Latest != "hello-00001" || !contains(rec.Revisions, "hello-00002") {
		t.Errorf("latest %s revisions %v: the failed revision must stay published at 0 %%", rec.Latest, rec.Revisions)
	}
}

// A leader killed mid-rollout: the next one loads the stored state and
// completes the rollout without repeating or skipping a step.
func TestRolloutDriverResumesOnTheNextLeader(t *testing.T) {
	w := newRolloutWorld(t)
	ctx := context.Background()
	first := w.leader()
	first.tick(ctx)
	w.now = w.now.Add(10 * time.Second)
	w.serve("hello-00002", 20, 0, 10*time.Millisecond)
	first.tick(ctx)
	w.wantRoute(map[string]int{"hello-00002": 50, "hello-00001": 50})
	// kill -9: first is never called again.
	w.now = w.now.Add(4 * time.Second)
	next := w.leader()
	next.resumeStored(ctx)
	w.wantRoute(map[string]int{"hello-00002": 50, "hello-00001": 50})
	w.now = w.now.Add(10 * time.Second)
	w.serve("hello-00002", 20, 0, 10*time.Millisecond)
	next.tick(ctx)
	w.wantRoute(map[string]int{"hello-00002": 100})
	var steps []string
	for _, h := range w.record().Rollout.History {
		if h.Kind == string(canary.EventStepStarted) || h.Kind == string(canary.EventResumed) {
			steps = append(steps, h.Kind)
		}
	}
	if got := strings.Join(steps, ","); got != "step_started,step_started,resumed" {
		t.Errorf("history = %s, want two steps then the resume", got)
	}
	// The deposed leader's state write fails: it lets the rollout go.
	first.tick(ctx)
	if len(first.runs) != 0 {
		t.Errorf("the deposed leader still drives %d rollouts", len(first.runs))
	}
}

// A person's traffic change ends the rollout; the machine stops, says so,
// and leaves the route as the person set it.
func TestRolloutDriverStopsForAPerson(t *testing.T) {
	w := newRolloutWorld(t)
	d := w.leader()
	ctx := context.Background()
	d.tick(ctx)
	rec, idx, _ := w.consul.ReadRecord(ctx, "", "hello")
	rec.Rollout.Phase, rec.Rollout.Reason = consulroute.RolloutStopped, "traffic was set by a person"
	rec.Service.Traffic = []spec.TrafficTarget{{Revision: "hello-00001", Percent: 70}, {Latest: true, Percent: 30}}
	if err := w.consul.Publish(ctx, rec, idx); err != nil {
		t.Fatal(err)
	}
	w.now = w.now.Add(10 * time.Second)
	w.serve("hello-00002", 20, 0, 10*time.Millisecond)
	d.tick(ctx)
	w.wantRoute(map[string]int{"hello-00001": 70, "hello-00002": 30})
	if len(d.runs) != 0 {
		t.Fatal("the machine still runs after a person took the route over")
	}
	if evs := strings.Join(w.nomad.events, "\n"); !strings.Contains(evs, "stopped at step 10%: traffic was set by a person") {
		t.Errorf("scaling events do not say why it stopped:\n%s", evs)
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// A leader that died after storing a rollback but before writing it: the
// next one writes it. One that finds the end written leaves the record as
// a person may have changed it since.
func TestRolloutDriverWritesAStoredEndOnlyOnce(t *testing.T) {
	w := newRolloutWorld(t)
	ctx := context.Background()
	first := w.leader()
	first.tick(ctx)
	// The step fails; the state is stored, then the leader dies before
	// the record hears of it.
	w.now = w.now.Add(10 * time.Second)
	r := first.runs[runKey("default", "hello")]
	out, err := r.m.Tick(w.now, canary.Input{New: canary.Measurement{Requests: 20, Errors: 10}})
	if err != nil {
		t.Fatal(err)
	}
	r.history = append(r.history, out.Events...)
	if !first.store(ctx, r) {
		t.Fatal("store")
	}
	w.wantRoute(map[string]int{"hello-00002": 10, "hello-00001": 90})
	next := w.leader()
	next.resumeStored(ctx)
	w.wantRoute(map[string]int{"hello-00001": 100})
	if rec := w.record(); rec.Rollout.Phase != consulroute.RolloutRolledBack || rec.Latest != "hello-00001" {
		t.Fatalf("after takeover: phase %s latest %s", rec.Rollout.Phase, rec.Latest)
	}
	// A person rolls forward to the failed revision by hand; a later
	// leader must not undo it.
	rec, idx, _ := w.consul.ReadRecord(ctx, "", "hello")
	rec.Latest = "hello-00002"
	if err := w.consul.Publish(ctx, rec, idx); err != nil {
		t.Fatal(err)
	}
	w.leader().resumeStored(ctx)
	w.wantRoute(map[string]int{"hello-00002": 100})
}
