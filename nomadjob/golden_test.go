package nomadjob

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

var update = flag.Bool("update", false, "rewrite testdata/golden from the current output")

// testOptions are the options of the golden cases: a raw_exec sidecar at a
// fixed path so the output does not depend on the machine.
func testOptions() Options {
	return Options{Sidecar: SidecarOptions{Command: "/usr/local/bin/nomad-serverless"}}
}

// goldenCase is a revision built in Go, compiled with opts.
type goldenCase struct {
	name string
	svc  func() spec.Service
	gen  int
	opts Options
}

func dockerWebApp() spec.Service {
	s := spec.NewService("hello")
	s.Template.Task.Driver = "docker"
	s.Template.Task.Config = map[string]any{"image": "ghcr.io/example/hello:1.2.3", "args": []any{"--greeting", "hi"}}
	s.Template.Task.Env = map[string]string{"GREETING": "hello", "LOG_LEVEL": "info"}
	return s
}

func rawExecBinary() spec.Service {
	s := spec.NewService("report")
	s.Namespace = "tools"
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "/opt/report/bin/report", "args": []any{"serve", "--port", "${NOMAD_PORT_app}"}}
	s.Template.Task.Resources = spec.Resources{CPU: 250, MemoryMB: 256}
	s.Template.Task.KillTimeout = 10 * time.Second
	s.Template.Task.User = "nobody"
	s.Template.Task.Artifacts = []spec.Artifact{{Source: "https://example.com/report.tar.gz", Destination: "local/report", Options: map[string]string{"checksum": "sha256:abc123"}}}
	s.Template.Task.Templates = []spec.TaskTemplate{{Data: "DB_URL={{ key \"report/db\" }}\n", Destination: "secrets/db.env", Env: true, ChangeMode: "restart"}}
	return s
}

func probesAndBounds() spec.Service {
	s := spec.NewService("api")
	s.Template.Task.Driver = "docker"
	s.Template.Task.Config = map[string]any{"image": "example/api:7"}
	ready := spec.DefaultProbe(spec.ProbeHTTP)
	ready.Path = "/ready"
	ready.Headers = map[string]string{"X-Probe": "ready"}
	s.Template.Readiness = &ready
	live := spec.DefaultProbe(spec.ProbeHTTP)
	live.Path = "/healthz"
	live.Period = 5 * time.Second
	live.Timeout = 2 * time.Second
	live.InitialDelay = 3 * time.Second
	live.FailureThreshold = 4
	s.Template.Liveness = &live
	s.Template.Concurrency = 10
	s.Template.Timeout = 30 * time.Second
	s.Template.ResponseStartTimeout = 10 * time.Second
	s.Template.IdleTimeout = 5 * time.Second
	s.Scaling.Min, s.Scaling.Max, s.Scaling.Initial = 1, 5, 2
	s.Scaling.Metric, s.Scaling.Target = spec.MetricRPS, 50
	s.Scaling.ScaleDownDelay = 30 * time.Second
	s.Scaling.BurstCapacity = spec.Unlimited
	return s
}

func bridgeConnect() spec.Service {
	s := spec.NewService("orders")
	s.Template.Task.Driver = "docker"
	s.Template.Task.Config = map[string]any{"image": "example/orders:2"}
	s.Template.Task.Port = 9090
	s.Template.Network.Mode = spec.NetworkBridge
	s.Template.Connect = &spec.Connect{Upstreams: []spec.Upstream{{Destination: "postgres", LocalBindPort: 5432}, {Destination: "payments", LocalBindPort: 8081}}}
	return s
}

func traefikTags() spec.Service {
	s := spec.NewService("shop")
	s.Template.Task.Driver = "docker"
	s.Template.Task.Config = map[string]any{"image": "example/shop:1", "network_mode": "bridge", "ports": []any{"app"}}
	s.Template.Region = "eu"
	s.Template.Datacenters = []string{"eu-west-1a", "eu-west-1b"}
	s.Template.NodePool = "web"
	s.Template.Constraints = []spec.Constraint{{Attribute: "${attr.kernel.name}", Value: "linux"}, {Attribute: "${meta.tier}", Operator: "=", Value: "frontend"}}
	s.Template.Tags = []string{"traefik.enable=true", "traefik.http.routers.shop.rule=Host(`shop.example.com`)"}
	s.Template.Meta = map[string]string{"team": "web", "owner": "shop-team"}
	return s
}

