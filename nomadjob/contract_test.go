package nomadjob

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

func mustCompile(t *testing.T, svc spec.Service, gen int, opts Options) (spec.Revision, *api.Job) {
	t.Helper()
	if ps := svc.Validate(); len(ps) > 0 {
		t.Fatalf("invalid service: %v", ps)
	}
	rev := spec.NewRevision(&svc, gen)
	job, err := Compile(rev, opts)
	if err != nil {
		t.Fatalf("Compile: %v", err)
	}
	return rev, job
}

func taskByName(t *testing.T, g *api.TaskGroup, name string) *api.Task {
	t.Helper()
	for _, task := range g.Tasks {
		if task.Name == name {
			return task
		}
	}
	t.Fatalf("group has no task %q", name)
	return nil
}

// roundTrip sends a job through JSON, as it travels to Nomad and back.
func roundTrip(t *testing.T, job *api.Job) *api.Job {
	t.Helper()
	b, err := json.Marshal(job)
	if err != nil {
		t.Fatal(err)
	}
	var out api.Job
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatal(err)
	}
	return &out
}

func TestContractJobIdentityAndMeta(t *testing.T) {
	rev, job := mustCompile(t, probesAndBounds(), 3, testOptions())
	if *job.ID != "api-00003" || *job.Name != "api-00003" || *job.ID != rev.Name() {
		t.Errorf("ID/Name = %q/%q, want the revision name %q", *job.ID, *job.Name, rev.Name())
	}
	if *job.Type != "service" {
		t.Errorf("Type = %q, want service", *job.Type)
	}
	if *job.Namespace != "default" || !slices.Equal(job.Datacenters, []string{"*"}) {
		t.Errorf("namespace %q datacenters %v", *job.Namespace, job.Datacenters)
	}
	want := map[string]string{
		spec.JobMetaService:   "api",
		spec.JobMetaRevision:  "api-00003",
		spec.JobMetaGen:       "3",
		spec.JobMetaSpecHash:  rev.SpecHash,
		spec.JobMetaConcurren: "10",
		JobMetaTimeout:        "30s",
	}
	if !reflect.DeepEqual(job.Meta, want) {
		t.Errorf("meta = %v, want %v", job.Meta, want)
	}
	// Scaling settings must not be in job meta: a meta change is a
	// destructive update in Nomad.
	for k := range job.Meta {
		if strings.Contains(k, "scal") || strings.Contains(k, "min") || strings.Contains(k, "max") {
			t.Errorf("job meta holds a scaling setting %q", k)
		}
	}
	if job.Update == nil || job.Update.MaxParallel == nil || *job.Update.MaxParallel != 0 {
		t.Errorf("update = %+v, want max_parallel = 0 (deployments off)", job.Update)
	}
}

func TestContractTemplatePlacement(t *testing.T) {
	_, job := mustCompile(t, traefikTags(), 2, testOptions())
	if deref(job.Region, "") != "eu" || deref(job.NodePool, "") != "web" || !slices.Equal(job.Datacenters, []string{"eu-west-1a", "eu-west-1b"}) {
		t.Errorf("region %v node pool %v datacenters %v", job.Region, job.NodePool, job.Datacenters)
	}
	want := []*api.Constraint{{LTarget: "${attr.kernel.name}", RTarget: "linux"}, {LTarget: "${meta.tier}", Operand: "=", RTarget: "frontend"}}
	if !reflect.DeepEqual(job.Constraints, want) {
		t.Errorf("constraints = %+v", job.Constraints)
	}
}

