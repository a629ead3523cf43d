package hcl

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	hcl2 "github.com/hashicorp/hcl/v2"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

func mustParse(t *testing.T, src string, opts Options) *File {
	t.Helper()
	f, diags := Parse("svc.hcl", []byte(src), opts)
	if len(diags) > 0 {
		t.Fatalf("unexpected diagnostics:%s", dump(diags))
	}
	return f
}

func TestExamplesValidate(t *testing.T) {
	paths, err := filepath.Glob("../examples/*.hcl")
	if err != nil || len(paths) < 4 {
		t.Fatalf("examples: %v %v", paths, err)
	}
	for _, p := range paths {
		t.Run(filepath.Base(p), func(t *testing.T) {
			src, err := os.ReadFile(p)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.HasPrefix(src, []byte("# ")) {
				t.Errorf("%s does not start with a comment saying what it shows", p)
			}
			f, diags := ParseFile(p, Options{})
			if len(diags) > 0 {
				t.Fatalf("diagnostics:%s", dump(diags))
			}
			if len(f.Services) == 0 {
				t.Fatal("no services")
			}
			for _, s := range f.Services {
				if ps := s.Validate(); len(ps) > 0 {
					t.Errorf("service %s: %v", s.Name, ps)
				}
				if h := s.Template.Hash(); !strings.HasPrefix(h, "sha256:") {
					t.Errorf("hash %q", h)
				}
			}
		})
	}
}

func TestExampleContents(t *testing.T) {
	parse := func(name string, opts Options) []spec.Service {
		t.Helper()
		f, diags := ParseFile(filepath.Join("../examples", name), opts)
		if diags.HasErrors() {
			t.Fatalf("%s:%s", name, dump(diags))
		}
		return f.Services
	}

	hello := parse("hello.hcl", Options{})[0]
	wantTraffic := []spec.TrafficTarget{
		{Revision: "hello-00001", Percent: 90, Tag: "stable"},
		{Latest: true, Percent: 10, Tag: "canary"},
	}
	if !reflect.DeepEqual(hello.Traffic, wantTraffic) {
		t.Errorf("hello traffic = %+v", hello.Traffic)
	}
	if len(hello.Domains) == 0 || hello.Template.Task.Driver != "docker" || hello.Template.Task.Config["image"] == "" {
		t.Errorf("hello = %+v", hello)
	}
	// Variables move the split.
	hello = parse("hello.hcl", Options{Vars: map[string]string{"canary_percent": "50"}})[0]
	if hello.Traffic[0].Percent != 50 || hello.Traffic[1].Percent != 50 {
		t.Errorf("canary_percent=50: %+v", hello.Traffic)
	}

	raw := parse("raw-exec.hcl", Options{})[0]
	task := raw.Template.Task
	if task.Driver != "raw_exec" || task.Config["command"] != "nomad-serverless" ||
		!reflect.DeepEqual(task.Config["args"], []any{"testapp"}) || raw.Template.Concurrency != 10 {
		t.Errorf("raw-exec task = %+v, concurrency %d", task, raw.Template.Concurrency)
	}
	if raw.Scaling.Window > 10*time.Second || raw.Scaling.ScaleToZeroGrace > 10*time.Second {
		t.Errorf("raw-exec scaling is not fast: %+v", raw.Scaling)
	}
	raw = parse("raw-exec.hcl", Options{Vars: map[string]string{"binary": "/opt/bin/nomad-serverless"}})[0]
	if raw.Template.Task.Config["command"] != "/opt/bin/nomad-serverless" {
		t.Errorf("-var binary: command = %v", raw.Template.Task.Config["command"])
	}

	probes := parse("probes.hcl", Options{})
	api := probes[0]
	if r := api.Template.Readiness; r == nil || r.Type != spec.ProbeHTTP || r.Period != 0 || r.Path != "/ready" || r.Headers["X-Probe"] != "readiness" {
		t.Errorf("api readiness = %+v", r)
	}
	if l := api.Template.Liveness; l == nil || l.Period != 10*time.Second || l.InitialDelay != 10*time.Second {
		t.Errorf("api liveness = %+v", l)
	}
	if s := api.Scaling; s.Min != 1 || s.Max != 20 || s.Initial != 2 || s.Metric != spec.MetricRPS || s.Target != 150 || s.Window != 30*time.Second {
		t.Errorf("api scaling = %+v", s)
	}
	worker := probes[1]
	if worker.Template.Readiness.Type != spec.ProbeTCP || worker.Template.Liveness.Type != spec.ProbeExec ||
		!reflect.DeepEqual(worker.Template.Liveness.Command, []string{"/bin/worker", "health"}) {
		t.Errorf("worker probes = %+v %+v", worker.Template.Readiness, worker.Template.Liveness)
	}

	whoami := parse("traefik.hcl", Options{})[0]
	tags := strings.Join(whoami.Template.Tags, " ")
	if !strings.Contains(tags, "traefik.enable=true") || !strings.Contains(tags, "traefik.http.routers.whoami.rule=Host(`whoami.example.com`)") {
		t.Errorf("traefik tags = %v", whoami.Template.Tags)
	}
}

