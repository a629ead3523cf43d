//go:build linux

package devagents

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/fakeagents"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The guard is proved on this test binary run three deep: TestGuard starts
// it with guardModeEnv set; TestMain sees the variable and becomes the
// guard (Guarded), which runs the binary once more as the guarded child;
// there TestGuardedHelper starts fake agents with devagents.Start (the fake
// Nomad leaves an "executor" in a session of its own and a "task" below it,
// both deaf to SIGINT and SIGTERM, as Nomad's are), a fake serve with
// testbin.Start and a plain `sleep` (as h.cli runs commands), and then ends
// as the mode says. TestGuard checks that every one of those processes ran,
// and that once the guard exits none is left.

const (
	// guardModeEnv is how the guarded child should end.
	guardModeEnv = "DEVAGENTS_GUARD_TEST_MODE"
	// guardDirEnv is where it writes what it started.
	guardDirEnv = "DEVAGENTS_GUARD_TEST_DIR"
)

// guarded is what TestMain hands TestGuardedHelper in a guarded child; the
// zero value everywhere else.
var guarded struct {
	g    *Guard
	mode string
}

func TestMain(m *testing.M) {
	mode := os.Getenv(guardModeEnv)
	if mode == "" {
		os.Exit(m.Run())
	}
	os.Exit(Guarded(GuardOptions{Name: "test guard", Grace: 5 * time.Second, Report: os.Stdout}, func(g *Guard) int {
		os.Unsetenv(guardModeEnv) // the fakes are this binary too
		guarded.g, guarded.mode = g, mode
		return m.Run()
	}))
}

// fixedDir is a testing.TB whose TempDir is a directory the parent test
// reads: the guarded child's own would go with its cleanup.
type fixedDir struct {
	testing.TB
	dir string
}

func (f fixedDir) TempDir() string { return f.dir }

// TestGuardedHelper is not a test: it is the guarded child's body, and
// returns at once in a normal run.
func TestGuardedHelper(t *testing.T) {
	if guarded.mode == "" {
		return
	}
	if guarded.g == nil {
		t.Fatal("no guard")
	}
	dir := os.Getenv(guardDirEnv)
	fakesDir := filepath.Join(dir, "fakes")
	agentsDir := filepath.Join(dir, "agents")
	for _, d := range []string{fakesDir, agentsDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	env := map[string]string{"FAKE_EXECUTOR": "nomad"}
	if guarded.mode == "pass" {
		env = nil
	}
	f := fakeagents.New(fixedDir{t, fakesDir}, "TestFakeAgentProcess", []string{"consul", "nomad", "serve"}, env)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := Start(ctx, Options{
		ConsulBin: f.Path("consul"), NomadBin: f.Path("nomad"), Dir: agentsDir,
		ReadyTimeout: 30 * time.Second, Poll: 20 * time.Millisecond, StopGrace: 5 * time.Second,
		Guard: guarded.g,
	})
	if err != nil {
		t.Fatal(err)
	}
	serve := testbin.Start(t, f.Path("serve"), []string{"-listen", "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t)), "-admin-listen", "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))}, nil)
	sleep := exec.Command("sleep", "120")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	if env != nil {
		testbin.Eventually(t, 30*time.Second, 20*time.Millisecond, "the fake Nomad's executor and task start", func() (bool, string) {
			pids := f.PIDs(t)
			return pids["executor"] > 0 && pids["task"] > 0, fmt.Sprint(pids)
		})
	}
	testbin.Eventually(t, 30*time.Second, 20*time.Millisecond, "the fake serve starts", func() (bool, string) {
		return f.PIDs(t)["serve"] == serve.PID(), fmt.Sprint(f.PIDs(t))
	})
	ready := fmt.Sprintf("%d %d %s\n", os.Getpid(), sleep.Process.Pid, f.Events)
	if err := os.WriteFile(filepath.Join(dir, "ready.tmp"), []byte(ready), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(filepath.Join(dir, "ready.tmp"), filepath.Join(dir, "ready")); err != nil {
		t.Fatal(err)
	}

	// The parent checks that everything runs, then says go.
	testbin.Eventually(t, time.Minute, 10*time.Millisecond, "the parent test's go", func() (bool, string) {
		_, err := os.Stat(filepath.Join(dir, "go"))
		return err == nil, fmt.Sprint(err)
	})
	switch guarded.mode {
	case "panic":
		panic("panicking on purpose, with agents, an executor, a task, serve and sleep running")
	case "pass", "pass-leaving":
		// What TestMain does: stop the agents in order. The fake Nomad
		// leaves its executor, which Stop kills; pass-leaving leaves the
		// sleep, pass nothing.
		a.Stop(5 * time.Second)
		serve.Stop(t)
		if guarded.mode == "pass" {
			sleep.Process.Kill()
			sleep.Wait()
		}
	default: // hang (until -test.timeout), kill, interrupt (the parent acts)
		select {}
	}
}

func TestGuard(t *testing.T) {
	for _, tc := range []struct {
		mode string
		// code is what the guard exits with: the child's own code, 128 +
		// the signal that ended it, or 1 for a pass that left processes.
		code int
	}{
		{"panic", 2},
		{"hang", 2},        // -test.timeout: the testing package panics
		{"kill", 137},      // SIGKILL of the guarded test process
		{"interrupt", 130}, // Ctrl-C: SIGINT to the terminal's process group
		{"pass-leaving", 1},
		{"pass", 0},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			t.Parallel()
			testGuard(t, tc.mode, tc.code)
		})
	}
}

