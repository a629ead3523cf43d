package controlplane

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

func TestStandInWanted(t *testing.T) {
	rev := func(name string, desired int) catalog.Revision {
		return catalog.Revision{Name: name, Service: "hello", Desired: desired}
	}
	ready := map[string]int{"hello-00002": 1, "hello-00003": 2, "hello-00004": 1}
	got := standInWanted([]catalog.Revision{
		rev("hello-00001", 0), // at zero, nothing ready
		rev("hello-00002", 0), // told to go to zero, last instance still passing: make before break
		rev("hello-00003", 2), // serving
		rev("hello-00004", 3), // scaling up, one ready
		rev("hello-00005", 1), // waking, nothing ready yet
	}, func(r string) int { return ready[r] })
	want := map[string]string{"hello-00001": "hello", "hello-00002": "hello", "hello-00005": "hello"}
	if !maps.Equal(got, want) {
		t.Errorf("standInWanted = %v, want %v", got, want)
	}
}

func TestOrphanedStandInNodes(t *testing.T) {
	nodes := []consulroute.StandInNode{
		{Node: "n-me-00", Replica: "me"},     // mine
		{Node: "n-live-00", Replica: "live"}, // a live replica's
		{Node: "n-gone-00", Replica: "gone"}, // a replica no longer registered
		{Node: "n-gone-01", Replica: "gone"},
		{Node: "n--00", Replica: ""}, // no replica meta: nobody owns it
	}
	got := orphanedStandInNodes(nodes, map[string]bool{"me": true, "live": true}, "me")
	if want := []string{"n-gone-00", "n-gone-01", "n--00"}; !slices.Equal(got, want) {
		t.Errorf("orphanedStandInNodes = %v, want %v", got, want)
	}
	// This replica's own nodes stay even before its activator is
	// registered again (it is not in replicas yet).
	if got := orphanedStandInNodes(nodes[:1], map[string]bool{}, "me"); got != nil {
		t.Errorf("orphanedStandInNodes removes self's: %v", got)
	}
}

func TestOrphanedAgentStandIns(t *testing.T) {
	local := []consulroute.AgentStandIn{
		{ID: "a-00001-activator-me", Revision: "a-00001", Replica: "me"},     // mine, from before the upgrade
		{ID: "a-00001-activator-live", Revision: "a-00001", Replica: "live"}, // a live replica's (an earlier version still running)
		{ID: "a-00001-activator-gone", Revision: "a-00001", Replica: "gone"}, // a replica no longer registered
		{ID: "b-00002-activator-", Revision: "b-00002", Replica: ""},         // no replica meta: nobody owns it
	}
	got := orphanedAgentStandIns(local, map[string]bool{"me": true, "live": true}, "me")
	if want := []string{"a-00001-activator-me", "a-00001-activator-gone", "b-00002-activator-"}; !slices.Equal(got, want) {
		t.Errorf("orphanedAgentStandIns = %v, want %v", got, want)
	}
}

// fakeStandIn is one stand-in in the fake catalog.
type fakeStandIn struct {
	ID, Revision, Replica, Node string
}

// fakeStandIns is Consul's catalog of stand-ins (by ID) and the local
// agent's stand-ins from an earlier version.
type fakeStandIns struct {
	replica  string
	replicas map[string]bool

	mu           sync.Mutex
	reg          map[string]fakeStandIn
	agent        map[string]consulroute.AgentStandIn
	tags         map[string][]string
	removed      []string // stand-in IDs deregistered one by one
	removedNodes []string
}

func newFakeStandIns(replica string) *fakeStandIns {
	return &fakeStandIns{replica: replica, replicas: map[string]bool{replica: true}, reg: map[string]fakeStandIn{},
		agent: map[string]consulroute.AgentStandIn{}, tags: map[string][]string{}}
}

func (f *fakeStandIns) Replica() string { return f.replica }

func (f *fakeStandIns) StandInID(rev string) string { return rev + "-activator-" + f.replica }

