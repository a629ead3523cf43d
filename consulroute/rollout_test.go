package consulroute

import (
	"reflect"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestRecordRouteSplitsTheLatestShareDuringARollout(t *testing.T) {
	svc := spec.Service{Name: "hello", Traffic: []spec.TrafficTarget{
		{Latest: true, Percent: 90},
		{Revision: "hello-00001", Percent: 10, Tag: "old"},
	}}
	rec := Record{Service: svc, Latest: "hello-00003", Revisions: []string{"hello-00001", "hello-00002", "hello-00003"}}
	for _, tc := range []struct {
		name string
		ro   *RolloutRoute
		want []Split
	}{
		{"no rollout", nil, []Split{{"hello-00003", 90}, {"hello-00001", 10}}},
		{"pending holds nothing on the new revision", &RolloutRoute{New: "hello-00003", Previous: "hello-00002", Phase: RolloutPending},
			[]Split{{"hello-00001", 10}, {"hello-00002", 90}}},
		{"a step", &RolloutRoute{New: "hello-00003", Previous: "hello-00002", Phase: RolloutStepping, NewPercent: 9},
			[]Split{{"hello-00003", 9}, {"hello-00001", 10}, {"hello-00002", 81}}},
		{"previous also pinned", &RolloutRoute{New: "hello-00003", Previous: "hello-00001", Phase: RolloutStepping, NewPercent: 45},
			[]Split{{"hello-00003", 45}, {"hello-00001", 55}}},
		{"ended rollouts leave latest alone", &RolloutRoute{New: "hello-00003", Previous: "hello-00002", Phase: RolloutCompleted, NewPercent: 0},
			[]Split{{"hello-00003", 90}, {"hello-00001", 10}}},
		{"a rollout of another revision is stale", &RolloutRoute{New: "hello-00002", Previous: "hello-00001", Phase: RolloutStepping, NewPercent: 5},
			[]Split{{"hello-00003", 90}, {"hello-00001", 10}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec.Rollout = tc.ro
			route, err := rec.validate()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(route.Splits, tc.want) {
				t.Errorf("splits = %v, want %v", route.Splits, tc.want)
			}
			if route.Tags["old"] != "hello-00001" {
				t.Errorf("tags = %v: the rollout must leave them as written", route.Tags)
			}
		})
	}
}

func TestRolloutHistoryIsBounded(t *testing.T) {
	var r RolloutRoute
	for i := range MaxRolloutHistory + 7 {
		r.AddHistory(RolloutEvent{Kind: "judged", Message: string(rune('a' + i%26))})
	}
	if len(r.History) != MaxRolloutHistory {
		t.Fatalf("history has %d events, want %d", len(r.History), MaxRolloutHistory)
	}
	if r.History[0].Message != string(rune('a'+7%26)) {
		t.Errorf("the oldest kept is %q: the oldest must go first", r.History[0].Message)
	}
}

func TestRolloutKey(t *testing.T) {
	if got, want := RolloutKey("", "hello"), "nomad-serverless/control-plane/rollouts/default/hello"; got != want {
		t.Errorf("RolloutKey = %q, want %q", got, want)
	}
}

// Every step of a rollout reaches the service-splitter, as the gateway
// sees it in the record, and an ended rollout leaves latest alone.
func TestPublishWritesEveryRolloutStepToTheSplitter(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	f.afterWrite = noDanglingRoutes(t, "hello")
	publish(t, c, recordWith(nil, "hello-00001", []string{"hello-00001"}, nil))
	rec := recordWith(nil, "hello-00002", []string{"hello-00001", "hello-00002"}, nil)
	for _, tc := range []struct {
		phase   string
		percent int
		want    []Split
	}{
		{RolloutPending, 0, []Split{{"hello-00001", 100}}},
		{RolloutStepping, 10, []Split{{"hello-00002", 10}, {"hello-00001", 90}}},
		{RolloutStepping, 50, []Split{{"hello-00002", 50}, {"hello-00001", 50}}},
		{RolloutCompleted, 100, []Split{{"hello-00002", 100}}},
	} {
		rec.Rollout = &RolloutRoute{ID: "r1", New: "hello-00002", Previous: "hello-00001", Phase: tc.phase, NewPercent: tc.percent}
		publish(t, c, rec) // checks Consul's route equals the record's
		route, err := c.ReadRoute(ctxTimeout(t, 5*time.Second), "hello")
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(route.Splits, tc.want) {
			t.Errorf("%s %d%%: splitter %v, want %v", tc.phase, tc.percent, route.Splits, tc.want)
		}
	}
}
