package rollout

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

type fakeInstances struct {
	allocs map[string][]nomadjob.Allocation
	health map[string][]consulroute.InstanceHealth
	err    error
}

func (f fakeInstances) Allocations(_ context.Context, rev string) ([]nomadjob.Allocation, error) {
	return f.allocs[rev], f.err
}

func (f fakeInstances) Health(_ context.Context, rev string) ([]consulroute.InstanceHealth, error) {
	return f.health[rev], nil
}

// status explains each revision Nomad runs with fewer ready instances than
// asked, from what Nomad and Consul say, and nothing else.
func TestExplainNotReady(t *testing.T) {
	v := ServiceView{Service: "hello", Revisions: []RevisionRow{
		{Revision: "hello-00005", Desired: 1},                // crashed
		{Revision: "hello-00004", Desired: 2, Ready: 1},      // one not ready: its check says why
		{Revision: "hello-00003", Desired: 1},                // never placed
		{Revision: "hello-00002", Desired: 1, Ready: 1},      // fine
		{Revision: "hello-00001", Desired: 1, Stopped: true}, // stopped: not run
		{Revision: "hello-00006", Desired: 0},                // at zero
	}}
	f := fakeInstances{
		allocs: map[string][]nomadjob.Allocation{
			"hello-00005": {{ID: "aaaaaaaa-1", ClientStatus: "failed", DesiredStatus: "run", Failure: "task user: Exit 1: crashed on start"}},
			"hello-00004": {
				{ID: "bbbbbbbb-1", ClientStatus: "running", DesiredStatus: "run", Running: true},
				{ID: "cccccccc-1", ClientStatus: "running", DesiredStatus: "run", Running: true, Failure: "task user: restarting (2 restarts)"},
			},
		},
		health: map[string][]consulroute.InstanceHealth{
			"hello-00004": {
				{Instance: consulroute.Instance{ID: "_nomad-task-bbbbbbbb"}, Passing: true, Output: "ok"},
				{Instance: consulroute.Instance{ID: "_nomad-task-cccccccc"}, Status: "critical", Output: "readiness: GET /healthz: 503 warming up\nmore"},
			},
		},
	}
	nrs := ExplainNotReady(context.Background(), f, v)
	if len(nrs) != 3 {
		t.Fatalf("explained %+v", nrs)
	}
	want := []struct{ rev, reason, check string }{
		{"hello-00005", "allocation aaaaaaaa: task user: Exit 1: crashed on start", ""},
		{"hello-00004", "allocations 2 running; allocation cccccccc: task user: restarting (2 restarts)", "check on _nomad-task-cccccccc: readiness: GET /healthz: 503 warming up"},
		{"hello-00003", "no allocations yet (Nomad has not placed any: see `nomad job status hello-00003` for placement failures)", ""},
	}
	for i, w := range want {
		nr := nrs[i]
		if nr.Revision != w.rev || nr.Reason != w.reason {
			t.Errorf("%d: %s: %q, want %s: %q", i, nr.Revision, nr.Reason, w.rev, w.reason)
		}
		if got := strings.Join(nr.Checks, "|"); got != w.check {
			t.Errorf("%s checks %q, want %q", nr.Revision, got, w.check)
		}
	}

	// Nomad unreachable: said, not hidden.
	f.err = errors.New("connection refused")
	nrs = ExplainNotReady(context.Background(), f, ServiceView{Revisions: []RevisionRow{{Revision: "hello-00005", Desired: 1}}})
	if len(nrs) != 1 || !strings.Contains(nrs[0].Reason, "Nomad: connection refused") {
		t.Errorf("%+v", nrs)
	}
}
