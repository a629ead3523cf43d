package nomadjob

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
	"github.com/nomad-serverless/nomad-serverless/test/testcert"
)

var fixedNow = time.Date(2026, 10, 1, 12, 0, 0, 0, time.UTC)

// newTestClient starts a replay of exchanges and a client talking to it.
// The namespace parameter, which the client sends on every request, is
// left out of matching; tests assert it through Received.
func newTestClient(t *testing.T, exchanges ...fixtures.Exchange) (*Client, *fixtures.Replay) {
	t.Helper()
	r := fixtures.NewReplay(t, exchanges...).IgnoreQuery("namespace")
	c := newClientAt(t, r.Start())
	return c, r
}

func newClientAt(t *testing.T, addr string) *Client {
	t.Helper()
	c, err := NewClient(&api.Config{Address: addr})
	if err != nil {
		t.Fatal(err)
	}
	c.now = func() time.Time { return fixedNow }
	c.SetLogger(slog.New(slog.DiscardHandler))
	return c
}

func testCtx(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func load(t *testing.T, name string) fixtures.Exchange {
	t.Helper()
	return fixtures.Load(t, "nomad-1.6/"+name)
}

// asPut adapts a recorded POST to the PUT the Nomad API client sends:
// Nomad's agent treats PUT and POST alike on these endpoints.
func asPut(e fixtures.Exchange) fixtures.Exchange {
	e.Request.Method = http.MethodPut
	return e
}

// withJobBody replaces a job-read exchange's response with job.
func withJobBody(t *testing.T, e fixtures.Exchange, job *api.Job) fixtures.Exchange {
	t.Helper()
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	e.Response.Body = b
	return e
}

func helloRevision(t *testing.T) *api.Job {
	t.Helper()
	s := spec.NewService("hello")
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "/usr/bin/python3", "args": []any{"-m", "http.server", "${NOMAD_PORT_app}", "--bind", "127.0.0.1"}}
	s.Template.Task.Resources.MemoryMB = 64
	s.Template.Task.KillTimeout = 5 * time.Second
	s.Scaling.Max = 10
	_, job := mustCompile(t, s, 1, testOptions())
	return job
}

func assertNamespace(t *testing.T, r *fixtures.Replay, want string) {
	t.Helper()
	for _, rec := range r.Received() {
		if got := rec.Query.Get("namespace"); got != want {
			t.Errorf("%s %s sent namespace %q, want %q", rec.Method, rec.Path, got, want)
		}
	}
}

func TestRegister(t *testing.T) {
	c, r := newTestClient(t, load(t, "002-job-register.json"))
	job := helloRevision(t)
	eval, err := c.Register(testCtx(t), job, 0)
	if err != nil {
		t.Fatal(err)
	}
	if eval != "8b0535b1-0b1a-0c18-cb87-0f6ab9140a1f" {
		t.Errorf("eval = %q", eval)
	}
	got := r.Received()
	if len(got) != 1 {
		t.Fatalf("requests = %d", len(got))
	}
	var body struct {
		Job            api.Job
		EnforceIndex   bool
		JobModifyIndex uint64
		PreserveCounts bool
	}
	got[0].JSON(t, &body)
	if !body.EnforceIndex || body.JobModifyIndex != 0 || body.PreserveCounts {
		t.Errorf("register options EnforceIndex=%v JobModifyIndex=%d PreserveCounts=%v, want enforce index 0 (must not exist)", body.EnforceIndex, body.JobModifyIndex, body.PreserveCounts)
	}
	if *body.Job.ID != "hello-00001" || *body.Job.Update.MaxParallel != 0 || *body.Job.TaskGroups[0].Name != "app" {
		t.Errorf("registered job does not have the contract shape: %+v", body.Job)
	}
	if body.Job.Meta[JobMetaCreated] != "2026-10-01T12:00:00Z" {
		t.Errorf("created meta = %q", body.Job.Meta[JobMetaCreated])
	}
	if _, ok := job.Meta[JobMetaCreated]; ok {
		t.Error("Register changed the caller's job")
	}
	if s, err := ScalingFromJob(&body.Job); err != nil || s.Max != 10 {
		t.Errorf("registered scaling policy: %+v, %v", s, err)
	}
	assertNamespace(t, r, "default")
	r.AssertAllUsed(t)
}