// add puts a stand-in of replica in the catalog, on that replica's node.
func (f *fakeStandIns) add(rev, replica string) {
	id := rev + "-activator-" + replica
	f.reg[id] = fakeStandIn{ID: id, Revision: rev, Replica: replica, Node: "n-" + replica}
}

func (f *fakeStandIns) RegisterStandIn(_ context.Context, rev, svc, addr string, port int, tags ...string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.add(rev, f.replica)
	f.tags[rev] = tags
	return nil
}

func (f *fakeStandIns) DeregisterStandIn(_ context.Context, rev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.reg, f.StandInID(rev))
	f.removed = append(f.removed, f.StandInID(rev))
	return nil
}

func (f *fakeStandIns) StandInNodes(context.Context) ([]consulroute.StandInNode, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	seen := map[consulroute.StandInNode]bool{}
	for _, s := range f.reg {
		seen[consulroute.StandInNode{Node: s.Node, Replica: s.Replica}] = true
	}
	return slices.SortedFunc(maps.Keys(seen), func(a, b consulroute.StandInNode) int { return strings.Compare(a.Node, b.Node) }), nil
}

func (f *fakeStandIns) OwnStandIns(_ context.Context, nodes []consulroute.StandInNode) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var revs []string
	for _, s := range f.reg {
		if s.Replica == f.replica && slices.Contains(nodes, consulroute.StandInNode{Node: s.Node, Replica: s.Replica}) {
			revs = append(revs, s.Revision)
		}
	}
	slices.Sort(revs)
	return revs, nil
}

func (f *fakeStandIns) RemoveStandInNode(_ context.Context, node string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for id, s := range f.reg {
		if s.Node == node {
			delete(f.reg, id)
		}
	}
	f.removedNodes = append(f.removedNodes, node)
	return nil
}

func (f *fakeStandIns) RemoveStandInsOf(ctx context.Context, replica string) ([]string, error) {
	nodes, _ := f.StandInNodes(ctx)
	var removed []string
	for _, n := range nodes {
		if n.Replica == replica {
			_ = f.RemoveStandInNode(ctx, n.Node)
			removed = append(removed, n.Node)
		}
	}
	return removed, nil
}

func (f *fakeStandIns) AgentStandIns(context.Context) ([]consulroute.AgentStandIn, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.SortedFunc(maps.Values(f.agent), func(a, b consulroute.AgentStandIn) int { return strings.Compare(a.ID, b.ID) }), nil
}

func (f *fakeStandIns) RemoveAgentStandIn(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.agent, id)
	return nil
}

func (f *fakeStandIns) Replicas(context.Context) (map[string]bool, error) { return f.replicas, nil }

func (f *fakeStandIns) ids() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.reg))
}

func (f *fakeStandIns) agentIDs() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Sorted(maps.Keys(f.agent))
}

// runKeeper runs keepStandIns until the test ends, then checks it removed
// what it registered. A send on the channel it returns sweeps at once.
func runKeeper(t *testing.T, f *fakeStandIns, cat *catalog.Catalog, tags *revisionTags) chan<- struct{} {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	sweep := make(chan struct{})
	go func() { keepStandIns(ctx, f, cat, tags, "127.0.0.1", 8080, sweep, quietLog); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		for _, id := range f.ids() {
			if s := f.reg[id]; s.Replica == f.replica {
				t.Errorf("stand-in %s left registered after shutdown", id)
			}
		}
	})
	return sweep
}

func TestLostStandIns(t *testing.T) {
	own := []string{"a-00001"} // this replica's in the catalog
	registered := map[string]bool{"a-00001": true, "b-00001": true, "c-00001": true}
	if got, want := lostStandIns(own, registered), []string{"b-00001", "c-00001"}; !slices.Equal(got, want) {
		t.Errorf("lostStandIns = %v, want %v", got, want)
	}
	if got := lostStandIns(nil, nil); got != nil {
		t.Errorf("lostStandIns of nothing = %v", got)
	}
}