// A service that sets only image is spec.NewService with a docker task.
func TestDefaults(t *testing.T) {
	f := mustParse(t, "service \"hello\" {\n  image = \"nginx:1.27\"\n}\n", Options{})
	want := spec.NewService("hello")
	want.Template.Task.Driver = "docker"
	want.Template.Task.Config = map[string]any{"image": "nginx:1.27"}
	if !reflect.DeepEqual(f.Services, []spec.Service{want}) {
		t.Errorf("got  %+v\nwant %+v", f.Services[0], want)
	}
}

func TestEverySetting(t *testing.T) {
	src := `
service "full" {
  namespace   = "team-a"
  region      = "eu"
  datacenters = ["dc1", "dc2"]
  node_pool   = "gpu"
  constraint {
    attribute = "${attr.kernel.name}"
    operator  = "="
    value     = "linux"
  }
  task {
    driver = "exec"
    config {
      command = "/bin/app"
      args    = ["--port", "${NOMAD_PORT_app}", "${meta["rack"]}"]
      ratio   = 1.5
      count   = 3
      debug   = true
      labels  = { a = "b" }
      mount {
        type = "bind"
      }
      mount {
        type = "volume"
      }
      logging "syslog" {
        tag = "x"
      }
    }
    env = {
      LOG_LEVEL = "debug"
      WORKERS   = 4
    }
    resources {
      cpu    = 500
      memory = 256
    }
    port         = 9090
    user         = "nobody"
    kill_timeout = "10s"
    artifact {
      source      = "https://example.com/app.tgz"
      destination = "local/app"
      mode        = "any"
      options     = { checksum = "sha256:abc" }
    }
    template {
      data        = "X={{ key \"x\" }}"
      destination = "local/x.env"
      change_mode = "restart"
      env         = true
    }
  }
  readiness {
    grpc {
      service = "health"
    }
    port              = 9091
    initial_delay     = "1s"
    period            = "2s"
    timeout           = "500ms"
    success_threshold = 2
    failure_threshold = 5
  }
  liveness {
    exec {
      command = ["/bin/check"]
    }
  }
  concurrency            = 7
  timeout                = "60s"
  response_start_timeout = "5s"
  idle_timeout           = "30s"
  scaling {
    min                        = 1
    max                        = 9
    initial                    = 2
    target                     = 42
    metric                     = "concurrency"
    utilization                = 80
    window                     = "2m"
    panic_window_percentage    = 5
    panic_threshold_percentage = 300
    scale_to_zero_grace        = "1m"
    scale_down_delay           = "15m"
    burst_capacity             = -1
    activation_scale           = 2
    max_scale_up_rate          = 10
    max_scale_down_rate        = 4
  }
  traffic {
    latest  = true
    percent = 100
    tag     = "current"
  }
  network {
    mode = "bridge"
  }
  connect {
    upstream {
      destination     = "db"
      local_bind_port = 5432
    }
  }
  tags    = ["a", "b"]
  meta    = { "team" = "x", "cost-center" = "42" }
  domains = ["full.example.com"]
  https {
    redirect = true
  }
}
`
	f := mustParse(t, src, Options{})
	want := spec.NewService("full")
	want.Namespace = "team-a"
	tp := &want.Template
	tp.Region, tp.Datacenters, tp.NodePool = "eu", []string{"dc1", "dc2"}, "gpu"
	tp.Constraints = []spec.Constraint{{Attribute: "${attr.kernel.name}", Operator: "=", Value: "linux"}}
	tp.Task = spec.Task{
		Driver: "exec",
		Config: map[string]any{
			"command": "/bin/app",
			"args":    []any{"--port", "${NOMAD_PORT_app}", `${meta["rack"]}`},
			"ratio":   1.5,
			"count":   int64(3),
			"debug":   true,
			"labels":  map[string]any{"a": "b"},
			"mount":   []any{map[string]any{"type": "bind"}, map[string]any{"type": "volume"}},
			"logging": []any{map[string]any{"syslog": map[string]any{"tag": "x"}}},
		},
		Env:         map[string]string{"LOG_LEVEL": "debug", "WORKERS": "4"},
		Resources:   spec.Resources{CPU: 500, MemoryMB: 256},
		Port:        9090,
		User:        "nobody",
		KillTimeout: 10 * time.Second,
		Artifacts:   []spec.Artifact{{Source: "https://example.com/app.tgz", Destination: "local/app", Mode: "any", Options: map[string]string{"checksum": "sha256:abc"}}},
		Templates:   []spec.TaskTemplate{{Data: `X={{ key "x" }}`, Destination: "local/x.env", ChangeMode: "restart", Env: true}},
	}
	tp.Readiness = &spec.Probe{Type: spec.ProbeGRPC, GRPCService: "health", Port: 9091, InitialDelay: time.Second, Period: 2 * time.Second,
		Timeout: 500 * time.Millisecond, SuccessThreshold: 2, FailureThreshold: 5}
	tp.Liveness = &spec.Probe{Type: spec.ProbeExec, Command: []string{"/bin/check"}, Period: spec.DefaultLivenessPeriod,
		Timeout: time.Second, SuccessThreshold: 1, FailureThreshold: 3}
	tp.Concurrency, tp.Timeout, tp.ResponseStartTimeout, tp.IdleTimeout = 7, time.Minute, 5*time.Second, 30*time.Second
	tp.Network = spec.Network{Mode: spec.NetworkBridge}
	tp.Connect = &spec.Connect{Upstreams: []spec.Upstream{{Destination: "db", LocalBindPort: 5432}}}
	tp.Tags = []string{"a", "b"}
	tp.Meta = map[string]string{"team": "x", "cost-center": "42"}
	want.Scaling = spec.Scaling{Min: 1, Max: 9, Initial: 2, Target: 42, Metric: spec.MetricConcurrency, Utilization: 80,
		Window: 2 * time.Minute, PanicWindowPercentage: 5, PanicThresholdPercentage: 300, ScaleToZeroGrace: time.Minute,
		ScaleDownDelay: 15 * time.Minute, BurstCapacity: spec.Unlimited, ActivationScale: 2, MaxScaleUpRate: 10, MaxScaleDownRate: 4}
	want.Traffic = []spec.TrafficTarget{{Latest: true, Percent: 100, Tag: "current"}}
	want.Domains = []string{"full.example.com"}
	want.HTTPS = spec.HTTPS{Redirect: true}
	if !reflect.DeepEqual(f.Services[0], want) {
		t.Errorf("got  %+v\nwant %+v", f.Services[0], want)
	}
	ds := f.Problems(0, []spec.Problem{{Path: "meta.cost-center", Summary: "s."}})
	if ds[0].Subject == nil || ds[0].Subject.Start.Line != 107 || ds[0].Subject.Start.Column != 29 {
		t.Errorf("meta.cost-center located at %v", ds[0].Subject)
	}
}