func TestContractGroupTasksLifecycle(t *testing.T) {
	_, job := mustCompile(t, dockerWebApp(), 1, testOptions())
	if len(job.TaskGroups) != 1 || *job.TaskGroups[0].Name != spec.GroupName {
		t.Fatalf("groups = %d, want one named %q", len(job.TaskGroups), spec.GroupName)
	}
	g := job.TaskGroups[0]
	if *g.Count != 1 {
		t.Errorf("count = %d, want scaling.initial 1", *g.Count)
	}
	if len(g.Tasks) != 2 {
		t.Fatalf("tasks = %d, want user and queue-proxy", len(g.Tasks))
	}
	user := taskByName(t, g, spec.UserTaskName)
	proxy := taskByName(t, g, spec.SidecarTaskName)
	if user.Lifecycle != nil {
		t.Errorf("user task has a lifecycle %+v; it is the main task", user.Lifecycle)
	}
	if !user.Leader {
		t.Errorf("user task leader = %v, want true: it stops first, before the queue-proxy", user.Leader)
	}
	// Beside a container whose app port is published (docker, host
	// networking) the sidecar starts once the container runs: see
	// sidecarLifecycle. Everywhere else it is a main task, started with
	// the app.
	if proxy.Lifecycle == nil || proxy.Lifecycle.Hook != "poststart" || !proxy.Lifecycle.Sidecar {
		t.Errorf("queue-proxy lifecycle beside a published container = %+v, want poststart sidecar", proxy.Lifecycle)
	}
	for name, svc := range map[string]spec.Service{"raw_exec": rawExecBinary(), "bridge": bridgeConnect()} {
		_, other := mustCompile(t, svc, 1, testOptions())
		if lc := taskByName(t, other.TaskGroups[0], spec.SidecarTaskName).Lifecycle; lc != nil {
			t.Errorf("queue-proxy lifecycle beside a %s app = %+v, want none (a main task, started with the app)", name, lc)
		}
		if !taskByName(t, other.TaskGroups[0], spec.UserTaskName).Leader {
			t.Errorf("user task beside a %s app is not the leader", name)
		}
	}
	if *proxy.KillTimeout != *user.KillTimeout {
		t.Errorf("sidecar kill_timeout %s, user %s: want equal", *proxy.KillTimeout, *user.KillTimeout)
	}
	if g.ShutdownDelay == nil || *g.ShutdownDelay != DefaultShutdownDelay || DefaultShutdownDelay >= spec.DefaultKillTimeout {
		t.Errorf("shutdown_delay = %v, want %s (below kill_timeout)", g.ShutdownDelay, DefaultShutdownDelay)
	}
	if g.RestartPolicy == nil || *g.RestartPolicy.Delay > 5*time.Second || *g.RestartPolicy.Mode != "fail" {
		t.Errorf("restart policy = %+v, want fast restarts that fail the allocation", g.RestartPolicy)
	}
	if g.ReschedulePolicy == nil || !*g.ReschedulePolicy.Unlimited || *g.ReschedulePolicy.MaxDelay > time.Minute {
		t.Errorf("reschedule policy = %+v", g.ReschedulePolicy)
	}

	opts := testOptions()
	opts.ShutdownDelay = -1
	_, job = mustCompile(t, dockerWebApp(), 1, opts)
	if job.TaskGroups[0].ShutdownDelay != nil {
		t.Errorf("ShutdownDelay -1 should turn shutdown_delay off, got %v", *job.TaskGroups[0].ShutdownDelay)
	}
}

func portLabels(n *api.NetworkResource) []string {
	var out []string
	for _, p := range n.DynamicPorts {
		out = append(out, p.Label)
	}
	return out
}

func TestContractPortsHostMode(t *testing.T) {
	// An exec-driver app listens on the dynamic port PORT names, on the
	// node's network; the sidecar reaches it on loopback.
	_, job := mustCompile(t, rawExecBinary(), 1, testOptions())
	g := job.TaskGroups[0]
	if len(g.Networks) != 1 || g.Networks[0].Mode != "host" {
		t.Fatalf("networks = %+v, want one in host mode", g.Networks)
	}
	if got := portLabels(g.Networks[0]); !slices.Equal(got, []string{"http", "app", "admin"}) {
		t.Errorf("dynamic ports = %v, want http, app, admin", got)
	}
	for _, p := range g.Networks[0].DynamicPorts {
		if p.Value != 0 || p.To != 0 {
			t.Errorf("port %s is not dynamic: %+v", p.Label, p)
		}
	}
	user := taskByName(t, g, spec.UserTaskName)
	if user.Env["PORT"] != "${NOMAD_PORT_app}" {
		t.Errorf("user PORT = %q", user.Env["PORT"])
	}
	proxy := taskByName(t, g, spec.SidecarTaskName)
	if _, set := proxy.Env[spec.EnvSidecarAppHost]; set || proxy.Env[spec.EnvSidecarAppPort] != "${NOMAD_PORT_app}" {
		t.Errorf("sidecar app address: host %q port %q, want loopback and ${NOMAD_PORT_app}", proxy.Env[spec.EnvSidecarAppHost], proxy.Env[spec.EnvSidecarAppPort])
	}
}

