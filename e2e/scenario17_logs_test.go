package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// logsServiceHCL is scenario 17's service: the test app behind a shell that
// first starts a loop printing a numbered line with its allocation's ID to
// stdout twice a second for as long as the app runs. min is the scaling
// block's min (a change of it updates the revision in place).
func logsServiceHCL(name, bin string, min int) string {
	return fmt.Sprintf(`service %q {
  task {
    driver = "raw_exec"
    config {
      command = "/bin/sh"
      args = ["-c", "i=0; while kill -0 $$ 2>/dev/null; do i=$((i+1)); echo \"e2e-logs line $i from $NOMAD_ALLOC_ID\"; sleep 0.5; done & exec \"$0\" testapp", %q]
    }
    resources {
      cpu    = 50
      memory = 64
    }
    kill_timeout = "5s"
  }
  readiness {
    http {
      path = "/ready"
    }
  }
  concurrency = 10
  scaling {
    min                 = %d
    max                 = 3
    initial             = 1
    target              = 5
    window              = "6s"
    scale_to_zero_grace = "2s"
  }
}
`, name, bin, min)
}

// logLine is one line the loop printed, as logs shows it:
// "[<alloc8>] e2e-logs line <n> from <alloc ID>".
var logLine = regexp.MustCompile(`(?m)^\[([0-9a-f]{8})\] e2e-logs line (\d+) from ([0-9a-f-]{36})$`)

// linesByAlloc counts the loop's lines in out per allocation ID, and
// reports lines whose prefix is not the allocation that wrote them.
func linesByAlloc(out string) (map[string]int, []string) {
	n := map[string]int{}
	var wrong []string
	for _, m := range logLine.FindAllStringSubmatch(out, -1) {
		if !strings.HasPrefix(m[3], m[1]) {
			wrong = append(wrong, m[0])
		}
		n[m[3]]++
	}
	return n, wrong
}

