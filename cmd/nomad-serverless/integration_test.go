package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// TestIntegrationFakeCluster runs the real binary — deploy, traffic,
// status, revisions, list, delete and two `serve` replicas — against the
// fake Nomad and Consul of test/fakecluster, whose allocations are real
// test-app and sidecar processes. The scenarios build on each other and run
// in order; the first failure stops the rest. No assertion is on speed:
// every wait is bounded and generous, and a failure prints what serve and
// the tasks logged.
func TestIntegrationFakeCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("integration against the fake cluster runs real processes for about a minute; skipped with -short")
	}
	it := newInteg(t)
	a := it.startServe("replica-a")
	steps := []struct {
		name string
		run  func(t *testing.T)
	}{
		{"1 deploy, ready, request", func(t *testing.T) { it.scenarioDeploy(t, a) }},
		{"2 scale to zero, wake with a burst", func(t *testing.T) { it.scenarioZeroAndWake(t, a) }},
		{"3 new revision, traffic split under load, status", func(t *testing.T) { it.scenarioNewRevisionAndTraffic(t, a) }},
		{"4 tag route", func(t *testing.T) { it.scenarioTag(t, a) }},
		{"5 a revision that cannot start", func(t *testing.T) { it.scenarioCannotStart(t, a) }},
		{"6 same file, scaling-only change", func(t *testing.T) { it.scenarioInPlace(t, a) }},
		{"7 Nomad unreachable or refusing", func(t *testing.T) { it.scenarioNomadDown(t, a) }},
		{"8a kill -9 of a serve whose sockets a keeper holds", func(t *testing.T) { it.scenarioSocketKeeper(t) }},
		{"8 restart serve, two replicas, leader handover", func(t *testing.T) { a = it.scenarioRestartAndLeader(t, a) }},
		{"9 bad file deploys nothing, delete leaves nothing", func(t *testing.T) { it.scenarioBadFileAndDelete(t) }},
	}
	for _, s := range steps {
		it.t = t
		start := time.Now()
		ok := t.Run(s.name, func(t *testing.T) {
			it.t = t
			s.run(t)
		})
		t.Logf("%s: %s", s.name, time.Since(start).Round(100*time.Millisecond))
		if !ok {
			return
		}
	}
}

// Scenario 1: deploy a raw_exec service; the job has the contract's shape,
// the route and the KV record are in Consul, the instance passes its check,
// and a request through the gateway reaches the app.
func (it *integ) scenarioDeploy(t *testing.T, g *serveProc) {
	c := it.cluster
	it.deployHello(t, "v1", 1)

	// Nomad: the revision job in the contract's shape.
	job := c.Nomad.Job("default", "hello-00001")
	if job == nil {
		t.Fatalf("Nomad has no job hello-00001; jobs: %v", c.Nomad.JobIDs())
	}
	if *job.Type != "service" || job.Meta[spec.JobMetaService] != "hello" || job.Meta[spec.JobMetaRevision] != "hello-00001" || job.Meta[spec.JobMetaGen] != "1" {
		t.Errorf("job type %s meta %v", *job.Type, job.Meta)
	}
	if job.Update == nil || job.Update.MaxParallel == nil || *job.Update.MaxParallel != 0 {
		t.Errorf("job update block %+v, want max_parallel 0 (deployments off)", job.Update)
	}
	if len(job.TaskGroups) != 1 || *job.TaskGroups[0].Name != spec.GroupName {
		t.Fatalf("job groups %+v, want one group %q", job.TaskGroups, spec.GroupName)
	}
	g0 := job.TaskGroups[0]
	if g0.Scaling == nil || *g0.Scaling.Min != 0 || *g0.Scaling.Max != 3 || *g0.Count != 1 {
		t.Errorf("group count %d scaling %+v, want count 1 within 0..3", *g0.Count, g0.Scaling)
	}
	tasks := map[string]bool{}
	for _, task := range g0.Tasks {
		tasks[task.Name] = true
		// The queue-proxy is a main task started with the app, which
		// leads (nomadjob's sidecarLifecycle).
		if task.Name == spec.SidecarTaskName && task.Lifecycle != nil {
			t.Errorf("sidecar lifecycle %+v, want none: a main task beside the app", task.Lifecycle)
		}
		if task.Name == spec.UserTaskName && !task.Leader {
			t.Error("the user task is not the group's leader")
		}
	}
	if !tasks[spec.UserTaskName] || !tasks[spec.SidecarTaskName] || len(tasks) != 2 {
		t.Errorf("tasks %v, want %s and %s", tasks, spec.UserTaskName, spec.SidecarTaskName)
	}
	if len(g0.Services) != 1 || len(g0.Services[0].Checks) == 0 || g0.Services[0].Checks[0].Header[spec.ProbeHeader][0] != spec.ProbeHeaderValue {
		t.Errorf("group services %+v, want one with a check sending %s", g0.Services, spec.ProbeHeader)
	}

	// Consul: the route, the KV record, one passing instance.
	for _, want := range [][2]string{
		{"service-defaults", "hello"}, {"service-defaults", "hello-00001"}, {"service-defaults", spec.ActivatorServiceName},
		{"service-resolver", "hello-00001"}, {"service-splitter", "hello"},
	} {
		if c.Consul.ConfigEntry(want[0], want[1]) == nil {
			t.Errorf("Consul has no %s %s; it has %v", want[0], want[1], c.Consul.ConfigEntries(want[0]))
		}
	}
	if sp := c.Consul.ConfigEntry("service-splitter", "hello"); sp != nil {
		if got := fmt.Sprint(sp["Splits"]); !strings.Contains(got, "hello-00001") || !strings.Contains(got, "Weight:100") {
			t.Errorf("splitter splits %s, want hello-00001 at 100", got)
		}
	}
	if c.Consul.ConfigEntry("service-router", "hello") != nil {
		t.Errorf("a router exists for a route without tags")
	}
	if v, ok := c.Consul.KV(consulroute.RecordKey("default", "hello")); !ok || !strings.Contains(string(v), `"latest":"hello-00001"`) {
		t.Errorf("KV record %s = %q (present %v), want latest hello-00001", consulroute.RecordKey("default", "hello"), v, ok)
	}
	inst := c.Consul.Services("hello-00001")
	if len(inst) != 1 || inst[0].Status != "passing" {
		t.Errorf("Consul instances of hello-00001: %+v, want one passing", inst)
	}

	// The gateway routes to it.
	eventually(t, 20*time.Second, "a request through the gateway reaches v1", func() (bool, string) {
		r := g.request("hello", "", "/")
		return r.ok() && r.app == "v1", r.String()
	})
}