func TestRegisterConflict(t *testing.T) {
	c, r := newTestClient(t, load(t, "004-job-register-stale-index.json"))
	_, err := c.Register(testCtx(t), helloRevision(t), 1)
	if !errors.Is(err, ErrConflict) {
		t.Fatalf("err = %v, want ErrConflict", err)
	}
	if IsTransient(err) {
		t.Error("a conflict is not transient: it needs a re-read")
	}
	for _, want := range []string{"register revision hello-00001", "changed by someone else", "conflicting job modify index: 10"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	var body struct {
		EnforceIndex   bool
		JobModifyIndex uint64
	}
	r.Received()[0].JSON(t, &body)
	if !body.EnforceIndex || body.JobModifyIndex != 1 {
		t.Errorf("sent EnforceIndex=%v JobModifyIndex=%d, want true 1", body.EnforceIndex, body.JobModifyIndex)
	}
}

func TestJobAndUnknownJob(t *testing.T) {
	c, r := newTestClient(t, load(t, "003-job-read.json"), load(t, "016-job-read-unknown.json"))
	ctx := testCtx(t)
	info, err := c.Revision(ctx, "hello-00001")
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "hello-00001" || info.Count != 1 || info.Namespace != "default" {
		t.Errorf("info = %+v", info)
	}
	_, err = c.Job(ctx, "nope-00001")
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("err = %v, want ErrNotFound", err)
	}
	if want := `read revision nope-00001: not found in namespace "default" (Nomad: job not found)`; err.Error() != want {
		t.Errorf("message = %q, want %q", err, want)
	}
	r.AssertAllUsed(t)
}

func TestScale(t *testing.T) {
	c, r := newTestClient(t, asPut(load(t, "010-job-scale-up.json")), asPut(load(t, "021-job-scale-zero.json")))
	ctx := testCtx(t)
	meta := map[string]string{"stable": "1.2", "panic": "3.4"}
	if err := c.Scale(ctx, "hello-00001", 2, "panic: 3.4 concurrent per instance over 0.7 target", meta); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(ctx, "hello-00001", 0, "no traffic for 30s", nil); err != nil {
		t.Fatal(err)
	}
	got := r.Received()
	want := []struct {
		count int
		msg   string
		meta  map[string]string
	}{{2, "panic: 3.4 concurrent per instance over 0.7 target", meta}, {0, "no traffic for 30s", nil}}
	for i, w := range want {
		var body struct {
			Count   *int
			Target  map[string]string
			Message string
			Error   bool
			Meta    map[string]string
		}
		got[i].JSON(t, &body)
		if body.Count == nil || *body.Count != w.count || body.Target["Group"] != "app" || body.Target["Job"] != "hello-00001" || body.Message != w.msg || body.Error {
			t.Errorf("scale %d body = %+v", i, body)
		}
		if len(body.Meta) != len(w.meta) || body.Meta["panic"] != w.meta["panic"] || body.Meta["stable"] != w.meta["stable"] {
			t.Errorf("scale %d meta = %v, want %v", i, body.Meta, w.meta)
		}
	}
	r.AssertAllUsed(t)
}

// A scaling event with no count (a wake's timeline): the scale endpoint is
// called without a count, so Nomad records the event and scales nothing.
func TestRecordScalingEvent(t *testing.T) {
	c, r := newTestClient(t, asPut(load(t, "010-job-scale-up.json")))
	meta := map[string]string{"rule": "wake-timeline", "wake_timeline": "held=1 first_byte=2"}
	if err := c.RecordScalingEvent(testCtx(t), "hello-00001", "wake timeline: first byte 0.0 ms after the request", meta); err != nil {
		t.Fatal(err)
	}
	var body struct {
		Count   *int
		Target  map[string]string
		Message string
		Meta    map[string]string
	}
	r.Received()[0].JSON(t, &body)
	if body.Count != nil || body.Target["Group"] != "app" || body.Target["Job"] != "hello-00001" || !strings.HasPrefix(body.Message, "wake timeline") ||
		body.Meta["wake_timeline"] != meta["wake_timeline"] || body.Meta["rule"] != "wake-timeline" {
		t.Errorf("scale body = %+v, want no count, the message and the meta", body)
	}
	r.AssertAllUsed(t)
}

