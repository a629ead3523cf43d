package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// installRun runs `install args...` in process.
func installRun(t *testing.T, getenv map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return getenv[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = run(ctx, e, append([]string{"install"}, args...))
	return code, out.String(), errb.String()
}

// installDecodeJob reads the {"Job": ...} JSON install prints back into
// api.Job, as Nomad would.
func installDecodeJob(t *testing.T, text string) *api.Job {
	t.Helper()
	var wrapper struct{ Job *api.Job }
	dec := json.NewDecoder(strings.NewReader(text))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&wrapper); err != nil {
		t.Fatalf("install's JSON does not decode as a Nomad job: %v\n%s", err, text)
	}
	if wrapper.Job == nil {
		t.Fatalf("no Job in install's output:\n%s", text)
	}
	return wrapper.Job
}

// TestInstallGoldenFiles renders the defaults with -out and compares every
// file with the copies kept in deploy/ (UPDATE_GOLDEN=1 rewrites them).
func TestInstallGoldenFiles(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := installRun(t, nil, "-out", dir)
	if code != exitOK {
		t.Fatalf("install -out: exit %d\n%s", code, stderr)
	}
	written := strings.Fields(stdout)
	want := []string{
		filepath.Join(dir, "nomad-serverless.nomad.json"),
		filepath.Join(dir, "policies", "nomad-control-plane.policy.hcl"),
		filepath.Join(dir, "policies", "nomad-deploy.policy.hcl"),
		filepath.Join(dir, "policies", "consul-control-plane.policy.hcl"),
		filepath.Join(dir, "policies", "consul-deploy.policy.hcl"),
	}
	if !slices.Equal(written, want) {
		t.Fatalf("files written:\n%v\nwant\n%v", written, want)
	}
	golden := filepath.Join("..", "..", "deploy")
	for _, path := range want {
		rel, _ := filepath.Rel(dir, path)
		got, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		gpath := filepath.Join(golden, rel)
		if os.Getenv("UPDATE_GOLDEN") == "1" {
			if err := os.MkdirAll(filepath.Dir(gpath), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(gpath, got, 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		wantText, err := os.ReadFile(gpath)
		if err != nil {
			t.Fatalf("golden file missing (run with UPDATE_GOLDEN=1 to create): %v", err)
		}
		if !bytes.Equal(got, wantText) {
			t.Errorf("%s differs from %s (UPDATE_GOLDEN=1 to accept):\n--- got\n%s\n--- want\n%s", rel, gpath, got, wantText)
		}
	}
	// The job file is what stdout prints without -out.
	code, jobOut, _ := installRun(t, nil)
	if code != exitOK {
		t.Fatalf("install: exit %d", code)
	}
	if fileJob, _ := os.ReadFile(want[0]); string(fileJob) != jobOut {
		t.Errorf("install's stdout and its -out job file differ")
	}
	// deploy/ keeps the jobspec too, for `nomad job run` without -json.
	code, hclOut, stderr := installRun(t, nil, "-format", "hcl")
	if code != exitOK {
		t.Fatalf("install -format hcl: exit %d\n%s", code, stderr)
	}
	hclPath := filepath.Join(golden, "nomad-serverless.nomad.hcl")
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(hclPath, []byte(hclOut), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if b, err := os.ReadFile(hclPath); err != nil || string(b) != hclOut {
		t.Errorf("%s differs from install -format hcl (UPDATE_GOLDEN=1 to accept): %v\n--- got\n%s\n--- want\n%s", hclPath, err, hclOut, b)
	}
}

func TestInstallJobShape(t *testing.T) {
	code, stdout, stderr := installRun(t, nil,
		"-replicas", "3", "-domain", "apps.example.org", "-gateway-port", "80", "-admin-port", "9090",
		"-namespace", "platform", "-datacenters", "dc1, dc2", "-region", "eu")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	job := installDecodeJob(t, stdout)
	if *job.ID != "nomad-serverless" || *job.Type != "service" || *job.Namespace != "platform" || *job.Region != "eu" {
		t.Errorf("job ID/type/namespace/region = %s/%s/%s/%s", *job.ID, *job.Type, *job.Namespace, *job.Region)
	}
	if !slices.Equal(job.Datacenters, []string{"dc1", "dc2"}) {
		t.Errorf("datacenters = %v", job.Datacenters)
	}
	if len(job.TaskGroups) != 1 {
		t.Fatalf("want one group, got %d", len(job.TaskGroups))
	}
	g := job.TaskGroups[0]
	if *g.Count != 3 {
		t.Errorf("count = %d, want 3 (-replicas)", *g.Count)
	}
	if len(g.Spreads) != 1 || g.Spreads[0].Attribute != "${node.unique.id}" {
		t.Errorf("replicas are not spread over nodes: %+v", g.Spreads)
	}
	ports := map[string]int{}
	for _, p := range g.Networks[0].ReservedPorts {
		ports[p.Label] = p.Value
	}
	if ports["gateway"] != 80 || ports["admin"] != 9090 {
		t.Errorf("static ports = %v", ports)
	}
	if len(g.Services) != 1 {
		t.Fatalf("services = %d", len(g.Services))
	}
	svc := g.Services[0]
	if svc.Name != "nomad-serverless-gateway" || svc.PortLabel != "gateway" || len(svc.Checks) != 1 {
		t.Fatalf("service = %+v", svc)
	}
	if c := svc.Checks[0]; c.Type != "http" || c.Path != "/healthz" || c.PortLabel != "admin" || c.Interval <= 0 || c.Timeout <= 0 {
		t.Errorf("check = %+v, want http /healthz on the admin port", c)
	}
	if g.Update == nil || *g.Update.HealthCheck != "checks" || *g.Update.MaxParallel != 1 {
		t.Errorf("update = %+v, want one at a time by checks", g.Update)
	}
	task := g.Tasks[0]
	if task.Driver != "docker" || task.Config["image"] != installDefaultImage(version) || task.Config["network_mode"] != "host" {
		t.Errorf("task driver/config = %s %v", task.Driver, task.Config)
	}
	args := installTestStrings(task.Config["args"])
	if args[0] != "serve" || installTestFlag(args, "-domain") != "apps.example.org" ||
		installTestFlag(args, "-listen") != ":${NOMAD_PORT_gateway}" ||
		installTestFlag(args, "-admin-listen") != "${NOMAD_IP_admin}:${NOMAD_PORT_admin}" ||
		installTestFlag(args, "-replica") != "${NOMAD_ALLOC_ID}" {
		t.Errorf("serve args = %v", args)
	}
	if task.KillTimeout == nil || *task.KillTimeout < 30*time.Second {
		t.Errorf("kill_timeout %v leaves serve no time to drain", task.KillTimeout)
	}
}

func TestInstallAuthModes(t *testing.T) {
	for _, tc := range []struct {
		name            string
		args            []string
		nomadAddr       string
		identity        bool
		templateHas     []string
		templateMissing []string
	}{
		{
			name:            "identity and consul token from variable (defaults)",
			nomadAddr:       "unix://${NOMAD_SECRETS_DIR}/api.sock",
			identity:        true,
			templateHas:     []string{`nomadVar "nomad/jobs/nomad-serverless"`, "CONSUL_HTTP_TOKEN={{ .consul_token }}"},
			templateMissing: []string{"NOMAD_TOKEN"},
		},
		{
			name:        "both tokens from variable",
			args:        []string{"-nomad-auth", "variable", "-nomad-addr", "https://nomad.service.consul:4646", "-job", "ns-cp"},
			nomadAddr:   "https://nomad.service.consul:4646",
			templateHas: []string{`nomadVar "nomad/jobs/ns-cp"`, "NOMAD_TOKEN={{ .nomad_token }}", "CONSUL_HTTP_TOKEN={{ .consul_token }}"},
		},
		{
			name:      "no ACLs",
			args:      []string{"-nomad-auth", "none", "-nomad-addr", "http://${attr.unique.network.ip-address}:4646", "-consul-auth", "none"},
			nomadAddr: "http://${attr.unique.network.ip-address}:4646",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := installRun(t, nil, tc.args...)
			if code != exitOK {
				t.Fatalf("exit %d: %s", code, stderr)
			}
			task := installDecodeJob(t, stdout).TaskGroups[0].Tasks[0]
			if task.Env["NOMAD_ADDR"] != tc.nomadAddr {
				t.Errorf("NOMAD_ADDR = %q, want %q", task.Env["NOMAD_ADDR"], tc.nomadAddr)
			}
			if task.Env["CONSUL_HTTP_ADDR"] != "127.0.0.1:8500" {
				t.Errorf("CONSUL_HTTP_ADDR = %q", task.Env["CONSUL_HTTP_ADDR"])
			}
			if got := task.Identity != nil && task.Identity.Env; got != tc.identity {
				t.Errorf("workload identity in env = %v, want %v", got, tc.identity)
			}
			if len(tc.templateHas) == 0 {
				if len(task.Templates) != 0 {
					t.Errorf("no secrets wanted, got templates %+v", task.Templates)
				}
				return
			}
			if len(task.Templates) != 1 {
				t.Fatalf("templates = %d, want 1", len(task.Templates))
			}
			tmpl := task.Templates[0]
			if tmpl.Envvars == nil || !*tmpl.Envvars || !strings.HasPrefix(*tmpl.DestPath, "secrets/") {
				t.Errorf("tokens template must be env and under secrets/: %+v", tmpl)
			}
			for _, s := range tc.templateHas {
				if !strings.Contains(*tmpl.EmbeddedTmpl, s) {
					t.Errorf("template lacks %q:\n%s", s, *tmpl.EmbeddedTmpl)
				}
			}
			for _, s := range tc.templateMissing {
				if strings.Contains(*tmpl.EmbeddedTmpl, s) {
					t.Errorf("template has %q:\n%s", s, *tmpl.EmbeddedTmpl)
				}
			}
		})
	}
}

func TestInstallArtifact(t *testing.T) {
	url := "https://releases.example.com/nomad-serverless_linux_amd64.tar.gz"
	code, stdout, stderr := installRun(t, nil, "-artifact", url)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	task := installDecodeJob(t, stdout).TaskGroups[0].Tasks[0]
	if task.Driver != "exec" || len(task.Artifacts) != 1 || *task.Artifacts[0].GetterSource != url {
		t.Fatalf("driver %s artifacts %+v", task.Driver, task.Artifacts)
	}
	cmd, _ := task.Config["command"].(string)
	if !strings.HasPrefix(cmd, strings.TrimSuffix(*task.Artifacts[0].RelativeDest, "/")+"/") {
		t.Errorf("command %q is not inside the artifact's destination %q", cmd, *task.Artifacts[0].RelativeDest)
	}
	// The same archive serves revision sidecars (-sidecar-artifact), which
	// nomadjob runs from local/nomad-serverless.
	if cmd != nomadjob.DefaultArtifactCommand {
		t.Errorf("command %q differs from the sidecar's %q: one archive would not serve both", cmd, nomadjob.DefaultArtifactCommand)
	}
	if _, ok := task.Config["image"]; ok {
		t.Errorf("exec task has an image: %v", task.Config)
	}
}

func TestInstallRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-replicas", "0"}, "-replicas 0"},
		{[]string{"-gateway-port", "8081"}, "must differ"},
		{[]string{"-admin-port", "70000"}, "-admin-port 70000"},
		{[]string{"-domain", "Not A Domain"}, "-domain"},
		{[]string{"-image", "x", "-artifact", "y"}, "choose one"},
		{[]string{"-nomad-auth", "variable"}, "needs -nomad-addr"},
		{[]string{"-nomad-addr", "http://x:4646"}, "only used with"},
		{[]string{"-consul-auth", "identity"}, "want variable or none"},
		{[]string{"-format", "yaml"}, "want json or hcl"},
		{[]string{"-datacenters", " , "}, "at least one datacenter"},
		{[]string{"-service-namespace", "a b"}, "-service-namespace"},
		{[]string{"extra"}, "unexpected argument"},
	} {
		code, stdout, stderr := installRun(t, nil, tc.args...)
		if code != exitUsage || !strings.Contains(stderr, tc.want) || stdout != "" {
			t.Errorf("install %v: exit %d, stderr %q, stdout %d bytes; want exit %d naming %q and no output",
				tc.args, code, stderr, len(stdout), exitUsage, tc.want)
		}
	}
}

// installPolicyRule is one block of a policy as Nomad or Consul reads it:
// `namespace "apps" { capabilities = [...] }`, `key_prefix "x/" { policy = "write" }`.
type installPolicyRule struct {
	Kind, Label, Policy string
	Capabilities        []string
}

// installParsePolicy parses rules with the HCL parser both servers use and
// returns every block; anything but string attributes and lists of strings
// fails the test.
func installParsePolicy(t *testing.T, p installPolicy) []installPolicyRule {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(p.Rules), p.File, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%s does not parse: %v", p.File, diags)
	}
	body := f.Body.(*hclsyntax.Body)
	if len(body.Attributes) != 0 {
		t.Fatalf("%s: top-level attributes %v", p.File, body.Attributes)
	}
	var rules []installPolicyRule
	for _, b := range body.Blocks {
		if len(b.Labels) != 1 {
			t.Fatalf("%s: block %s has labels %v, want one", p.File, b.Type, b.Labels)
		}
		r := installPolicyRule{Kind: b.Type, Label: b.Labels[0]}
		for name, attr := range b.Body.Attributes {
			v, diags := attr.Expr.Value(nil)
			if diags.HasErrors() {
				t.Fatalf("%s: %s.%s: %v", p.File, b.Type, name, diags)
			}
			switch name {
			case "policy":
				r.Policy = v.AsString()
			case "capabilities":
				for _, c := range v.AsValueSlice() {
					r.Capabilities = append(r.Capabilities, c.AsString())
				}
			default:
				t.Fatalf("%s: unknown attribute %s.%s", p.File, b.Type, name)
			}
		}
		if len(b.Body.Blocks) != 0 {
			t.Fatalf("%s: nested blocks in %s", p.File, b.Type)
		}
		rules = append(rules, r)
	}
	return rules
}

