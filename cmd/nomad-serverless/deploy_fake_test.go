package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// runInProcess runs a CLI command in this process against a fake cluster.
func runInProcess(t *testing.T, c *fakecluster.Cluster, args ...string) (int, string, string) {
	t.Helper()
	for k, v := range c.Env() {
		t.Setenv(k, v)
	}
	t.Setenv("NOMAD_NAMESPACE", "")
	var out, errb bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := run(ctx, &env{stdout: &out, stderr: &errb, getenv: os.Getenv}, args)
	return code, out.String(), errb.String()
}

const namespacedService = `service "hello" {
  namespace = %q
  task {
    driver = "raw_exec"
    config {
      command = "/bin/sh"
      args    = ["-c", "exec sleep 60"]
    }
  }
}
`

// Consul's config entries and service names are not namespaced (Consul
// CE): a service name can live in one Nomad namespace only, and deploy
// must refuse a second one rather than overwrite the first one's route.
func TestDeployRefusesAServiceNameTakenInAnotherNamespace(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1})
	dir := t.TempDir()
	write := func(name, ns string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, fmt.Appendf(nil, namespacedService, ns), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	if code, out, errs := runInProcess(t, c, "deploy", "-detach", "-sidecar-command", "/bin/sh", write("a.hcl", "default")); code != 0 {
		t.Fatalf("first deploy: %d\n%s%s", code, out, errs)
	}
	splitter := c.Consul.ConfigEntry("service-splitter", "hello")
	code, out, errs := runInProcess(t, c, "deploy", "-detach", "-sidecar-command", "/bin/sh", write("b.hcl", "team"))
	t.Logf("second deploy:\n%s", errs)
	if code != exitError || !strings.Contains(errs, `namespace default`) || !strings.Contains(errs, "Nothing was deployed") {
		t.Errorf("deploying hello into a second namespace: exit %d\n%s%s", code, out, errs)
	}
	for _, id := range c.Nomad.JobIDs() {
		if strings.HasPrefix(id, "team/") {
			t.Errorf("registered %s", id)
		}
	}
	if after := c.Consul.ConfigEntry("service-splitter", "hello"); after["ModifyIndex"] != splitter["ModifyIndex"] {
		t.Errorf("the default namespace's route was rewritten: %v -> %v", splitter, after)
	}
}

// A service whose jobs are in Nomad but whose route is gone (a delete cut
// short) is still shown, without made-up URLs, and list says what is wrong.
func TestStatusOfAServiceWithoutARoute(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1})
	p := filepath.Join(t.TempDir(), "a.hcl")
	if err := os.WriteFile(p, fmt.Appendf(nil, namespacedService, "default"), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, out, errs := runInProcess(t, c, "deploy", "-detach", "-sidecar-command", "/bin/sh", p); code != 0 {
		t.Fatalf("deploy: %d\n%s%s", code, out, errs)
	}
	// A gateway runs (registered as serve registers itself).
	if err := c.Consul.Register(&consulapi.AgentServiceRegistration{ID: "gw", Name: spec.ActivatorServiceName, Address: "127.0.0.1", Port: 8080,
		Meta: map[string]string{consulroute.MetaDomain: "localhost", consulroute.MetaReplica: "r"}}, true); err != nil {
		t.Fatal(err)
	}
	// Only the route goes.
	req, _ := http.NewRequest(http.MethodDelete, c.Consul.Addr()+"/v1/kv/nomad-serverless/services/default/hello", nil)
	if resp, err := http.DefaultClient.Do(req); err != nil {
		t.Fatal(err)
	} else {
		resp.Body.Close()
	}
	code, out, errs := runInProcess(t, c, "status", "hello", "-json")
	if code != 0 {
		t.Fatalf("status: %d\n%s%s", code, out, errs)
	}
	var v rollout.ServiceView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	if v.Service != "hello" || len(v.Revisions) != 1 || len(v.URLs) != 0 || v.Latest != "" {
		t.Errorf("status of a service without a route: %+v", v)
	}
	code, out, _ = runInProcess(t, c, "list", "-json")
	var rows []listRow
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 1 || len(rows[0].Problems) == 0 || rows[0].URL != "" {
		t.Errorf("list: %d %v %+v", code, err, rows)
	}
}