// realApp is an API with an init step, an agent beside it, a log shipper
// once it runs, clean-up after it, a host volume, a per-instance CSI volume
// and a scratch disk.
func realApp() spec.Service {
	s := spec.NewService("ledger")
	t := &s.Template
	t.Task.Driver = "exec"
	t.Task.Config = map[string]any{"command": "/opt/ledger/bin/ledger"}
	t.Task.VolumeMounts = []spec.VolumeMount{{Volume: "config", Destination: "/etc/ledger", ReadOnly: true}, {Volume: "db", Destination: "/var/lib/ledger"}}
	res := spec.Resources{CPU: 50, MemoryMB: 64}
	t.SideTasks = []spec.SideTask{
		{Name: "migrate", Driver: "exec", Config: map[string]any{"command": "/opt/ledger/bin/ledger", "args": []any{"migrate", "up"}},
			Resources: res, KillTimeout: spec.DefaultSideKillTimeout, Lifecycle: &spec.Lifecycle{Hook: spec.HookPrestart},
			VolumeMounts: []spec.VolumeMount{{Volume: "db", Destination: "/var/lib/ledger"}}},
		{Name: "vault-agent", Driver: "docker", Config: map[string]any{"image": "hashicorp/vault:1.15", "args": []any{"agent", "-config=/local/agent.hcl"}},
			Env: map[string]string{"VAULT_ADDR": "https://vault.service.consul:8200"}, Resources: res, KillTimeout: spec.DefaultSideKillTimeout,
			Lifecycle: &spec.Lifecycle{Hook: spec.HookPrestart, Sidecar: true},
			Templates: []spec.TaskTemplate{{Data: "auto_auth {}\n", Destination: "local/agent.hcl"}}},
		{Name: "ship-logs", Driver: "docker", Config: map[string]any{"image": "fluent/fluent-bit:3"}, Resources: res,
			KillTimeout: 10 * time.Second, Lifecycle: &spec.Lifecycle{Hook: spec.HookPoststart, Sidecar: true}},
		{Name: "cleanup", Driver: "exec", Config: map[string]any{"command": "/bin/rm", "args": []any{"-rf", "/alloc/data/tmp"}},
			Resources: res, KillTimeout: spec.DefaultSideKillTimeout, Lifecycle: &spec.Lifecycle{Hook: spec.HookPoststop}},
	}
	t.Volumes = []spec.Volume{
		{Name: "config", Type: spec.VolumeHost, Source: "ledger-config", ReadOnly: true},
		{Name: "db", Type: spec.VolumeCSI, Source: "ledger-db", AccessMode: spec.AccessSingleNodeWriter, AttachmentMode: spec.AttachFileSystem, PerAlloc: true},
	}
	t.EphemeralDisk = &spec.EphemeralDisk{SizeMB: 1024, Sticky: true, Migrate: true}
	s.Scaling.Max = 4
	return s
}

func goldenCases() []goldenCase {
	return []goldenCase{
		{name: "docker-web-app", svc: dockerWebApp, gen: 1, opts: testOptions()},
		{name: "raw-exec-binary", svc: rawExecBinary, gen: 12, opts: Options{
			Sidecar:       SidecarOptions{ArtifactURL: "https://releases.example.com/nomad-serverless_linux_amd64.tar.gz", CPU: 100, MemoryMB: 48},
			CheckInterval: 2 * time.Second,
		}},
		{name: "probes-and-bounds", svc: probesAndBounds, gen: 3, opts: testOptions()},
		{name: "bridge-connect", svc: bridgeConnect, gen: 1, opts: Options{Sidecar: SidecarOptions{Image: "ghcr.io/nomad-serverless/nomad-serverless:0.1.0"}}},
		{name: "traefik-tags", svc: traefikTags, gen: 2, opts: Options{Sidecar: SidecarOptions{Command: "/usr/local/bin/nomad-serverless"}, ShutdownDelay: 10 * time.Second, UnboundedMax: 50}},
		{name: "host-network", svc: hostNetworkService, gen: 1, opts: testOptions()},
		{name: "real-app", svc: realApp, gen: 1, opts: testOptions()},
	}
}

