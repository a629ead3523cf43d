package rollout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// fakeCluster stands in for Nomad and Consul in deploy tests: revision jobs
// by name, one record per service with a CAS index, and health that turns
// passing after readyAfter polls.
type fakeCluster struct {
	mu         sync.Mutex
	jobs       map[string]*nomadapi.Job
	purged     []string
	stopped    []string
	scaled     []string
	record     map[string]consulroute.Record
	recordIdx  map[string]uint64
	index      uint64
	publishes  int
	registers  int
	polls      int
	readyAfter int
	failAlloc  string // non-empty: allocations report this failure
	failTask   string // with failAlloc: the task that failed
	stderr     string // that task's stderr
	logReqs    []nomadjob.LogRequest
	healthErr  error // non-nil: Health fails with it
	// conflictOnce makes the next Register fail with ErrConflict after
	// registering the same job, as a concurrent identical deploy would.
	conflictOnce bool
	casLossOnce  bool
	// onRegister, when set, runs (with mu held) on every Register.
	onRegister func(job string)
}

func newFakeCluster() *fakeCluster {
	return &fakeCluster{jobs: map[string]*nomadapi.Job{}, record: map[string]consulroute.Record{}, recordIdx: map[string]uint64{}, readyAfter: 2}
}

func (f *fakeCluster) Plan(_ context.Context, svc *spec.Service) (nomadjob.Plan, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var plan nomadjob.Plan
	maxGen := 0
	hash := svc.Template.Hash()
	for name, job := range f.jobs {
		info, err := nomadjob.RevisionFromJob(job)
		if err != nil || info.Service != svc.Name {
			continue
		}
		plan.Existing = append(plan.Existing, nomadjob.RevisionStatus{RevisionInfo: info, Desired: info.Count})
		maxGen = max(maxGen, info.Generation)
		if info.SpecHash == hash {
			plan.Unchanged = true
			plan.Revision = spec.NewRevision(svc, info.Generation)
			plan.ScalingChanged = info.Scaling != svc.Scaling
			_ = name
		}
	}
	if !plan.Unchanged {
		plan.Revision = spec.NewRevision(svc, maxGen+1)
	}
	return plan, nil
}

func (f *fakeCluster) Register(_ context.Context, job *nomadapi.Job, enforce uint64) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.registers++
	if f.onRegister != nil {
		f.onRegister(*job.ID)
	}
	if _, ok := f.jobs[*job.ID]; ok && enforce == 0 {
		return "", &nomadjob.Error{Op: "register", Kind: nomadjob.ErrConflict}
	}
	f.jobs[*job.ID] = job
	if f.conflictOnce {
		f.conflictOnce = false
		return "", &nomadjob.Error{Op: "register", Kind: nomadjob.ErrConflict}
	}
	return "eval", nil
}

func (f *fakeCluster) UpdateScaling(_ context.Context, rev string, s spec.Scaling) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scaled = append(f.scaled, rev+" scaling")
	return nil
}

func (f *fakeCluster) Allocations(_ context.Context, rev string) ([]nomadjob.Allocation, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failAlloc != "" {
		return []nomadjob.Allocation{{ID: "0123456789", Revision: rev, ClientStatus: "failed", DesiredStatus: "run", Failure: f.failAlloc, FailedTask: f.failTask}}, nil
	}
	return []nomadjob.Allocation{{ID: "0123456789", Revision: rev, ClientStatus: "running", DesiredStatus: "run", Running: true}}, nil
}

func (f *fakeCluster) Logs(_ context.Context, _ string, req nomadjob.LogRequest, fn func([]byte) error) error {
	f.mu.Lock()
	f.logReqs = append(f.logReqs, req)
	out := f.stderr
	f.mu.Unlock()
	if !req.Stderr || req.Follow {
		return fmt.Errorf("fake: only stderr, not followed")
	}
	// In two pieces that do not end at a line, as Nomad's frames need not.
	half := len(out) / 2
	if err := fn([]byte(out[:half])); err != nil {
		return err
	}
	return fn([]byte(out[half:]))
}