func TestScaleRefusals(t *testing.T) {
	overMax := asPut(load(t, "013-job-scale-over-max.json"))
	unknown := asPut(load(t, "015-job-scale-unknown-job.json"))
	c, _ := newTestClient(t, overMax, unknown)
	ctx := testCtx(t)

	err := c.Scale(ctx, "hello-00001", 11, "", nil)
	if !errors.Is(err, ErrOutOfBounds) || IsTransient(err) {
		t.Errorf("over max: err = %v (transient %v), want ErrOutOfBounds, not transient", err, IsTransient(err))
	}
	if want := "scale revision hello-00001 to 11: Nomad refused it: group count was greater than scaling policy maximum: 11 > 10"; err.Error() != want {
		t.Errorf("message = %q\nwant      %q", err, want)
	}
	err = c.Scale(ctx, "nope-00001", 1, "", nil)
	if !errors.Is(err, ErrNotFound) || IsTransient(err) {
		t.Errorf("unknown job: err = %v, want ErrNotFound", err)
	}
	if err := c.Scale(ctx, "hello-00001", -1, "", nil); err == nil {
		t.Error("a negative count was sent")
	}
}

func TestErrorKinds(t *testing.T) {
	ex := load(t, "014-job-scale-unknown-group.json")
	if k := kindOf(ex.Response.Status, string(ex.Response.BodyBytes())); k != ErrRefused {
		t.Errorf("unknown group: kind %v, want ErrRefused", k)
	}
	for _, c := range []struct {
		status int
		body   string
		want   error
	}{
		{500, "Enforcing job modify index 1: job exists with conflicting job modify index: 10", ErrConflict},
		{500, "Enforcing job modify index 0: job already exists", ErrConflict},
		{500, "rpc error: no leader", ErrServer},
		{503, "", ErrServer},
		{429, "too many requests", ErrServer},
		{403, "Permission denied", ErrPermission},
		{400, "group count was less than scaling policy minimum: 0 < 1", ErrOutOfBounds},
		{404, "job not found", ErrNotFound},
	} {
		if k := kindOf(c.status, c.body); k != c.want {
			t.Errorf("%d %q: kind %v, want %v", c.status, c.body, k, c.want)
		}
	}
}

func TestScalingEvents(t *testing.T) {
	c, _ := newTestClient(t, load(t, "012-job-scale-status-after.json"))
	evs, err := c.ScalingEvents(testCtx(t), "hello-00001")
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 1 {
		t.Fatalf("events = %+v", evs)
	}
	e := evs[0]
	if e.Count == nil || *e.Count != 2 || e.PreviousCount != 1 || e.Message != "panic: 3.4 concurrent per instance over 0.7 target" ||
		e.Meta["panic"] != "3.4" || e.EvalID != "6619a68e-c466-31db-e1ac-be1321c3dd2d" || e.Time.UnixNano() != 1795991256648879579 {
		t.Errorf("event = %+v", e)
	}
}

func TestPurge(t *testing.T) {
	c, r := newTestClient(t, load(t, "057-job-deregister-purge.json"))
	if err := c.Purge(testCtx(t), "hello-00001"); err != nil {
		t.Fatal(err)
	}
	got := r.Received()[0]
	if got.Method != http.MethodDelete || got.Query.Get("purge") != "true" {
		t.Errorf("sent %s ?%s", got.Method, got.Query.Encode())
	}
}