func TestContractHostModeContainerPublishesItsPort(t *testing.T) {
	// A container keeps its own network: it listens on its declared port
	// (an image that ignores PORT works), Nomad publishes a dynamic port
	// of the node's address to it, and the sidecar goes there.
	rev := dockerWebApp()
	_, job := mustCompile(t, rev, 1, testOptions())
	g := job.TaskGroups[0]
	var app api.Port
	for _, p := range g.Networks[0].DynamicPorts {
		if p.Label == spec.PortApp {
			app = p
		}
	}
	if app.Value != 0 || app.To != rev.Template.Task.Port {
		t.Errorf("app port = %+v, want dynamic, mapped to %d", app, rev.Template.Task.Port)
	}
	user := taskByName(t, g, spec.UserTaskName)
	if user.Env["PORT"] != strconv.Itoa(rev.Template.Task.Port) {
		t.Errorf("user PORT = %q, want the port inside the container", user.Env["PORT"])
	}
	if got := user.Config["ports"]; !reflect.DeepEqual(got, []string{"app"}) {
		t.Errorf("docker ports = %v, want [app]", got)
	}
	if _, set := user.Config["network_mode"]; set {
		t.Errorf("network_mode set: %v", user.Config["network_mode"])
	}
	proxy := taskByName(t, g, spec.SidecarTaskName)
	if proxy.Env[spec.EnvSidecarAppHost] != "${NOMAD_IP_app}" || proxy.Env[spec.EnvSidecarAppPort] != "${NOMAD_HOST_PORT_app}" {
		t.Errorf("sidecar app address: %q:%q", proxy.Env[spec.EnvSidecarAppHost], proxy.Env[spec.EnvSidecarAppPort])
	}
	// A user's own network choice is kept, and then nothing is published.
	_, job = mustCompile(t, traefikTags(), 1, testOptions())
	user = taskByName(t, job.TaskGroups[0], spec.UserTaskName)
	if got := user.Config["network_mode"]; got != "bridge" {
		t.Errorf("user's network_mode overwritten: %v", got)
	}
	if got := user.Config["ports"]; !reflect.DeepEqual(got, []any{"app"}) {
		t.Errorf("user's ports changed: %#v", got)
	}
	if job.TaskGroups[0].Networks[0].DynamicPorts[1].To != 0 {
		t.Errorf("app port mapped although the user chose the network: %+v", job.TaskGroups[0].Networks[0].DynamicPorts[1])
	}
}

func TestContractPortsBridgeMode(t *testing.T) {
	_, job := mustCompile(t, bridgeConnect(), 1, testOptions())
	g := job.TaskGroups[0]
	if g.Networks[0].Mode != "bridge" {
		t.Fatalf("mode = %q", g.Networks[0].Mode)
	}
	if got := portLabels(g.Networks[0]); !slices.Equal(got, []string{"http", "admin"}) {
		t.Errorf("mapped ports = %v, want only the sidecar's http and admin (the app stays inside the allocation)", got)
	}
	user := taskByName(t, g, spec.UserTaskName)
	proxy := taskByName(t, g, spec.SidecarTaskName)
	if user.Env["PORT"] != "9090" || proxy.Env[spec.EnvSidecarAppPort] != "9090" {
		t.Errorf("app port: user PORT %q sidecar %q, want the fixed 9090", user.Env["PORT"], proxy.Env[spec.EnvSidecarAppPort])
	}
	if _, ok := user.Config["network_mode"]; ok {
		t.Errorf("bridge mode must not set network_mode: %v", user.Config)
	}
	svc := g.Services[0]
	if svc.Connect == nil || svc.Connect.SidecarService == nil || svc.Connect.SidecarService.Proxy == nil {
		t.Fatalf("connect = %+v, want sidecar_service with a proxy", svc.Connect)
	}
	ups := svc.Connect.SidecarService.Proxy.Upstreams
	if len(ups) != 2 || ups[0].DestinationName != "postgres" || ups[0].LocalBindPort != 5432 || ups[1].DestinationName != "payments" {
		t.Errorf("upstreams = %+v", ups)
	}

	// Connect needs bridge networking.
	s := bridgeConnect()
	s.Template.Network.Mode = spec.NetworkHost
	if _, err := Compile(spec.NewRevision(&s, 1), testOptions()); err == nil || !strings.Contains(err.Error(), "bridge") {
		t.Errorf("connect in host mode: err = %v, want one naming bridge networking", err)
	}
}