func TestScalingTargetFollowsMetric(t *testing.T) {
	for _, tc := range []struct {
		scaling string
		metric  spec.Metric
		target  float64
	}{
		{"", spec.MetricConcurrency, 100},
		{"metric = \"rps\"", spec.MetricRPS, spec.DefaultTarget(spec.MetricRPS)},
		{"metric = \"concurrency\"", spec.MetricConcurrency, 100},
		{"metric = \"rps\"\n    target = 30", spec.MetricRPS, 30},
		{"target = 30", spec.MetricConcurrency, 30},
		// null means "not set": the target still follows the metric.
		{"metric = \"rps\"\n    target = null", spec.MetricRPS, spec.DefaultTarget(spec.MetricRPS)},
	} {
		f := mustParse(t, docker("  scaling {\n    "+tc.scaling+"\n  }"), Options{})
		if s := f.Services[0].Scaling; s.Metric != tc.metric || s.Target != tc.target {
			t.Errorf("%q: metric %s target %g, want %s %g", tc.scaling, s.Metric, s.Target, tc.metric, tc.target)
		}
	}
}

func TestProbeDefaults(t *testing.T) {
	f := mustParse(t, docker("  readiness {\n    http {}\n  }\n  liveness {\n    http {}\n  }"), Options{})
	want := spec.DefaultProbe(spec.ProbeHTTP)
	if got := *f.Services[0].Template.Readiness; !reflect.DeepEqual(got, want) {
		t.Errorf("readiness = %+v, want %+v", got, want)
	}
	want.Period = spec.DefaultLivenessPeriod
	if got := *f.Services[0].Template.Liveness; !reflect.DeepEqual(got, want) {
		t.Errorf("liveness = %+v, want %+v", got, want)
	}
}

