package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Scenario 27: a real app, not one process (raw_exec, so on the suite's own
// agents). A service whose group runs an init step (a prestart task that
// writes a migration's result into the allocation's shared directory), a
// helper beside the app (a poststart sidecar that writes its own file and
// keeps running) and clean-up after it (poststop):
//   - deploy: ready; the app serves what the migration and the helper
//     wrote; `logs -task migrate` reads the init step's log; Nomad ran the tasks in the order their hooks say (the
//     migration ended before the app started; the helper started after
//     it); the queue-proxy is a main task started with the app;
//   - wake from zero with the init step in the way: served, and the wake's
//     timeline has the init step, marked as the app's;
//   - a migration that fails (exit 3, a line on stderr): deploy exits
//     non-zero, names the task and shows the end of its stderr; traffic
//     stays on the revision before.
//
// The host volume and a docker app with an init step are scenario 18's
// (raw_exec has no volume mounts).
func TestE2E27RealApp(t *testing.T) {
	h := newHarness(t, "27 real app")
	const svc = "e2e-realapp"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-27", "", "")

	migrate := `echo "migrated by $NOMAD_ALLOC_ID" > "$NOMAD_ALLOC_DIR/data/migration.txt"; echo "migration: 3 steps applied" >&2; sleep 0.05`
	file := h.writeRealApp("realapp.hcl", svc, migrate)
	start := time.Now()
	out := h.deploy(file)
	h.timing("deploy with init step -> ready", time.Since(start))
	if r := out.Ready[rev]; r.Passing != 1 {
		t.Fatalf("deploy did not report %s ready: %+v", rev, out.Ready)
	}
	alloc := h.waitRunning(rev, 1, 30*time.Second)[0].ID

	// The app serves what the init step and the helper wrote into the
	// allocation's shared directory.
	for _, want := range []struct{ file, content string }{
		{"migration.txt", "migrated by " + alloc},
		{"helper.txt", "helper up in " + alloc},
	} {
		eventually(t, 20*time.Second, "the app serves "+want.file, func() (bool, string) {
			code, body := getHost(g, svc, "/file?path="+allocDataDir(h, alloc)+"/"+want.file)
			return code == 200 && strings.TrimSpace(body) == want.content, fmt.Sprintf("%d %q", code, body)
		})
	}

	// logs reads a named task's log.
	if out := h.mustCLI("logs", "-task", "migrate", "-stderr", "-follow=false", svc); !strings.Contains(out, "migration: 3 steps applied") {
		t.Errorf("logs -task migrate -stderr: want the migration's stderr, got:\n%s", out)
	}

	// Nomad ran them in their hooks' order. The client reports task
	// states in batches (Nomad 1.6 a moment after the helper already
	// wrote its file), so wait for the helper's start to be known.
	var states map[string]*nomad.TaskState
	eventually(t, 20*time.Second, "Nomad reports the poststart helper started", func() (bool, string) {
		info, _, err := h.nomad.Allocations().Info(alloc, nil)
		if err != nil {
			return false, err.Error()
		}
		states = info.TaskStates
		ts := states["helper"]
		return ts != nil && !ts.StartedAt.IsZero(), fmt.Sprintf("helper %+v", ts)
	})
	started := func(task string) time.Time {
		if ts := states[task]; ts != nil {
			return ts.StartedAt
		}
		return time.Time{}
	}
	finished := func(task string) time.Time {
		if ts := states[task]; ts != nil {
			return ts.FinishedAt
		}
		return time.Time{}
	}
	if ts := states["migrate"]; ts == nil || ts.State != "dead" || ts.Failed {
		t.Errorf("migrate task: %+v, want dead and not failed", ts)
	}
	if f, s := finished("migrate"), started(spec.UserTaskName); f.IsZero() || s.Before(f) {
		t.Errorf("the app started at %s, before the migration finished at %s", s, f)
	}
	if s, app := started("helper"), started(spec.UserTaskName); s.IsZero() || s.Before(app) {
		t.Errorf("the poststart helper started at %s, before the app at %s", s, app)
	}
	if ts := states["cleanup"]; ts == nil || ts.State != "pending" {
		t.Errorf("the poststop task is %+v, want pending while the instance runs", ts)
	}
	// The queue-proxy starts with the app, not before it.
	proxy, app := started(spec.SidecarTaskName), started(spec.UserTaskName)
	t.Logf("task starts: migrate finished %s, app %s, queue-proxy %s, helper %s",
		finished("migrate").Format("15:04:05.000"), app.Format("15:04:05.000"), proxy.Format("15:04:05.000"), started("helper").Format("15:04:05.000"))
	h.timing("queue-proxy task start - app task start (started together)", proxy.Sub(app))
	job, _, err := h.nomad.Jobs().Info(rev, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range job.TaskGroups[0].Tasks {
		if task.Name == spec.SidecarTaskName && task.Lifecycle != nil && task.Lifecycle.Hook != "" {
			t.Errorf("queue-proxy lifecycle %+v, want none: a main task beside the app", task.Lifecycle)
		}
		if task.Name == spec.UserTaskName && !task.Leader {
			t.Error("the app task is not the group's leader")
		}
	}

	// Wake from zero with the init step in the way: served, and the
	// timeline shows the init step as the app's time.
	for i := 1; i <= 3; i++ {
		h.waitZero(rev, 90*time.Second)
		cs := h.wake(g, svc, rev, "raw_exec+init")
		t.Logf("wake %d: %v", i, cs.Split())
		tl := h.lastWake(svc, rev)
		at, ok := tl.At(spec.WakeInitDone)
		if !ok {
			t.Errorf("wake %d: the timeline has no %s step: %s", i, spec.WakeInitDone, tl.Summary())
			continue
		}
		if spec.WakeInitDone.Whose() != spec.WhoseApp {
			t.Errorf("the init step's time is %s's, want the app's", spec.WakeInitDone.Whose())
		}
		if recv, ok := tl.At(spec.WakeReceived); ok {
			h.timing("client received -> init steps done", at.Sub(recv))
		}
		if appTask, ok := tl.At(spec.WakeAppTask); ok && appTask.Before(at) {
			t.Errorf("wake %d: the app task started %s before the init steps were done", i, at.Sub(appTask))
		}
	}

	// A failing migration: deploy says which task and shows its stderr;
	// the route stays on the revision before.
	bad := `echo "connecting to db"; echo "ERROR: relation \"users\" already exists" >&2; exit 3`
	file = h.writeRealApp("realapp.hcl", svc, bad)
	start = time.Now()
	stdout, stderr, code := h.cli("deploy", "-sidecar-command", h.bin, "-wait", "2m", file)
	h.timing("deploy with a failing init step -> exit", time.Since(start))
	if code == 0 {
		t.Fatalf("deploy of a failing migration exited 0:\n%s%s", stdout, stderr)
	}
	for _, want := range []string{"task migrate", "exited with code 3", "last lines of task migrate's stderr", `ERROR: relation "users" already exists`, "Traffic still goes where it went before"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("deploy's error lacks %q:\n%s", want, stderr)
		}
	}
	if code, body := getHost(g, svc, "/"); code != 200 {
		t.Errorf("after the failed deploy the service answers %d %q, want the revision before's answer", code, body)
	}
}

// lastWake is the last wake's timeline of a service as `status -json`
// shows it.
func (h *harness) lastWake(svc, rev string) spec.WakeTimeline {
	h.t.Helper()
	var v struct {
		LastWake *spec.WakeTimeline `json:"last_wake"`
	}
	if err := json.Unmarshal([]byte(h.mustCLI("status", "-json", svc)), &v); err != nil || v.LastWake == nil || v.LastWake.Revision != rev {
		h.t.Fatalf("status -json %s: no last wake of %s (%v)", svc, rev, err)
	}
	return *v.LastWake
}

// realAppReadinessAndScaling ends the real apps' service blocks (27, 18):
// readiness on the test app's /ready, and fast scaling to and from zero.
const realAppReadinessAndScaling = `
  readiness {
    http { path = "/ready" }
  }

  scaling {
    min                 = 0
    max                 = 2
    initial             = 1
    target              = 5
    window              = "6s"
    scale_to_zero_grace = "2s"
  }
}
`

// writeRealApp writes the service of scenario 27 with migrate as its init
// step's shell script.
func (h *harness) writeRealApp(name, svc, migrate string) string {
	h.t.Helper()
	src := fmt.Sprintf(`service %q {
  task {
    driver = "raw_exec"
    config {
      command = %q
      args    = ["testapp"]
    }
    resources {
      cpu    = 50
      memory = 64
    }
    kill_timeout = "5s"
  }

  task "migrate" {
    driver = "raw_exec"
    config {
      command = "/bin/sh"
      args    = ["-c", %q]
    }
    lifecycle { hook = "prestart" }
    resources {
      cpu    = 20
      memory = 32
    }
  }

  task "helper" {
    driver = "raw_exec"
    config {
      command = "/bin/sh"
      args    = ["-c", "echo \"helper up in $NOMAD_ALLOC_ID\" > \"$NOMAD_ALLOC_DIR/data/helper.txt\"; exec sleep 86400"]
    }
    lifecycle {
      hook    = "poststart"
      sidecar = true
    }
    resources {
      cpu    = 20
      memory = 32
    }
  }

  task "cleanup" {
    driver = "raw_exec"
    config {
      command = "/bin/sh"
      args    = ["-c", "rm -f \"$NOMAD_ALLOC_DIR/data/helper.txt\""]
    }
    lifecycle { hook = "poststop" }
    resources {
      cpu    = 20
      memory = 32
    }
  }
`+realAppReadinessAndScaling, svc, h.bin, migrate)
	return h.writeRaw(name, src)
}

// allocDataDir is the allocation's shared data directory on the node
// (NOMAD_ALLOC_DIR/data), from Nomad's alloc dir of the local dev client.
func allocDataDir(h *harness, alloc string) string {
	h.t.Helper()
	node, _, err := h.nomad.Allocations().Info(alloc, nil)
	if err != nil {
		h.t.Fatal(err)
	}
	self, err := h.nomad.Agent().Self()
	if err != nil {
		h.t.Fatal(err)
	}
	dir := ""
	if c, ok := self.Config["Client"].(map[string]any); ok {
		dir, _ = c["AllocDir"].(string)
	}
	if dir == "" {
		if dd, ok := self.Config["DataDir"].(string); ok {
			dir = dd + "/alloc"
		}
	}
	return dir + "/" + node.ID + "/alloc/data"
}

// getHost GETs path through the gateway for a service, waking it if it
// must.
func getHost(g *gateway, service, path string) (int, string) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url()+path, nil)
	if err != nil {
		return 0, err.Error()
	}
	req.Host = host(service, "")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b)
}
