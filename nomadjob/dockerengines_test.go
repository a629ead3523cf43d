package nomadjob

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestDockerAnnounces(t *testing.T) {
	for _, c := range []struct {
		name     string
		versions []string
		want     bool
	}{
		{"no docker node", nil, false},
		{"28.0.0, the first that announces", []string{"28.0.0"}, true},
		{"every one 28 or later", []string{"28.5.2", "29.1.0", "v30.0.0"}, true},
		{"Debian 12's docker.io", []string{"20.10.24+dfsg1"}, false},
		{"27, one short", []string{"28.5.2", "27.5.1"}, false},
		{"a version Nomad did not fingerprint", []string{"28.5.2", ""}, false},
		{"not a version", []string{"library-import"}, false},
	} {
		var engines []DockerEngine
		for i, v := range c.versions {
			engines = append(engines, DockerEngine{Node: string(rune('a' + i)), Version: v})
		}
		if got := DockerAnnounces(engines); got != c.want {
			t.Errorf("%s: DockerAnnounces(%v) = %v, want %v", c.name, c.versions, got, c.want)
		}
	}
}

// The node lists Nomad 1.6.5 and 2.0.5 answered (recorded, each with a dev
// agent's docker: Debian's 20.10 and a moby 28.5.2 built here) carry the
// docker version in the list itself; nodes that are down are left out.
func TestDockerEnginesFromRecordedNodeLists(t *testing.T) {
	for _, c := range []struct {
		file     string
		version  string
		announce bool
	}{
		{"nomad-1.6.5-docker-20.10.24.json", "20.10.24+dfsg1", false},
		{"nomad-2.0.5-docker-28.5.2.json", "28.5.2", true},
	} {
		t.Run(c.file, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("testdata", "nodes", c.file))
			if err != nil {
				t.Fatal(err)
			}
			// A second node, down, with an old engine: not counted.
			var nodes []map[string]any
			if err := json.Unmarshal(b, &nodes); err != nil || len(nodes) != 1 {
				t.Fatalf("recorded list: %v, %d nodes", err, len(nodes))
			}
			downJSON := strings.Replace(strings.Replace(string(b[1:len(b)-1]), `"Status":"ready"`, `"Status":"down"`, 1), `"driver.docker.version":"`+c.version+`"`, `"driver.docker.version":"19.03.1"`, 1)
			list := "[" + string(b[1:len(b)-1]) + "," + downJSON + "]"
			var paths []string
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				paths = append(paths, r.URL.Path)
				if r.URL.Path != "/v1/nodes" {
					http.NotFound(w, r)
					return
				}
				w.Header().Set("X-Nomad-Index", "10")
				w.Write([]byte(list))
			}))
			t.Cleanup(srv.Close)
			engines, err := newClientAt(t, srv.URL).DockerEngines(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if len(engines) != 1 || engines[0].Version != c.version || engines[0].Node == "" {
				t.Fatalf("engines %+v, want the ready node's %s", engines, c.version)
			}
			if got := DockerAnnounces(engines); got != c.announce {
				t.Errorf("DockerAnnounces = %v, want %v", got, c.announce)
			}
			if !slices.Equal(paths, []string{"/v1/nodes"}) {
				t.Errorf("requests %v, want the node list alone", paths)
			}
		})
	}
}

func TestDockerEnginesWithoutNodeRead(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "Permission denied", http.StatusForbidden)
	}))
	t.Cleanup(srv.Close)
	_, err := newClientAt(t, srv.URL).DockerEngines(testCtx(t))
	if !errors.Is(err, ErrPermission) || !strings.Contains(err.Error(), "list nodes") || !strings.Contains(err.Error(), "node:read") {
		t.Fatalf("err = %v, want a permission error naming node:read", err)
	}
}

// Beside a published docker container the queue-proxy starts with the app
// only when the cluster's engines announce; beside podman, or in bridge
// mode, the option changes nothing.
func TestCompileDockerAnnouncesMovesOnlyTheDockerProxy(t *testing.T) {
	image := spec.Template{Task: spec.Task{Driver: "docker", Port: 80, Config: map[string]any{"image": "nginx:1"}}, Network: spec.Network{Mode: spec.NetworkHost}}
	podman := image
	podman.Task.Driver = "podman"
	for _, c := range []struct {
		name      string
		t         spec.Template
		announces bool
		wantHook  string
	}{
		{"docker, old engines", image, false, api.TaskLifecycleHookPoststart},
		{"docker, engines announce", image, true, ""},
		{"podman, whatever docker does", podman, true, api.TaskLifecycleHookPoststart},
	} {
		got := sidecarLifecycle(c.t, Options{DockerAnnounces: c.announces})
		hook := ""
		if got != nil {
			hook = got.Hook
		}
		if hook != c.wantHook {
			t.Errorf("%s: queue-proxy hook %q, want %q", c.name, hook, c.wantHook)
		}
	}
}