func (f *fakeCluster) Revisions(_ context.Context, ns, svc string) ([]nomadjob.RevisionStatus, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []nomadjob.RevisionStatus
	for _, job := range f.jobs {
		info, err := nomadjob.RevisionFromJob(job)
		if err == nil && info.Service == svc {
			// Old revisions have scaled to zero by the time they are collected.
			out = append(out, nomadjob.RevisionStatus{RevisionInfo: info, Desired: info.Count})
		}
	}
	return out, nil
}

func (f *fakeCluster) AllServices(context.Context) ([]nomadjob.ServiceRef, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	byName := map[string]*nomadjob.ServiceRef{}
	for name, job := range f.jobs {
		info, err := nomadjob.RevisionFromJob(job)
		if err != nil {
			continue
		}
		ref := byName[info.Service]
		if ref == nil {
			ref = &nomadjob.ServiceRef{Namespace: info.Namespace, Name: info.Service}
			byName[info.Service] = ref
		}
		ref.Revisions = append(ref.Revisions, name)
	}
	var out []nomadjob.ServiceRef
	for _, r := range byName {
		out = append(out, *r)
	}
	return out, nil
}

func (f *fakeCluster) Records(context.Context) ([]consulroute.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []consulroute.Record
	for _, r := range f.record {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeCluster) Scale(_ context.Context, rev string, n int, reason string, _ map[string]string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.scaled = append(f.scaled, fmt.Sprintf("%s=%d (%s)", rev, n, reason))
	return nil
}

func (f *fakeCluster) Stop(_ context.Context, rev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if job, ok := f.jobs[rev]; ok {
		job.Stop = new(true)
	}
	f.stopped = append(f.stopped, rev)
	return nil
}

func (f *fakeCluster) Purge(_ context.Context, rev string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.jobs, rev)
	f.purged = append(f.purged, rev)
	return nil
}

func (f *fakeCluster) ReadRecord(_ context.Context, ns, svc string) (consulroute.Record, uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec, ok := f.record[svc]
	if !ok {
		return consulroute.Record{}, 0, consulroute.ErrNotFound
	}
	return rec, f.recordIdx[svc], nil
}

func (f *fakeCluster) Publish(ctx context.Context, rec consulroute.Record, cas uint64) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("publish %s: %w", rec.Service.Name, err) // as an HTTP client fails
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.casLossOnce {
		f.casLossOnce = false
		f.index++ // a concurrent deploy of the same service wrote first
		f.record[rec.Service.Name] = rec
		f.recordIdx[rec.Service.Name] = f.index
		return consulroute.ErrConflict
	}
	if f.recordIdx[rec.Service.Name] != cas {
		return consulroute.ErrConflict
	}
	if _, err := consulroute.ConfigEntries(rec); err != nil {
		return err
	}
	f.index++
	f.record[rec.Service.Name] = rec
	f.recordIdx[rec.Service.Name] = f.index
	f.publishes++
	return nil
}