func TestContractConsulService(t *testing.T) {
	_, job := mustCompile(t, traefikTags(), 2, testOptions())
	svcs := job.TaskGroups[0].Services
	if len(svcs) != 1 {
		t.Fatalf("services = %d, want 1", len(svcs))
	}
	s := svcs[0]
	if s.Name != "shop-00002" || s.PortLabel != "http" || s.Provider != "consul" {
		t.Errorf("service name %q port %q provider %q", s.Name, s.PortLabel, s.Provider)
	}
	wantTags := []string{"serverless", "service=shop", "traefik.enable=true", "traefik.http.routers.shop.rule=Host(`shop.example.com`)"}
	if !slices.Equal(s.Tags, wantTags) {
		t.Errorf("tags = %q, want %q", s.Tags, wantTags)
	}
	wantMeta := map[string]string{"service": "shop", "revision": "shop-00002", "admin-port": "${NOMAD_HOST_PORT_admin}", "team": "web", "owner": "shop-team"}
	if !reflect.DeepEqual(s.Meta, wantMeta) {
		t.Errorf("meta = %v, want %v", s.Meta, wantMeta)
	}
	if len(s.Checks) != 1 {
		t.Fatalf("checks = %d, want the readiness check only (no liveness declared)", len(s.Checks))
	}
	c := s.Checks[0]
	if c.Type != "http" || c.Path != "/" || c.PortLabel != "http" || c.Interval != time.Second || c.Timeout != time.Second {
		t.Errorf("check = %+v", c)
	}
	if got := c.Header["K-Network-Probe"]; !slices.Equal(got, []string{"queue"}) {
		t.Errorf("check header K-Network-Probe = %q, want [queue]", got)
	}

	// The interval is configurable; the timeout never exceeds it.
	opts := testOptions()
	opts.CheckInterval = 500 * time.Millisecond
	_, job = mustCompile(t, traefikTags(), 2, opts)
	c = job.TaskGroups[0].Services[0].Checks[0]
	if c.Interval != 500*time.Millisecond || c.Timeout != 500*time.Millisecond {
		t.Errorf("interval %s timeout %s, want 500ms both", c.Interval, c.Timeout)
	}
}

func TestContractLivenessCheck(t *testing.T) {
	_, job := mustCompile(t, probesAndBounds(), 1, testOptions())
	checks := job.TaskGroups[0].Services[0].Checks
	if len(checks) != 2 {
		t.Fatalf("checks = %d, want readiness and liveness", len(checks))
	}
	l := checks[1]
	if l.PortLabel != "admin" || l.Path != "/liveness" || l.TaskName != "user" || l.Type != "http" {
		t.Errorf("liveness check = %+v", l)
	}
	if l.Interval != 5*time.Second || l.Timeout != 2*time.Second {
		t.Errorf("liveness interval %s timeout %s, want the probe's 5s/2s", l.Interval, l.Timeout)
	}
	if l.CheckRestart == nil || l.CheckRestart.Limit != 4 || *l.CheckRestart.Grace != 3*time.Second+DefaultLivenessGrace {
		t.Errorf("check_restart = %+v, want limit 4 (failure_threshold) and grace initial_delay + %s", l.CheckRestart, DefaultLivenessGrace)
	}
	// A liveness probe without a period is checked every
	// spec.DefaultLivenessPeriod.
	s := probesAndBounds()
	s.Template.Liveness.Period = 0
	_, job = mustCompile(t, s, 1, testOptions())
	if got := job.TaskGroups[0].Services[0].Checks[1].Interval; got != spec.DefaultLivenessPeriod {
		t.Errorf("interval = %s, want %s", got, spec.DefaultLivenessPeriod)
	}
}

func TestContractScalingBlock(t *testing.T) {
	rev, job := mustCompile(t, probesAndBounds(), 1, testOptions())
	g := job.TaskGroups[0]
	sc := g.Scaling
	if sc == nil || *sc.Min != 1 || *sc.Max != 5 || *sc.Enabled {
		t.Fatalf("scaling = %+v, want min 1 max 5 disabled", sc)
	}
	if *g.Count != 2 {
		t.Errorf("count = %d, want initial 2", *g.Count)
	}
	if _, ok := sc.Policy[PolicyKey]; !ok {
		t.Fatalf("policy %v has no %q", sc.Policy, PolicyKey)
	}
	pol := sc.Policy[PolicyKey].(map[string]any)
	if pol["window"] != "1m0s" || pol["scale_down_delay"] != "30s" || pol["metric"] != "rps" {
		t.Errorf("policy durations/metric not written as strings: %v", pol)
	}
	got, err := ScalingFromJob(roundTrip(t, job))
	if err != nil || got != rev.Scaling {
		t.Errorf("ScalingFromJob = %+v, %v; want %+v", got, err, rev.Scaling)
	}

	// Unbounded max uses UnboundedMax, or the option.
	_, job = mustCompile(t, dockerWebApp(), 1, testOptions())
	if got := *job.TaskGroups[0].Scaling.Max; got != UnboundedMax {
		t.Errorf("max for unbounded = %d, want %d", got, UnboundedMax)
	}
	opts := testOptions()
	opts.UnboundedMax = 7
	_, job = mustCompile(t, dockerWebApp(), 1, opts)
	if got := *job.TaskGroups[0].Scaling.Max; got != 7 {
		t.Errorf("max with UnboundedMax 7 = %d", got)
	}
	if s, _ := ScalingFromJob(job); s.Max != 0 {
		t.Errorf("policy max = %d, want 0 (unbounded) whatever the block says", s.Max)
	}
}