// A stand-in gone from the catalog (another replica's sweep removed it
// while this replica's activator registration was reaped, or somebody
// deregistered it by hand) is registered again at the next sweep while it
// is still wanted.
func TestStandInKeeperRegistersAgainWhatTheCatalogLost(t *testing.T) {
	f := newFakeStandIns("me")
	cat := catalog.New()
	cat.SetRevision(catalog.Revision{Name: "zero-00001", Service: "zero", Desired: 0})
	sweep := runKeeper(t, f, cat, newRevisionTags())
	waitFor(t, "a stand-in", func() bool { return slices.Equal(f.ids(), []string{"zero-00001-activator-me"}) })
	f.mu.Lock()
	delete(f.reg, "zero-00001-activator-me") // gone: the keeper did not deregister it
	f.mu.Unlock()
	sweep <- struct{}{}
	waitFor(t, "the stand-in registered again", func() bool { return slices.Equal(f.ids(), []string{"zero-00001-activator-me"}) })
}

func TestStandInsExistOnlyWhileARevisionHasNoReadyInstance(t *testing.T) {
	f := newFakeStandIns("me")
	cat := catalog.New()
	runKeeper(t, f, cat, newRevisionTags())
	cat.SetRevision(catalog.Revision{Name: "hello-00001", Service: "hello", Desired: 1})
	waitFor(t, "a stand-in", func() bool { return slices.Equal(f.ids(), []string{"hello-00001-activator-me"}) })
	cat.SetReady("hello-00001", []consulroute.Instance{{ID: "i1", Revision: "hello-00001"}})
	waitFor(t, "the stand-in to go", func() bool { return len(f.ids()) == 0 })
	// Scaled to zero: the stand-in comes while the instance still passes.
	cat.SetRevision(catalog.Revision{Name: "hello-00001", Service: "hello", Desired: 0})
	waitFor(t, "the stand-in to come back before the last instance leaves", func() bool { return len(f.ids()) == 1 })
	cat.SetReady("hello-00001", nil)
	cat.DeleteRevision("hello-00001")
	waitFor(t, "the stand-in to go with the revision", func() bool { return len(f.ids()) == 0 })
}

// A stand-in carries the revision's own tags (from its Nomad job), so a
// proxy configured by instance tags (Traefik) routes to it as to an
// instance; and it goes when Nomad says the revision went, whether by a
// stopped job or by a purge, which Nomad reports only as an evaluation.
func TestStandInsCarryTheRevisionsTagsAndGoWithIt(t *testing.T) {
	f := newFakeStandIns("me")
	cat := catalog.New()
	tags := newRevisionTags()
	runKeeper(t, f, cat, tags)
	want := []string{"serverless", "service=whoami", "traefik.enable=true", "traefik.http.routers.whoami.rule=Host(`whoami.example.com`)"}
	applyNomadEvent(cat, tags, nomadjob.Event{Kind: nomadjob.EventRevisionRegistered,
		Revision: nomadjob.RevisionInfo{Name: "whoami-00001", Service: "whoami", ServiceTags: want}})
	waitFor(t, "a stand-in with the revision's tags", func() bool {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Equal(f.tags["whoami-00001"], want)
	})
	// What nomadjob makes of Nomad's JobDeregistered evaluation.
	applyNomadEvent(cat, tags, nomadjob.Event{Kind: nomadjob.EventRevisionDeregistered, Revision: nomadjob.RevisionInfo{Name: "whoami-00001", Service: "whoami", Stopped: true}})
	waitFor(t, "the stand-in to go with the revision", func() bool { return len(f.ids()) == 0 })
	if got := tags.get("whoami-00001"); got != nil {
		t.Errorf("tags of a deregistered revision kept: %v", got)
	}
}