func testGuard(t *testing.T, mode string, wantCode int) {
	dir := t.TempDir()
	timeout := "2m" // a bound: every mode but hang ends long before
	if mode == "hang" {
		timeout = "15s"
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestGuardedHelper$", "-test.timeout="+timeout)
	// GORACE: a race-enabled binary otherwise sleeps a second at exit.
	cmd.Env = append(os.Environ(), guardModeEnv+"="+mode, guardDirEnv+"="+dir, "GORACE=atexit_sleep_ms=0")
	out := &testbin.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true} // as a shell runs a job
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	// pids are the processes the guarded child started, by role, and
	// started their /proc entries once seen running.
	pids := map[string]int{}
	started := map[string]procStat{}
	t.Cleanup(func() {
		// Whatever failed, this test leaves nothing either (and kills
		// only the processes it saw, not later ones with their PIDs).
		select {
		case <-done:
		default:
			syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
		for _, st := range started {
			if now, ok := readStat(st.pid); ok && now.start == st.start {
				syscall.Kill(st.pid, syscall.SIGKILL)
			}
		}
		if t.Failed() {
			t.Logf("guard's output:\n%s", out.String())
		}
	})

	var ready []string
	testbin.Eventually(t, 60*time.Second, 20*time.Millisecond, "the guarded child starts everything", func() (bool, string) {
		select {
		case <-done:
			t.Fatalf("the guard exited before the child was ready:\n%s", out.String())
		default:
		}
		b, err := os.ReadFile(filepath.Join(dir, "ready"))
		ready = strings.Fields(string(b))
		return err == nil && len(ready) == 3, fmt.Sprint(err)
	})
	fakes := fakeagents.Fakes{Events: ready[2]}
	for role, pid := range fakes.PIDs(t) {
		pids[role] = pid
	}
	pids["guarded child"], _ = strconv.Atoi(ready[0])
	pids["sleep"], _ = strconv.Atoi(ready[1])
	want := []string{"consul", "nomad", "serve", "guarded child", "sleep", "executor", "task"}
	if mode == "pass" {
		want = want[:5]
	}
	for _, role := range want {
		// The check below can fail: each of these ran.
		if !running(pids[role]) {
			t.Fatalf("%s (pid %d) is not running; started: %v", role, pids[role], pids)
		}
		started[role], _ = readStat(pids[role])
	}

	if err := os.WriteFile(filepath.Join(dir, "go"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	switch mode {
	case "kill":
		syscall.Kill(pids["guarded child"], syscall.SIGKILL)
	case "interrupt":
		syscall.Kill(-cmd.Process.Pid, syscall.SIGINT)
	}
	select {
	case <-done:
	case <-time.After(60 * time.Second):
		t.Fatalf("the guard has not exited 60s after the child was ready (%s):\n%s", mode, out.String())
	}
	if code := cmd.ProcessState.ExitCode(); code != wantCode {
		t.Errorf("the guard exited %d, want %d", code, wantCode)
	}

	// Nothing is left: the guard reaped what it killed, so every PID is
	// gone (a zombie of someone else's, about to be reaped, counts as gone).
	for _, role := range want {
		if running(pids[role]) {
			t.Errorf("%s (pid %d) still runs after the guard exited: %s", role, pids[role], cmdline(pids[role]))
		}
	}
	// The agents were stopped gracefully, Nomad first.
	agents := slices.DeleteFunc(fakes.Stops(t), func(role string) bool { return role != "nomad" && role != "consul" })
	if !slices.Equal(agents, []string{"nomad", "consul"}) {
		t.Errorf("agents stopped: %v, want nomad then consul", agents)
	}
	for _, l := range fakes.Lines(t) {
		if strings.HasPrefix(l, "stop nomad") || strings.HasPrefix(l, "stop consul") {
			if !strings.HasSuffix(l, "signal=interrupt") {
				t.Errorf("an agent stopped with something else than SIGINT: %s", l)
			}
		}
	}

	report := out.String()
	switch mode {
	case "pass":
		if strings.Contains(report, "test guard:") {
			t.Errorf("the guard spoke after a clean pass:\n%s", report)
		}
	case "pass-leaving":
		// Agents.Stop killed what the fake Nomad left (its executor and
		// task); the sleep the test started itself is the guard's.
		for _, role := range []string{"executor", "task"} {
			if strings.Contains(report, fmt.Sprintf("pid %d ", pids[role])) {
				t.Errorf("the %s (pid %d) that Nomad left outlived Agents.Stop:\n%s", role, pids[role], report)
			}
		}
		if !strings.Contains(report, fmt.Sprintf("pid %d ", pids["sleep"])) {
			t.Errorf("the guard's report does not name the sleep (pid %d) it killed:\n%s", pids["sleep"], report)
		}
		if !strings.Contains(report, "exited 0 but left processes behind") {
			t.Errorf("the guard did not say the pass left processes:\n%s", report)
		}
	default:
		for _, s := range []string{
			fmt.Sprintf("test guard: stopping nomad (pid %d): SIGINT", pids["nomad"]),
			fmt.Sprintf("test guard: stopping consul (pid %d): SIGINT", pids["consul"]),
			fmt.Sprintf("pid %d ", pids["executor"]),
			fmt.Sprintf("pid %d ", pids["task"]),
		} {
			if !strings.Contains(report, s) {
				t.Errorf("the guard's report lacks %q:\n%s", s, report)
			}
		}
	}
}

// running reports whether pid exists and is not a zombie.
func running(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	st, ok := readStat(pid)
	return ok && st.state != "Z"
}