// Scenario 2: without traffic the autoscaler scales the revision to zero
// (Nomad records our reason); a burst of 50 concurrent requests then wakes
// it with one scale-from-zero call, and every request succeeds.
func (it *integ) scenarioZeroAndWake(t *testing.T, g *serveProc) {
	c := it.cluster
	eventually(t, 45*time.Second, "hello-00001 scaled to zero", func() (bool, string) {
		n, ok := c.Nomad.Count("default", "hello-00001", spec.GroupName)
		return ok && n == 0, fmt.Sprintf("count %d; scale calls %s", n, describeScales(c.Nomad.ScaleRequests("hello-00001")))
	})
	zero := -1
	calls := c.Nomad.ScaleRequests("hello-00001")
	for i, s := range calls {
		if s.Count != nil && *s.Count == 0 {
			zero = i
		}
	}
	if zero < 0 || !strings.HasPrefix(calls[zero].Message, "no traffic for") || calls[zero].Meta["rule"] == nil {
		t.Fatalf("the scale call to zero does not carry the autoscaler's reason and numbers: %s", describeScales(calls))
	}
	it.waitAsleep(t, "hello-00001", g)
	// While it has no instance, serve stands in for it in Consul, with the
	// revision's tags, so a proxy configured by them routes to it.
	_, portText, err := net.SplitHostPort(g.listen)
	if err != nil {
		t.Fatal(err)
	}
	gwPort, err := strconv.Atoi(portText)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "serve registers a stand-in for hello-00001", func() (bool, string) {
		inst := c.Consul.Services("hello-00001")
		return len(inst) == 1 && slices.Contains(inst[0].Tags, spec.TagActivator) && slices.Contains(inst[0].Tags, "traefik.enable=true") &&
			inst[0].Port == gwPort && inst[0].Status == "passing", fmt.Sprintf("%+v", inst)
	})

	const burst = 50
	replies := make([]reply, burst)
	var wg sync.WaitGroup
	for i := range burst {
		wg.Add(1)
		go func() {
			defer wg.Done()
			replies[i] = g.request("hello", "", "/")
		}()
	}
	wg.Wait()
	failed := 0
	for _, r := range replies {
		if !r.ok() || r.app != "v1" {
			failed++
			t.Errorf("burst request: %s", r)
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests of the burst failed", failed, burst)
	}
	after := c.Nomad.ScaleRequests("hello-00001")[zero+1:]
	fromZero := 0
	for _, s := range after {
		if s.PreviousCount == 0 && s.Count != nil && *s.Count > 0 {
			fromZero++
		}
		if s.Count != nil && *s.Count == 0 {
			t.Errorf("scaled to zero again during the burst: %s", describeScales(after))
		}
	}
	if fromZero != 1 {
		t.Errorf("%d scale-from-zero calls for the burst, want 1: %s", fromZero, describeScales(after))
	}
	t.Logf("scale calls of hello-00001: %s", describeScales(c.Nomad.ScaleRequests("hello-00001")))
}

