package controlplane

import (
	"context"
	"fmt"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// sleepingRevision is a revision job whose tasks only sleep: a real job
// shape for the feeder, no sidecar to wait for.
func sleepingRevision(t *testing.T, service string, gen, count int) *nomadapi.Job {
	t.Helper()
	return sleepingRevisionScaled(t, service, gen, count, nil)
}

// sleepingRevisionScaled is sleepingRevision with its scaling changed by
// mod.
func sleepingRevisionScaled(t *testing.T, service string, gen, count int, mod func(*spec.Scaling)) *nomadapi.Job {
	t.Helper()
	svc := spec.NewService(service)
	svc.Template.Task.Driver = "raw_exec"
	svc.Template.Task.Config = map[string]any{"command": "/bin/sh"}
	svc.Scaling.Min, svc.Scaling.Max, svc.Scaling.Initial = 0, 30, count
	if mod != nil {
		mod(&svc.Scaling)
	}
	job, err := nomadjob.Compile(spec.NewRevision(&svc, gen), nomadjob.Options{Sidecar: nomadjob.SidecarOptions{Command: "/bin/sh"}})
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

// TestFeedNomadCatchesUpAfterLosingEvents: Nomad keeps only its last 100
// events. When serve's event stream is down for longer than that many
// changes take, resuming from its last index silently skips the rest; the
// feeder must list again so the catalog does not stay wrong for good.
func TestFeedNomadCatchesUpAfterLosingEvents(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1, RescheduleDelay: time.Hour, HeartbeatInterval: time.Second})
	nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	nc.SetLogger(quietLog)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := nc.Register(ctx, sleepingRevision(t, "first", 1, 1), 0); err != nil {
		t.Fatal(err)
	}
	cat := catalog.New()
	done := make(chan error, 1)
	go func() { done <- feedNomad(ctx, nc, cat, newRevisionTags(), nil, nil, nil, quietLog) }()
	defer func() {
		cancel()
		<-done
	}()
	waitCatalog(t, cat, "first-00001 and its running allocation", func() bool {
		return running(cat, "first-00001") == 1
	})

	// The stream breaks and cannot come back for a while (a leader
	// election, a proxy in between): meanwhile a revision is registered,
	// and another scales up and down enough to push its events out of
	// Nomad's buffer.
	c.Nomad.SetFault(fakecluster.Fault{Status: 500, PathPrefix: "/v1/event/stream"})
	c.Nomad.Down()
	if err := c.Nomad.Up(); err != nil {
		t.Fatal(err)
	}
	// The feed's job reads leave keep-alive connections to the Nomad that
	// went down; a register (a PUT, not retried) must not pick one.
	nc.API().Close()
	if _, err := nc.Register(ctx, sleepingRevision(t, "second", 1, 2), 0); err != nil {
		t.Fatal(err)
	}
	if _, err := nc.Register(ctx, sleepingRevision(t, "churn", 1, 0), 0); err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{12, 0, 12, 0} {
		if err := nc.Scale(ctx, "churn-00001", n, "churn", nil); err != nil {
			t.Fatal(err)
		}
		waitAllocs(t, c, "churn-00001", n)
	}
	waitAllocs(t, c, "second-00001", 2)
	if err := nc.Scale(ctx, "first-00001", 0, "to zero while serve cannot hear", nil); err != nil {
		t.Fatal(err)
	}
	waitAllocs(t, c, "first-00001", 0)
	c.Nomad.SetFault(fakecluster.Fault{})

	waitCatalog(t, cat, "the catalog knows second-00001 with its 2 allocations and first-00001 at zero", func() bool {
		r, ok := cat.Revision("second-00001")
		f, _ := cat.Revision("first-00001")
		return ok && r.Desired == 2 && running(cat, "second-00001") == 2 && f.Desired == 0 && running(cat, "first-00001") == 0
	})
}

func running(cat *catalog.Catalog, rev string) int {
	n := 0
	for _, a := range cat.Allocations(rev) {
		if a.Running {
			n++
		}
	}
	return n
}

// eventually polls cond every 100 ms until it holds; after timeout it fails
// the test with what cond last said.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testbin.Eventually(t, timeout, 100*time.Millisecond, what, cond)
}

func waitCatalog(t *testing.T, cat *catalog.Catalog, what string, cond func() bool) {
	t.Helper()
	eventually(t, 30*time.Second, what, func() (bool, string) {
		var state []string
		for _, r := range cat.Revisions() {
			state = append(state, fmt.Sprintf("%s desired %d allocations %+v", r.Name, r.Desired, cat.Allocations(r.Name)))
		}
		return cond(), fmt.Sprintf("catalog: %v", state)
	})
}

// waitAllocs waits until a job has exactly n running allocations and none
// pending or stopping.
func waitAllocs(t *testing.T, c *fakecluster.Cluster, job string, n int) {
	t.Helper()
	eventually(t, 20*time.Second, fmt.Sprintf("%s runs %d allocations", job, n), func() (bool, string) {
		run, busy := 0, 0
		for _, a := range c.Nomad.Allocations("default", job) {
			switch {
			case a.ClientStatus == "running" && a.DesiredStatus == "run":
				run++
			case a.ClientStatus == "pending" || a.ClientStatus == "running":
				busy++
			}
		}
		return run == n && busy == 0, fmt.Sprintf("%d running, %d pending or stopping", run, busy)
	})
}