func TestInstallPolicies(t *testing.T) {
	code, stdout, stderr := installRun(t, nil, "-policies-only", "-service-namespace", "apps")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("-policies-only writes only the policies; stderr: %s", stderr)
	}
	policies := installPolicies(installOptions{ServiceNamespace: "apps", Namespace: "default", JobName: "nomad-serverless"})
	if len(policies) != 4 {
		t.Fatalf("want 4 policies, got %d", len(policies))
	}
	for _, p := range policies {
		if !strings.Contains(stdout, p.Rules) || !strings.Contains(stdout, `"`+p.Name+`"`) {
			t.Errorf("-policies-only output lacks policy %s/%s", p.System, p.Name)
		}
	}

	want := [][]installPolicyRule{
		{{Kind: "namespace", Label: "*", Capabilities: []string{"list-jobs", "read-job", "read-job-scaling", "scale-job"}}},
		{{Kind: "namespace", Label: "apps", Capabilities: []string{"list-jobs", "read-job", "read-job-scaling", "submit-job"}}},
		{
			{Kind: "service_prefix", Label: "", Policy: "write"},
			{Kind: "node_prefix", Label: "", Policy: "read"},
			{Kind: "key_prefix", Label: "nomad-serverless/", Policy: "write"},
			{Kind: "key", Label: "nomad-serverless/control-plane/admin-keys", Policy: "write"},
			{Kind: "session_prefix", Label: "", Policy: "write"},
		},
		{
			{Kind: "service_prefix", Label: "", Policy: "write"},
			{Kind: "node_prefix", Label: "", Policy: "read"},
			{Kind: "key_prefix", Label: "nomad-serverless/services/", Policy: "write"},
			{Kind: "key_prefix", Label: "nomad-serverless/control-plane/", Policy: "deny"},
		},
	}
	for i, p := range policies {
		got := installParsePolicy(t, p)
		if !slices.EqualFunc(got, want[i], func(a, b installPolicyRule) bool {
			return a.Kind == b.Kind && a.Label == b.Label && a.Policy == b.Policy && slices.Equal(a.Capabilities, b.Capabilities)
		}) {
			t.Errorf("%s %s rules:\n got  %+v\n want %+v", p.System, p.Name, got, want[i])
		}
	}
	if !strings.Contains(policies[2].Rules, spec.ActivatorServiceName) {
		t.Errorf("the Consul control-plane policy should say it registers %s", spec.ActivatorServiceName)
	}
}

