package rollout

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// routeRemover removes fakeCluster's record, or fails with err.
type routeRemover struct {
	f   *fakeCluster
	err error
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
	err := Delete(ctx, f, routeRemover{f: f, err: errors.New("Consul: 500")}, "default", "hello", &out, &diag)
	if err == nil || !strings.Contains(err.Error(), "No revision was purged") || len(f.purged) != 0 {
		t.Fatalf("Delete with the route kept: %v, purged %v", err, f.purged)
	}

	out.Reset()
	if err := Delete(ctx, f, routeRemover{f: f}, "default", "hello", &out, &diag); err != nil {
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
	if err := Delete(ctx, f, routeRemover{f: f}, "default", "hello", &out, &diag); err == nil || !strings.Contains(err.Error(), `service "hello" not found in namespace default`) {
		t.Errorf("Delete of a deleted service: %v", err)
	}
}