// Against the fake cluster's Nomad (real HTTP, the real client): the
// catalog is listed, every revision routable with its meta's fields,
// while no job can be read at all; once they can, every revision is whole.
func TestFeedNomadListsWithoutReadingJobs(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1, RescheduleDelay: time.Hour, HeartbeatInterval: time.Second})
	nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	nc.SetLogger(quietLog)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i, count := range []int{0, 0, 1} {
		if _, err := nc.Register(ctx, sleepingRevision(t, fmt.Sprintf("svc%d", i), 1, count), 0); err != nil {
			t.Fatal(err)
		}
	}
	waitAllocs(t, c, "svc2-00001", 1)
	// Job reads fail (a GET of /v1/job/<id>, allocations included); the
	// listing (/v1/jobs) does not.
	c.Nomad.SetFault(fakecluster.Fault{Status: 500, PathPrefix: "/v1/job/", Method: "GET"})
	cat, tags := catalog.New(), newRevisionTags()
	listed, read := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- feedNomad(ctx, nc, cat, tags, nil, func() { close(listed) }, func() { close(read) }, quietLog)
	}()
	defer func() {
		cancel()
		<-done
	}()
	select {
	case <-listed:
	case <-time.After(20 * time.Second):
		t.Fatal("not listed while jobs cannot be read")
	}
	for i := range 3 {
		name := fmt.Sprintf("svc%d-00001", i)
		r, ok := cat.Revision(name)
		if !ok || !r.Partial || r.Service != fmt.Sprintf("svc%d", i) || r.Namespace != "default" || r.Timeout != spec.DefaultTimeout || r.Generation != 1 {
			t.Errorf("%s listed as %+v, %v", name, r, ok)
		}
	}
	if r, _ := cat.Revision("svc2-00001"); r.Desired != 1 {
		t.Errorf("svc2-00001 desired %d, want the summary's 1 running", r.Desired)
	}
	select {
	case <-read:
		t.Fatal("read said done while no job could be read")
	default:
	}
	c.Nomad.SetFault(fakecluster.Fault{})
	select {
	case <-read:
	case <-time.After(30 * time.Second):
		t.Fatal("the jobs were never read")
	}
	for _, r := range cat.Revisions() {
		if r.Partial || r.Scaling.Max != 30 {
			t.Errorf("%s after its read: %+v", r.Name, r)
		}
	}
	if r, _ := cat.Revision("svc2-00001"); r.Desired != 1 {
		t.Errorf("svc2-00001 desired %d, want its job's 1", r.Desired)
	}
}

// busyScraper says every instance has 200 requests in flight, all along.
type busyScraper struct{}

func (busyScraper) Scrape(_ context.Context, inst consulroute.Instance) (spec.Stats, error) {
	return spec.Stats{Revision: inst.Revision, Instance: inst.ID, IntervalSeconds: 1, AverageConcurrency: 200, InFlight: 200}, nil
}

// The gap a new leader starts in: its catalog is listed (routable) but
// the jobs are not read, and it runs the autoscaler at once. A running
// revision of two instances, each with 200 requests in flight, wants two
// by its own scaling (target 1,000 an instance at 100 %); by the
// placeholder's (target 100 at 70 %) it would be raised to six at once
// (panic). While its job cannot be read it is not touched; once read, it
// is decided by its own scaling: kept at 2.
func TestNewLeaderDecidesNothingBeforeTheJobIsRead(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1, RescheduleDelay: time.Hour, HeartbeatInterval: time.Second})
	nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	nc.SetLogger(quietLog)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	job := sleepingRevisionScaled(t, "busy", 1, 2, func(s *spec.Scaling) {
		s.Target, s.Utilization, s.Window = 1000, 100, 2*time.Second
	})
	if _, err := nc.Register(ctx, job, 0); err != nil {
		t.Fatal(err)
	}
	waitAllocs(t, c, "busy-00001", 2)
	c.Nomad.SetFault(fakecluster.Fault{Status: 500, PathPrefix: "/v1/job/busy-00001", Method: "GET"})

	cat := catalog.New()
	listed := make(chan struct{})
	done := make(chan error, 2)
	go func() {
		done <- feedNomad(ctx, nc, cat, newRevisionTags(), nil, func() { close(listed) }, nil, quietLog)
	}()
	<-listed
	// Both instances pass (no Consul feed here: set by hand).
	cat.SetReady("busy-00001", []consulroute.Instance{{ID: "i1", Revision: "busy-00001"}, {ID: "i2", Revision: "busy-00001"}})
	auto, err := autoscaler.New(autoscaler.Config{Revisions: cat, Scaler: nc, Scraper: busyScraper{}, Tick: 200 * time.Millisecond, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	go func() { done <- auto.Run(ctx) }()
	defer func() {
		cancel()
		<-done
		<-done
	}()
	time.Sleep(3 * time.Second) // 15 ticks, a window and more
	if n, _ := c.Nomad.Count("default", "busy-00001", "app"); n != 2 {
		t.Fatalf("count %d while the job could not be read, want 2 untouched", n)
	}
	if r, _ := cat.Revision("busy-00001"); !r.Partial {
		t.Fatalf("busy-00001 = %+v, want partial", r)
	}
	c.Nomad.SetFault(fakecluster.Fault{})
	eventually(t, 30*time.Second, "the autoscaler decides busy-00001 once its job is read", func() (bool, string) {
		_, known := auto.ExcessBurstCapacity("busy-00001")
		return known, "no decision published"
	})
	time.Sleep(time.Second) // 5 ticks more
	if n, _ := c.Nomad.Count("default", "busy-00001", "app"); n != 2 {
		t.Errorf("count %d once read, want its own scaling's 2", n)
	}
}
