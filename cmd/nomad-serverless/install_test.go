package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/install"
)

// The job and the policies are tested in package install; these test the
// command: its flags, what it prints and writes, and -apply.

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

// TestInstallOutputs: -out writes the job and the policies and lists them,
// stdout prints the same job without -out, in either format, and
// -policies-only prints only the policies.
func TestInstallOutputs(t *testing.T) {
	dir := t.TempDir()
	code, stdout, stderr := installRun(t, nil, "-out", dir)
	if code != exitOK {
		t.Fatalf("install -out: exit %d\n%s", code, stderr)
	}
	// It lists every file it wrote, the job first (package install tests
	// which files those are).
	var files []string
	if err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			files = append(files, path)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	written := strings.Fields(stdout)
	if len(files) != 5 || len(written) != len(files) || !slices.Equal(slices.Sorted(slices.Values(written)), files) {
		t.Fatalf("files listed:\n%v\nwritten\n%v", written, files)
	}
	want := []string{filepath.Join(dir, "nomad-serverless.nomad.json")}
	if written[0] != want[0] {
		t.Errorf("the job file %s is not listed first: %v", want[0], written)
	}
	// The job file is what stdout prints without -out, and what package
	// install renders (its golden files are in deploy/).
	code, jobOut, _ := installRun(t, nil)
	if code != exitOK {
		t.Fatalf("install: exit %d", code)
	}
	if fileJob, _ := os.ReadFile(want[0]); string(fileJob) != jobOut {
		t.Errorf("install's stdout and its -out job file differ")
	}
	if golden, err := os.ReadFile(filepath.Join("..", "..", "deploy", "nomad-serverless.nomad.json")); err != nil || string(golden) != jobOut {
		t.Errorf("install's stdout differs from deploy/nomad-serverless.nomad.json: %v", err)
	}

	code, hclOut, stderr := installRun(t, nil, "-format", "hcl")
	if code != exitOK {
		t.Fatalf("install -format hcl: exit %d\n%s", code, stderr)
	}
	hclDir := t.TempDir()
	if code, stdout, stderr := installRun(t, nil, "-format", "hcl", "-out", hclDir); code != exitOK || !strings.Contains(stdout, filepath.Join(hclDir, "nomad-serverless.nomad.hcl")) {
		t.Fatalf("install -format hcl -out: exit %d\n%s%s", code, stdout, stderr)
	}
	if b, _ := os.ReadFile(filepath.Join(hclDir, "nomad-serverless.nomad.hcl")); string(b) != hclOut {
		t.Errorf("the -out HCL file differs from what stdout prints")
	}

	code, stdout, stderr = installRun(t, nil, "-policies-only", "-service-namespace", "apps")
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if stderr != "" {
		t.Errorf("-policies-only writes only the policies; stderr: %s", stderr)
	}
	for _, p := range install.Policies(install.Options{ServiceNamespace: "apps", Namespace: "default", JobName: "nomad-serverless"}) {
		if !strings.Contains(stdout, p.Rules) || !strings.Contains(stdout, `"`+p.Name+`"`) {
			t.Errorf("-policies-only output lacks policy %s/%s", p.System, p.Name)
		}
	}
}

// TestInstallFlags: the flags reach the job: install prints what package
// install renders for the options they set.
func TestInstallFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		set  func(*install.Options)
	}{
		{
			[]string{"-replicas", "3", "-domain", "apps.example.org", "-gateway-port", "80", "-admin-port", "9090",
				"-namespace", "platform", "-datacenters", "dc1, dc2", "-region", "eu"},
			func(o *install.Options) {
				o.Replicas, o.Domain, o.GatewayPort, o.AdminPort = 3, "apps.example.org", 80, 9090
				o.Namespace, o.Datacenters, o.Region = "platform", []string{"dc1", "dc2"}, "eu"
			},
		},
		{
			[]string{"-nomad-auth", "variable", "-nomad-addr", "https://nomad.service.consul:4646", "-job", "ns-cp", "-consul-addr", "10.0.0.1:8500"},
			func(o *install.Options) {
				o.NomadAuth, o.NomadAddr, o.JobName, o.ConsulAddr = install.AuthVariable, "https://nomad.service.consul:4646", "ns-cp", "10.0.0.1:8500"
			},
		},
		{
			[]string{"-artifact", "https://releases.example.com/nomad-serverless_linux_amd64.tar.gz", "-cpu", "200", "-memory", "128", "-service-namespace", "*"},
			func(o *install.Options) {
				o.Artifact, o.CPU, o.MemoryMB, o.ServiceNamespace = "https://releases.example.com/nomad-serverless_linux_amd64.tar.gz", 200, 128, "*"
			},
		},
		{
			[]string{"-image", "registry.example/ns:1", "-consul-auth", "none"},
			func(o *install.Options) { o.Image, o.ConsulAuth = "registry.example/ns:1", install.AuthNone },
		},
	} {
		code, stdout, stderr := installRun(t, nil, tc.args...)
		if code != exitOK {
			t.Fatalf("install %v: exit %d: %s", tc.args, code, stderr)
		}
		o := install.Defaults()
		tc.set(&o)
		want, err := install.Render(install.Job(o, version), "json")
		if err != nil {
			t.Fatal(err)
		}
		if stdout != string(want) {
			t.Errorf("install %v prints another job than the options it sets:\n--- got\n%s\n--- want\n%s", tc.args, stdout, want)
		}
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