func describeScales(calls []fakecluster.ScaleRequest) string {
	var parts []string
	for _, s := range calls {
		n := "-"
		if s.Count != nil {
			n = fmt.Sprint(*s.Count)
		}
		parts = append(parts, fmt.Sprintf("[%s %d->%s %q]", s.Time.Format("15:04:05.000"), s.PreviousCount, n, s.Message))
	}
	return strings.Join(parts, " ")
}

// Scenario 3: a changed template makes hello-00002; splitting traffic 50/50
// and then sending all of it to latest, under a light load, fails no
// request; status, revisions and list say what happened.
func (it *integ) scenarioNewRevisionAndTraffic(t *testing.T, g *serveProc) {
	c := it.cluster
	it.deployHello(t, "v2", 2)
	if c.Nomad.Job("default", "hello-00001") == nil {
		t.Errorf("deploying hello-00002 removed hello-00001, which is among the 3 most recent")
	}
	eventually(t, 20*time.Second, "the gateway sends plain requests to v2", func() (bool, string) {
		r := g.request("hello", "", "/")
		return r.ok() && r.app == "v2", r.String()
	})

	// Split only once hello-00001 sleeps, so the split also wakes it
	// under load.
	eventually(t, 45*time.Second, "hello-00001, without traffic, scaled to zero again", func() (bool, string) {
		n, _ := c.Nomad.Count("default", "hello-00001", spec.GroupName)
		return n == 0, fmt.Sprintf("count %d; scale calls %s", n, describeScales(c.Nomad.ScaleRequests("hello-00001")))
	})
	l := startLoad(g, "hello", 2)
	stopped := false
	defer func() {
		if !stopped {
			l.stop()
		}
	}()
	it.mustCLI("traffic", "hello", "-to", "hello-00001=50", "-to", "hello-00002=50")
	eventually(t, 40*time.Second, "both revisions answer under a 50/50 split", func() (bool, string) {
		sent, failures, apps := l.snapshot()
		return apps["v1"] > 5 && apps["v2"] > 5, fmt.Sprintf("sent %d, apps %v, failures %v", sent, apps, failures)
	})
	it.mustCLI("traffic", "hello", "-to", "latest=100")
	_, _, before := l.snapshot()
	eventually(t, 30*time.Second, "only v2 answers after -to latest=100", func() (bool, string) {
		// 20 answers in a row from v2: read the counts twice.
		_, _, apps := l.snapshot()
		return apps["v2"]-before["v2"] >= 20 && checkOnlyV2(g), fmt.Sprintf("apps %v (before %v)", apps, before)
	})
	l.stop()
	stopped = true
	sent, failures, apps := l.snapshot()
	if len(failures) > 0 {
		t.Errorf("%d of %d requests failed while traffic moved: %v", len(failures), sent, failures)
	}
	t.Logf("load during the traffic changes: %d requests, answers %v", sent, apps)

	var st rollout.ServiceView
	it.cliJSON(&st, "status", "hello", "-json")
	if st.Service != "hello" || st.Namespace != "default" || st.Latest != "hello-00002" {
		t.Errorf("status: service %q namespace %q latest %q", st.Service, st.Namespace, st.Latest)
	}
	if len(st.Route.Splits) != 1 || st.Route.Splits[0] != (consulroute.Split{Revision: "hello-00002", Percent: 100}) {
		t.Errorf("status route %+v, want hello-00002 100%%", st.Route)
	}
	if len(st.URLs) == 0 || st.URLs[0] != "http://hello.default.localhost/" {
		t.Errorf("status URLs %v, want http://hello.default.localhost/ first", st.URLs)
	}
	rows := map[string]rollout.RevisionRow{}
	for _, row := range st.Revisions {
		rows[row.Revision] = row
	}
	if v2 := rows["hello-00002"]; v2.Generation != 2 || v2.Percent != 100 || !v2.Latest || v2.Desired < 1 || v2.Ready < 1 || v2.Running < 1 || !v2.Retained || v2.Autoscaler == nil {
		t.Errorf("status row of hello-00002: %+v", v2)
	}
	if v1 := rows["hello-00001"]; v1.Generation != 1 || v1.Percent != 0 || v1.Latest || !v1.Retained || v1.Why == "" {
		t.Errorf("status row of hello-00001: %+v", v1)
	}
	if len(st.Revisions) != 2 || st.Revisions[0].Revision != "hello-00002" {
		t.Errorf("status revisions %+v, want hello-00002 then hello-00001", st.Revisions)
	}

	var revs []rollout.RevisionRow
	it.cliJSON(&revs, "revisions", "hello", "-json")
	if len(revs) != 2 || revs[0].Revision != "hello-00002" || revs[1].Revision != "hello-00001" || revs[0].Percent != 100 || !revs[0].Latest {
		t.Errorf("revisions -json: %+v", revs)
	}
	for _, row := range revs {
		if !row.Retained || row.Why == "" || row.Created.IsZero() {
			t.Errorf("revisions row %s: retained %v why %q created %v", row.Revision, row.Retained, row.Why, row.Created)
		}
	}

	var list []listRow
	it.cliJSON(&list, "list", "-json")
	if len(list) != 1 {
		t.Fatalf("list -json: %+v, want the one service", list)
	}
	if row := list[0]; row.Service != "hello" || row.Namespace != "default" || row.Latest != "hello-00002" || row.Traffic != "hello-00002 100%" ||
		row.Revisions != 2 || row.URL != "http://hello.default.localhost/" || len(row.Problems) > 0 || row.Desired < 1 || row.Running < 1 {
		t.Errorf("list -json row: %+v", row)
	}
}