func (f *fakeCluster) Health(ctx context.Context, rev string) ([]consulroute.InstanceHealth, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("health of %s: %w", rev, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.polls++
	if f.healthErr != nil {
		return nil, f.healthErr
	}
	h := consulroute.InstanceHealth{Instance: consulroute.Instance{ID: "i1", Revision: rev}, Output: "app not ready: connection refused"}
	h.Passing = f.polls > f.readyAfter && f.failAlloc == ""
	return []consulroute.InstanceHealth{h}, nil
}

func (f *fakeCluster) Gateways(context.Context) ([]consulroute.Gateway, error) {
	return []consulroute.Gateway{{Address: "127.0.0.1", Port: 8080, Domain: "localhost", Internal: "127.0.0.1:8082"}}, nil
}

const deployFile = `
service "hello" {
  task {
    driver = "raw_exec"
    config {
      command = "/bin/app"
    }
    env = { V = "%s" }
  }
  %s
}
`

func parseDeployFile(t *testing.T, version, extra string) []Service {
	t.Helper()
	f, diags := svchcl.Parse("hello.hcl", []byte(fmt.Sprintf(deployFile, version, extra)), svchcl.Options{})
	if diags.HasErrors() {
		t.Fatalf("parse: %v", diags)
	}
	return []Service{{File: f, Index: 0}}
}

func newTestDeployer(t *testing.T, f *fakeCluster, out, diag *bytes.Buffer) *Deployer {
	t.Helper()
	d, err := New(Config{
		Nomad: f, Consul: f, Out: out, Diag: diag,
		Compile: nomadjob.Options{Sidecar: nomadjob.SidecarOptions{Command: "/usr/local/bin/nomad-serverless"}},
		Wait:    5 * time.Second, Poll: time.Millisecond, Now: time.Now, Retain: consulroute.DefaultRetention(),
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// The deploy command's exit codes, which runTestDeploy returns as the
// command would.
const (
	exitOK    = 0
	exitError = 1
)

func runTestDeploy(t *testing.T, f *fakeCluster, services []Service) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := exitOK
	if err := newTestDeployer(t, f, &out, &errb).Deploy(context.Background(), services); err != nil {
		code = exitError
		if !errors.Is(err, ErrRefused) && !errors.Is(err, ErrFailed) {
			fmt.Fprintln(&errb, err) // not said yet
		}
	}
	return code, out.String(), errb.String()
}

func TestDeployFirstRevisionRegistersWaitsAndRoutes(t *testing.T) {
	f := newFakeCluster()
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", ""))
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if _, ok := f.jobs["hello-00001"]; !ok {
		t.Fatalf("hello-00001 not registered; jobs %v", f.jobs)
	}
	rec := f.record["hello"]
	if rec.Latest != "hello-00001" {
		t.Fatalf("latest = %q", rec.Latest)
	}
	for _, want := range []string{"hello-00001: registered", "ready (1/1", "route published (hello-00001 100%)", "http://hello.default.localhost/"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

func TestDeploySameFileTwiceMakesNoRevision(t *testing.T) {
	f := newFakeCluster()
	if code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", "")); code != exitOK {
		t.Fatalf("first deploy: %d\n%s%s", code, out, errs)
	}
	regs := f.registers
	code, out, _ := runTestDeploy(t, f, parseDeployFile(t, "1", ""))
	if code != exitOK || f.registers != regs {
		t.Fatalf("second deploy: exit %d, registers %d -> %d", code, regs, f.registers)
	}
	if !strings.Contains(out, "template unchanged") {
		t.Errorf("output lacks 'template unchanged':\n%s", out)
	}
}

// A revision whose init step fails: deploy names the task and shows the
// end of its stderr, and only that.
func TestDeployFailedTaskShowsItsStderr(t *testing.T) {
	f := newFakeCluster()
	f.failAlloc = "task migrate: exited with code 3"
	f.failTask = "migrate"
	var lines []string
	for i := 1; i <= 14; i++ {
		lines = append(lines, fmt.Sprintf("migrate: step %d", i))
	}
	f.stderr = strings.Join(lines, "\n") + "\nERROR: relation \"users\" already exists\n\n"
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", ""))
	if code != exitError {
		t.Fatalf("exit %d, want failure\n%s%s", code, out, errs)
	}
	for _, want := range []string{"exited with code 3", "last lines of task migrate's stderr", "ERROR: relation \"users\" already exists", "migrate: step 6"} {
		if !strings.Contains(errs, want) {
			t.Errorf("error lacks %q:\n%s", want, errs)
		}
	}
	if strings.Contains(errs, "migrate: step 5\n") {
		t.Errorf("error shows more than the last %d lines:\n%s", failedLogLines, errs)
	}
	if len(f.logReqs) != 1 || f.logReqs[0].Task != "migrate" || f.logReqs[0].Alloc != "0123456789" || f.logReqs[0].Since.IsZero() || f.logReqs[0].MaxHistory <= 0 {
		t.Errorf("log requests %+v, want migrate's stderr history once", f.logReqs)
	}
}

func TestDeployChangedTemplateRoutesOnlyWhenReady(t *testing.T) {
	f := newFakeCluster()
	runTestDeploy(t, f, parseDeployFile(t, "1", ""))
	f.polls = 0
	f.failAlloc = "Driver Failure: exec format error"
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "2", ""))
	if code != exitError {
		t.Fatalf("exit %d, want failure\n%s%s", code, out, errs)
	}
	if !strings.Contains(errs, "exec format error") || !strings.Contains(errs, "Traffic still goes where it went before") {
		t.Errorf("error lacks the reason or the reassurance:\n%s", errs)
	}
	if got := f.record["hello"].Latest; got != "hello-00001" {
		t.Errorf("latest moved to %q although hello-00002 never became ready", got)
	}
	if len(f.scaled) == 0 || !strings.HasPrefix(f.scaled[len(f.scaled)-1], "hello-00002=0 (deploy failed: ") {
		t.Errorf("the failed revision was not scaled to zero with the reason: %v", f.scaled)
	}
	// Stopped, so nothing brings it back (the autoscaler keeps a new
	// revision at its initial scale until it was once ready, and Nomad
	// refuses a count below min).
	if len(f.stopped) != 1 || f.stopped[0] != "hello-00002" {
		t.Errorf("the failed revision was not stopped: %v", f.stopped)
	}

	f.failAlloc, f.polls = "", 0
	code, out, errs = runTestDeploy(t, f, parseDeployFile(t, "3", ""))
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if got := f.record["hello"].Latest; got != "hello-00003" {
		t.Errorf("latest = %q, want hello-00003", got)
	}
}

func TestDeployUnknownTrafficRevisionChangesNothing(t *testing.T) {
	f := newFakeCluster()
	extra := `traffic {
    revision = "hello-00007"
    percent  = 100
  }`
	code, _, errs := runTestDeploy(t, f, parseDeployFile(t, "1", extra))
	if code != exitError {
		t.Fatalf("exit %d, want 1", code)
	}
	if f.registers != 0 || f.publishes != 0 {
		t.Fatalf("a refused deploy wrote: %d registers, %d publishes", f.registers, f.publishes)
	}
	for _, want := range []string{"hello.hcl line 11", `revision "hello-00007" does not exist`, "Nothing was deployed."} {
		if !strings.Contains(errs, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, errs)
		}
	}
}

func TestDeployRetriesAConcurrentRegistrationAndALostCAS(t *testing.T) {
	f := newFakeCluster()
	f.conflictOnce = true
	f.casLossOnce = true
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", ""))
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if f.record["hello"].Latest != "hello-00001" {
		t.Fatalf("record = %+v", f.record["hello"])
	}
}

func TestDeployScalingOnlyChangeUpdatesInPlace(t *testing.T) {
	f := newFakeCluster()
	runTestDeploy(t, f, parseDeployFile(t, "1", ""))
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", "scaling {\n max = 7\n}"))
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(out, "scaling settings updated in place") || f.registers != 1 {
		t.Fatalf("registers %d; output:\n%s", f.registers, out)
	}
}

func TestCollectRevisionsDeletesOnlyOldUnroutedOnes(t *testing.T) {
	f := newFakeCluster()
	for v := 1; v <= 6; v++ {
		f.polls = 0
		if code, out, errs := runTestDeploy(t, f, parseDeployFile(t, fmt.Sprint(v), "")); code != exitOK {
			t.Fatalf("deploy %d: %d\n%s%s", v, code, out, errs)
		}
	}
	// Age every revision past the retention's minimum age.
	for _, job := range f.jobs {
		job.Meta[nomadjob.JobMetaCreated] = time.Now().Add(-100 * time.Hour).UTC().Format(time.RFC3339)
	}
	gone, err := Collect(context.Background(), f, f, "default", "hello", consulroute.DefaultRetention(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, g := range gone {
		names = append(names, g.Revision)
	}
	// Latest hello-00006 stays, and the 3 most recent unrouted (5, 4, 3).
	if strings.Join(names, ",") != "hello-00002,hello-00001" && strings.Join(names, ",") != "hello-00001,hello-00002" {
		t.Fatalf("deleted %v, want hello-00001 and hello-00002", names)
	}
	rec := f.record["hello"]
	if len(rec.Deleting) != 0 || strings.Contains(strings.Join(rec.Revisions, ","), "hello-00001") {
		t.Fatalf("record still names deleted revisions: %+v", rec)
	}
	if len(f.purged) != 2 {
		t.Fatalf("purged %v", f.purged)
	}
}

func TestTrafficChangeApply(t *testing.T) {
	cur := []spec.TrafficTarget{{Revision: "hello-00001", Percent: 90, Tag: "stable"}, {Latest: true, Percent: 10}}
	cases := []struct {
		name   string
		change TrafficChange
		want   string
	}{
		{"splits replace splits, tags stay", TrafficChange{To: []spec.TrafficTarget{{Latest: true, Percent: 100}}},
			"latest 100%; hello-00001 0% tag stable"},
		{"tag moves", TrafficChange{Tags: map[string]string{"stable": "hello-00002"}},
			"hello-00001 90%; latest 10%; hello-00002 0% tag stable"},
		{"untag", TrafficChange{Untag: []string{"stable"}}, "hello-00001 90%; latest 10%"},
		{"tag joins its split", TrafficChange{Tags: map[string]string{"new": "latest"}},
			"hello-00001 90% tag stable; latest 10% tag new"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var parts []string
			for _, tt := range c.change.apply(cur) {
				name := tt.Revision
				if tt.Latest {
					name = "latest"
				}
				s := fmt.Sprintf("%s %d%%", name, tt.Percent)
				if tt.Tag != "" {
					s += " tag " + tt.Tag
				}
				parts = append(parts, s)
			}
			if got := strings.Join(parts, "; "); got != c.want {
				t.Fatalf("got  %s\nwant %s", got, c.want)
			}
		})
	}
}

// The count deploy waits for is the one Nomad was given: initial raised to
// min for a new revision, the count moved into new bounds for a scaling
// change.
func TestDeployWaitsForTheCountNomadWasGiven(t *testing.T) {
	f := newFakeCluster()
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", "scaling {\n min = 1\n initial = 0\n}"))
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if n := *f.jobs["hello-00001"].TaskGroups[0].Count; n != 1 {
		t.Fatalf("compiled count %d, want min 1", n)
	}
	if !strings.Contains(out, "hello-00001: ready (1/1 instances passing)") || strings.Contains(out, "scaled to zero") {
		t.Errorf("deploy of a revision with min 1 did not wait for its instance:\n%s", out)
	}

	// At zero, a change raising min to 1 moves the count to 1 in place:
	// deploy waits for that instance too.
	f2 := newFakeCluster()
	if code, out, errs := runTestDeploy(t, f2, parseDeployFile(t, "1", "scaling {\n initial = 0\n}")); code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	f2.polls = 0
	code, out, errs = runTestDeploy(t, f2, parseDeployFile(t, "1", "scaling {\n min = 1\n initial = 0\n}"))
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(out, "scaling settings updated in place") || !strings.Contains(out, "hello-00001: ready (1/1 instances passing)") {
		t.Errorf("a scaling change raising min from a count of 0 did not wait for the instance:\n%s", out)
	}
}

// A refused token or TLS setting ends the wait for readiness at once, with
// its own words, instead of behind the deadline: waiting will not fix it.
func TestDeployStopsWaitingOnAWrongSetting(t *testing.T) {
	f := newFakeCluster()
	f.readyAfter = 1 << 30
	f.healthErr = &consulroute.Error{Op: "read the health of hello-00001", Status: 403, Message: "ACL not found", Hint: "Consul does not know the token in CONSUL_HTTP_TOKEN"}
	start := time.Now()
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", ""))
	if code != exitError || !strings.Contains(errs, "Consul does not know the token in CONSUL_HTTP_TOKEN") {
		t.Fatalf("deploy: exit %d\n%s%s", code, out, errs)
	}
	// The deployer waits up to 5 s polling every millisecond: a wait that
	// hid the error would have polled thousands of times.
	if f.polls > 3 {
		t.Errorf("Health polled %d times after a 403 (%s): the wait hid the error", f.polls, time.Since(start))
	}
}

// Visibility is a route setting: deploying the same template as internal
// makes no revision, changes the published record, and says where the
// service now answers.
func TestDeployVisibilityChangeOnlyChangesTheRoute(t *testing.T) {
	f := newFakeCluster()
	if code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", "")); code != exitOK {
		t.Fatalf("first deploy: %d\n%s%s", code, out, errs)
	}
	regs, pubs := f.registers, f.publishes
	code, out, errs := runTestDeploy(t, f, parseDeployFile(t, "1", `visibility = "internal"`))
	if code != exitOK {
		t.Fatalf("exit %d\n%s%s", code, out, errs)
	}
	if f.registers != regs || !strings.Contains(out, "template unchanged; no new revision") {
		t.Errorf("a visibility change made a revision: registers %d -> %d\n%s", regs, f.registers, out)
	}
	if f.publishes == pubs || f.record["hello"].Service.Visibility != spec.VisibilityInternal || f.record["hello"].Latest != "hello-00001" {
		t.Errorf("route not republished as internal: publishes %d -> %d, record %+v", pubs, f.publishes, f.record["hello"])
	}
	for _, want := range []string{"internal, on the gateways' internal listener (127.0.0.1:8082)", "http://127.0.0.1:8082/"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// A deploy of many services stopped by a signal stops at once: it does not
// go on through the remaining services with one error each (issue 45), and
// it says what was deployed, what was cut short and what was not started.
func TestDeployInterruptedStopsAtOnceAndSaysWhatWasDeployed(t *testing.T) {
	var src strings.Builder
	for i := range 8 {
		fmt.Fprintf(&src, "service \"s%d\" {\n  task {\n    driver = \"raw_exec\"\n    config {\n      command = \"/bin/app\"\n    }\n  }\n}\n", i)
	}
	file, diags := svchcl.Parse("many.hcl", []byte(src.String()), svchcl.Options{})
	if diags.HasErrors() {
		t.Fatalf("parse: %v", diags)
	}
	var services []Service
	for i := range file.Services {
		services = append(services, Service{File: file, Index: i})
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	f := newFakeCluster()
	f.onRegister = func(job string) {
		if job == "s3-00001" {
			cancel(errors.New("terminated signal received"))
		}
	}
	var out, diag bytes.Buffer
	err := newTestDeployer(t, f, &out, &diag).Deploy(ctx, services)
	if !errors.Is(err, ErrInterrupted) {
		t.Fatalf("Deploy: %v, want ErrInterrupted\n%s%s", err, out.String(), diag.String())
	}
	if f.registers != 4 {
		t.Errorf("%d registrations, want 4 (s0 to s3, none after the signal)", f.registers)
	}
	msg := diag.String()
	for _, want := range []string{
		"stopped (terminated signal received)",
		"deployed (3): s0, s1, s2\n",
		"cut short (1): s3",
		"not started (4): s4, s5, s6, s7\n",
		"Deploy the same files again",
	} {
		if !strings.Contains(msg, want) {
			t.Errorf("diagnostics lack %q:\n%s", want, msg)
		}
	}
	if n := strings.Count(msg, "terminated signal received"); n != 1 {
		t.Errorf("the cause is said %d times, want once:\n%s", n, msg)
	}
	for _, svc := range []string{"s0", "s1", "s2"} {
		if f.record[svc].Latest != svc+"-00001" {
			t.Errorf("%s not routed: %+v", svc, f.record[svc])
		}
	}
}

func TestNameListNamesAFewThenCounts(t *testing.T) {
	for _, tc := range []struct {
		in   []string
		want string
	}{
		{nil, "none"},
		{[]string{"a"}, "a"},
		{[]string{"a", "b", "c", "d", "e"}, "a, b, c, d, e"},
		{[]string{"a", "b", "c", "d", "e", "f", "g"}, "a, b, c, d, e and 2 more"},
	} {
		if got := nameList(tc.in); got != tc.want {
			t.Errorf("nameList(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