func TestInitialCountWithinBounds(t *testing.T) {
	for _, c := range []struct {
		min, max, initial, want int
	}{
		{0, 0, 1, 1},
		{0, 0, 0, 0},
		{3, 0, 1, 3},  // raised to min: Nomad refuses a count below it
		{0, 2, 2, 2},  //
		{2, 10, 5, 5}, //
		{0, 0, 5000, UnboundedMax},
	} {
		s := spec.DefaultScaling()
		s.Min, s.Max, s.Initial = c.min, c.max, c.initial
		if got := initialCount(s, UnboundedMax); got != c.want {
			t.Errorf("min %d max %d initial %d: count %d, want %d", c.min, c.max, c.initial, got, c.want)
		}
	}
	s := spec.NewService("big")
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "/bin/true"}
	s.Scaling.Min = 20
	_, err := Compile(spec.NewRevision(&s, 1), Options{Sidecar: SidecarOptions{Command: "/x"}, UnboundedMax: 10})
	if err == nil || !strings.Contains(err.Error(), "min 20") {
		t.Errorf("min above the unbounded max: err = %v", err)
	}
}

func TestScalingRoundTrip(t *testing.T) {
	cases := []spec.Scaling{spec.DefaultScaling()}
	s := spec.DefaultScaling()
	s.Min, s.Max, s.Initial, s.ActivationScale = 2, 40, 3, 2
	s.Target, s.Utilization, s.Metric = 12.5, 85.25, spec.MetricRPS
	s.Window, s.ScaleToZeroGrace, s.ScaleDownDelay = 90*time.Second, 1500*time.Millisecond, 2*time.Minute
	s.PanicWindowPercentage, s.PanicThresholdPercentage = 6.5, 150
	s.BurstCapacity, s.MaxScaleUpRate, s.MaxScaleDownRate = spec.Unlimited, 3.5, 1.25
	cases = append(cases, s)
	for _, want := range cases {
		svc := dockerWebApp()
		svc.Scaling = want
		_, job := mustCompile(t, svc, 1, testOptions())
		got, err := ScalingFromJob(roundTrip(t, job))
		if err != nil || got != want {
			t.Errorf("round trip: got %+v, %v\nwant %+v", got, err, want)
		}
	}
	if _, err := ScalingFromJob(&api.Job{ID: new("x-00001")}); err == nil {
		t.Error("ScalingFromJob of a job without group app succeeded")
	}
	bad := roundTrip(t, mustJob(t))
	bad.TaskGroups[0].Scaling.Policy[PolicyKey].(map[string]any)["window"] = "soon"
	if _, err := ScalingFromJob(bad); err == nil || !strings.Contains(err.Error(), "window") {
		t.Errorf("bad duration: err = %v, want one naming window", err)
	}
}

func mustJob(t *testing.T) *api.Job {
	t.Helper()
	_, job := mustCompile(t, dockerWebApp(), 1, testOptions())
	return job
}

func TestRevisionFromJob(t *testing.T) {
	rev, job := mustCompile(t, probesAndBounds(), 3, testOptions())
	info, err := RevisionFromJob(roundTrip(t, job))
	if err != nil {
		t.Fatal(err)
	}
	want := RevisionInfo{
		Name: "api-00003", Service: "api", Namespace: "default", Generation: 3, SpecHash: rev.SpecHash,
		Concurrency: 10, Timeout: 30 * time.Second, Scaling: rev.Scaling, Count: 2,
		ServiceTags: []string{spec.TagServerless, spec.TagServicePrefix + "api"},
	}
	if !reflect.DeepEqual(info, want) {
		t.Errorf("RevisionFromJob =\n%+v\nwant\n%+v", info, want)
	}

	notOurs := &api.Job{ID: new("redis"), Meta: map[string]string{"owner": "ops"}}
	if _, err := RevisionFromJob(notOurs); !errors.Is(err, ErrNotOurs) || !strings.Contains(err.Error(), "redis") {
		t.Errorf("job without our meta: err = %v, want ErrNotOurs naming it", err)
	}
	forged := roundTrip(t, job)
	forged.Meta[spec.JobMetaGen] = "7"
	if _, err := RevisionFromJob(forged); err == nil || !strings.Contains(err.Error(), "generation") {
		t.Errorf("generation meta contradicting the ID: err = %v", err)
	}
}