func TestAllocations(t *testing.T) {
	list := load(t, "005-job-allocations.json")
	// The API client always sends all=false (Nomad's default); the
	// recording was made without it.
	list.Request.Query.Set("all", "false")
	c, r := newTestClient(t, list, load(t, "006-allocation-read.json"))
	allocs, err := c.Allocations(testCtx(t), "hello-00001")
	if err != nil {
		t.Fatal(err)
	}
	if len(allocs) != 1 {
		t.Fatalf("allocations = %+v", allocs)
	}
	a := allocs[0]
	want := Allocation{
		ID: "7aeda235-fa62-ed5b-8c3e-46186a5d398b", Name: "hello-00001.app[0]", Revision: "hello-00001", NodeName: "vm",
		ClientStatus: "running", DesiredStatus: "run", Address: "127.0.0.1", HTTPPort: 24721, AdminPort: 30598,
		Running: true, Created: time.Unix(0, 1795991255403064440).UTC(),
	}
	if a != want {
		t.Errorf("allocation =\n%+v\nwant\n%+v", a, want)
	}
	r.AssertAllUsed(t)
}

// TestAllocationsNomad20: Nomad 2.0 drops the zero fields of networks and
// ports (To, CIDR, MBits...) and adds Paused to task states
// (nomad-2.0/005, 006); the ports we read are where they were.
func TestAllocationsNomad20(t *testing.T) {
	list := fixtures.Load(t, "nomad-2.0/005-job-allocations.json")
	list.Request.Query.Set("all", "false") // as in TestAllocations
	read := fixtures.Load(t, "nomad-2.0/006-allocation-read.json")
	c, r := newTestClient(t, list, read)
	allocs, err := c.Allocations(testCtx(t), "hello-00001")
	if err != nil {
		t.Fatal(err)
	}
	if len(allocs) != 1 {
		t.Fatalf("allocations = %+v", allocs)
	}
	want := Allocation{
		ID: "4b0368ef-80a2-bdff-976a-eff7daf961f2", Name: "hello-00001.app[0]", Revision: "hello-00001", NodeName: "vm",
		ClientStatus: "running", DesiredStatus: "run", Address: "127.0.0.1", HTTPPort: 30533, AdminPort: 23780,
		Running: true, Created: time.Unix(0, 1796502995799845930).UTC(),
	}
	if allocs[0] != want {
		t.Errorf("allocation =\n%+v\nwant\n%+v", allocs[0], want)
	}
	r.AssertAllUsed(t)
}

func TestRevisionsAndPlan(t *testing.T) {
	c, r := newTestClient(t, serviceListing(t), load(t, "003-job-read.json"))
	ctx := testCtx(t)
	revs, err := c.Revisions(ctx, "default", "hello")
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != 1 {
		t.Fatalf("revisions = %+v", revs)
	}
	rs := revs[0]
	if rs.Name != "hello-00001" || rs.Generation != 1 || rs.Status != "running" || rs.Desired != 1 || rs.Running != 1 || rs.Stopped ||
		!rs.Created.Equal(time.Unix(0, 1795991255394151506)) {
		t.Errorf("status = %+v", rs)
	}
	assertNamespace(t, r, "default")
	r.AssertAllUsed(t)

	// A different template: the next generation.
	svc := spec.NewService("hello")
	svc.Template.Task.Driver = "raw_exec"
	svc.Template.Task.Config = map[string]any{"command": "/bin/hello"}
	c, _ = newTestClient(t, serviceListing(t), load(t, "003-job-read.json"))
	p, err := c.Plan(ctx, &svc)
	if err != nil {
		t.Fatal(err)
	}
	if p.Unchanged || p.Revision.Name() != "hello-00002" || p.Revision.SpecHash != svc.Template.Hash() || !p.Known()["hello-00001"] {
		t.Errorf("plan = %+v", p)
	}

	// The same template (the stored job carries its hash): unchanged.
	read := load(t, "003-job-read.json")
	var stored api.Job
	if err := json.Unmarshal(read.Response.BodyBytes(), &stored); err != nil {
		t.Fatal(err)
	}
	stored.Meta[spec.JobMetaSpecHash] = svc.Template.Hash()
	c, _ = newTestClient(t, serviceListing(t), withJobBody(t, read, &stored))
	p, err = c.Plan(ctx, &svc)
	if err != nil {
		t.Fatal(err)
	}
	if !p.Unchanged || p.Revision.Name() != "hello-00001" || !p.ScalingChanged {
		t.Errorf("plan of the same template = %+v, want unchanged hello-00001 whose (defaulted) scaling needs updating", p)
	}

	// ... unless that revision was stopped.
	stored.Stop = new(true)
	c, _ = newTestClient(t, serviceListing(t), withJobBody(t, read, &stored))
	if p, err = c.Plan(ctx, &svc); err != nil || p.Unchanged || p.Revision.Generation != 2 {
		t.Errorf("plan over a stopped revision = %+v, %v; want generation 2", p, err)
	}
}

