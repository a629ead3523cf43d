package nomadjob_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

func fakeClient(t *testing.T) (*fakecluster.Cluster, *nomadjob.Client) {
	t.Helper()
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1})
	nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	return c, nc
}

func sleeper(t *testing.T, svc *spec.Service, gen int) *api.Job {
	t.Helper()
	job, err := nomadjob.Compile(spec.NewRevision(svc, gen), nomadjob.Options{Sidecar: nomadjob.SidecarOptions{Command: "/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range job.TaskGroups[0].Tasks {
		task.Config = map[string]any{"command": "/bin/sh", "args": []string{"-c", "exec sleep 60"}}
		task.KillTimeout = new(time.Second)
	}
	job.TaskGroups[0].Services = nil
	return job
}

func sleepService() spec.Service {
	s := spec.NewService("stop")
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "/bin/sh"}
	s.Scaling.Min, s.Scaling.Max, s.Scaling.Initial = 1, 3, 1
	return s
}

// Stop keeps the job, stopped; a stopped revision is not the one a deploy
// of the same template reuses.
func TestStopKeepsTheJobAndPlanMakesANewRevision(t *testing.T) {
	c, nc := fakeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	svc := sleepService()
	if _, err := nc.Register(ctx, sleeper(t, &svc, 1), 0); err != nil {
		t.Fatal(err)
	}
	// Nomad refuses a count above max; below min it does not (the
	// autoscaler holds min, and would start the instance again: stopping
	// is how a failed revision with min 1 is stopped).
	if err := nc.Scale(ctx, "stop-00001", 4, "above max", nil); !errors.Is(err, nomadjob.ErrOutOfBounds) {
		t.Fatalf("scale above max: %v, want ErrOutOfBounds", err)
	}
	if err := nc.Stop(ctx, "stop-00001"); err != nil {
		t.Fatal(err)
	}
	revs, err := nc.Revisions(ctx, "default", "stop")
	if err != nil || len(revs) != 1 || !revs[0].Stopped {
		t.Fatalf("revisions after stop: %+v, %v", revs, err)
	}
	testbin.Eventually(t, 10*time.Second, 50*time.Millisecond, "the allocation stopped and complete", func() (bool, string) {
		as, err := nc.Allocations(ctx, "stop-00001")
		return err == nil && len(as) == 1 && as[0].Stopped() && as[0].ClientStatus == "complete", fmt.Sprintf("allocations %+v, %v", as, err)
	})
	plan, err := nc.Plan(ctx, &svc)
	if err != nil || plan.Unchanged || plan.Revision.Name() != "stop-00002" {
		t.Fatalf("plan after stop: unchanged %v revision %s, %v", plan.Unchanged, plan.Revision.Name(), err)
	}
	if ids := c.Nomad.JobIDs(); len(ids) != 1 {
		t.Fatalf("jobs %v, want the stopped one kept", ids)
	}
}

// UpdateScaling moves a count outside new bounds into them, in the same
// registration, and says why in the scaling events; inside them it keeps
// the count (PreserveCounts) even when the job changed in between.
func TestUpdateScalingAgainstTheFake(t *testing.T) {
	c, nc := fakeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	svc := sleepService()
	svc.Scaling.Min = 0
	if _, err := nc.Register(ctx, sleeper(t, &svc, 1), 0); err != nil {
		t.Fatal(err)
	}
	if err := nc.Scale(ctx, "stop-00001", 3, "busy", nil); err != nil {
		t.Fatal(err)
	}
	s := svc.Scaling
	s.Max = 2
	if err := nc.UpdateScaling(ctx, "stop-00001", s); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Nomad.Count("default", "stop-00001", "app"); n != 2 {
		t.Errorf("count %d after max fell to 2, want 2", n)
	}
	evs, err := nc.ScalingEvents(ctx, "stop-00001")
	if err != nil || len(evs) != 2 || !strings.Contains(evs[0].Message, "scaling bounds changed to 0..2: count 3 moved into them (2)") {
		t.Errorf("scaling events %+v, %v", evs, err)
	}
	s.Max = 5
	if err := nc.UpdateScaling(ctx, "stop-00001", s); err != nil {
		t.Fatal(err)
	}
	job := c.Nomad.Job("default", "stop-00001")
	if *job.TaskGroups[0].Count != 2 || *job.TaskGroups[0].Scaling.Max != 5 {
		t.Errorf("count %d max %d after raising max, want 2 and 5", *job.TaskGroups[0].Count, *job.TaskGroups[0].Scaling.Max)
	}
	info, err := nc.Revision(ctx, "stop-00001")
	if err != nil || info.Scaling.Max != 5 {
		t.Errorf("scaling read back: %+v, %v", info.Scaling, err)
	}
	// The same settings again change nothing.
	before := *job.JobModifyIndex
	if err := nc.UpdateScaling(ctx, "stop-00001", s); err != nil {
		t.Fatal(err)
	}
	if after := *c.Nomad.Job("default", "stop-00001").JobModifyIndex; after != before {
		t.Errorf("an unchanged UpdateScaling wrote the job (%d -> %d)", before, after)
	}
}