// compileCase validates the case's service (a golden case must be a valid
// service) and compiles its revision.
func compileCase(t *testing.T, c goldenCase) (spec.Revision, *api.Job) {
	t.Helper()
	svc := c.svc()
	if ps := svc.Validate(); len(ps) > 0 {
		t.Fatalf("case %s is not a valid service: %v", c.name, ps)
	}
	rev := spec.NewRevision(&svc, c.gen)
	job, err := Compile(rev, c.opts)
	if err != nil {
		t.Fatalf("Compile(%s): %v", c.name, err)
	}
	return rev, job
}

func TestGolden(t *testing.T) {
	for _, c := range goldenCases() {
		t.Run(c.name, func(t *testing.T) {
			_, job := compileCase(t, c)
			checkGoldenJob(t, filepath.Join("testdata", "golden", c.name), job)
		})
	}
}

// checkGoldenJob compares a job's indented JSON with <base>.json and its
// HCL with <base>.hcl, or rewrites both with -update.
func checkGoldenJob(t *testing.T, base string, job *api.Job) {
	t.Helper()
	js, err := json.MarshalIndent(job, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	js = append(js, '\n')
	h, _ := mustFormatHCL(t, job)
	checkGolden(t, base+".json", js)
	checkGolden(t, base+".hcl", h)
}

func checkGolden(t *testing.T, path string, got []byte) {
	t.Helper()
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./nomadjob -update to write it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the compiled output (- golden, + got; go test ./nomadjob -update rewrites it):\n%s",
			path, lineDiff(string(want), string(got)))
	}
}

// assertValidHCL parses FormatHCL's output and returns its body.
func assertValidHCL(t *testing.T, src []byte) *hclsyntax.Body {
	t.Helper()
	f, diags := hclsyntax.ParseConfig(src, "job.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("FormatHCL wrote invalid HCL: %v\n%s", diags, src)
	}
	return f.Body.(*hclsyntax.Body)
}

// lineDiff is a unified-style diff of two texts' lines (longest common
// subsequence), with 3 lines of context around each change.
func lineDiff(a, b string) string {
	x, y := strings.Split(a, "\n"), strings.Split(b, "\n")
	n, m := len(x), len(y)
	lcs := make([][]int, n+1)
	for i := range lcs {
		lcs[i] = make([]int, m+1)
	}
	for i := n - 1; i >= 0; i-- {
		for j := m - 1; j >= 0; j-- {
			if x[i] == y[j] {
				lcs[i][j] = lcs[i+1][j+1] + 1
			} else {
				lcs[i][j] = max(lcs[i+1][j], lcs[i][j+1])
			}
		}
	}
	type line struct {
		op   byte
		text string
		at   int // line number in a (or b for additions), 1-based
	}
	var ops []line
	i, j := 0, 0
	for i < n || j < m {
		switch {
		case i < n && j < m && x[i] == y[j]:
			ops = append(ops, line{' ', x[i], i + 1})
			i++
			j++
		case i < n && (j == m || lcs[i+1][j] >= lcs[i][j+1]):
			ops = append(ops, line{'-', x[i], i + 1})
			i++
		default:
			ops = append(ops, line{'+', y[j], j + 1})
			j++
		}
	}
	const context = 3
	show := make([]bool, len(ops))
	for k, l := range ops {
		if l.op == ' ' {
			continue
		}
		for c := max(0, k-context); c <= min(len(ops)-1, k+context); c++ {
			show[c] = true
		}
	}
	var sb strings.Builder
	prev := -1
	for k, l := range ops {
		if !show[k] {
			continue
		}
		if k != prev+1 || prev < 0 {
			fmt.Fprintf(&sb, "@@ line %d @@\n", l.at)
		}
		fmt.Fprintf(&sb, "%c %s\n", l.op, l.text)
		prev = k
	}
	return sb.String()
}

func TestLineDiff(t *testing.T) {
	a := "0\n1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n11\n12\n13"
	b := "0\n1\n2\n3\n4\nfive\n6\n7\n8\n9\n10\n11\n12\n13\n14"
	got := lineDiff(a, b)
	for _, want := range []string{"- 5\n", "+ five\n", "+ 14\n", "  4\n", "  6\n", "  8\n", "  11\n"} {
		if !strings.Contains(got, want) {
			t.Errorf("diff lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "  1\n") || strings.Contains(got, "  9\n") {
		t.Errorf("diff shows more than 3 lines of context:\n%s", got)
	}
	if lineDiff("x\ny", "x\ny") != "" {
		t.Error("diff of equal texts is not empty")
	}
}
