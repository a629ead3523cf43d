package e2e

// Unit tests of the docker scenario's helpers (docker.go); no dockerd.

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestUnitDecideDocker(t *testing.T) {
	answers := func(hosts ...string) func(string) error {
		return func(h string) error {
			if slices.Contains(hosts, h) {
				return nil
			}
			return errors.New("dial unix: connect: no such file or directory")
		}
	}
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}
	have := func(bin string) (string, error) {
		if bin == "dockerd" {
			return "/usr/sbin/dockerd", nil
		}
		return "", errors.New("not found")
	}
	none := func(string) (string, error) { return "", errors.New("not found") }
	for _, tc := range []struct {
		name   string
		getenv func(string) string
		look   func(string) (string, error)
		ping   func(string) error
		want   DockerPlan
	}{
		{"the default socket answers", env(), have, answers(DefaultDockerHost), DockerPlan{Host: DefaultDockerHost}},
		{"DOCKER_HOST answers", env("DOCKER_HOST", "unix:///run/user/1000/docker.sock"), none, answers("unix:///run/user/1000/docker.sock"), DockerPlan{Host: "unix:///run/user/1000/docker.sock"}},
		{"nothing answers, dockerd on PATH", env(), have, answers(), DockerPlan{Dockerd: "/usr/sbin/dockerd"}},
		{"nothing at all", env(), none, answers(), DockerPlan{Skip: "docker: SKIPPED: no dockerd answers at unix:///var/run/docker.sock and dockerd is not on PATH (Debian: apt-get install docker.io)"}},
		{"DOCKER_HOST silent: not started in its place", env("DOCKER_HOST", "unix:///x.sock"), have, answers(DefaultDockerHost),
			DockerPlan{Skip: "docker: SKIPPED: DOCKER_HOST=unix:///x.sock does not answer: dial unix: connect: no such file or directory"}},
		{"DOCKER_HOST over TCP", env("DOCKER_HOST", "tcp://10.0.0.1:2375"), have, answers(),
			DockerPlan{Skip: "docker: SKIPPED: DOCKER_HOST=tcp://10.0.0.1:2375: the suite talks to dockerd on a unix socket only (unix:///path/docker.sock)"}},
	} {
		if got := DecideDocker(tc.getenv, tc.look, tc.ping); got != tc.want {
			t.Errorf("%s: %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestUnitDockerServiceParses(t *testing.T) {
	host := DockerService{Name: "e2e-docker", Image: "nomad-serverless:e2e", Args: []string{"testapp"}, Port: 80,
		Env: map[string]string{"TESTAPP_HOST": "0.0.0.0", "TESTAPP_NAME": "docker"}, CPU: 50, MemoryMB: 96, Concurrency: 10, Scaling: FastScaling()}
	bridge := DockerService{Name: "e2e-docker-bridge", Image: "nomad-serverless:e2e", Args: []string{"testapp"}, Port: 8080, Bridge: true,
		CPU: 50, MemoryMB: 80, Scaling: Scaling{Min: 1, Initial: 1}}
	path, err := WriteDockerServiceFile(t.TempDir(), "docker.hcl", host, bridge)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := svchcl.ParseFile(path, svchcl.Options{})
	if diags.HasErrors() {
		var b strings.Builder
		f.WriteDiagnostics(&b, diags)
		src, _ := os.ReadFile(path)
		t.Fatalf("the service language rejects the suite's docker file:\n%s\n%s", b.String(), src)
	}
	if len(f.Services) != 2 {
		t.Fatalf("services = %d", len(f.Services))
	}
	for i, want := range []DockerService{host, bridge} {
		got := f.Services[i]
		task := got.Template.Task
		if errs := got.Validate(); errs != nil {
			t.Errorf("%s: invalid: %v", want.Name, errs)
		}
		if task.Driver != "docker" || task.Config["image"] != want.Image || fmt.Sprint(task.Config["args"]) != "[testapp]" || task.Port != want.Port {
			t.Errorf("%s: task %s %v port %d", want.Name, task.Driver, task.Config, task.Port)
		}
		if task.Resources.CPU != want.CPU || task.Resources.MemoryMB != want.MemoryMB {
			t.Errorf("%s: resources %+v", want.Name, task.Resources)
		}
		mode := spec.NetworkHost
		if want.Bridge {
			mode = spec.NetworkBridge
		}
		if got.Template.Network.Mode != mode {
			t.Errorf("%s: network %q, want %q", want.Name, got.Template.Network.Mode, mode)
		}
		if got.Scaling.Min != want.Scaling.Min || got.Template.Readiness == nil || got.Template.Readiness.Path != "/ready" {
			t.Errorf("%s: scaling %+v readiness %+v", want.Name, got.Scaling, got.Template.Readiness)
		}
	}
	if f.Services[0].Template.Task.Env["TESTAPP_HOST"] != "0.0.0.0" {
		t.Errorf("env = %v", f.Services[0].Template.Task.Env)
	}
}

// TestUnitScratchImageMatchesDockerfile: deploy/Dockerfile.scratch gives
// containers what the repository's Dockerfile gives them (the e2e scenario
// checks the image built from it, and runs it).
func TestUnitScratchImageMatchesDockerfile(t *testing.T) {
	parse := func(path string) DockerfileStage {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		st, err := ParseDockerfile(string(b))
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		return st
	}
	full, scratch := parse(filepath.Join("..", "Dockerfile")), parse(filepath.Join("..", "deploy", "Dockerfile.scratch"))
	if scratch.From != "scratch" {
		t.Errorf("Dockerfile.scratch is FROM %s", scratch.From)
	}
	if len(full.Entrypoint) != 1 || !slices.Equal(full.Entrypoint, scratch.Entrypoint) {
		t.Errorf("entrypoints %q and %q", full.Entrypoint, scratch.Entrypoint)
	}
	if !slices.Equal(full.Cmd, []string{"serve"}) || !slices.Equal(full.Cmd, scratch.Cmd) {
		t.Errorf("default commands %q and %q, want [serve]", full.Cmd, scratch.Cmd)
	}
	if !slices.Equal(full.Expose, scratch.Expose) {
		t.Errorf("ports %v and %v", full.Expose, scratch.Expose)
	}
	if u, ok := distrolessUsers[full.User]; !ok || u != scratch.User || strings.HasPrefix(u, "0") {
		t.Errorf("users %q (distroless: %q) and %q: want the same non-root user", full.User, u, scratch.User)
	}
	bin := full.Entrypoint[0]
	if _, ok := full.Copies[bin]; !ok || scratch.Copies[bin] != "nomad-serverless" {
		t.Errorf("the entrypoint %s is not copied in (Dockerfile %v, scratch %v)", bin, full.Copies, scratch.Copies)
	}
}

func TestUnitParseDockerfile(t *testing.T) {
	st, err := ParseDockerfile("FROM golang AS build\nUSER x\nCMD [\"a\"]\n# c\nFROM scratch\nCOPY --chown=1:1 \\\n  a /b\nEXPOSE 1 2\nENTRYPOINT [\"/b\"]\n")
	if err != nil {
		t.Fatal(err)
	}
	if st.From != "scratch" || st.User != "" || st.Cmd != nil || st.Copies["/b"] != "a" || fmt.Sprint(st.Expose) != "[1 2]" || fmt.Sprint(st.Entrypoint) != "[/b]" {
		t.Errorf("only the final stage counts: %+v", st)
	}
	if _, err := ParseDockerfile("FROM scratch\nCMD serve\n"); err == nil {
		t.Errorf("the shell form is not read, and says so")
	}
}

func TestUnitFindCNIPath(t *testing.T) {
	empty, full := t.TempDir(), t.TempDir()
	for _, p := range CNIPlugins {
		if err := os.WriteFile(filepath.Join(full, p), nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if got, why := FindCNIPath([]string{empty, full}); got != full || why != "" {
		t.Errorf("found %q %q, want %s", got, why, full)
	}
	if got, why := FindCNIPath([]string{empty}); got != "" || !strings.Contains(why, "containernetworking-plugins") {
		t.Errorf("found %q %q", got, why)
	}
}

func TestUnitDemuxLogs(t *testing.T) {
	var b bytes.Buffer
	for _, f := range []struct {
		stream byte
		text   string
	}{{1, "out\n"}, {2, "err\n"}} {
		hdr := [8]byte{f.stream}
		binary.BigEndian.PutUint32(hdr[4:], uint32(len(f.text)))
		b.Write(hdr[:])
		b.WriteString(f.text)
	}
	if got, err := demuxLogs(&b); err != nil || got != "out\nerr\n" {
		t.Errorf("demux = %q, %v", got, err)
	}
}

// TestUnitDockerClient runs the client against a stand-in for dockerd on
// a unix socket: a build whose step fails reports the step's error, and
// container lists are filtered by label.
func TestUnitDockerClient(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "d.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	var filters string
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/_ping":
			fmt.Fprint(w, "OK")
		case r.URL.Path == "/build" && r.URL.Query().Get("t") == "bad:1":
			fmt.Fprint(w, `{"stream":"Step 1/2 : FROM scratch\n"}`+"\n"+`{"error":"COPY failed: file not found"}`+"\n")
		case r.URL.Path == "/build":
			fmt.Fprint(w, `{"stream":"Step 1/1 : FROM scratch\n"}`+"\n"+`{"aux":{"ID":"sha256:abc"}}`+"\n")
		case r.URL.Path == "/containers/json":
			filters = r.URL.Query().Get("filters")
			fmt.Fprint(w, `[{"Id":"2","Names":["/user-x"],"State":"running"},{"Id":"1","Names":["/queue-proxy-x"],"State":"running"}]`)
		default:
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"message":"No such image: nope"}`)
		}
	})}
	go srv.Serve(ln)
	defer srv.Close()

	dc := NewDockerClient("unix://" + sock)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := dc.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	if id, err := dc.Build(ctx, "good:1", "Dockerfile", nil); err != nil || id != "sha256:abc" {
		t.Errorf("build = %q, %v", id, err)
	}
	if _, err := dc.Build(ctx, "bad:1", "Dockerfile", nil); err == nil || !strings.Contains(err.Error(), "COPY failed") {
		t.Errorf("failed build: %v", err)
	}
	cs, err := dc.Containers(ctx, false, "a=b")
	if err != nil || len(cs) != 2 || cs[0].Name() != "queue-proxy-x" || filters != `{"label":["a=b"]}` {
		t.Errorf("containers %+v %v, filters %s", cs, err, filters)
	}
	var de *DockerError
	if _, err := dc.Image(ctx, "nope"); !errors.As(err, &de) || de.Status != 404 || de.Message != "No such image: nope" {
		t.Errorf("missing image: %v", err)
	}
}