// checkOnlyV2 sends a few requests and reports whether all reach v2.
func checkOnlyV2(g *serveProc) bool {
	for range 5 {
		if r := g.request("hello", "", "/"); !r.ok() || r.app != "v2" {
			return false
		}
	}
	return true
}

// Scenario 4: a tag routes <tag>-<service>.<ns>.<domain> to the tagged
// revision, while the plain host keeps its split.
func (it *integ) scenarioTag(t *testing.T, g *serveProc) {
	c := it.cluster
	r := it.mustCLI("traffic", "hello", "-tag", "hello-00001=old")
	if !strings.Contains(r.stdout, "tag old -> hello-00001") {
		t.Errorf("traffic's output lacks the tag:\n%s", r)
	}
	rt := c.Consul.ConfigEntry("service-router", "hello")
	if rt == nil || !strings.Contains(fmt.Sprint(rt["Routes"]), "Exact:old") || !strings.Contains(fmt.Sprint(rt["Routes"]), "Service:hello-00001") {
		t.Errorf("service-router hello = %v, want a route for X-Serverless-Tag old to hello-00001", rt)
	}
	eventually(t, 30*time.Second, "old-hello reaches v1", func() (bool, string) {
		r := g.request("hello", "old", "/")
		return r.ok() && r.app == "v1", r.String()
	})
	for range 5 {
		if r := g.request("hello", "", "/"); !r.ok() || r.app != "v2" {
			t.Fatalf("the plain host after tagging: %s, want v2", r)
		}
	}
	var st rollout.ServiceView
	it.cliJSON(&st, "status", "hello", "-json")
	if st.Route.Tags["old"] != "hello-00001" || !slices.Contains(st.URLs, "http://old-hello.default.localhost/") {
		t.Errorf("status after tagging: route %+v urls %v", st.Route, st.URLs)
	}
}

