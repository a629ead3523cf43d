//go:build unix

package tasklog

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The test binary plays two more parts, chosen by TASKLOG_ROLE: "runner"
// (this package's Run, as `nomad-serverless run-task` runs it under
// Nomad) and "app" (the task's command, doing what TASKLOG_APP says).
func TestMain(m *testing.M) {
	switch os.Getenv("TASKLOG_ROLE") {
	case "runner":
		args := os.Args[1:]
		t, err := TaskFromEnv(os.Getenv, args[0], args[1:])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		// The command the runner starts is this binary again, as the app.
		os.Setenv("TASKLOG_ROLE", "app")
		if n, _ := strconv.Atoi(os.Getenv("TASKLOG_MAX_BYTES")); n > 0 {
			t.MaxFiles, t.MaxBytes = 3, int64(n)
		}
		os.Exit(Run(t))
	case "app":
		os.Exit(app(os.Getenv("TASKLOG_APP")))
	}
	os.Exit(m.Run())
}

// app is the task's command: it says which it is on both streams, then
// does as told.
func app(what string) int {
	fmt.Println("out: started", os.Args[0])
	fmt.Fprintln(os.Stderr, "err: started")
	switch what {
	case "exit3":
		return 3
	case "lines":
		for i := range 40 {
			fmt.Printf("line %02d\n", i)
		}
		return 0
	case "wait-term":
		// Nomad's kill_signal reaches the app through the runner.
		s := make(chan os.Signal, 1)
		signal.Notify(s, syscall.SIGTERM, syscall.SIGHUP)
		fmt.Println("out: ready")
		for {
			switch <-s {
			case syscall.SIGHUP:
				fmt.Println("out: reloaded")
			case syscall.SIGTERM:
				fmt.Fprintln(os.Stderr, "err: terminating")
				return 0
			}
		}
	case "killed":
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute)
	}
	return 0
}

// task is an allocation directory as Nomad lays it out, for task "user".
type task struct {
	alloc, dir string
}

func newTask(t *testing.T) task {
	t.Helper()
	root := t.TempDir()
	tk := task{alloc: filepath.Join(root, "alloc"), dir: filepath.Join(root, "user")}
	for _, d := range []string{filepath.Join(tk.alloc, "logs"), filepath.Join(tk.dir, "local")} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return tk
}

// runner is the runner process for command and args, with the task's
// NOMAD_* environment.
func (tk task) runner(t *testing.T, appMode string, extraEnv []string, command string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], append([]string{command}, args...)...)
	cmd.Env = append(os.Environ(), "TASKLOG_ROLE=runner", "NOMAD_ALLOC_DIR="+tk.alloc, "NOMAD_TASK_NAME=user",
		"NOMAD_TASK_DIR="+filepath.Join(tk.dir, "local"), "TASKLOG_APP="+appMode)
	cmd.Env = append(cmd.Env, extraEnv...)
	cmd.Dir = tk.dir
	return cmd
}

func (tk task) log(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tk.alloc, "logs", name))
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return string(b)
}

// appBinary links the test binary into dir under name, as a task's
// artifact would land there.
func appBinary(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.Symlink(os.Args[0], filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func TestRunWritesBothStreamsUnderNomadsNamesAndExitsWithTheCode(t *testing.T) {
	tk := newTask(t)
	appBinary(t, filepath.Join(tk.dir, "local"), "app")
	// "app", not a path: found in local/ first, as Nomad looks.
	out, err := runAsApp(tk.runner(t, "exit3", nil, "app"))
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 3 {
		t.Fatalf("runner ended %v, want exit code 3 (output %q)", err, out)
	}
	if len(out) != 0 {
		t.Errorf("the runner's own stdout and stderr got %q; everything belongs in the files", out)
	}
	if got := tk.log(t, "user.stdout.0"); got != "out: started app\n" {
		t.Errorf("user.stdout.0 = %q (argv[0] stays the task's command)", got)
	}
	if got := tk.log(t, "user.stderr.0"); got != "err: started\n" {
		t.Errorf("user.stderr.0 = %q", got)
	}
}

// runAsApp runs the runner to its end, with its own output.
func runAsApp(cmd *exec.Cmd) ([]byte, error) {
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	return out.Bytes(), err
}

func TestRunRotatesUnderTheBounds(t *testing.T) {
	tk := newTask(t)
	cmd := tk.runner(t, "lines", []string{"TASKLOG_MAX_BYTES=64"}, os.Args[0])
	if out, err := runAsApp(cmd); err != nil {
		t.Fatalf("runner: %v (%q)", err, out)
	}
	entries, err := os.ReadDir(filepath.Join(tk.alloc, "logs"))
	if err != nil {
		t.Fatal(err)
	}
	var stdout []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "user.stdout.") {
			stdout = append(stdout, e.Name())
		}
	}
	if len(stdout) != 3 {
		t.Errorf("stdout files %v, want the newest 3 (max files 3)", stdout)
	}
	var all string
	for i := 0; i < 100; i++ {
		if b, err := os.ReadFile(filepath.Join(tk.alloc, "logs", "user.stdout."+strconv.Itoa(i))); err == nil {
			if len(b) > 64+len("line 00\n") {
				t.Errorf("user.stdout.%d holds %d bytes, over the bound of 64 by more than a write", i, len(b))
			}
			all += string(b)
		}
	}
	if !strings.HasSuffix(all, "line 39\n") {
		t.Errorf("the newest files end %q, want the last line", all[max(0, len(all)-40):])
	}
}

