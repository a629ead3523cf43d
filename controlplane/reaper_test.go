package controlplane

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

func TestDeadReplicas(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	reg := func(replica string, critical bool) consulroute.ReplicaRegistration {
		return consulroute.ReplicaRegistration{Replica: replica, ID: "nomad-serverless-activator-" + replica, Node: "n1", Critical: critical}
	}
	for _, tc := range []struct {
		name      string
		regs      []consulroute.ReplicaRegistration
		holders   map[string]bool
		since     map[string]time.Time
		now       time.Time
		wantDead  []string
		wantSince map[string]time.Time
	}{
		{name: "alive: check passing, session held",
			regs: []consulroute.ReplicaRegistration{reg("a", false)}, holders: map[string]bool{"a": true},
			now: t0, wantSince: map[string]time.Time{}},
		{name: "starting: passing, no session yet",
			regs: []consulroute.ReplicaRegistration{reg("a", false)}, holders: map[string]bool{},
			now: t0, wantSince: map[string]time.Time{}},
		{name: "check critical but session still held (Consul has not ended it yet)",
			regs: []consulroute.ReplicaRegistration{reg("a", true)}, holders: map[string]bool{"a": true},
			now: t0, wantSince: map[string]time.Time{}},
		{name: "first seen dead: wait for the grace",
			regs: []consulroute.ReplicaRegistration{reg("a", true)}, holders: map[string]bool{},
			now: t0, wantSince: map[string]time.Time{"a": t0}},
		{name: "dead within the grace",
			regs: []consulroute.ReplicaRegistration{reg("a", true)}, holders: map[string]bool{},
			since: map[string]time.Time{"a": t0}, now: t0.Add(2 * time.Second), wantSince: map[string]time.Time{"a": t0}},
		{name: "dead past the grace",
			regs: []consulroute.ReplicaRegistration{reg("a", true), reg("b", false)}, holders: map[string]bool{"b": true},
			since: map[string]time.Time{"a": t0}, now: t0.Add(3 * time.Second), wantDead: []string{"a"}, wantSince: map[string]time.Time{"a": t0}},
		{name: "came back within the grace: forgotten",
			regs: []consulroute.ReplicaRegistration{reg("a", false)}, holders: map[string]bool{"a": true},
			since: map[string]time.Time{"a": t0}, now: t0.Add(time.Second), wantSince: map[string]time.Time{}},
		{name: "self is never dead",
			regs: []consulroute.ReplicaRegistration{reg("me", true)}, holders: map[string]bool{},
			since: map[string]time.Time{"me": t0}, now: t0.Add(time.Hour), wantSince: map[string]time.Time{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dead, since := deadReplicas(tc.regs, tc.holders, "me", tc.since, tc.now, 3*time.Second)
			var names []string
			for _, r := range dead {
				names = append(names, r.Replica)
			}
			if !slices.Equal(names, tc.wantDead) {
				t.Errorf("dead %v, want %v", names, tc.wantDead)
			}
			if len(since) != len(tc.wantSince) {
				t.Errorf("since %v, want %v", since, tc.wantSince)
			}
			for k, v := range tc.wantSince {
				if !since[k].Equal(v) {
					t.Errorf("since[%s] = %v, want %v", k, since[k], v)
				}
			}
		})
	}
}

// fakeReplicas is a replicaSource: registrations, session holders, and
// what RemoveReplica was asked to remove.
type fakeReplicas struct {
	mu      sync.Mutex
	regs    []consulroute.ReplicaRegistration
	holders map[string]bool
	removed []string
}

func (f *fakeReplicas) ReplicaRegistrations(context.Context) ([]consulroute.ReplicaRegistration, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.regs), nil
}

func (f *fakeReplicas) SessionHolders(context.Context) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for k, v := range f.holders {
		out[k] = v
	}
	return out, nil
}

func (f *fakeReplicas) RemoveReplica(_ context.Context, r consulroute.ReplicaRegistration) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.removed = append(f.removed, r.Replica)
	f.regs = slices.DeleteFunc(f.regs, func(x consulroute.ReplicaRegistration) bool { return x.Replica == r.Replica })
	return []string{r.ID}, nil
}

// The leader removes a dead replica's registrations, and only its: not its
// own, not a live one's, not one whose check fails while it holds its
// session.
func TestReaperRemovesOnlyDeadReplicas(t *testing.T) {
	f := &fakeReplicas{
		regs: []consulroute.ReplicaRegistration{
			{Replica: "dead", ID: "act-dead", Critical: true},
			{Replica: "me", ID: "act-me", Critical: true},
			{Replica: "flaky", ID: "act-flaky", Critical: true},
			{Replica: "live", ID: "act-live"},
		},
		holders: map[string]bool{"flaky": true, "live": true},
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		reapDeadReplicas(ctx, f, "me", time.Millisecond, 0, slog.New(slog.DiscardHandler))
	}()
	waitFor(t, "the dead replica removed", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return len(f.removed) > 0
	})
	cancel()
	<-done
	if !slices.Equal(f.removed, []string{"dead"}) {
		t.Errorf("removed %v, want [dead]", f.removed)
	}
}
