package devagents

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestDockerConfig(t *testing.T) {
	p := Ports{ConsulHTTP: 18500, ConsulGRPC: 18502, NomadHTTP: 14646, NomadRPC: 14647, NomadSerf: 14648}
	d := Docker{Endpoint: "unix:///tmp/d/docker.sock", CNIPath: "/usr/lib/cni", InfraImage: "pause:local", KeepImages: true}
	// Appended to the agent's configuration, as StartDocker writes it.
	got := hclAttrs(t, NomadConfig(p, "/tmp/d", ConfigOptions{})+d.NomadConfig())
	for k, v := range map[string]string{
		"client.cni_path":                  "/usr/lib/cni",
		"plugin.docker.config.endpoint":    "unix:///tmp/d/docker.sock",
		"plugin.docker.config.infra_image": "pause:local",
		"plugin.docker.config.gc.image":    "false",
		"plugin.raw_exec.config.enabled":   "true",
		"consul.address":                   "127.0.0.1:18500",
	} {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	// The zero value keeps Nomad's defaults: nothing but an empty plugin
	// block.
	zero := hclAttrs(t, Docker{}.NomadConfig())
	if len(zero) != 0 {
		t.Errorf("Docker{} sets %v", zero)
	}
}

func TestDockerNodeCheck(t *testing.T) {
	healthy := false
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/nodes":
			fmt.Fprint(w, `[{"ID":"0123456789abcdef"}]`)
		case "/v1/node/0123456789abcdef":
			fmt.Fprintf(w, `{"Status":"ready","Drivers":{"docker":{"Detected":%v,"Healthy":%v,"HealthDescription":"Failed to connect to docker daemon"}}}`, healthy, healthy)
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	a := agentHTTP{base: srv.URL, tokenHeader: "X-Nomad-Token"}
	err := a.dockerNodeCheck(context.Background())
	if err == nil || !strings.Contains(err.Error(), "Failed to connect to docker daemon") || !strings.Contains(err.Error(), "node 01234567") {
		t.Errorf("unhealthy driver: %v", err)
	}
	healthy = true
	if err := a.dockerNodeCheck(context.Background()); err != nil {
		t.Errorf("healthy driver: %v", err)
	}
}