func TestRunPassesSignalsOnAndEndsAsTheCommandEnds(t *testing.T) {
	tk := newTask(t)
	cmd := tk.runner(t, "wait-term", nil, os.Args[0])
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	waitFor(t, func() bool { return strings.Contains(readOr(tk, "user.stdout.0"), "out: ready") }, "the app to start")
	_ = cmd.Process.Signal(syscall.SIGHUP)
	waitFor(t, func() bool { return strings.Contains(readOr(tk, "user.stdout.0"), "out: reloaded") }, "SIGHUP to reach the app")
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("runner ended %v after the app's clean exit on SIGTERM, want 0 (%q)", err, out.String())
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("the runner did not end after SIGTERM")
	}
	if got := tk.log(t, "user.stderr.0"); !strings.Contains(got, "err: terminating") {
		t.Errorf("user.stderr.0 = %q, want the app's last words", got)
	}
}

func TestRunDiesOfTheSignalThatKilledTheCommand(t *testing.T) {
	tk := newTask(t)
	out, err := runAsApp(tk.runner(t, "killed", nil, os.Args[0]))
	var exit *exec.ExitError
	if !errors.As(err, &exit) {
		t.Fatalf("runner ended %v, want killed (%q)", err, out)
	}
	if ws := exit.Sys().(syscall.WaitStatus); !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Errorf("runner ended %v, want killed by SIGKILL as its command was", exit)
	}
}

func TestRunSaysWhyTheCommandDidNotStart(t *testing.T) {
	tk := newTask(t)
	// A script fetched without its execute bit runs, as under Nomad.
	script := filepath.Join(tk.dir, "local", "hello.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\necho hello from a script\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runAsApp(tk.runner(t, "", nil, "hello.sh")); err != nil {
		t.Fatalf("script: %v (%q)", err, out)
	}
	if got := tk.log(t, "user.stdout.0"); got != "hello from a script\n" {
		t.Errorf("user.stdout.0 = %q", got)
	}

	out, err := runAsApp(tk.runner(t, "", nil, "no-such-binary"))
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 127 {
		t.Fatalf("runner ended %v, want 127 for a missing command (%q)", err, out)
	}
	if got := tk.log(t, "user.stderr.0"); !strings.Contains(got, `binary "no-such-binary" could not be found`) {
		t.Errorf("user.stderr.0 = %q, want the reason where the task's stderr is read", got)
	}
}

func TestTaskFromEnvNeedsNomadsVariables(t *testing.T) {
	env := map[string]string{"NOMAD_ALLOC_DIR": "/a/alloc", "NOMAD_TASK_NAME": "user", "NOMAD_TASK_DIR": "/a/user/local"}
	tk, err := TaskFromEnv(func(k string) string { return env[k] }, "app", []string{"x"})
	if err != nil {
		t.Fatal(err)
	}
	if tk.Dir != "/a/user" || tk.Stdout != "/a/alloc/logs/user.stdout" || tk.Stderr != "/a/alloc/logs/user.stderr" {
		t.Errorf("task %+v", tk)
	}
	delete(env, "NOMAD_TASK_DIR")
	if _, err := TaskFromEnv(func(k string) string { return env[k] }, "app", nil); err == nil {
		t.Error("no error without NOMAD_TASK_DIR")
	}
}

func readOr(tk task, name string) string {
	b, _ := os.ReadFile(filepath.Join(tk.alloc, "logs", name))
	return string(b)
}

// waitFor polls cond every 10 ms for up to 30 s (a busy machine is slow,
// never this slow).
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatalf("timed out waiting for %s", what)
}