// Scenario 17: `logs` on real agents. It shows each instance's user-task
// stdout (or stderr, or the sidecar's) through Nomad's allocation logs API,
// each line prefixed with the allocation that wrote it; following, it picks
// up an instance that starts later; at zero it says there is no instance
// and does not wake the revision.
func TestE2E17Logs(t *testing.T) {
	h := newHarness(t, "17 logs")
	if h.s.Plan.Mode == Rehearse {
		t.Skip("e2e 17: SKIPPED in a rehearsal: Nomad's allocation logs API is real agents' only (test/fakecluster does not simulate it)")
	}
	const svc = "e2e-logs"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-17", "", "")
	file := filepath.Join(h.dir, "logs.hcl")
	deployMin := func(min int) {
		t.Helper()
		if err := os.WriteFile(file, []byte(logsServiceHCL(svc, h.bin, min)), 0o644); err != nil {
			t.Fatal(err)
		}
		h.deploy(file)
	}
	deployMin(1)
	a := h.waitRunning(rev, 1, 60*time.Second)[0].ID

	// What an instance wrote, with -follow=false: whole lines, prefixed
	// with the allocation that wrote them.
	eventually(t, 30*time.Second, "logs -follow=false shows the stdout of "+a, func() (bool, string) {
		out, errOut, code := h.cli("logs", "-follow=false", "-since", "1m", svc)
		n, wrong := linesByAlloc(out)
		if len(wrong) > 0 {
			t.Fatalf("lines prefixed with another allocation: %q", wrong)
		}
		return code == 0 && n[a] >= 3, fmt.Sprintf("exit %d, lines %v: %s", code, n, errOut)
	})
	// The app's stderr, and the sidecar's (JSON lines).
	out, _, code := h.cli("logs", "-follow=false", "-since", "10m", "-stderr", svc)
	if code != 0 || !strings.Contains(out, "["+a[:8]+"] ") || !strings.Contains(out, "testapp: listening") {
		t.Errorf("logs -stderr: exit %d, want the app's \"testapp: listening\":\n%s", code, out)
	}
	out, _, code = h.cli("logs", "-follow=false", "-since", "10m", "-sidecar", "-stderr", "-revision", rev, svc)
	if code != 0 || !strings.Contains(out, "["+a[:8]+"] {") || !strings.Contains(out, `"msg":`) {
		t.Errorf("logs -sidecar -stderr: exit %d, want the sidecar's JSON log:\n%s", code, out)
	}
	if out, _, code := h.cli("logs", "-follow=false", "-since", "25h", svc); code != 2 {
		t.Errorf("logs -since 25h: exit %d, want 2 (out of bounds):\n%s", code, out)
	}

	// Following: a second instance joins while logs runs, and the lines of
	// both come out interleaved, each with its own prefix.
	follow := testbin.Start(t, h.bin, []string{"logs", "-since", "0", svc}, h.env)
	eventually(t, 30*time.Second, "logs follows the new lines of "+a, func() (bool, string) {
		n, _ := linesByAlloc(follow.Output())
		return n[a] >= 2, follow.Output()
	})
	deployMin(2)
	live := h.waitRunning(rev, 2, 60*time.Second)
	b := live[0].ID
	if b == a {
		b = live[1].ID
	}
	eventually(t, 60*time.Second, "logs picks up the new instance "+b+" and interleaves both", func() (bool, string) {
		out := follow.Output()
		n, wrong := linesByAlloc(out)
		if len(wrong) > 0 {
			t.Fatalf("lines prefixed with another allocation: %q", wrong)
		}
		return strings.Contains(out, "new instance: "+rev+" "+b[:8]) && n[a] >= 4 && n[b] >= 2, fmt.Sprintf("lines %v", n)
	})
	_ = follow.Signal(syscall.SIGINT)
	if code, err := follow.Wait(15 * time.Second); err != nil || code != 0 {
		t.Errorf("logs after SIGINT: exit %d, %v", code, err)
	}
	t.Logf("logs output following two instances (first lines):\n%s", firstLines(follow.Output(), 12))

	// At zero there is nothing to show, logs says so, and it wakes nothing.
	deployMin(0)
	h.waitZero(rev, 90*time.Second)
	logsStart := time.Now()
	out, errOut, code := h.cli("logs", "-follow=false", svc)
	for _, want := range []string{"no instance of " + svc + " is running", rev + " is at zero", "logs does not wake it"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("logs at zero does not say %q:\n%s%s", want, out, errOut)
		}
	}
	if code != 1 {
		t.Errorf("logs -follow=false at zero: exit %d, want 1", code)
	}
	waiting := testbin.Start(t, h.bin, []string{"logs", "-since", "0", svc}, h.env)
	eventually(t, 30*time.Second, "logs at zero waits for an instance", func() (bool, string) {
		return strings.Contains(waiting.Output(), "waiting for an instance to start"), waiting.Output()
	})
	if n, err := h.groupCount(rev); err != nil || n != 0 {
		t.Fatalf("count of %s with logs running: %d %v, want 0", rev, n, err)
	}
	if ups := ScaleUpsFromZero(h.scalingEvents(rev), logsStart); len(ups) != 0 {
		t.Errorf("logs woke %s: scale-ups from zero since it ran: %v", rev, ups)
	}
	// A request wakes the revision; the waiting logs follows the new
	// instance.
	o := g.request(svc, "", "/", NewClient(1)).Do(context.Background())
	if !o.OK() {
		t.Fatalf("request at zero: %s", o.Describe())
	}
	eventually(t, 60*time.Second, "logs follows the instance the request woke", func() (bool, string) {
		out := waiting.Output()
		n, _ := linesByAlloc(out)
		total := 0
		for _, c := range n {
			total += c
		}
		return strings.Contains(out, "new instance: "+rev) && total >= 2, out
	})
	_ = waiting.Signal(syscall.SIGINT)
	if code, err := waiting.Wait(15 * time.Second); err != nil || code != 0 {
		t.Errorf("logs after SIGINT: exit %d, %v", code, err)
	}
	t.Logf("logs output from zero to a woken instance (first lines):\n%s", firstLines(waiting.Output(), 8))

	// status says why a revision is not ready, from Nomad and Consul: here
	// an app that never passes its readiness check. (The check's output is
	// not asserted: a check that starts critical and stays critical changes
	// only its output, which a Consul agent passes to the catalog only every
	// check_update_interval, 5 minutes by default.)
	const stuck = "e2e-notready"
	h.cleanupService(stuck)
	ns := testService(stuck)
	ns.Env["TESTAPP_READY_DELAY"] = "1h"
	ns.Scaling.Min = 1
	h.mustCLI("deploy", "-sidecar-command", h.bin, "-detach", h.writeServices("notready.hcl", ns))
	eventually(t, 60*time.Second, "status explains why "+revision(stuck, 1)+" is not ready", func() (bool, string) {
		out, _, code := h.cli("status", stuck)
		return code == 0 && strings.Contains(out, "Not ready:\n  "+revision(stuck, 1)+": 0 of 1 ready; allocations 1 running"), out
	})
}

func firstLines(s string, n int) string {
	lines := strings.SplitAfter(s, "\n")
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "")
}