// null means "not set": the default stays. This lets a variable default to
// null to mean "leave it".
func TestNullKeepsDefault(t *testing.T) {
	src := "variable \"ns\" {\n  default = null\n}\n" + docker("  namespace = var.ns\n  concurrency = null")
	f := mustParse(t, src, Options{})
	if s := f.Services[0]; s.Namespace != spec.DefaultNamespace || s.Template.Concurrency != 0 {
		t.Errorf("null: %+v", s)
	}
	f = mustParse(t, src, Options{Vars: map[string]string{"ns": "prod"}})
	if f.Services[0].Namespace != "prod" {
		t.Errorf("-var ns=prod: namespace %q", f.Services[0].Namespace)
	}
}

func TestVariableSources(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	src := `
variable "image" {
  type    = string
  default = "nginx:default"
}
variable "replicas" {
  type    = number
  default = 1
}
variable "dcs" {
  type    = list(string)
  default = ["dc1"]
}
variable "labels" {
  type    = map(string)
  default = {}
}
variable "canary" {
  type    = bool
  default = false
}
locals {
  max = var.replicas * 2
}
service "hello" {
  image       = var.image
  datacenters = var.dcs
  meta        = var.labels
  scaling {
    min = var.replicas
    max = local.max
  }
  tags = var.canary ? ["canary"] : ["stable"]
}
`
	env := map[string]string{
		"NOMAD_SERVERLESS_VAR_image":    "nginx:env",
		"NOMAD_SERVERLESS_VAR_replicas": "2",
		"NOMAD_SERVERLESS_VAR_canary":   "true",
		"NOMAD_SERVERLESS_VAR_dcs":      `["env1", "env2"]`,
	}
	getenv := func(k string) string { return env[k] }
	file1 := write("one.hcl", "image = \"nginx:file1\"\nreplicas = 3\nlabels = { team = \"a\" }\n")
	file2 := write("two.hcl", "image = \"nginx:file2\"\n")

	type got struct {
		image    string
		min, max int
		dcs      []string
		labels   map[string]string
		tags     []string
	}
	read := func(opts Options) got {
		t.Helper()
		f, diags := Parse("svc.hcl", []byte(src), opts)
		if diags.HasErrors() {
			t.Fatalf("%+v:%s", opts, dump(diags))
		}
		s := f.Services[0]
		return got{s.Template.Task.Config["image"].(string), s.Scaling.Min, s.Scaling.Max, s.Template.Datacenters, s.Template.Meta, s.Template.Tags}
	}

	if g := read(Options{}); g.image != "nginx:default" || g.min != 1 || g.max != 2 || g.tags[0] != "stable" || len(g.labels) != 0 {
		t.Errorf("defaults: %+v", g)
	}
	if g := read(Options{Getenv: getenv}); g.image != "nginx:env" || g.min != 2 || g.max != 4 || g.tags[0] != "canary" ||
		!reflect.DeepEqual(g.dcs, []string{"env1", "env2"}) {
		t.Errorf("env: %+v", g)
	}
	// Files override the environment, later files override earlier ones.
	if g := read(Options{Getenv: getenv, VarFiles: []string{file1, file2}}); g.image != "nginx:file2" || g.min != 3 || g.labels["team"] != "a" {
		t.Errorf("var files: %+v", g)
	}
	// -var overrides everything; complex types are written in HCL syntax.
	g := read(Options{Getenv: getenv, VarFiles: []string{file1}, Vars: map[string]string{
		"image": "nginx:flag", "replicas": "5", "dcs": `["f1"]`, "labels": `{ team = "b", tier = "web" }`, "canary": "false",
	}})
	if g.image != "nginx:flag" || g.min != 5 || g.max != 10 || !reflect.DeepEqual(g.dcs, []string{"f1"}) ||
		!reflect.DeepEqual(g.labels, map[string]string{"team": "b", "tier": "web"}) || g.tags[0] != "stable" {
		t.Errorf("-var: %+v", g)
	}

	// Undeclared names are warnings (one -var may serve several files).
	_, diags := Parse("svc.hcl", []byte(src), Options{
		Vars:     map[string]string{"imgae": "x"},
		VarFiles: []string{write("three.hcl", "replica = 2\n")},
	})
	if diags.HasErrors() || len(diags) != 2 {
		t.Fatalf("undeclared: want two warnings:%s", dump(diags))
	}
	if d := findDiag(diags, hcl2.DiagWarning, "undeclared"); d == nil || !strings.Contains(dump(diags), `Did you mean "image"?`) ||
		!strings.Contains(dump(diags), `Did you mean "replicas"?`) {
		t.Errorf("undeclared warnings lack suggestions:%s", dump(diags))
	}
	for _, d := range diags {
		if strings.Contains(d.Detail, "replica") && (d.Subject == nil || d.Subject.Filename != filepath.Join(dir, "three.hcl") || d.Subject.Start.Line != 1) {
			t.Errorf("var-file warning not located in the var file: %v", d.Subject)
		}
	}

	// Errors in a var file point into it.
	bad := write("bad.hcl", "replicas = \"many\"\n")
	_, diags = Parse("svc.hcl", []byte(src), Options{VarFiles: []string{bad}})
	d := findDiag(diags, hcl2.DiagError, "Invalid value for variable")
	if d == nil || d.Subject == nil || d.Subject.Filename != bad || d.Subject.Start.Line != 1 || d.Subject.Start.Column != 12 {
		t.Errorf("bad var file:%s", dump(diags))
	}
	_, diags = Parse("svc.hcl", []byte(src), Options{VarFiles: []string{filepath.Join(dir, "missing.hcl")}})
	if !diags.HasErrors() || !strings.Contains(dump(diags), "missing.hcl") {
		t.Errorf("missing var file:%s", dump(diags))
	}
	blocky := write("blocky.hcl", "service \"x\" {\n}\n")
	_, diags = Parse("svc.hcl", []byte(src), Options{VarFiles: []string{blocky}})
	if !diags.HasErrors() {
		t.Errorf("var file with a block: no error")
	}
}

