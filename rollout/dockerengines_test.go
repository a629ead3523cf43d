package rollout

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Two docker apps and one raw_exec app in one file: the raw_exec one never
// asks for the engines.
const dockerAppsFile = `
service "web" {
  image = "nginx:1"
  port  = 80
}
service "api" {
  image = "api:1"
  port  = 8080
}
service "worker" {
  task {
    driver = "raw_exec"
    config {
      command = "/bin/app"
    }
  }
}
`

func sidecarLifecycleOf(t *testing.T, job *nomadapi.Job) *nomadapi.TaskLifecycle {
	t.Helper()
	for _, g := range job.TaskGroups {
		for _, task := range g.Tasks {
			if task.Name == spec.SidecarTaskName {
				return task.Lifecycle
			}
		}
	}
	t.Fatalf("job %s has no %s task", *job.ID, spec.SidecarTaskName)
	return nil
}

// deploy reads the cluster's docker engines once, and only for a docker
// app; the queue-proxy of a docker app starts beside it only when every
// engine announces addresses, and after it (saying why once) when the
// engines cannot be read.
func TestDeployStartsTheProxyBesideADockerAppOnlyWhereEveryEngineAnnounces(t *testing.T) {
	for _, c := range []struct {
		name       string
		engines    []nomadjob.DockerEngine
		err        error
		beside     bool
		diagSays   string
		skipLookup bool
	}{
		{name: "every engine 28 or later", engines: []nomadjob.DockerEngine{{Node: "a", Version: "28.5.2"}, {Node: "b", Version: "29.0.1"}}, beside: true},
		{name: "one engine older", engines: []nomadjob.DockerEngine{{Node: "a", Version: "28.5.2"}, {Node: "b", Version: "20.10.24+dfsg1"}}},
		{name: "no docker node", engines: nil},
		{name: "nodes not readable", err: errors.New("list nodes: Permission denied (node:read)"), diagSays: "Note: the queue-proxy of docker apps starts after the app, not with it (slower wakes): list nodes: Permission denied (node:read)"},
		{name: "deploy given no engine reader", skipLookup: true},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFakeCluster()
			fl, diags := svchcl.Parse("apps.hcl", []byte(dockerAppsFile), svchcl.Options{})
			if diags.HasErrors() {
				t.Fatalf("parse: %v", diags)
			}
			var services []Service
			for i := range fl.Services {
				services = append(services, Service{File: fl, Index: i})
			}
			calls := 0
			cfg := Config{
				Nomad: f, Consul: f, Out: &bytes.Buffer{}, Diag: &bytes.Buffer{},
				Compile: nomadjob.Options{Sidecar: nomadjob.SidecarOptions{Image: "nomad-serverless:1"}},
				Wait:    5 * time.Second, Poll: time.Millisecond, Now: time.Now, Retain: consulroute.DefaultRetention(),
			}
			if !c.skipLookup {
				cfg.DockerEngines = func(context.Context) ([]nomadjob.DockerEngine, error) {
					calls++
					return c.engines, c.err
				}
			}
			d, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := d.Deploy(context.Background(), services); err != nil {
				t.Fatalf("deploy: %v\n%s", err, cfg.Diag)
			}
			if want := map[bool]int{true: 0, false: 1}[c.skipLookup]; calls != want {
				t.Errorf("engines read %d times, want %d (once per deploy)", calls, want)
			}
			for _, name := range []string{"web-00001", "api-00001"} {
				lc := sidecarLifecycleOf(t, f.jobs[name])
				if c.beside && lc != nil {
					t.Errorf("%s: queue-proxy lifecycle %+v, want none (started with the app)", name, *lc)
				}
				if !c.beside && (lc == nil || lc.Hook != nomadapi.TaskLifecycleHookPoststart || !lc.Sidecar) {
					t.Errorf("%s: queue-proxy lifecycle %+v, want a poststart sidecar", name, lc)
				}
			}
			if lc := sidecarLifecycleOf(t, f.jobs["worker-00001"]); lc != nil {
				t.Errorf("worker (raw_exec): queue-proxy lifecycle %+v, want none", *lc)
			}
			diag := fmt.Sprint(cfg.Diag)
			if c.diagSays != "" && strings.Count(diag, c.diagSays) != 1 {
				t.Errorf("diagnostics say %q, want once %q", diag, c.diagSays)
			}
			if c.diagSays == "" && strings.Contains(diag, "Note:") {
				t.Errorf("diagnostics: %q", diag)
			}
		})
	}
}