// Scenario 8: a restarted serve rebuilds its state from Nomad and Consul
// and keeps routing; with two replicas only the lock holder scales, and
// the lock passes to the other when the holder stops.
func (it *integ) scenarioRestartAndLeader(t *testing.T, a *serveProc) *serveProc {
	c := it.cluster
	a.stop(t)
	if holder := c.Consul.KVHolder(consulroute.AutoscalerLockKey); holder != "" {
		t.Errorf("the leader lock is still held (session %s) after its holder stopped", holder)
	}
	if inst := c.Consul.Services(spec.ActivatorServiceName); len(inst) != 0 {
		t.Errorf("the stopped replica is still registered as the activator: %+v", inst)
	}
	a2 := it.startServe("replica-a")
	eventually(t, 20*time.Second, "the restarted serve routes both hosts", func() (bool, string) {
		r1, r2 := a2.request("hello", "", "/"), a2.request("hello", "old", "/")
		return r1.ok() && r1.app == "v2" && r2.ok() && r2.app == "v1", r1.String() + " / " + r2.String()
	})
	eventually(t, 20*time.Second, "replica-a leads again", func() (bool, string) {
		v, ok := c.Consul.KV(consulroute.AutoscalerLockKey)
		return ok && string(v) == "replica-a" && c.Consul.KVHolder(consulroute.AutoscalerLockKey) != "", fmt.Sprintf("value %q held by %q", v, c.Consul.KVHolder(consulroute.AutoscalerLockKey))
	})
	b := it.startServe("replica-b")
	// Both replicas route; only replica-a decides.
	eventually(t, 20*time.Second, "replica-b routes", func() (bool, string) {
		r := b.request("hello", "", "/")
		return r.ok() && r.app == "v2", r.String()
	})
	var states []map[string]any
	eventually(t, 10*time.Second, "the leader's autoscaler knows the revisions", func() (bool, string) {
		err := a2.adminJSON("/v1/autoscaler/revisions", &states)
		return err == nil && len(states) >= 2, fmt.Sprintf("%v, %v", states, err)
	})
	if err := b.adminJSON("/v1/autoscaler/revisions", &states); err == nil || !strings.Contains(err.Error(), "503") {
		t.Errorf("replica-b, not the leader, answers its autoscaler state: %v (err %v), want 503", states, err)
	}
	// A wake through the follower: hello-00001 (0%% of the plain traffic)
	// goes back to zero, then the follower wakes it through the leader.
	it.waitAsleep(t, "hello-00001", a2, b)
	before := len(c.Nomad.ScaleRequests("hello-00001"))
	if r := b.request("hello", "old", "/"); !r.ok() || r.app != "v1" {
		t.Fatalf("waking hello-00001 through replica-b: %s", r)
	}
	fromZero := 0
	for _, s := range c.Nomad.ScaleRequests("hello-00001")[before:] {
		if s.PreviousCount == 0 && s.Count != nil && *s.Count > 0 {
			fromZero++
		}
	}
	if fromZero != 1 {
		t.Errorf("%d scale-from-zero calls to wake through the follower, want 1: %s", fromZero, describeScales(c.Nomad.ScaleRequests("hello-00001")[before:]))
	}

	// The leader stops: replica-b takes the lock and keeps routing.
	a2.stop(t)
	eventually(t, 30*time.Second, "replica-b takes the leader lock", func() (bool, string) {
		v, ok := c.Consul.KV(consulroute.AutoscalerLockKey)
		return ok && string(v) == "replica-b" && c.Consul.KVHolder(consulroute.AutoscalerLockKey) != "", fmt.Sprintf("value %q held by %q", v, c.Consul.KVHolder(consulroute.AutoscalerLockKey))
	})
	if r := b.request("hello", "", "/"); !r.ok() || r.app != "v2" {
		t.Errorf("replica-b after the handover: %s", r)
	}
	return b
}

// Scenario 9: a file with an error deploys nothing; delete removes the
// service from Nomad and Consul entirely.
func (it *integ) scenarioBadFileAndDelete(t *testing.T) {
	c := it.cluster
	bad := it.writeFile("bad.hcl", `service "broken" {
  task {
    driver = "raw_exec"
    config {
      command = "/bin/true"
    }
  }
  scaling {
    min = 3
    max = 1
  }
}
`)
	r := it.deploy(bad)
	if r.code != 1 || !strings.Contains(r.stderr, "bad.hcl line 9") || !strings.Contains(r.stderr, "Nothing was deployed") {
		t.Errorf("deploying an invalid file: %s", r)
	}
	for _, id := range c.Nomad.JobIDs() {
		if strings.HasPrefix(id, "default/broken") {
			t.Errorf("an invalid file registered job %s", id)
		}
	}
	for _, kind := range []string{"service-defaults", "service-resolver", "service-splitter", "service-router"} {
		for _, name := range c.Consul.ConfigEntries(kind) {
			if strings.HasPrefix(name, "broken") {
				t.Errorf("an invalid file wrote %s %s", kind, name)
			}
		}
	}
	if _, ok := c.Consul.KV(consulroute.RecordKey("default", "broken")); ok {
		t.Errorf("an invalid file wrote its KV record")
	}

	r = it.mustCLI("delete", "hello")
	if !strings.Contains(r.stdout, "route removed") || !strings.Contains(r.stdout, "hello-00001: purged") || !strings.Contains(r.stdout, "hello-00004: purged") {
		t.Errorf("delete's output:\n%s", r)
	}
	eventually(t, 30*time.Second, "nothing of hello left in Nomad and Consul", func() (bool, string) {
		var left []string
		for _, id := range c.Nomad.JobIDs() {
			left = append(left, "job "+id)
		}
		for _, kind := range []string{"service-defaults", "service-resolver", "service-splitter", "service-router"} {
			for _, name := range c.Consul.ConfigEntries(kind) {
				if name != spec.ActivatorServiceName {
					left = append(left, kind+" "+name)
				}
			}
		}
		for _, k := range c.Consul.KVKeys(consulroute.KVPrefix) {
			left = append(left, "kv "+k)
		}
		for _, in := range c.Consul.Services("") {
			if in.Name != spec.ActivatorServiceName {
				left = append(left, "service "+in.ID)
			}
		}
		for _, rev := range []string{"hello-00001", "hello-00002", "hello-00003", "hello-00004"} {
			for _, a := range c.Nomad.Allocations("default", rev) {
				if a.ClientStatus == "running" || a.ClientStatus == "pending" {
					left = append(left, "allocation "+a.Name+" "+a.ClientStatus)
				}
			}
		}
		return len(left) == 0, strings.Join(left, ", ")
	})
	if r := it.cli("status", "hello"); r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("status of a deleted service: %s", r)
	}
}