// installFakeNomad records job registrations the way Nomad's PUT /v1/jobs
// receives them.
type installFakeNomad struct {
	mu     sync.Mutex
	bodies [][]byte
	tokens []string
	status int
}

func (f *installFakeNomad) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/v1/jobs" || (r.Method != http.MethodPut && r.Method != http.MethodPost) {
		http.Error(w, "unexpected "+r.Method+" "+r.URL.Path, http.StatusNotFound)
		return
	}
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.tokens = append(f.tokens, r.Header.Get("X-Nomad-Token"))
	status := f.status
	f.mu.Unlock()
	if status != 0 {
		http.Error(w, "Permission denied", status)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"EvalID":"5bc0a3f6-0000-0000-0000-000000000000","EvalCreateIndex":12,"JobModifyIndex":12,"Warnings":"","Index":12}`)
}

func TestInstallApplyRegistersTheJob(t *testing.T) {
	fake := &installFakeNomad{}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	envs := map[string]string{"NOMAD_ADDR": srv.URL, "NOMAD_TOKEN": "secret-token"}

	code, stdout, stderr := installRun(t, envs, "-apply", "-replicas", "4", "-namespace", "ops")
	if code != exitOK {
		t.Fatalf("install -apply: exit %d\n%s", code, stderr)
	}
	if !strings.Contains(stdout, "Registered job nomad-serverless in namespace ops with 4 replicas") {
		t.Errorf("stdout = %q", stdout)
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if len(fake.bodies) != 1 {
		t.Fatalf("Nomad got %d registrations, want 1", len(fake.bodies))
	}
	if fake.tokens[0] != "secret-token" {
		t.Errorf("token sent = %q, want NOMAD_TOKEN", fake.tokens[0])
	}
	var req api.JobRegisterRequest
	if err := json.Unmarshal(fake.bodies[0], &req); err != nil {
		t.Fatalf("registration body: %v", err)
	}
	if *req.Job.ID != "nomad-serverless" || *req.Job.Namespace != "ops" || *req.Job.TaskGroups[0].Count != 4 {
		t.Errorf("registered job %s ns %s count %d", *req.Job.ID, *req.Job.Namespace, *req.Job.TaskGroups[0].Count)
	}
}

func TestInstallApplyReportsRefusal(t *testing.T) {
	fake := &installFakeNomad{status: http.StatusForbidden}
	srv := httptest.NewServer(fake)
	defer srv.Close()
	code, _, stderr := installRun(t, map[string]string{"NOMAD_ADDR": srv.URL}, "-apply")
	if code != exitError {
		t.Fatalf("exit %d, want %d", code, exitError)
	}
	for _, want := range []string{"register job nomad-serverless", srv.URL, "Permission denied", "NOMAD_TOKEN"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("error lacks %q: %s", want, stderr)
		}
	}
}

func installTestStrings(v any) []string {
	list, _ := v.([]any)
	out := make([]string, len(list))
	for i, x := range list {
		out[i], _ = x.(string)
	}
	return out
}

func installTestFlag(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}

// TestInstallHCL: -format hcl prints a jobspec holding every field of the
// job the JSON holds, for the defaults and for each way of running serve.
func TestInstallHCL(t *testing.T) {
	for _, flags := range [][]string{
		nil,
		{"-artifact", "https://example.com/nomad-serverless.tar.gz", "-replicas", "3", "-region", "eu", "-datacenters", "dc1,dc2"},
		{"-nomad-auth", "variable", "-nomad-addr", "http://${attr.unique.network.ip-address}:4646"},
		{"-nomad-auth", "none", "-nomad-addr", "http://10.0.0.1:4646", "-consul-auth", "none"},
	} {
		code, hclOut, stderr := installRun(t, nil, append([]string{"-format", "hcl"}, flags...)...)
		if code != exitOK {
			t.Fatalf("install -format hcl %v: exit %d\n%s", flags, code, stderr)
		}
		f, diags := hclsyntax.ParseConfig([]byte(hclOut), "job.nomad.hcl", hcl.InitialPos)
		if diags.HasErrors() {
			t.Fatalf("%v: HCL job does not parse: %v\n%s", flags, diags, hclOut)
		}
		if blocks := f.Body.(*hclsyntax.Body).Blocks; len(blocks) != 1 || blocks[0].Type != "job" || blocks[0].Labels[0] != "nomad-serverless" {
			t.Fatalf("%v: want one job \"nomad-serverless\" block:\n%s", flags, hclOut)
		}
		code, jsonOut, _ := installRun(t, nil, flags...)
		if code != exitOK {
			t.Fatalf("install %v: exit %d", flags, code)
		}
		if err := nomadjob.CheckHCL(installDecodeJob(t, jsonOut), []byte(hclOut)); err != nil {
			t.Errorf("install -format hcl %v does not say what the JSON job says: %v\n%s", flags, err, hclOut)
		}
	}
	// The settings the HCL formatter used to lack, as a jobspec spells them.
	_, hclOut, _ := installRun(t, nil, "-format", "hcl")
	for _, want := range []string{
		"spread {\n      attribute = \"${node.unique.id}\"\n    }",
		"auto_revert      = true",
		"identity {\n        env = true\n      }",
		`kill_signal    = "SIGTERM"`,
		`shutdown_delay = "5s"`,
		"port \"gateway\" {\n        static = 8080\n      }",
	} {
		if !strings.Contains(hclOut, want) {
			t.Errorf("HCL lacks %q:\n%s", want, hclOut)
		}
	}

	dir := t.TempDir()
	if code, stdout, stderr := installRun(t, nil, "-format", "hcl", "-out", dir); code != exitOK || !strings.Contains(stdout, filepath.Join(dir, "nomad-serverless.nomad.hcl")) {
		t.Fatalf("install -format hcl -out: exit %d\n%s%s", code, stdout, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "nomad-serverless.nomad.hcl")); string(b) != hclOut {
		t.Errorf("the -out HCL file differs from what stdout prints")
	}
}
