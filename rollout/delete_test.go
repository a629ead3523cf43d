package rollout

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// routeRemover removes fakeCluster's record, or fails with err. Its
// registrations answer Registrations: the i-th blocking query (index i)
// answers registrations[i]; past the end it blocks until ctx ends.
type routeRemover struct {
	f             *fakeCluster
	err           error
	registrations [][]consulroute.Registration
	replicas      []consulroute.ReplicaRegistration
}

func (r routeRemover) ReplicaRegistrations(context.Context) ([]consulroute.ReplicaRegistration, error) {
	return r.replicas, nil
}

func (r routeRemover) Registrations(ctx context.Context, _ string, index uint64) ([]consulroute.Registration, uint64, error) {
	if int(index) < len(r.registrations) {
		return r.registrations[index], index + 1, nil
	}
	if index == 0 {
		return nil, 1, nil
	}
	<-ctx.Done()
	return nil, 0, ctx.Err()
}

func (r routeRemover) Delete(_ context.Context, _, service string) error {
	if r.err != nil {
		return r.err
	}
	r.f.mu.Lock()
	defer r.f.mu.Unlock()
	if _, ok := r.f.record[service]; !ok {
		return consulroute.ErrNotFound
	}
	delete(r.f.record, service)
	return nil
}

func TestDeleteRemovesTheRouteThenPurges(t *testing.T) {
	f := newFakeCluster()
	for _, v := range []string{"1", "2"} {
		f.polls = 0
		if code, out, errs := runTestDeploy(t, f, parseDeployFile(t, v, "")); code != exitOK {
			t.Fatalf("deploy: %d\n%s%s", code, out, errs)
		}
	}
	ctx := context.Background()

	// A route Consul will not remove: nothing is purged.
	var out, diag bytes.Buffer
	err := Delete(ctx, f, routeRemover{f: f, err: errors.New("Consul: 500")}, "default", "hello", time.Minute, &out, &diag)
	if err == nil || !strings.Contains(err.Error(), "No revision was purged") || len(f.purged) != 0 {
		t.Fatalf("Delete with the route kept: %v, purged %v", err, f.purged)
	}

	out.Reset()
	if err := Delete(ctx, f, routeRemover{f: f}, "default", "hello", time.Minute, &out, &diag); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"hello: route removed from Consul\n", "hello-00001: purged from Nomad\n", "hello-00002: purged from Nomad\n"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if strings.Index(out.String(), "route removed") > strings.Index(out.String(), "purged") {
		t.Errorf("purged before the route was removed:\n%s", out.String())
	}
	if err := Delete(ctx, f, routeRemover{f: f}, "default", "hello", time.Minute, &out, &diag); err == nil || !strings.Contains(err.Error(), `service "hello" not found in namespace default`) {
		t.Errorf("Delete of a deleted service: %v", err)
	}
}

func TestDeleteWaitsUntilConsulListsNothing(t *testing.T) {
	f := newFakeCluster()
	if code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", "")); code != exitOK {
		t.Fatalf("deploy: %d\n%s%s", code, out, errs)
	}
	instance := consulroute.Registration{ID: "_nomad-task-1", Node: "node-1", Status: "passing"}
	standIn := consulroute.Registration{ID: "hello-00001-activator-r2", Node: "node-2", Status: "critical", Replica: "r2"}
	var out, diag bytes.Buffer
	rr := routeRemover{f: f, registrations: [][]consulroute.Registration{{instance, standIn}, {standIn}, {}}}
	if err := Delete(context.Background(), f, rr, "default", "hello", time.Minute, &out, &diag); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"hello-00001: purged from Nomad\nhello-00001: waiting for Consul to drop 1 instance (Nomad removes each when its allocation has stopped) and 1 activator stand-in (each control-plane replica removes its own)\n",
		"hello-00001: gone from Consul\n",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if diag.Len() != 0 {
		t.Errorf("diagnostics: %s", diag.String())
	}
}

func TestDeleteSaysWhatConsulStillListsWhenTheWaitRunsOut(t *testing.T) {
	const node = "nomad-serverless-stand-ins-r2-07"
	for _, tc := range []struct {
		name     string
		replicas []consulroute.ReplicaRegistration
		want     string
	}{
		{"dead replica", []consulroute.ReplicaRegistration{{Replica: "r2", Critical: true}},
			"hello-00001-activator-r2 on catalog node " + node + ": the stand-in of control-plane replica r2, which is not running: the leading replica removes its stand-ins a few seconds after the replica's Consul session ended"},
		{"running replica", []consulroute.ReplicaRegistration{{Replica: "r2"}},
			"the stand-in of control-plane replica r2, which runs and has not seen the delete yet: see its log"},
		{"replica gone", nil,
			"the stand-in of control-plane replica r2, which is gone: the next control-plane replica to start removes it (it removes the stand-ins of replicas no longer registered), or remove its node by hand: curl -X PUT $CONSUL_HTTP_ADDR/v1/catalog/deregister -d '{\"Node\":\"" + node + "\"}'"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeCluster()
			if code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", "")); code != exitOK {
				t.Fatalf("deploy: %d\n%s%s", code, out, errs)
			}
			standIn := consulroute.Registration{ID: "hello-00001-activator-r2", Node: node, Status: "passing", Replica: "r2"}
			var out, diag bytes.Buffer
			// Every query answers the replica's stand-in; blocking ones
			// wait for the deadline.
			rr := routeRemover{f: f, registrations: [][]consulroute.Registration{{standIn}}, replicas: tc.replicas}
			if err := Delete(context.Background(), f, stillThere{rr, standIn}, "default", "hello", 50*time.Millisecond, &out, &diag); err != nil {
				t.Fatalf("a leftover is not a failed delete: %v", err)
			}
			if !strings.Contains(diag.String(), tc.want) || !strings.Contains(diag.String(), "still in Consul after 50ms") {
				t.Errorf("diagnostics lack %q:\n%s", tc.want, diag.String())
			}
			if strings.Contains(out.String(), "gone from Consul") {
				t.Errorf("said gone:\n%s", out.String())
			}
		})
	}
}

// stillThere is a routeRemover whose revision's service never empties:
// the first and the last look (index 0) both list leftover.
type stillThere struct {
	routeRemover
	leftover consulroute.Registration
}

func (s stillThere) Registrations(ctx context.Context, rev string, index uint64) ([]consulroute.Registration, uint64, error) {
	if index == 0 {
		return []consulroute.Registration{s.leftover}, 1, nil
	}
	return s.routeRemover.Registrations(ctx, rev, index)
}