func TestRevisionFromRecordedJob(t *testing.T) {
	// The job Nomad 1.6 returned in fixture 003 was registered before the
	// scaling settings moved to the policy: it reads with defaulted
	// scaling within the block's bounds.
	ex := fixtures.Load(t, "nomad-1.6/003-job-read.json")
	var job api.Job
	if err := json.Unmarshal(ex.Response.BodyBytes(), &job); err != nil {
		t.Fatal(err)
	}
	info, err := RevisionFromJob(&job)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "hello-00001" || info.Service != "hello" || info.Generation != 1 || info.SpecHash != "sha256:0f3c" ||
		info.Count != 1 || !info.ScalingDefaulted || info.Scaling.Max != 10 || info.Timeout != spec.DefaultTimeout || info.JobModifyIndex != 10 {
		t.Errorf("info = %+v", info)
	}
}

// TestRevisionFromRecordedJobNomad20: Nomad 2.0 returns the same job with
// more fields (a default workload Identity on every task, a null group
// Consul block, Networks without their zero fields; nomad-2.0/003). None of
// it is ours, so the revision reads the same.
func TestRevisionFromRecordedJobNomad20(t *testing.T) {
	ex := fixtures.Load(t, "nomad-2.0/003-job-read.json")
	var job api.Job
	if err := json.Unmarshal(ex.Response.BodyBytes(), &job); err != nil {
		t.Fatal(err)
	}
	if job.TaskGroups[0].Tasks[0].Identity == nil || job.TaskGroups[0].Consul != nil {
		t.Fatalf("fixture no longer shows Nomad 2.0's default identity and null group Consul")
	}
	info, err := RevisionFromJob(&job)
	if err != nil {
		t.Fatal(err)
	}
	if info.Name != "hello-00001" || info.Service != "hello" || info.Generation != 1 || info.SpecHash != "sha256:0f3c" ||
		info.Count != 1 || !info.ScalingDefaulted || info.Scaling.Max != 10 || info.Timeout != spec.DefaultTimeout || info.JobModifyIndex != 11 {
		t.Errorf("info = %+v", info)
	}
}

// TestSidecarEnvParses checks the sidecar's environment against the
// sidecar's own parser once Nomad has filled in the ports.
func TestSidecarEnvParses(t *testing.T) {
	for _, c := range goldenCases() {
		rev, job := compileCase(t, c)
		proxy := taskByName(t, job.TaskGroups[0], spec.SidecarTaskName)
		nomad := strings.NewReplacer("${NOMAD_PORT_http}", "21000", "${NOMAD_PORT_app}", "21001", "${NOMAD_HOST_PORT_app}", "21001",
			"${NOMAD_IP_app}", "10.0.0.7", "${NOMAD_PORT_admin}", "21002", "${NOMAD_ALLOC_ID}", "7aeda235")
		env := map[string]string{}
		for k, v := range proxy.Env {
			env[k] = nomad.Replace(v)
		}
		cfg, err := spec.ParseSidecarEnv(func(k string) string { return env[k] })
		if err != nil {
			t.Errorf("%s: sidecar env does not parse: %v", c.name, err)
			continue
		}
		want := spec.SidecarConfigForRevision(rev)
		want.Port, want.AdminPort, want.Instance = 21000, 21002, "7aeda235"
		want.AppPort = 21001
		if rev.Template.Network.Mode == spec.NetworkBridge {
			want.AppPort = rev.Template.Task.Port
		}
		if proxy.Env[spec.EnvSidecarAppHost] != "" {
			want.AppHost = "10.0.0.7"
		}
		if !reflect.DeepEqual(cfg, want) {
			t.Errorf("%s: sidecar config\n%+v\nwant\n%+v", c.name, cfg, want)
		}
		user := taskByName(t, job.TaskGroups[0], spec.UserTaskName)
		if user.Env[spec.EnvKService] != rev.Service || user.Env[spec.EnvRevision] != rev.Name() || user.Env[spec.EnvConfiguration] != rev.Service {
			t.Errorf("%s: user env %v", c.name, user.Env)
		}
		for k, v := range rev.Template.Task.Env {
			if user.Env[k] != v {
				t.Errorf("%s: user env %s = %q, want %q", c.name, k, user.Env[k], v)
			}
		}
	}
}