func TestSeveralServices(t *testing.T) {
	src := docker("") + "service \"two\" {\n  image = \"b\"\n  concurrency = 2\n}\nservice \"three\" {\n  image = \"c\"\n}\n"
	f := mustParse(t, src, Options{})
	var names []string
	for _, s := range f.Services {
		names = append(names, s.Name)
	}
	if !reflect.DeepEqual(names, []string{"hello", "two", "three"}) || f.Services[1].Template.Concurrency != 2 {
		t.Errorf("services = %v", names)
	}
	// Each service's problems point into its own block.
	if ds := f.Problems(1, []spec.Problem{{Path: "concurrency", Summary: "s."}}); ds[0].Subject.Start.Line != 7 {
		t.Errorf("concurrency of service two located at %v", ds[0].Subject)
	}
	if ds := f.Problems(2, []spec.Problem{{Path: "name", Summary: "s."}}); ds[0].Subject.Start.Line != 9 {
		t.Errorf("name of service three located at %v", ds[0].Subject)
	}
}

// One bad service makes the whole file fail, and its problems name it.
func TestOneBadServiceFailsTheFile(t *testing.T) {
	src := docker("") + "service \"bad\" {\n  image = \"b\"\n  scaling {\n    min = 3\n    max = 2\n  }\n}\nservice \"fine\" {\n  image = \"c\"\n}\n"
	f, diags := Parse("svc.hcl", []byte(src), Options{})
	if !diags.HasErrors() {
		t.Fatal("want errors")
	}
	errs := 0
	for _, d := range diags {
		if d.Severity == hcl2.DiagError {
			errs++
			if d.Subject == nil || d.Subject.Start.Line != 8 {
				t.Errorf("error outside service bad: %v", d.Subject)
			}
		}
	}
	if errs != 1 || len(f.Services) != 3 {
		t.Errorf("errors %d, services %d:%s", errs, len(f.Services), dump(diags))
	}
}