// A replica that starts takes back its own stand-ins from an earlier run,
// removes the nodes of replicas that no longer exist, and removes what an
// earlier version left on its agent (its own, and dead replicas').
func TestStandInKeeperCleansUpAfterEarlierReplicas(t *testing.T) {
	f := newFakeStandIns("me")
	f.replicas["live"] = true
	f.add("kept-00001", "me")
	f.add("gone-00001", "me")
	f.add("gone-00001", "dead")
	f.add("kept-00001", "live")
	for _, s := range []consulroute.AgentStandIn{
		{ID: "old-00001-activator-me", Revision: "old-00001", Replica: "me"},
		{ID: "old-00001-activator-dead", Revision: "old-00001", Replica: "dead"},
		{ID: "old-00001-activator-live", Revision: "old-00001", Replica: "live"},
	} {
		f.agent[s.ID] = s
	}
	cat := catalog.New()
	cat.SetRevision(catalog.Revision{Name: "kept-00001", Service: "kept", Desired: 0})
	runKeeper(t, f, cat, newRevisionTags())
	want := []string{"kept-00001-activator-live", "kept-00001-activator-me"}
	waitFor(t, "the orphans gone and the wanted one kept", func() bool { return slices.Equal(f.ids(), want) })
	waitFor(t, "the earlier version's agent stand-ins of this and dead replicas gone", func() bool {
		return slices.Equal(f.agentIDs(), []string{"old-00001-activator-live"})
	})
	f.mu.Lock()
	removed, removedNodes := slices.Clone(f.removed), slices.Clone(f.removedNodes)
	f.mu.Unlock()
	if slices.Contains(removed, "kept-00001-activator-me") {
		t.Errorf("the keeper removed a stand-in it still wants (it should adopt it): removed %v", removed)
	}
	if !slices.Equal(removedNodes, []string{"n-dead"}) {
		t.Errorf("nodes removed while running %v, want the dead replica's only", removedNodes)
	}
}

// recordingScaler records scale calls with the stand-ins registered at the
// moment of each.
type recordingScaler struct {
	f     *fakeStandIns
	calls []string
}

func (r *recordingScaler) Scale(_ context.Context, rev string, n int, _ string, _ map[string]string) error {
	r.calls = append(r.calls, fmt.Sprintf("%s=%d %v", rev, n, r.f.ids()))
	return nil
}

// Scaling to zero registers the stand-in before Nomad is told: the route
// of a catalog-driven proxy is never left without a passing instance.
func TestStandInFirstRegistersBeforeScalingToZero(t *testing.T) {
	f := newFakeStandIns("me")
	cat := catalog.New()
	cat.SetRevision(catalog.Revision{Name: "hello-00001", Service: "hello", Desired: 2})
	tags := newRevisionTags()
	tags.set("hello-00001", []string{"urlprefix-hello.example.com/"})
	rec := &recordingScaler{f: f}
	s := standInFirst{scaler: rec, src: f, cat: cat, tags: tags, addr: "127.0.0.1", port: 8080, log: quietLog}
	ctx := context.Background()
	for _, n := range []int{1, 0} {
		if err := s.Scale(ctx, "hello-00001", n, "test", nil); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{"hello-00001=1 []", "hello-00001=0 [hello-00001-activator-me]"}
	if !slices.Equal(rec.calls, want) {
		t.Errorf("scale calls %q, want %q (no stand-in for a scale to 1, one before a scale to 0)", rec.calls, want)
	}
	if got := f.tags["hello-00001"]; !slices.Equal(got, []string{"urlprefix-hello.example.com/"}) {
		t.Errorf("the stand-in's tags %v, want the revision's", got)
	}
}

// The keeper's passes read the whole catalog; during a burst of changes
// the next waits nine times the last, at most a second (issue 45).
func TestStandInGap(t *testing.T) {
	for d, want := range map[time.Duration]time.Duration{0: 0, time.Millisecond: 9 * time.Millisecond, 200 * time.Millisecond: time.Second} {
		if got := standInGap(d); got != want {
			t.Errorf("standInGap(%s) = %s, want %s", d, got, want)
		}
	}
}