// allRevisionsList is the recorded list answered for the all-namespace
// filter the client uses.
func allRevisionsList(t *testing.T) fixtures.Exchange {
	e := serviceListing(t)
	e.Name = "jobs-list-all-ours"
	e.Request.Query = fixtures.Query{"filter": {`"serverless.service" in Meta`}}
	return e
}

func TestAllRevisionsAndServices(t *testing.T) {
	c, r := newTestClient(t, allRevisionsList(t), load(t, "003-job-read.json"), allRevisionsList(t))
	ctx := testCtx(t)
	revs, index, err := c.AllRevisions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != 1 || revs[0].Name != "hello-00001" || index != 13 {
		t.Errorf("revisions %+v index %d", revs, index)
	}
	svcs, err := c.AllServices(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(svcs) != 1 || svcs[0].Name != "hello" || svcs[0].Namespace != "default" || len(svcs[0].Revisions) != 1 || svcs[0].Revisions[0] != "hello-00001" {
		t.Errorf("services = %+v", svcs)
	}
	got := r.Received()
	if ns := got[0].Query.Get("namespace"); ns != "*" {
		t.Errorf("list sent namespace %q, want *", ns)
	}
	if ns := got[1].Query.Get("namespace"); ns != "default" {
		t.Errorf("job read sent namespace %q, want the job's", ns)
	}
}

func TestNamespaceLearnedFromListing(t *testing.T) {
	list := serviceListing(t)
	var stubs []map[string]any
	if err := json.Unmarshal(list.Response.BodyBytes(), &stubs); err != nil {
		t.Fatal(err)
	}
	stubs[0]["Namespace"] = "tools"
	b, _ := json.Marshal(stubs)
	list.Response.Body = b
	read := load(t, "003-job-read.json")
	c, r := newTestClient(t, list, read, asPut(load(t, "010-job-scale-up.json")))
	ctx := testCtx(t)
	if _, err := c.Revisions(ctx, "tools", "hello"); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(ctx, "hello-00001", 2, "x", nil); err != nil {
		t.Fatal(err)
	}
	got := r.Received()
	if ns := got[len(got)-1].Query.Get("namespace"); ns != "tools" {
		t.Errorf("scale sent namespace %q, want tools (learned from the listing)", ns)
	}
}

func TestUpdateScaling(t *testing.T) {
	ctx := testCtx(t)
	s := spec.DefaultScaling()
	s.Max = 5

	t.Run("in bounds preserves the count", func(t *testing.T) {
		c, r := newTestClient(t, load(t, "003-job-read.json"), load(t, "002-job-register.json"))
		if err := c.UpdateScaling(ctx, "hello-00001", s); err != nil {
			t.Fatal(err)
		}
		got := r.Received()
		if len(got) != 2 {
			t.Fatalf("requests = %d, want read + register", len(got))
		}
		var body struct {
			Job            api.Job
			EnforceIndex   bool
			JobModifyIndex uint64
			PreserveCounts bool
		}
		got[1].JSON(t, &body)
		g := body.Job.TaskGroups[0]
		if !body.EnforceIndex || body.JobModifyIndex != 10 || !body.PreserveCounts {
			t.Errorf("EnforceIndex %v JobModifyIndex %d PreserveCounts %v, want true 10 true", body.EnforceIndex, body.JobModifyIndex, body.PreserveCounts)
		}
		if *g.Scaling.Min != 0 || *g.Scaling.Max != 5 || *g.Count != 1 || *g.Scaling.Enabled {
			t.Errorf("scaling %+v count %d", g.Scaling, *g.Count)
		}
		if got, err := ScalingFromJob(&body.Job); err != nil || got != s {
			t.Errorf("policy = %+v, %v", got, err)
		}
		// Nothing but the scaling block changed.
		if body.Job.Meta[spec.JobMetaSpecHash] != "sha256:0f3c" || g.Tasks[0].Config["command"] != "/usr/bin/python3" {
			t.Errorf("the job changed beyond its scaling block: %+v", body.Job.Meta)
		}
	})

	t.Run("retries a conflict after re-reading", func(t *testing.T) {
		c, r := newTestClient(t, load(t, "003-job-read.json"), load(t, "004-job-register-stale-index.json"),
			load(t, "003-job-read.json"), load(t, "002-job-register.json"))
		if err := c.UpdateScaling(ctx, "hello-00001", s); err != nil {
			t.Fatal(err)
		}
		if n := len(r.Received()); n != 4 {
			t.Errorf("requests = %d, want read, register (conflict), read, register", n)
		}
		r.AssertAllUsed(t)
	})

	t.Run("moves an out-of-bounds count with a reason", func(t *testing.T) {
		event := asPut(load(t, "010-job-scale-up.json"))
		c, r := newTestClient(t, load(t, "003-job-read.json"), load(t, "002-job-register.json"), event)
		s2 := s
		s2.Min = 2
		if err := c.UpdateScaling(ctx, "hello-00001", s2); err != nil {
			t.Fatal(err)
		}
		got := r.Received()
		if len(got) != 3 {
			t.Fatalf("requests = %d, want read, register, scaling event", len(got))
		}
		var reg struct {
			Job            api.Job
			PreserveCounts bool
		}
		got[1].JSON(t, &reg)
		if *reg.Job.TaskGroups[0].Count != 2 || reg.PreserveCounts {
			t.Errorf("count %d PreserveCounts %v, want 2 set explicitly", *reg.Job.TaskGroups[0].Count, reg.PreserveCounts)
		}
		var ev struct {
			Count   *int
			Message string
			Target  map[string]string
		}
		got[2].JSON(t, &ev)
		if ev.Count != nil || !strings.Contains(ev.Message, "2..5") || !strings.Contains(ev.Message, "count 1") || ev.Target["Group"] != "app" {
			t.Errorf("scaling event = %+v", ev)
		}
	})

	t.Run("unchanged settings change nothing", func(t *testing.T) {
		job := roundTrip(t, helloRevision(t))
		job.JobModifyIndex = new(uint64(10))
		c, r := newTestClient(t, withJobBody(t, load(t, "003-job-read.json"), job))
		want, _ := ScalingFromJob(job)
		if err := c.UpdateScaling(ctx, "hello-00001", want); err != nil {
			t.Fatal(err)
		}
		if n := len(r.Received()); n != 1 {
			t.Errorf("requests = %d, want only the read", n)
		}
	})
}

func TestUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := "http://" + l.Addr().String()
	l.Close()
	c := newClientAt(t, addr)
	err = c.Scale(testCtx(t), "hello-00001", 1, "", nil)
	if !errors.Is(err, ErrUnreachable) || !IsTransient(err) {
		t.Fatalf("err = %v, want ErrUnreachable (transient)", err)
	}
	want := "scale revision hello-00001 to 1: cannot reach Nomad at " + addr + ": connection refused; is the agent running? set NOMAD_ADDR"
	if err.Error() != want || Describe(err) != want {
		t.Errorf("message = %q\nwant      %q", err, want)
	}
	var tr interface{ Transient() bool }
	if !errors.As(err, &tr) || !tr.Transient() {
		t.Error("error does not offer Transient() to callers that do not import nomadjob")
	}
}

