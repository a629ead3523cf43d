package nomadjob_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The fake cluster's allocation stats, through UsageReader: a serving task
// that burns cpu reads well above its 100 MHz once measured twice (the
// first measure of a process reads 0, as on raw_exec), with its memory
// against 64 MiB.
func TestUsageReaderOnFakeCluster(t *testing.T) {
	c, nc := fakeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	svc := sleepService()
	svc.Name = "burn"
	svc.Template.Task.Resources.CPU, svc.Template.Task.Resources.MemoryMB = 100, 64
	job := sleeper(t, &svc, 1)
	for _, task := range job.TaskGroups[0].Tasks {
		if task.Name == spec.UserTaskName {
			// Bounded: the loop ends by itself after 20 s.
			task.Config = map[string]any{"command": "/bin/sh", "args": []string{"-c", "exec timeout 20 sh -c 'while :; do :; done'"}}
		}
	}
	if _, err := nc.Register(ctx, job, 0); err != nil {
		t.Fatal(err)
	}
	var alloc string
	testbin.Eventually(t, 10*time.Second, 50*time.Millisecond, "the allocation runs", func() (bool, string) {
		as := c.Nomad.Allocations("default", "burn-00001")
		if len(as) == 1 && as[0].PIDs[spec.UserTaskName] > 0 {
			alloc = as[0].ID
			return true, ""
		}
		return false, fmt.Sprintf("%+v", as)
	})
	ur := nomadjob.NewUsageReader(nc)
	first, err := ur.Utilization(ctx, "burn-00001", alloc, spec.MetricCPU)
	if err != nil || first != 0 {
		t.Fatalf("first measure %v%% (%v), want 0 (no interval yet)", first, err)
	}
	var cpu float64
	testbin.Eventually(t, 10*time.Second, 200*time.Millisecond, "the busy task reads above its reservation", func() (bool, string) {
		cpu, err = ur.Utilization(ctx, "burn-00001", alloc, spec.MetricCPU)
		return err == nil && cpu > 100, fmt.Sprintf("%v%% (%v)", cpu, err)
	})
	u, err := ur.ServingUsage(ctx, "burn-00001", alloc)
	if err != nil || u.ReservedCPUMHz != 100 || u.ReservedMemoryMB != 64 || u.MemoryBytes == 0 {
		t.Fatalf("usage %+v (%v), want the reservation 100 MHz / 64 MiB and some RSS", u, err)
	}
	t.Logf("busy user task: cpu %.0f%% of reserved, %d bytes RSS", cpu, u.MemoryBytes)
}
