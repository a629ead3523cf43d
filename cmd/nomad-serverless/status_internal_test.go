package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	consulapi "github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

const internalService = `service "billing" {
  visibility = "internal"
  domains    = ["billing.corp.example"]
  task {
    driver = "raw_exec"
    config {
      command = "/bin/sh"
      args    = ["-c", "exec sleep 60"]
    }
  }
}
`

// status and list say an internal service answers on the gateways'
// internal listener, with every URL of it; its names get no https:// URL.
func TestStatusAndListOfAnInternalService(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1})
	p := filepath.Join(t.TempDir(), "billing.hcl")
	if err := os.WriteFile(p, []byte(internalService), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := c.Consul.Register(&consulapi.AgentServiceRegistration{ID: "gw", Name: spec.ActivatorServiceName, Address: "10.0.0.5", Port: 8080,
		Meta: map[string]string{consulroute.MetaDomain: "apps.example.com", consulroute.MetaReplica: "r", consulroute.MetaInternal: "10.1.0.5:8082"}}, true); err != nil {
		t.Fatal(err)
	}
	code, out, errs := runInProcess(t, c, "deploy", "-detach", "-sidecar-command", "/bin/sh", p)
	if code != 0 {
		t.Fatalf("deploy: %d\n%s%s", code, out, errs)
	}
	if !strings.Contains(out, "billing: internal, on the gateways' internal listener (10.1.0.5:8082)") ||
		!strings.Contains(out, "curl -H 'Host: billing.default.apps.example.com' http://10.1.0.5:8082/") {
		t.Errorf("deploy does not say where the internal service answers:\n%s", out)
	}

	code, out, errs = runInProcess(t, c, "status", "billing", "-json")
	if code != 0 {
		t.Fatalf("status: %d\n%s%s", code, out, errs)
	}
	var v rollout.ServiceView
	if err := json.Unmarshal([]byte(out), &v); err != nil {
		t.Fatal(err)
	}
	want := []string{"http://billing.default.apps.example.com/", "http://billing.corp.example/"}
	if !v.Served.Internal || v.Served.Listener != "10.1.0.5:8082" || !slices.Equal(v.URLs, want) {
		t.Errorf("status -json: served %+v, urls %v; want internal on 10.1.0.5:8082, %v", v.Served, v.URLs, want)
	}
	code, out, _ = runInProcess(t, c, "status", "billing")
	if code != 0 || !strings.Contains(out, "Served:    internal, on the gateways' internal listener (10.1.0.5:8082)") {
		t.Errorf("status: %d\n%s", code, out)
	}

	code, out, _ = runInProcess(t, c, "list")
	if code != 0 || !strings.Contains(out, "http://billing.default.apps.example.com/ (internal)") {
		t.Errorf("list: %d\n%s", code, out)
	}
	code, out, _ = runInProcess(t, c, "list", "-json")
	var rows []listRow
	if err := json.Unmarshal([]byte(out), &rows); code != 0 || err != nil || len(rows) != 1 || !rows[0].Internal {
		t.Errorf("list -json: %d %v %+v", code, err, rows)
	}
}