// A setting that failed to decode is not reported again by validation.
func TestNoEchoOfDecodeErrors(t *testing.T) {
	_, diags := Parse("svc.hcl", []byte("service \"hello\" {\n  task {\n    driverr = \"docker\"\n  }\n  traffic {\n    latest = true\n    percent = \"all\"\n  }\n}\n"), Options{})
	for _, unwanted := range []string{"no task to run", "add up to"} {
		if findDiag(diags, hcl2.DiagError, unwanted) != nil {
			t.Errorf("follow-on error %q reported:%s", unwanted, dump(diags))
		}
	}
	for _, wanted := range []string{"Unsupported argument", "Missing required argument", "Incorrect attribute value type"} {
		if findDiag(diags, hcl2.DiagError, wanted) == nil {
			t.Errorf("missing %q:%s", wanted, dump(diags))
		}
	}
}

func TestFunctionsAndLocals(t *testing.T) {
	src := `
variable "env" {
  default = "prod"
}
locals {
  name   = "api"
  labels = merge({ team = "a" }, { env = var.env })
  hosts  = [for h in ["a", "b"] : "${h}.example.com"]
}
service "hello" {
  image     = format("registry.example.com/%s:%s", local.name, "1.0")
  namespace = lower(upper(var.env))
  tags      = concat(["x"], split(",", "y,z"))
  meta      = merge(local.labels, { json = jsonencode({ a = 1 }), n = tostring(max(1, 5, 3)) })
  domains   = local.hosts
  task_env  = null
}
`
	_, diags := Parse("svc.hcl", []byte(src), Options{})
	if d := findDiag(diags, hcl2.DiagError, "Unsupported argument"); d == nil {
		t.Fatalf("task_env accepted:%s", dump(diags))
	}
	src = strings.Replace(src, "  task_env  = null\n", "", 1)
	f := mustParse(t, src, Options{})
	s := f.Services[0]
	if s.Template.Task.Config["image"] != "registry.example.com/api:1.0" || s.Namespace != "prod" ||
		!reflect.DeepEqual(s.Template.Tags, []string{"x", "y", "z"}) ||
		!reflect.DeepEqual(s.Template.Meta, map[string]string{"team": "a", "env": "prod", "json": `{"a":1}`, "n": "5"}) ||
		!reflect.DeepEqual(s.Domains, []string{"a.example.com", "b.example.com"}) {
		t.Errorf("service = %+v", s)
	}
}