func TestSidecarDelivery(t *testing.T) {
	base := dockerWebApp()
	for _, c := range []struct {
		name   string
		opts   SidecarOptions
		driver string
		check  func(t *testing.T, task *api.Task)
	}{
		{"docker image", SidecarOptions{Image: "example/ns:1"}, "docker", func(t *testing.T, task *api.Task) {
			if task.Config["image"] != "example/ns:1" || task.Config["network_mode"] != "host" {
				t.Errorf("config = %v", task.Config)
			}
		}},
		{"raw_exec path", SidecarOptions{Command: "/home/me/bin/nomad-serverless"}, "raw_exec", func(t *testing.T, task *api.Task) {
			if task.Config["command"] != "/home/me/bin/nomad-serverless" {
				t.Errorf("config = %v", task.Config)
			}
		}},
		{"artifact", SidecarOptions{ArtifactURL: "https://x/ns.tgz", ArtifactDriver: "raw_exec"}, "raw_exec", func(t *testing.T, task *api.Task) {
			if len(task.Artifacts) != 1 || *task.Artifacts[0].GetterSource != "https://x/ns.tgz" || task.Config["command"] != DefaultArtifactCommand {
				t.Errorf("artifacts %+v config %v", task.Artifacts, task.Config)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, job := mustCompile(t, base, 1, Options{Sidecar: c.opts})
			task := taskByName(t, job.TaskGroups[0], spec.SidecarTaskName)
			if task.Driver != c.driver {
				t.Errorf("driver = %q, want %q", task.Driver, c.driver)
			}
			if args, _ := task.Config["args"].([]string); !slices.Equal(args, []string{"sidecar"}) {
				t.Errorf("args = %v, want [sidecar]", task.Config["args"])
			}
			if *task.Resources.CPU != DefaultSidecarCPU || *task.Resources.MemoryMB != DefaultSidecarMemoryMB {
				t.Errorf("resources = %d/%d", *task.Resources.CPU, *task.Resources.MemoryMB)
			}
			c.check(t, task)
		})
	}
}

func TestOptionsErrors(t *testing.T) {
	svc := dockerWebApp()
	rev := spec.NewRevision(&svc, 1)
	for _, c := range []struct {
		opts Options
		want string
	}{
		{Options{}, "exactly one of Image"},
		{Options{Sidecar: SidecarOptions{Image: "a", Command: "/b"}}, "exactly one of Image"},
		{Options{Sidecar: SidecarOptions{ArtifactURL: "https://x", ArtifactDriver: "docker"}}, "artifact driver"},
		{Options{Sidecar: SidecarOptions{Command: "/b", MemoryMB: 4}}, "10 MiB"},
	} {
		if _, err := Compile(rev, c.opts); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Compile with %+v: err = %v, want %q", c.opts, err, c.want)
		}
	}
	nan := rev
	nan.Scaling.Target = math.NaN()
	if _, err := Compile(nan, testOptions()); err == nil || !strings.Contains(err.Error(), "scaling settings") {
		t.Errorf("NaN target: err = %v", err)
	}
	bad := rev
	bad.Generation = 0
	if _, err := Compile(bad, testOptions()); err == nil || !strings.Contains(err.Error(), "generation 0") {
		t.Errorf("generation 0: err = %v", err)
	}
}

func TestCompileIsPureAndDoesNotAlias(t *testing.T) {
	svc := rawExecBinary()
	svc.Template.Task.Env = map[string]string{"A": "1"}
	rev := spec.NewRevision(&svc, 1)
	a, err := Compile(rev, testOptions())
	if err != nil {
		t.Fatal(err)
	}
	b, _ := Compile(rev, testOptions())
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	if string(ja) != string(jb) {
		t.Error("two compiles of one revision differ")
	}
	// Through run-task (writeOwnLogs) the app's args are a new slice:
	// change every element of whatever the job holds.
	user := a.TaskGroups[0].Tasks[0]
	switch args := user.Config["args"].(type) {
	case []any:
		for i := range args {
			args[i] = "changed"
		}
	case []string:
		for i := range args {
			args[i] = "changed"
		}
	}
	user.Env["NEW"] = "x"
	if rev.Template.Task.Config["args"].([]any)[0] != "serve" || rev.Template.Task.Env != nil && rev.Template.Task.Env["NEW"] != "" {
		t.Error("the compiled job aliases the revision's template")
	}
	if rev.SpecHash != svc.Template.Hash() {
		t.Error("compiling changed the template")
	}
}