// TestTaskAPISocketMissing: with NOMAD_ADDR naming the task API socket and
// no socket there (Nomad soft-fails making it), the error names the socket
// and where Nomad says why, not http://127.0.0.1.
func TestTaskAPISocketMissing(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "api.sock")
	cfg := api.DefaultConfig()
	cfg.Address = "unix://" + sock
	c, err := NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	err = c.Scale(testCtx(t), "hello-00001", 1, "", nil)
	if !errors.Is(err, ErrUnreachable) {
		t.Fatalf("err = %v, want ErrUnreachable", err)
	}
	for _, want := range []string{"cannot reach Nomad at unix://" + sock, "no socket at " + sock, "error creating task api socket", "data_dir"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("message lacks %q:\n%s", want, err)
		}
	}
}

// A 403 says which token setting to change, from what Nomad said and
// whether a token was sent, and names the policy to grant.
func TestPermissionDenied(t *testing.T) {
	for _, tc := range []struct {
		name, nomadSays, token, policy string
		// selfStatus is Nomad's answer to the token reading itself
		// (0: 200 with the token).
		selfStatus int
		want       string
	}{
		{"no token", "Permission denied", "", "nomad-serverless-deploy", 0,
			`scale revision hello-00001 to 1: Nomad denied permission (Permission denied): NOMAD_TOKEN is not set, and Nomad's anonymous policy does not allow it: set NOMAD_TOKEN to the secret ID of a token whose ACL policy grants "scale-job" on namespace "default" (the policy nomad-serverless-deploy that ` + "`nomad-serverless install -out`" + ` writes)`},
		{"a token without the capability", "Permission denied", "secret", "nomad-serverless-control-plane", 0,
			`scale revision hello-00001 to 1: Nomad denied permission (Permission denied): the ACL policy of the token in NOMAD_TOKEN needs "scale-job" on namespace "default": grant it the policy nomad-serverless-control-plane that ` + "`nomad-serverless install -out`" + ` writes`},
		// Nomad 2.0 says "Permission denied" for an expired token too;
		// the token cannot read itself either.
		{"an expired token, as Nomad 2.0 says it", "Permission denied", "secret", "nomad-serverless-deploy", http.StatusForbidden,
			`scale revision hello-00001 to 1: Nomad denied permission (Permission denied): Nomad does not accept the token in NOMAD_TOKEN at all: it has expired, or was deleted, or is from another cluster: set NOMAD_TOKEN to the secret ID of a token whose ACL policy grants "scale-job" on namespace "default" (the policy nomad-serverless-deploy that ` + "`nomad-serverless install -out`" + ` writes)`},
		{"an expired token", "ACL token expired", "secret", "", http.StatusForbidden,
			`scale revision hello-00001 to 1: Nomad denied permission (ACL token expired): the token in NOMAD_TOKEN has expired: create a new one (nomad acl token create) and set NOMAD_TOKEN to its secret ID`},
		{"an unknown token", "ACL token not found", "secret", "", http.StatusForbidden,
			`scale revision hello-00001 to 1: Nomad denied permission (ACL token not found): Nomad does not know the token in NOMAD_TOKEN (deleted, mistyped, or from another cluster): set NOMAD_TOKEN to the secret ID of a token whose ACL policy grants "scale-job" on namespace "default"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.URL.Path == "/v1/acl/token/self" {
					if tc.selfStatus != 0 {
						http.Error(w, "Permission denied", tc.selfStatus)
						return
					}
					w.Write([]byte(`{"AccessorID":"a","SecretID":"secret","Type":"client"}`))
					return
				}
				http.Error(w, tc.nomadSays, http.StatusForbidden)
			}))
			t.Cleanup(srv.Close)
			c, err := NewClient(&api.Config{Address: srv.URL, SecretID: tc.token})
			if err != nil {
				t.Fatal(err)
			}
			c.SetPolicy(tc.policy)
			err = c.Scale(testCtx(t), "hello-00001", 1, "", nil)
			if !errors.Is(err, ErrPermission) || IsTransient(err) {
				t.Fatalf("err = %v, want ErrPermission", err)
			}
			if err.Error() != tc.want {
				t.Errorf("message = %q\nwant      %q", err, tc.want)
			}
			_, err = c.Register(testCtx(t), helloRevision(t), 0)
			if tc.nomadSays == "Permission denied" && !strings.Contains(err.Error(), `"submit-job"`) {
				t.Errorf("register: %v", err)
			}
		})
	}
}

// A TLS failure is not transient (a setting is wrong) and names the
// variable to set.
func TestTLSErrors(t *testing.T) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { http.Error(w, "unexpected", http.StatusTeapot) })
	tlsSrv := httptest.NewTLSServer(ok)
	t.Cleanup(tlsSrv.Close)
	mtlsSrv := httptest.NewUnstartedServer(ok)
	mtlsSrv.TLS = &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}
	mtlsSrv.StartTLS()
	t.Cleanup(mtlsSrv.Close)
	plainSrv := httptest.NewServer(ok)
	t.Cleanup(plainSrv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: mtlsSrv.Certificate().Raw}), 0o644); err != nil {
		t.Fatal(err)
	}
	otherCA := filepath.Join(t.TempDir(), "other-ca.pem")
	if err := os.WriteFile(otherCA, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: otherCACert(t)}), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		cfg  *api.Config
		want []string
	}{
		{"a CA that did not sign Nomad's certificate", &api.Config{Address: tlsSrv.URL, TLSConfig: &api.TLSConfig{CACert: otherCA}},
			[]string{"cannot talk to Nomad at " + tlsSrv.URL + " over TLS: Nomad's certificate is not signed by the CA in NOMAD_CACERT (" + otherCA + "): set NOMAD_CACERT"}},
		{"no CA set", &api.Config{Address: tlsSrv.URL},
			[]string{"not signed by a CA this machine trusts: set NOMAD_CACERT"}},
		{"no client certificate", &api.Config{Address: mtlsSrv.URL, TLSConfig: &api.TLSConfig{CACert: ca}},
			[]string{"Nomad asks for a client certificate", "set NOMAD_CLIENT_CERT and NOMAD_CLIENT_KEY"}},
		{"https to a plain HTTP Nomad", &api.Config{Address: "https://" + strings.TrimPrefix(plainSrv.URL, "http://")},
			[]string{"Nomad speaks plain HTTP there and the request was HTTPS: start NOMAD_ADDR with http://"}},
		{"http to an HTTPS Nomad", &api.Config{Address: "http://" + strings.TrimPrefix(tlsSrv.URL, "https://")},
			[]string{"Nomad speaks HTTPS there and the request was plain HTTP: start NOMAD_ADDR with https://"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewClient(tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = c.Scale(testCtx(t), "hello-00001", 1, "", nil)
			if !errors.Is(err, ErrTLS) || IsTransient(err) {
				t.Fatalf("err = %v, want ErrTLS, not transient", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("message lacks %q:\n%s", w, err)
				}
			}
		})
	}
}

// otherCACert is the DER of a throwaway self-signed CA certificate.
func otherCACert(t *testing.T) []byte {
	c, _ := testcert.SelfSigned(t, "another-ca.test")
	return c.Certificate[0]
}

func TestServerErrorIsTransient(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "No cluster leader", http.StatusInternalServerError)
	}))
	t.Cleanup(srv.Close)
	c := newClientAt(t, srv.URL)
	err := c.Scale(testCtx(t), "hello-00001", 1, "", nil)
	if !errors.Is(err, ErrServer) || !IsTransient(err) || !strings.Contains(err.Error(), "No cluster leader") {
		t.Errorf("err = %v, want a transient server error with Nomad's message", err)
	}
}

func TestCanceledContextIsNotTransient(t *testing.T) {
	c := newClientAt(t, "http://127.0.0.1:1")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.Scale(ctx, "hello-00001", 1, "", nil)
	if !errors.Is(err, context.Canceled) || IsTransient(err) {
		t.Errorf("err = %v, want context.Canceled, not transient", err)
	}
}

// serviceListing is fixture 008 (a job listing filtered on the service's
// meta) as Revisions asks for it now: with the revision-name prefix too,
// which Nomad applies first (its ID index) and which changes nothing in the
// answer.
func serviceListing(t *testing.T) fixtures.Exchange {
	t.Helper()
	e := load(t, "008-jobs-list-meta-filter.json")
	e.Request.Query.Set("prefix", "hello-")
	return e
}
