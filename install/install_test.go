package install

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// testVersion is the version an unstamped binary reports (`go test` and
// `go build` without -ldflags): the golden files in deploy/ are rendered
// with it.
const testVersion = "dev"

// decodeJob reads the {"Job": ...} JSON Render prints back into api.Job, as
// Nomad would.
func decodeJob(t *testing.T, text string) *api.Job {
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

// render validates o and renders its job in format.
func render(t *testing.T, o Options, format string) string {
	t.Helper()
	if err := o.Validate(); err != nil {
		t.Fatalf("options: %v", err)
	}
	b, err := Render(Job(o, testVersion), format)
	if err != nil {
		t.Fatalf("render %s: %v", format, err)
	}
	return string(b)
}

// renderJob renders o's job as JSON and reads it back as Nomad would.
func renderJob(t *testing.T, o Options) *api.Job {
	t.Helper()
	return decodeJob(t, render(t, o, "json"))
}

// TestGoldenFiles writes the defaults' files and compares every one with
// the copies kept in deploy/ (UPDATE_GOLDEN=1 rewrites them).
func TestGoldenFiles(t *testing.T) {
	dir := t.TempDir()
	o := Defaults()
	jobText := render(t, o, "json")
	written, err := WriteFiles(dir, o, "json", []byte(jobText), Policies(o))
	if err != nil {
		t.Fatal(err)
	}
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
	golden := filepath.Join("..", "deploy")
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
	// The job file is the rendered job.
	if fileJob, _ := os.ReadFile(want[0]); string(fileJob) != jobText {
		t.Errorf("the rendered job and its written file differ")
	}
	// deploy/ keeps the jobspec too, for `nomad job run` without -json.
	hclOut := render(t, o, "hcl")
	hclPath := filepath.Join(golden, "nomad-serverless.nomad.hcl")
	if os.Getenv("UPDATE_GOLDEN") == "1" {
		if err := os.WriteFile(hclPath, []byte(hclOut), 0o644); err != nil {
			t.Fatal(err)
		}
	} else if b, err := os.ReadFile(hclPath); err != nil || string(b) != hclOut {
		t.Errorf("%s differs from the rendered jobspec (UPDATE_GOLDEN=1 to accept): %v\n--- got\n%s\n--- want\n%s", hclPath, err, hclOut, b)
	}
}

func TestJobShape(t *testing.T) {
	o := Defaults()
	o.Replicas, o.Domain, o.GatewayPort, o.AdminPort = 3, "apps.example.org", 80, 9090
	o.Namespace, o.Datacenters, o.Region = "platform", []string{"dc1", "dc2"}, "eu"
	job := renderJob(t, o)
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
		t.Errorf("count = %d, want 3 (Replicas)", *g.Count)
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
	// The gateway is the serve task's service: Nomad takes it out of
	// Consul the moment the task exits, not when its check next fails.
	if len(g.Services) != 0 || len(g.Tasks[0].Services) != 1 {
		t.Fatalf("group services = %d, task services = %d: want the one gateway service on the task", len(g.Services), len(g.Tasks[0].Services))
	}
	svc := g.Tasks[0].Services[0]
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
	if task.Driver != "docker" || task.Config["image"] != DefaultImage(testVersion) || task.Config["network_mode"] != "host" {
		t.Errorf("task driver/config = %s %v", task.Driver, task.Config)
	}
	args := testStrings(task.Config["args"])
	if args[0] != "serve" || testFlag(args, "-domain") != "apps.example.org" ||
		testFlag(args, "-listen") != ":${NOMAD_PORT_gateway}" ||
		testFlag(args, "-admin-listen") != "${NOMAD_IP_admin}:${NOMAD_PORT_admin}" ||
		testFlag(args, "-replica") != "${NOMAD_ALLOC_ID}" {
		t.Errorf("serve args = %v", args)
	}
	if task.KillTimeout == nil || *task.KillTimeout < 30*time.Second {
		t.Errorf("kill_timeout %v leaves serve no time to drain", task.KillTimeout)
	}
	// A crashed replica restarts at once and always: its stand-ins stay
	// in Consul until it is back.
	if rp := g.RestartPolicy; rp == nil || rp.Delay == nil || *rp.Delay > 2*time.Second || rp.Mode == nil || *rp.Mode != "delay" {
		t.Errorf("restart = %+v, want a delay of at most 2 s in mode delay", rp)
	}
}

func TestAuthModes(t *testing.T) {
	for _, tc := range []struct {
		name            string
		set             func(*Options)
		nomadAddr       string
		identity        bool
		templateHas     []string
		templateMissing []string
	}{
		{
			name:            "identity and consul token from variable (defaults)",
			set:             func(*Options) {},
			nomadAddr:       "unix://${NOMAD_SECRETS_DIR}/api.sock",
			identity:        true,
			templateHas:     []string{`nomadVar "nomad/jobs/nomad-serverless"`, "CONSUL_HTTP_TOKEN={{ .consul_token }}"},
			templateMissing: []string{"NOMAD_TOKEN"},
		},
		{
			name: "both tokens from variable",
			set: func(o *Options) {
				o.NomadAuth, o.NomadAddr, o.JobName = AuthVariable, "https://nomad.service.consul:4646", "ns-cp"
			},
			nomadAddr:   "https://nomad.service.consul:4646",
			templateHas: []string{`nomadVar "nomad/jobs/ns-cp"`, "NOMAD_TOKEN={{ .nomad_token }}", "CONSUL_HTTP_TOKEN={{ .consul_token }}"},
		},
		{
			name: "no ACLs",
			set: func(o *Options) {
				o.NomadAuth, o.NomadAddr, o.ConsulAuth = AuthNone, "http://${attr.unique.network.ip-address}:4646", AuthNone
			},
			nomadAddr: "http://${attr.unique.network.ip-address}:4646",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := Defaults()
			tc.set(&o)
			task := renderJob(t, o).TaskGroups[0].Tasks[0]
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

// TestConsulTLS: with -consul-tls variable, the CA and the client
// certificate come from the job's Variable into secrets/, where the
// variables the Consul client reads point, and the token template stays
// the env file it was.
func TestConsulTLS(t *testing.T) {
	o := Defaults()
	o.ConsulTLS, o.ConsulAddr = AuthVariable, "https://${attr.unique.network.ip-address}:8501"
	o.GatewayTags = []string{"urlprefix-/", "traefik.enable=true"}
	o.HTTPSPort = 8443 // the image's own user binds it
	o.GatewayIP = "${NOMAD_IP_gateway}"
	job := renderJob(t, o)
	if args, _ := job.TaskGroups[0].Tasks[0].Config["args"].([]any); !slices.Contains(args, any("${NOMAD_IP_gateway}:${NOMAD_PORT_gateway}")) {
		t.Errorf("-gateway-ip: serve's args %v lack -listen ${NOMAD_IP_gateway}:${NOMAD_PORT_gateway}", args)
	}
	task := job.TaskGroups[0].Tasks[0]
	if task.Env["CONSUL_HTTP_ADDR"] != o.ConsulAddr {
		t.Errorf("CONSUL_HTTP_ADDR = %q", task.Env["CONSUL_HTTP_ADDR"])
	}
	if len(task.Templates) != 4 || !*task.Templates[0].Envvars {
		t.Fatalf("templates: want the tokens env file then 3 PEM files, got %d", len(task.Templates))
	}
	for _, f := range []struct{ env, item, file string }{
		{"CONSUL_CACERT", "consul_ca", "secrets/consul-ca.pem"},
		{"CONSUL_CLIENT_CERT", "consul_client_cert", "secrets/consul-client.pem"},
		{"CONSUL_CLIENT_KEY", "consul_client_key", "secrets/consul-client-key.pem"},
	} {
		if task.Env[f.env] != "${NOMAD_SECRETS_DIR}/"+strings.TrimPrefix(f.file, "secrets/") {
			t.Errorf("%s = %q, want the template's file %s", f.env, task.Env[f.env], f.file)
		}
		var found bool
		for _, tmpl := range task.Templates[1:] {
			if *tmpl.DestPath != f.file {
				continue
			}
			found = true
			if !strings.Contains(*tmpl.EmbeddedTmpl, `nomadVar "nomad/jobs/nomad-serverless"`) || !strings.Contains(*tmpl.EmbeddedTmpl, "{{ ."+f.item+" }}") {
				t.Errorf("%s reads %q", f.file, *tmpl.EmbeddedTmpl)
			}
			if tmpl.Envvars != nil && *tmpl.Envvars {
				t.Errorf("%s is read as environment variables", f.file)
			}
			// The image's user (docker) owns them; only it reads the key.
			if tmpl.Uid == nil || *tmpl.Uid != imageUID || *tmpl.Gid != imageUID {
				t.Errorf("%s: owner %v:%v, want the image's user %d", f.file, tmpl.Uid, tmpl.Gid, imageUID)
			}
			if wantPerms := map[bool]string{true: "0400", false: "0644"}[f.env == "CONSUL_CLIENT_KEY"]; *tmpl.Perms != wantPerms {
				t.Errorf("%s: perms %s, want %s", f.file, *tmpl.Perms, wantPerms)
			}
		}
		if !found {
			t.Errorf("no template writes %s", f.file)
		}
	}
	if tags := job.TaskGroups[0].Tasks[0].Services[0].Tags; !slices.Equal(tags, []string{"nomad-serverless", "gateway", "urlprefix-/", "traefik.enable=true"}) {
		t.Errorf("gateway tags %v", tags)
	}
	// On 443 the socket keeper binds the port, as root with the
	// capability; serve keeps the image's user, which owns the files.
	o.HTTPSPort = 443
	job = renderJob(t, o)
	serve, keeper := job.TaskGroups[0].Tasks[0], job.TaskGroups[0].Tasks[1]
	if serve.User != "" || serve.Config["cap_add"] != nil {
		t.Errorf("serve runs as %q with cap_add %v: only the keeper binds 443", serve.User, serve.Config["cap_add"])
	}
	if keeper.User != "root" || fmt.Sprint(keeper.Config["cap_add"]) != "[net_bind_service]" {
		t.Errorf("the keeper runs as %q with cap_add %v: it binds 443", keeper.User, keeper.Config["cap_add"])
	}
	// serve, the image's user, must be able to connect to root's socket.
	if owner := testFlag(testStrings(keeper.Config["args"]), "-owner"); owner != fmt.Sprint(imageUID) {
		t.Errorf("the keeper gives its socket to %q, want the image's user %d", owner, imageUID)
	}
	for _, tmpl := range serve.Templates[1:] {
		if tmpl.Uid == nil || *tmpl.Uid != imageUID {
			t.Errorf("%s: owner %v, want the image's user %d", *tmpl.DestPath, tmpl.Uid, imageUID)
		}
	}
}

// The gateway's sockets are held by a prestart sidecar and taken by serve,
// so they outlive a crash of serve; both name the same sockets.
func TestSocketKeeperTask(t *testing.T) {
	o := Defaults()
	o.HTTPSPort = 8443
	g := renderJob(t, o).TaskGroups[0]
	if len(g.Tasks) != 2 {
		t.Fatalf("tasks = %d, want serve and its socket keeper", len(g.Tasks))
	}
	serve, keeper := g.Tasks[0], g.Tasks[1]
	if keeper.Lifecycle == nil || keeper.Lifecycle.Hook != "prestart" || !keeper.Lifecycle.Sidecar {
		t.Errorf("keeper lifecycle = %+v, want a prestart sidecar", keeper.Lifecycle)
	}
	sargs, kargs := testStrings(serve.Config["args"]), testStrings(keeper.Config["args"])
	if kargs[0] != "keep-sockets" || testFlag(kargs, "-socket") == "" || testFlag(kargs, "-socket") != testFlag(sargs, "-sockets") {
		t.Errorf("keeper args %v and serve args %v do not name the same socket", kargs, sargs)
	}
	if testFlag(kargs, "-listen") != testFlag(sargs, "-listen") {
		t.Errorf("the keeper holds %q, serve listens on %q", testFlag(kargs, "-listen"), testFlag(sargs, "-listen"))
	}
	if testFlag(kargs, "-https-listen") != ":${NOMAD_PORT_https}" {
		t.Errorf("the keeper's HTTPS = %q", testFlag(kargs, "-https-listen"))
	}
	// The internal listener on the node's own address, not every
	// interface, held by the keeper as the others.
	if want := "${NOMAD_IP_internal}:${NOMAD_PORT_internal}"; testFlag(sargs, "-internal-listen") != want || testFlag(kargs, "-internal-listen") != want {
		t.Errorf("internal listener: serve %q, keeper %q, want %q", testFlag(sargs, "-internal-listen"), testFlag(kargs, "-internal-listen"), want)
	}
	if keeper.Driver != serve.Driver || keeper.Config["image"] != serve.Config["image"] || keeper.Config["network_mode"] != "host" {
		t.Errorf("keeper %s %v, serve %s %v: the same binary in the same network", keeper.Driver, keeper.Config, serve.Driver, serve.Config)
	}
}

func TestArtifact(t *testing.T) {
	url := "https://releases.example.com/nomad-serverless_linux_amd64.tar.gz"
	o := Defaults()
	o.Artifact = url
	task := renderJob(t, o).TaskGroups[0].Tasks[0]
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

func TestValidateRejectsBadOptions(t *testing.T) {
	for _, tc := range []struct {
		set  func(*Options)
		want string
	}{
		{func(o *Options) { o.Replicas = 0 }, "-replicas 0"},
		{func(o *Options) { o.GatewayPort = 8081 }, "must differ"},
		{func(o *Options) { o.AdminPort = 70000 }, "-admin-port 70000"},
		{func(o *Options) { o.Domain = "Not A Domain" }, "-domain"},
		{func(o *Options) { o.Image, o.Artifact = "x", "y" }, "choose one"},
		{func(o *Options) { o.NomadAuth = AuthVariable }, "needs -nomad-addr"},
		{func(o *Options) { o.NomadAddr = "http://x:4646" }, "only used with"},
		{func(o *Options) { o.ConsulAuth = "identity" }, "want variable or none"},
		{func(o *Options) { o.Datacenters = nil }, "at least one datacenter"},
		{func(o *Options) { o.ServiceNamespace = "a b" }, "-service-namespace"},
		{func(o *Options) { o.ConsulTLS = AuthVariable }, "needs an https:// -consul-addr"},
		{func(o *Options) { o.ConsulTLS = "files" }, "-consul-tls \"files\""},
		{func(o *Options) { o.GatewayTags = []string{"a b"} }, "-gateway-tags"},
		{func(o *Options) { o.GatewayIP = "eth0" }, "-gateway-ip"},
		{func(o *Options) { o.InternalPort = o.AdminPort }, "-internal-port 8081 is also"},
		{func(o *Options) { o.InternalPort = -1 }, "-internal-port -1"},
	} {
		o := Defaults()
		tc.set(&o)
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: Validate() = %v, want an error naming %q", o, err, tc.want)
		}
	}
	if err := Defaults().Validate(); err != nil {
		t.Errorf("the defaults do not validate: %v", err)
	}
}

// policyRule is one block of a policy as Nomad or Consul reads it:
// `namespace "apps" { capabilities = [...] }`, `key_prefix "x/" { policy = "write" }`.
type policyRule struct {
	Kind, Label, Policy string
	Capabilities        []string
}

// parsePolicy parses rules with the HCL parser both servers use and returns
// every block; anything but string attributes and lists of strings fails
// the test.
func parsePolicy(t *testing.T, p Policy) []policyRule {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(p.Rules), p.File, hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("%s does not parse: %v", p.File, diags)
	}
	body := f.Body.(*hclsyntax.Body)
	if len(body.Attributes) != 0 {
		t.Fatalf("%s: top-level attributes %v", p.File, body.Attributes)
	}
	var rules []policyRule
	for _, b := range body.Blocks {
		// Nomad's node, agent, operator and quota blocks have no label.
		if len(b.Labels) > 1 || len(b.Labels) == 0 && b.Type != "node" {
			t.Fatalf("%s: block %s has labels %v", p.File, b.Type, b.Labels)
		}
		r := policyRule{Kind: b.Type}
		if len(b.Labels) == 1 {
			r.Label = b.Labels[0]
		}
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

func TestPolicies(t *testing.T) {
	policies := Policies(Options{ServiceNamespace: "apps", Namespace: "default", JobName: "nomad-serverless"})
	if len(policies) != 4 {
		t.Fatalf("want 4 policies, got %d", len(policies))
	}
	want := [][]policyRule{
		{{Kind: "namespace", Label: "*", Capabilities: []string{"list-jobs", "read-job", "read-job-scaling", "scale-job"}}},
		{
			{Kind: "namespace", Label: "apps", Capabilities: []string{"list-jobs", "read-job", "read-job-scaling", "submit-job", "read-logs", "read-fs"}},
			{Kind: "node", Policy: "read"},
		},
		{
			{Kind: "service_prefix", Label: "", Policy: "write"},
			{Kind: "node_prefix", Label: "", Policy: "read"},
			{Kind: "node_prefix", Label: "nomad-serverless-stand-ins-", Policy: "write"},
			{Kind: "key_prefix", Label: "nomad-serverless/", Policy: "write"},
			{Kind: "key", Label: "nomad-serverless/control-plane/admin-keys", Policy: "write"},
			{Kind: "key_prefix", Label: "nomad-serverless/control-plane/tls/", Policy: "write"},
			{Kind: "session_prefix", Label: "", Policy: "write"},
		},
		{
			{Kind: "service_prefix", Label: "", Policy: "write"},
			{Kind: "node_prefix", Label: "", Policy: "read"},
			{Kind: "key_prefix", Label: "nomad-serverless/services/", Policy: "write"},
			{Kind: "key", Label: "nomad-serverless/tracing", Policy: "read"},
			{Kind: "key_prefix", Label: "nomad-serverless/control-plane/", Policy: "deny"},
		},
	}
	for i, p := range policies {
		got := parsePolicy(t, p)
		if !slices.EqualFunc(got, want[i], func(a, b policyRule) bool {
			return a.Kind == b.Kind && a.Label == b.Label && a.Policy == b.Policy && slices.Equal(a.Capabilities, b.Capabilities)
		}) {
			t.Errorf("%s %s rules:\n got  %+v\n want %+v", p.System, p.Name, got, want[i])
		}
	}
	if !strings.Contains(policies[2].Rules, spec.ActivatorServiceName) {
		t.Errorf("the Consul control-plane policy should say it registers %s", spec.ActivatorServiceName)
	}
}

func testStrings(v any) []string {
	list, _ := v.([]any)
	out := make([]string, len(list))
	for i, x := range list {
		out[i], _ = x.(string)
	}
	return out
}

func testFlag(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}

// TestHCL: Render "hcl" gives a jobspec holding every field of the job the
// JSON holds, for the defaults and for each way of running serve.
func TestHCL(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Options)
	}{
		{"defaults", func(*Options) {}},
		{"artifact", func(o *Options) {
			o.Artifact, o.Replicas, o.Region, o.Datacenters = "https://example.com/nomad-serverless.tar.gz", 3, "eu", []string{"dc1", "dc2"}
		}},
		{"nomad token from variable", func(o *Options) {
			o.NomadAuth, o.NomadAddr = AuthVariable, "http://${attr.unique.network.ip-address}:4646"
		}},
		{"no ACLs", func(o *Options) {
			o.NomadAuth, o.NomadAddr, o.ConsulAuth = AuthNone, "http://10.0.0.1:4646", AuthNone
		}},
		{"consul mutual TLS and gateway tags", func(o *Options) {
			o.ConsulTLS, o.ConsulAddr = AuthVariable, "https://${attr.unique.network.ip-address}:8501"
			o.GatewayTags = []string{"urlprefix-/"}
		}},
	} {
		o := Defaults()
		tc.set(&o)
		hclOut := render(t, o, "hcl")
		f, diags := hclsyntax.ParseConfig([]byte(hclOut), "job.nomad.hcl", hcl.InitialPos)
		if diags.HasErrors() {
			t.Fatalf("%s: HCL job does not parse: %v\n%s", tc.name, diags, hclOut)
		}
		if blocks := f.Body.(*hclsyntax.Body).Blocks; len(blocks) != 1 || blocks[0].Type != "job" || blocks[0].Labels[0] != "nomad-serverless" {
			t.Fatalf("%s: want one job \"nomad-serverless\" block:\n%s", tc.name, hclOut)
		}
		if err := nomadjob.CheckHCL(renderJob(t, o), []byte(hclOut)); err != nil {
			t.Errorf("the jobspec of %s does not say what the JSON job says: %v\n%s", tc.name, err, hclOut)
		}
	}
	// The settings the HCL formatter used to lack, as a jobspec spells them.
	o := Defaults()
	hclOut := render(t, o, "hcl")
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
	written, err := WriteFiles(dir, o, "hcl", []byte(hclOut), Policies(o))
	if err != nil || !slices.Contains(written, filepath.Join(dir, "nomad-serverless.nomad.hcl")) {
		t.Fatalf("WriteFiles hcl: %v %v", written, err)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, "nomad-serverless.nomad.hcl")); string(b) != hclOut {
		t.Errorf("the written HCL file differs from the rendered jobspec")
	}
}

// TestNextSteps: the commands name the files written, attach the Nomad
// control-plane policy to the job under identity, and put the tokens the
// job reads from its Variable.
func TestNextSteps(t *testing.T) {
	o := Defaults()
	var b bytes.Buffer
	NextSteps(&b, o, Policies(o), "out")
	for _, want := range []string{
		"nomad acl policy apply -namespace default -job nomad-serverless nomad-serverless-control-plane " + filepath.Join("out", "policies", "nomad-control-plane.policy.hcl"),
		"consul acl policy create -name nomad-serverless-deploy",
		"nomad var put -namespace default nomad/jobs/nomad-serverless consul_token=",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("next steps lack %q:\n%s", want, b.String())
		}
	}
	if strings.Contains(b.String(), "nomad_token=") {
		t.Errorf("a job with workload identity needs no Nomad token:\n%s", b.String())
	}
	if strings.Contains(b.String(), "consul_ca=") {
		t.Errorf("no Consul TLS asked, yet the steps put a CA:\n%s", b.String())
	}
	b.Reset()
	o.ConsulTLS, o.ConsulAddr = AuthVariable, "https://127.0.0.1:8501"
	NextSteps(&b, o, Policies(o), "out")
	if !strings.Contains(b.String(), "consul_ca=@") || !strings.Contains(b.String(), "consul_client_key=@") {
		t.Errorf("-consul-tls variable: the steps do not put the CA and client certificate:\n%s", b.String())
	}
}

// install passes its OTEL_* settings into serve's environment.
func TestJobCarriesTracingSettings(t *testing.T) {
	o := Defaults()
	o.Tracing = map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_SERVICE_NAME": "edge"}
	job := Job(o, testVersion)
	env := job.TaskGroups[0].Tasks[0].Env
	if env["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://collector:4318" || env["OTEL_SERVICE_NAME"] != "edge" || env["CONSUL_HTTP_ADDR"] == "" {
		t.Errorf("serve's env %v", env)
	}
}
