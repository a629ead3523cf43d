package consulroute

import (
	"reflect"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestRetain(t *testing.T) {
	now := time.Date(2024, 6, 1, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	rev := func(gen int, age time.Duration, instances int) RevisionState {
		return RevisionState{Name: spec.RevisionName("hello", gen), Generation: gen, Created: now.Add(-age), Ready: true, Instances: instances}
	}
	route := func(splits map[int]int, tags map[string]int) Route {
		r := Route{Service: "hello"}
		for gen := 1; gen <= 99; gen++ {
			if p, ok := splits[gen]; ok {
				r.Splits = append(r.Splits, Split{Revision: spec.RevisionName("hello", gen), Percent: p})
			}
		}
		for tag, gen := range tags {
			if r.Tags == nil {
				r.Tags = map[string]string{}
			}
			r.Tags[tag] = spec.RevisionName("hello", gen)
		}
		return r
	}
	type want struct {
		keep   bool
		reason string
	}
	cases := []struct {
		name   string
		revs   []RevisionState
		route  Route
		latest int
		policy RetentionPolicy
		want   map[int]want // by generation
	}{
		{
			name:   "one revision, latest and routed",
			revs:   []RevisionState{rev(1, 30*day, 0)},
			route:  route(map[int]int{1: 100}, nil),
			latest: 1, policy: DefaultRetention(),
			want: map[int]want{1: {true, "routed 100%, latest"}},
		},
		{
			name: "split, tag, latest, the 3 most recent unrouted, then age",
			revs: []RevisionState{
				rev(9, 1*day, 0), rev(8, 2*day, 0), rev(7, 3*day, 0), rev(6, 4*day, 0),
				rev(5, 5*day, 0), rev(4, 6*day, 0), rev(3, 7*day, 0), rev(2, 8*day, 0), rev(1, 9*day, 0),
			},
			route:  route(map[int]int{9: 90, 2: 10}, map[string]int{"old": 1}),
			latest: 9, policy: DefaultRetention(),
			want: map[int]want{
				9: {true, "routed 90%, latest"},
				8: {true, "among the 3 most recent"},
				7: {true, "among the 3 most recent"},
				6: {true, "among the 3 most recent"},
				5: {false, "older than 2d and not routed"},
				4: {false, "older than 2d and not routed"},
				3: {false, "older than 2d and not routed"},
				2: {true, "routed 10%"},
				1: {true, "tagged old"},
			},
		},
		{
			name:   "young unrouted revisions stay until MinAge",
			revs:   []RevisionState{rev(6, time.Hour, 0), rev(5, 2*time.Hour, 0), rev(4, 3*time.Hour, 0), rev(3, 4*time.Hour, 0), rev(2, 47*time.Hour, 0), rev(1, 48*time.Hour, 0)},
			route:  route(map[int]int{6: 100}, nil),
			latest: 6, policy: DefaultRetention(),
			want: map[int]want{
				6: {true, "routed 100%, latest"},
				5: {true, "among the 3 most recent"}, 4: {true, "among the 3 most recent"}, 3: {true, "among the 3 most recent"},
				2: {true, "younger than 2d"},
				1: {false, "older than 2d and not routed"},
			},
		},
		{
			name:   "MaxKept caps young revisions too",
			revs:   []RevisionState{rev(5, time.Minute, 0), rev(4, time.Minute, 0), rev(3, time.Minute, 0), rev(2, time.Minute, 0), rev(1, time.Minute, 0)},
			route:  route(map[int]int{5: 100}, nil),
			latest: 5, policy: RetentionPolicy{KeepRecent: 1, MinAge: 7 * day, MaxKept: 2},
			want: map[int]want{
				5: {true, "routed 100%, latest"},
				4: {true, "the most recent"},
				3: {true, "younger than 7d"},
				2: {false, "beyond the 2 most recent not routed"},
				1: {false, "beyond the 2 most recent not routed"},
			},
		},
		{
			name:   "instances still running (draining) keep an old revision",
			revs:   []RevisionState{rev(3, day, 0), rev(2, 30*day, 0), rev(1, 30*day, 2)},
			route:  route(map[int]int{3: 100}, nil),
			latest: 3, policy: RetentionPolicy{KeepRecent: 0, MinAge: 7 * day},
			want: map[int]want{
				3: {true, "routed 100%, latest"},
				2: {false, "older than 7d and not routed"},
				1: {true, "has 2 instances"},
			},
		},
		{
			name:   "a revision newer than latest (failed deploy) follows the same rules; latest kept even unrouted",
			revs:   []RevisionState{rev(4, 10*day, 0), rev(3, 10*day, 0), rev(2, 10*day, 0)},
			route:  route(map[int]int{2: 100}, map[string]int{"a": 2, "b": 2}),
			latest: 3, policy: RetentionPolicy{KeepRecent: 0, MinAge: day},
			want: map[int]want{
				4: {false, "older than 1d and not routed"},
				3: {true, "latest"},
				2: {true, "routed 100%, tagged a, b"},
			},
		},
		{
			name:   "unknown creation time is never deleted on age",
			revs:   []RevisionState{{Name: "hello-00002", Generation: 2, Created: now}, {Name: "hello-00001", Generation: 1}},
			route:  route(map[int]int{2: 100}, nil),
			latest: 2, policy: RetentionPolicy{MinAge: time.Hour},
			want: map[int]want{2: {true, "routed 100%, latest"}, 1: {true, "creation time unknown"}},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.policy.Validate(); err != nil {
				t.Fatal(err)
			}
			got := Retain(now, tc.revs, tc.route, spec.RevisionName("hello", tc.latest), tc.policy)
			if len(got) != len(tc.revs) {
				t.Fatalf("%d decisions for %d revisions", len(got), len(tc.revs))
			}
			for i, d := range got {
				if i > 0 {
					_, prev, _ := spec.ParseRevisionName(got[i-1].Revision)
					_, cur, _ := spec.ParseRevisionName(d.Revision)
					if prev < cur {
						t.Errorf("decisions not newest first: %s before %s", got[i-1].Revision, d.Revision)
					}
				}
				_, gen, _ := spec.ParseRevisionName(d.Revision)
				w := tc.want[gen]
				if d.Keep != w.keep || d.Reason != w.reason {
					t.Errorf("%s: keep=%v %q, want keep=%v %q", d.Revision, d.Keep, d.Reason, w.keep, w.reason)
				}
			}
		})
	}
}

func TestRetainDoesNotModifyInput(t *testing.T) {
	revs := []RevisionState{{Name: "hello-00001", Generation: 1}, {Name: "hello-00002", Generation: 2}}
	orig := append([]RevisionState(nil), revs...)
	Retain(time.Now(), revs, Route{}, "hello-00002", DefaultRetention())
	if !reflect.DeepEqual(revs, orig) {
		t.Error("Retain reordered its input")
	}
}

func TestRetentionPolicyValidate(t *testing.T) {
	if err := DefaultRetention().Validate(); err != nil {
		t.Errorf("default: %v", err)
	}
	for _, p := range []RetentionPolicy{{KeepRecent: -1}, {MinAge: -time.Second}, {MaxKept: -1}, {KeepRecent: 5, MaxKept: 2}} {
		if p.Validate() == nil {
			t.Errorf("accepted %+v", p)
		}
	}
}