// Scenario 5: a revision whose app exits at once fails the deploy with
// Nomad's reason; it is scaled to zero and traffic stays where it was.
func (it *integ) scenarioCannotStart(t *testing.T, g *serveProc) {
	c := it.cluster
	file := it.writeFile("broken.hcl", strings.Replace(it.helloService("v3"), `args    = ["testapp"]`, `args    = ["testapp", "-no-such-flag"]`, 1))
	r := it.deploy(file)
	if r.code != 1 {
		t.Fatalf("deploying a revision whose app cannot start: %s", r)
	}
	for _, want := range []string{"hello-00003 failed to start", "task user: exited with code 2", "restarts exceeded",
		"Revision hello-00003 is stopped", "Traffic still goes where it went before"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("deploy's error lacks %q:\n%s", want, r)
		}
	}
	if job := c.Nomad.Job("default", "hello-00003"); job == nil || !*job.Stop {
		t.Fatalf("the failed revision's job is not stopped (kept for inspection): %+v", job)
	}
	calls := c.Nomad.ScaleRequests("hello-00003")
	if len(calls) != 1 || !strings.HasPrefix(calls[0].Message, "deploy failed: ") {
		t.Errorf("scale calls of the failed revision: %s, want one saying the deploy failed", describeScales(calls))
	}
	// serve drops the stopped revision, so its autoscaler (which keeps a
	// new revision at its initial scale until it was once ready) does not
	// start it again.
	eventually(t, 10*time.Second, "serve forgets the stopped revision", func() (bool, string) {
		var revs []map[string]any
		err := g.adminJSON("/v1/activator/revisions", &revs)
		return err == nil && !strings.Contains(fmt.Sprint(revs), "hello-00003"), fmt.Sprintf("%v %v", revs, err)
	})
	for _, a := range c.Nomad.Allocations("default", "hello-00003") {
		if a.DesiredStatus == "run" && (a.ClientStatus == "running" || a.ClientStatus == "pending") {
			t.Errorf("allocation %s of the stopped revision still runs", a.Name)
		}
	}
	if calls := c.Nomad.ScaleRequests("hello-00003"); len(calls) != 1 {
		t.Errorf("the stopped revision was scaled again: %s", describeScales(calls))
	}
	var revs []rollout.RevisionRow
	it.cliJSON(&revs, "revisions", "hello", "-json")
	if len(revs) == 0 || revs[0].Revision != "hello-00003" || !revs[0].Stopped {
		t.Errorf("revisions after the failed deploy: %+v, want hello-00003 first and stopped", revs)
	}

	// An app that runs but never passes its readiness: deploy gives up at
	// -wait with the check's output, and stops the revision too.
	notReady := strings.Replace(it.helloService("v4"), `TESTAPP_NAME = "v4"`, `TESTAPP_NAME = "v4"
      TESTAPP_FAIL_READY = "true"`, 1)
	notReady = strings.Replace(notReady, "  concurrency = 10", "  readiness {\n    http { path = \"/ready\" }\n  }\n  concurrency = 10", 1)
	r = it.cli("deploy", "-sidecar-command", it.bin, "-wait", "3s", it.writeFile("notready.hcl", notReady))
	if r.code != 1 {
		t.Fatalf("deploying a revision that never gets ready: %s", r)
	}
	for _, want := range []string{"hello-00004: 0 of 1 instances ready after 3s", "503 Service Unavailable", "Revision hello-00004 is stopped", "Traffic still goes where it went before"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("deploy's error lacks %q:\n%s", want, r)
		}
	}
	if job := c.Nomad.Job("default", "hello-00004"); job == nil || !*job.Stop {
		t.Errorf("the never-ready revision's job is not stopped: %+v", job)
	}
	var st rollout.ServiceView
	it.cliJSON(&st, "status", "hello", "-json")
	if st.Latest != "hello-00002" || len(st.Route.Splits) != 1 || st.Route.Splits[0].Revision != "hello-00002" {
		t.Errorf("after a failed deploy the route moved: latest %q route %+v", st.Latest, st.Route)
	}
	if r := g.request("hello", "", "/"); !r.ok() || r.app != "v2" {
		t.Errorf("after a failed deploy: %s, want v2", r)
	}
}

