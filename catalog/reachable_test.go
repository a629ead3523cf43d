package catalog

import (
	"testing"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// TestReachability is Knative's revision reachability, read from the
// service's record: min holds only for revisions a route reaches or is
// about to (issue 45's soak: every good deploy left the previous revision
// running at its min until garbage collection).
func TestReachability(t *testing.T) {
	split := func(pairs ...any) []consulroute.Split {
		var out []consulroute.Split
		for i := 0; i < len(pairs); i += 2 {
			out = append(out, consulroute.Split{Revision: pairs[i].(string), Percent: pairs[i+1].(int)})
		}
		return out
	}
	for _, c := range []struct {
		name    string
		service *Service // nil: the record is not loaded
		revs    []int    // generations of hello-0000N in the catalog
		want    map[string]bool
	}{
		{
			name: "no record yet: every revision reachable",
			revs: []int{1, 2},
			want: map[string]bool{"hello-00001": true, "hello-00002": true},
		},
		{
			name:    "a deploy left the previous revision behind",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00002", 100)}},
			revs:    []int{1, 2},
			want:    map[string]bool{"hello-00001": false, "hello-00002": true},
		},
		{
			name:    "a revision newer than the routed one: a deploy waits for it",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00002", 100)}},
			revs:    []int{1, 2, 3},
			want:    map[string]bool{"hello-00001": false, "hello-00002": true, "hello-00003": true},
		},
		{
			name:    "a split keeps both; the one before them is left",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00002", 90, "hello-00003", 10)}},
			revs:    []int{1, 2, 3},
			want:    map[string]bool{"hello-00001": false, "hello-00002": true, "hello-00003": true},
		},
		{
			name: "a tag reaches an old revision",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00003", 100),
				Tags: map[string]string{"v1": "hello-00001"}}},
			revs: []int{1, 2, 3},
			want: map[string]bool{"hello-00001": true, "hello-00002": false, "hello-00003": true},
		},
		{
			name: "a rollout in progress keeps the previous and the new",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00002", 100)},
				Rollout: &consulroute.RolloutRoute{New: "hello-00003", Previous: "hello-00002", Phase: consulroute.RolloutWaking}},
			revs: []int{1, 2, 3},
			want: map[string]bool{"hello-00001": false, "hello-00002": true, "hello-00003": true},
		},
		{
			name: "a rolled-back canary is left, though newer",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00002", 100)},
				Rollout: &consulroute.RolloutRoute{New: "hello-00003", Previous: "hello-00002", Phase: consulroute.RolloutRolledBack}},
			revs: []int{2, 3},
			want: map[string]bool{"hello-00002": true, "hello-00003": false},
		},
		{
			name: "a completed rollout: the new is routed, the previous left",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00003", 100)},
				Rollout: &consulroute.RolloutRoute{New: "hello-00003", Previous: "hello-00002", Phase: consulroute.RolloutCompleted}},
			revs: []int{2, 3},
			want: map[string]bool{"hello-00002": false, "hello-00003": true},
		},
		{
			name:    "a rollback by hand: the latest ready revision is left, though newer",
			service: &Service{Latest: "hello-00002", Route: consulroute.Route{Splits: split("hello-00001", 100)}},
			revs:    []int{1, 2, 3},
			want:    map[string]bool{"hello-00001": true, "hello-00002": false, "hello-00003": true},
		},
		{
			name:    "traffic pinned to an old revision: a new ready one is left",
			service: &Service{Latest: "hello-00003", Route: consulroute.Route{Splits: split("hello-00001", 100)}},
			revs:    []int{1, 2, 3},
			want:    map[string]bool{"hello-00001": true, "hello-00002": false, "hello-00003": false},
		},
		{
			name:    "the route names only revisions the catalog does not know",
			service: &Service{Route: consulroute.Route{Splits: split("hello-00009", 100)}},
			revs:    []int{1, 2},
			want:    map[string]bool{"hello-00001": true, "hello-00002": true},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			cat := New()
			for _, g := range c.revs {
				cat.SetRevision(Revision{Name: revName(g), Service: "hello", Namespace: "default", Generation: g})
			}
			// Another service's route changes nothing of hello's.
			cat.SetRevision(Revision{Name: "other-00001", Service: "other", Generation: 1})
			cat.SetService(Service{Name: "other", Route: consulroute.Route{Splits: split("other-00001", 100)}})
			if c.service != nil {
				s := *c.service
				s.Name = "hello"
				cat.SetService(s)
			}
			got := map[string]bool{}
			for _, r := range cat.Revisions() {
				if r.Service != "hello" {
					if r.Unreachable {
						t.Errorf("%s unreachable", r.Name)
					}
					continue
				}
				got[r.Name] = !r.Unreachable
				one, ok := cat.Revision(r.Name)
				if !ok || one.Unreachable != r.Unreachable {
					t.Errorf("Revision(%s).Unreachable = %v, Revisions says %v", r.Name, one.Unreachable, r.Unreachable)
				}
			}
			for name, want := range c.want {
				if got[name] != want {
					t.Errorf("%s reachable = %v, want %v (all: %v)", name, got[name], want, got)
				}
			}
		})
	}
}

// TestReachabilityFollowsTheRoute: the cached list is worked out again when
// the route moves, and what a reader hands back is never stored.
func TestReachabilityFollowsTheRoute(t *testing.T) {
	cat := New()
	for g := 1; g <= 2; g++ {
		cat.SetRevision(Revision{Name: revName(g), Service: "hello", Generation: g})
	}
	route := func(rev string) {
		cat.SetService(Service{Name: "hello", Latest: "hello-00002",
			Route: consulroute.Route{Splits: []consulroute.Split{{Revision: rev, Percent: 100}}}})
	}
	route("hello-00002")
	if r, _ := cat.Revision("hello-00001"); !r.Unreachable {
		t.Fatal("hello-00001 reachable with the route on hello-00002")
	}
	ch := cat.Changed()
	r, _ := cat.Revision("hello-00001")
	cat.SetRevision(r) // as read: unchanged, so no notification
	select {
	case <-ch:
		t.Fatal("setting a revision as read notified")
	default:
	}
	route("hello-00001") // a rollback by hand
	for _, r := range cat.Revisions() {
		if want := r.Name == "hello-00001"; r.Unreachable == want {
			t.Errorf("%s unreachable = %v after the route moved back", r.Name, r.Unreachable)
		}
	}
}

func revName(gen int) string {
	return "hello-0000" + string(rune('0'+gen))
}