// TestShapeMatchesRecordedRegister compares the compiled job with the job
// Nomad 1.6 accepted in fixture 002 on every field both set.
func TestShapeMatchesRecordedRegister(t *testing.T) {
	ex := fixtures.Load(t, "nomad-1.6/002-job-register.json")
	var body struct{ Job api.Job }
	if err := json.Unmarshal(ex.Request.BodyBytes(), &body); err != nil {
		t.Fatal(err)
	}
	rec := body.Job
	s := spec.NewService("hello")
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "/usr/bin/python3"}
	s.Scaling.Max = 10
	_, job := mustCompile(t, s, 1, testOptions())
	g, rg := job.TaskGroups[0], rec.TaskGroups[0]
	if *job.ID != *rec.ID || *job.Type != *rec.Type || *job.Update.MaxParallel != *rec.Update.MaxParallel || *g.Name != *rg.Name || *g.Count != *rg.Count {
		t.Errorf("job identity differs from the recorded one")
	}
	if *g.Scaling.Min != *rg.Scaling.Min || *g.Scaling.Max != *rg.Scaling.Max || *g.Scaling.Enabled != *rg.Scaling.Enabled {
		t.Errorf("scaling block %+v, recorded %+v", g.Scaling, rg.Scaling)
	}
	if !slices.Equal(portLabels(g.Networks[0]), portLabels(rg.Networks[0])) || g.Networks[0].Mode != rg.Networks[0].Mode {
		t.Errorf("ports differ from the recorded job")
	}
	sv, rsv := g.Services[0], rg.Services[0]
	if sv.Name != rsv.Name || sv.PortLabel != rsv.PortLabel || sv.Provider != rsv.Provider || !slices.Equal(sv.Tags, rsv.Tags) {
		t.Errorf("service %+v, recorded %+v", sv, rsv)
	}
	c, rc := sv.Checks[0], rsv.Checks[0]
	if c.Name != rc.Name || c.Type != rc.Type || c.Path != rc.Path || c.PortLabel != rc.PortLabel || c.Interval != rc.Interval || !reflect.DeepEqual(c.Header, rc.Header) {
		t.Errorf("check %+v, recorded %+v", c, rc)
	}
	// The queue-proxy was a prestart sidecar when this was recorded; it
	// is a main task now, started with the app (sidecarLifecycle), which
	// e2e checks on the real agents.
	for i, task := range g.Tasks {
		rt := rg.Tasks[i]
		if task.Name != rt.Name || task.Name == spec.UserTaskName && !reflect.DeepEqual(task.Lifecycle, rt.Lifecycle) {
			t.Errorf("task %d: %s %+v, recorded %s %+v", i, task.Name, task.Lifecycle, rt.Name, rt.Lifecycle)
		}
	}
	for k, v := range rec.Meta {
		if k != spec.JobMetaSpecHash && job.Meta[k] != v {
			t.Errorf("meta %s = %q, recorded %q", k, job.Meta[k], v)
		}
	}
}

// The sidecar runs with one P per 1,000 MHz of its reservation, at least
// one, whatever the node's core count.
func TestSidecarProcs(t *testing.T) {
	for _, c := range []struct{ mhz, want int }{{1, 1}, {DefaultSidecarCPU, 1}, {1000, 1}, {1001, 2}, {2500, 3}} {
		if got := SidecarProcs(c.mhz); got != c.want {
			t.Errorf("SidecarProcs(%d) = %d, want %d", c.mhz, got, c.want)
		}
	}
	for _, c := range []struct {
		mhz  int
		want string
	}{{0, "1"}, {1500, "2"}} { // 0: DefaultSidecarCPU
		opts := testOptions()
		opts.Sidecar.CPU = c.mhz
		_, job := mustCompile(t, probesAndBounds(), 1, opts)
		if got := taskByName(t, job.TaskGroups[0], spec.SidecarTaskName).Env["GOMAXPROCS"]; got != c.want {
			t.Errorf("sidecar GOMAXPROCS with cpu = %d: %q, want %s", c.mhz, got, c.want)
		}
	}
}

// An app that declares h2c has its sidecar told so; one that does not
// leaves the variable out (HTTP/1.1).
func TestContractAppProtocol(t *testing.T) {
	svc := dockerWebApp()
	svc.Template.Task.Protocol = spec.ProtocolH2C
	_, job := mustCompile(t, svc, 1, testOptions())
	proxy := taskByName(t, job.TaskGroups[0], spec.SidecarTaskName)
	if got := proxy.Env[spec.EnvSidecarAppProtocol]; got != spec.ProtocolH2C {
		t.Errorf("%s = %q, want h2c", spec.EnvSidecarAppProtocol, got)
	}
	_, job = mustCompile(t, dockerWebApp(), 1, testOptions())
	proxy = taskByName(t, job.TaskGroups[0], spec.SidecarTaskName)
	if got, set := proxy.Env[spec.EnvSidecarAppProtocol]; set {
		t.Errorf("an HTTP/1.1 app's sidecar has %s = %q", spec.EnvSidecarAppProtocol, got)
	}
}