// Scenario 6: the same file again makes no revision; a change of scaling
// only updates the revision in place, keeping its count.
func (it *integ) scenarioInPlace(t *testing.T, g *serveProc) {
	c := it.cluster
	file := it.writeFile("hello.hcl", it.helloService("v2"))
	r := it.deploy(file)
	if r.code != 0 || !strings.Contains(r.stdout, "hello-00002: template unchanged; no new revision") {
		t.Fatalf("deploying the same file again: %s", r)
	}
	before := c.Nomad.Job("default", "hello-00002")
	file = it.writeFile("hello.hcl", strings.Replace(it.helloService("v2"), "max                 = 3", "max                 = 4", 1))
	r = it.deploy(file)
	if r.code != 0 || !strings.Contains(r.stdout, "hello-00002: template unchanged; scaling settings updated in place") {
		t.Fatalf("a scaling-only change: %s", r)
	}
	after := c.Nomad.Job("default", "hello-00002")
	if after == nil || *after.TaskGroups[0].Scaling.Max != 4 {
		t.Fatalf("hello-00002's scaling block after the change: %+v", after.TaskGroups[0].Scaling)
	}
	if *after.TaskGroups[0].Count != *before.TaskGroups[0].Count && len(c.Nomad.ScaleRequests("hello-00002")) == 0 {
		t.Errorf("the count changed from %d to %d without a scale call", *before.TaskGroups[0].Count, *after.TaskGroups[0].Count)
	}
	for _, id := range c.Nomad.JobIDs() {
		if id == "default/hello-00005" {
			t.Errorf("a scaling-only change made a new revision")
		}
	}
	var revs []rollout.RevisionRow
	it.cliJSON(&revs, "revisions", "hello", "-json")
	if len(revs) != 4 {
		t.Errorf("revisions after the in-place change: %+v, want 4 (2 stopped)", revs)
	}
}

// Scenario 7: with Nomad unreachable, the CLI says where it tried and why,
// serve keeps routing to what runs, and once Nomad is back serve follows it
// again (a wake from zero works). A refusal (403) is worded as one.
func (it *integ) scenarioNomadDown(t *testing.T, g *serveProc) {
	c := it.cluster
	eventually(t, 20*time.Second, "hello-00002 answers", func() (bool, string) {
		r := g.request("hello", "", "/")
		return r.ok() && r.app == "v2", r.String()
	})
	c.Nomad.Down()
	up := false
	defer func() {
		if !up {
			_ = c.Nomad.Up()
		}
	}()
	r := it.cli("status", "hello")
	if r.code != 1 || !strings.Contains(r.stderr, "cannot reach Nomad at "+c.Nomad.Addr()) || !strings.Contains(r.stderr, "connection refused") {
		t.Errorf("status with Nomad down: %s", r)
	}
	for range 10 {
		if r := g.request("hello", "", "/"); !r.ok() || r.app != "v2" {
			t.Fatalf("routing to a running instance with Nomad down: %s", r)
		}
	}
	if err := c.Nomad.Up(); err != nil {
		t.Fatal(err)
	}
	up = true

	c.Nomad.SetFault(fakecluster.Fault{Status: 403, PathPrefix: "/v1/job"})
	r = it.cli("traffic", "hello", "-to", "latest=100")
	c.Nomad.SetFault(fakecluster.Fault{})
	if r.code != 1 || !strings.Contains(r.stderr, "Nomad denied permission") || !strings.Contains(r.stderr, "NOMAD_TOKEN") {
		t.Errorf("traffic with a token Nomad refuses: %s", r)
	}

	// Deploying the file (scenario 6) set the traffic back to what the
	// file says, without the tag: tag hello-00001 again.
	it.mustCLI("traffic", "hello", "-tag", "hello-00001=old")
	// serve follows Nomad again: hello-00001 goes to zero (serve sees its
	// instance go) and a request wakes it (serve sees the new one).
	it.waitAsleep(t, "hello-00001", g)
	before := len(c.Nomad.ScaleRequests("hello-00001"))
	if r := g.request("hello", "old", "/"); !r.ok() || r.app != "v1" {
		t.Fatalf("waking hello-00001 after Nomad came back: %s", r)
	}
	if calls := c.Nomad.ScaleRequests("hello-00001")[before:]; len(calls) == 0 || calls[0].PreviousCount != 0 {
		t.Errorf("the request was not served by waking hello-00001: %s", describeScales(calls))
	}
}

