package rollout

import (
	"context"
	"fmt"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// idleRevision is a revision job at zero: a real job shape for the
// collector, with nothing to run.
func idleRevision(t *testing.T, service string, gen int) *nomadapi.Job {
	t.Helper()
	svc := spec.NewService(service)
	svc.Template.Task.Driver = "raw_exec"
	svc.Template.Task.Config = map[string]any{"command": "/bin/sh"}
	svc.Scaling.Min, svc.Scaling.Initial = 0, 0
	job, err := nomadjob.Compile(spec.NewRevision(&svc, gen), nomadjob.Options{Sidecar: nomadjob.SidecarOptions{Command: "/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// TestCollectRevisionsAgainstTheFakeCluster runs garbage collection
// through the real adapters: the old revision leaves the route (Consul
// refuses to remove a resolver or service-defaults something still routes
// to, so the order matters), its job is purged, and the record forgets it.
func TestCollectRevisionsAgainstTheFakeCluster(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1})
	nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	cc, err := consulroute.NewClient(c.Consul.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for gen := 1; gen <= 3; gen++ {
		if _, err := nc.Register(ctx, idleRevision(t, "gc", gen), 0); err != nil {
			t.Fatal(err)
		}
	}
	svc := spec.NewService("gc")
	svc.Traffic = []spec.TrafficTarget{{Latest: true, Percent: 100}, {Revision: "gc-00002", Tag: "old"}}
	rec := consulroute.Record{Service: svc, Latest: "gc-00003", Revisions: []string{"gc-00001", "gc-00002", "gc-00003"}}
	if err := cc.Publish(ctx, rec, 0); err != nil {
		t.Fatal(err)
	}
	if c.Consul.ConfigEntry("service-resolver", "gc-00001") == nil {
		t.Fatal("publish wrote no resolver for gc-00001")
	}
	// Keep nothing that is not routed: gc-00001 goes; gc-00002 (tagged)
	// and gc-00003 (latest) stay.
	gone, err := Collect(ctx, nc, cc, "default", "gc", consulroute.RetentionPolicy{}, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 1 || gone[0].Revision != "gc-00001" {
		t.Fatalf("collected %+v, want gc-00001 only", gone)
	}
	if ids := c.Nomad.JobIDs(); fmt.Sprint(ids) != "[default/gc-00002 default/gc-00003]" {
		t.Errorf("jobs after collection: %v", ids)
	}
	for _, kind := range []string{"service-resolver", "service-defaults"} {
		if c.Consul.ConfigEntry(kind, "gc-00001") != nil {
			t.Errorf("%s gc-00001 still exists", kind)
		}
		if c.Consul.ConfigEntry(kind, "gc-00002") == nil {
			t.Errorf("%s gc-00002 (tagged) was removed", kind)
		}
	}
	got, _, err := cc.ReadRecord(ctx, "default", "gc")
	if err != nil || fmt.Sprint(got.Revisions) != "[gc-00002 gc-00003]" || len(got.Deleting) != 0 {
		t.Errorf("record after collection: %+v, %v", got, err)
	}
	if _, err := cc.DiscoveryChain(ctx, "gc"); err != nil {
		t.Errorf("the chain no longer compiles: %v", err)
	}
}