// Two files that differ only in the order of map keys and attributes make
// the same revision.
func TestHashIndependentOfWritingOrder(t *testing.T) {
	a := mustParse(t, "service \"h\" {\n  task {\n    driver = \"docker\"\n    config {\n      image = \"x\"\n      args = [\"1\"]\n    }\n    env = { A = \"1\", B = \"2\" }\n  }\n  meta = { x = \"1\", y = \"2\" }\n}\n", Options{})
	b := mustParse(t, "service \"h\" {\n  meta = { y = \"2\", x = \"1\" }\n  task {\n    env {\n      B = \"2\"\n      A = \"1\"\n    }\n    config {\n      args = [\"1\"]\n      image = \"x\"\n    }\n    driver = \"docker\"\n  }\n}\n", Options{})
	if a.Services[0].Template.Hash() != b.Services[0].Template.Hash() {
		t.Errorf("hashes differ:\n%+v\n%+v", a.Services[0].Template, b.Services[0].Template)
	}
}

func TestWriteDiagnostics(t *testing.T) {
	src := docker("  scaling {\n    min = 5\n    max = 3\n  }")
	f, diags := Parse("svc.hcl", []byte(src), Options{})
	var buf bytes.Buffer
	if err := f.WriteDiagnostics(&buf, diags); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"Error: min 5 is greater than max 3", `on svc.hcl line 4, in service "hello":`, "4:     min = 5", "Lower min or raise max."} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "\x1b[") {
		t.Errorf("colour codes written to a buffer:\n%q", out)
	}
	// A File that failed to read, and a nil File, still write.
	f, diags = ParseFile(filepath.Join(t.TempDir(), "nope.hcl"), Options{})
	buf.Reset()
	if err := f.WriteDiagnostics(&buf, diags); err != nil || !strings.Contains(buf.String(), "Failed to read file") || !strings.Contains(buf.String(), "nope.hcl") {
		t.Errorf("missing file: %v %q", err, buf.String())
	}
	var nilFile *File
	buf.Reset()
	if err := nilFile.WriteDiagnostics(&buf, diags); err != nil || buf.Len() == 0 {
		t.Errorf("nil file: %v %q", err, buf.String())
	}
}

func TestDiagnosticsSortedByPosition(t *testing.T) {
	src := docker("  scaling {\n    min = 5\n    max = 3\n  }\n  timeout = \"x\"\n  »concurrency = -1")
	src = strings.Replace(src, "»", "", 1)
	_, diags := Parse("svc.hcl", []byte(src), Options{})
	if len(diags) != 3 {
		t.Fatalf("want 3 diagnostics:%s", dump(diags))
	}
	for i := 1; i < len(diags); i++ {
		if diags[i].Subject.Start.Byte < diags[i-1].Subject.Start.Byte {
			t.Errorf("not sorted:%s", dump(diags))
		}
	}
}