// waitAsleep waits until a revision is at zero everywhere: count 0 in
// Nomad, no allocation left running (its drain included), no instance in
// Consul but stand-ins, and none in the given gateways' tables. A request
// sent then can only be served by waking it.
func (it *integ) waitAsleep(t *testing.T, rev string, gateways ...*serveProc) {
	t.Helper()
	c := it.cluster
	eventually(t, 45*time.Second, rev+" asleep: count 0, no allocation running, no instance in Consul or the gateways", func() (bool, string) {
		n, _ := c.Nomad.Count("default", rev, spec.GroupName)
		live := 0
		for _, a := range c.Nomad.Allocations("default", rev) {
			if a.ClientStatus == "running" || a.ClientStatus == "pending" {
				live++
			}
		}
		real := 0
		for _, in := range c.Consul.Services(rev) {
			if !slices.Contains(in.Tags, spec.TagActivator) {
				real++
			}
		}
		state := fmt.Sprintf("count %d, %d live allocations, %d instances in Consul", n, live, real)
		if n != 0 || live != 0 || real != 0 {
			return false, state
		}
		for _, g := range gateways {
			var revs []struct {
				Revision  string
				Instances []any
			}
			if err := g.adminJSON("/v1/activator/revisions", &revs); err != nil {
				return false, state + "; " + err.Error()
			}
			for _, r := range revs {
				if r.Revision == rev && len(r.Instances) > 0 {
					return false, fmt.Sprintf("%s; gateway %s still has %d instances", state, g.replica, len(r.Instances))
				}
			}
		}
		return true, state
	})
}

// Scenario 8a: `keep-sockets` holds the gateway's port for a
// second serve. A connection made after that serve is killed with SIGKILL
// waits in the kernel's backlog and the serve started next answers it; a
// serve stopped with SIGTERM leaves the port refusing.
func (it *integ) scenarioSocketKeeper(t *testing.T) {
	listen := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))
	sock := filepath.Join(t.TempDir(), "gateway-sockets.sock")
	keeper := testbin.Start(it.root, it.bin, []string{"keep-sockets", "-socket", sock, "-listen", listen}, nil)
	defer func() {
		if code := keeper.Stop(t); code != 0 {
			t.Errorf("keep-sockets exited %d after SIGTERM:\n%s", code, keeper.Output())
		}
	}()
	k := it.startServeOn("replica-k", listen, "-sockets", sock)
	if r := k.request("hello", "", "/"); !r.ok() || r.app != "v2" {
		t.Fatalf("through the kept socket: %s", r)
	}
	if err := k.proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if _, err := k.proc.Wait(30 * time.Second); err != nil {
		t.Fatalf("serve after SIGKILL: %v", err)
	}
	// serve is dead: the connection is still taken, and its request waits.
	answered := make(chan reply, 1)
	c, err := net.DialTimeout("tcp", listen, 10*time.Second)
	if err != nil {
		t.Fatalf("dial the gateway while serve is dead: %v (the keeper should hold the port)", err)
	}
	defer c.Close()
	go func() {
		c.SetDeadline(time.Now().Add(90 * time.Second))
		fmt.Fprintf(c, "GET / HTTP/1.1\r\nHost: hello.default.%s\r\nConnection: close\r\n\r\n", activator.DefaultDomain)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			answered <- reply{err: err}
			return
		}
		defer resp.Body.Close()
		answered <- reply{code: resp.StatusCode, app: resp.Header.Get("X-Testapp-Name")}
	}()
	k2 := it.startServeOn("replica-k", listen, "-sockets", sock)
	if r := <-answered; !r.ok() || r.app != "v2" {
		t.Errorf("the request made while serve was dead: %s, want 200 from v2", r)
	}
	k2.stop(t)
	eventually(t, 20*time.Second, "the port refuses once serve stopped on purpose", func() (bool, string) {
		c, err := net.DialTimeout("tcp", listen, time.Second)
		if c != nil {
			c.Close()
		}
		return errors.Is(err, syscall.ECONNREFUSED), fmt.Sprintf("dial: %v", err)
	})
}
