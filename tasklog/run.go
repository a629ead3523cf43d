//go:build unix

package tasklog

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"
)

// waitDelay bounds how long Run waits, once the command has exited, for
// the rest of its output: a child it left running may hold the pipes open.
const waitDelay = 2 * time.Second

// Run runs the task's command with its stdout and stderr written to the
// task's log files, as Nomad's logmon would have written them, and ends
// as the command ends. It returns only when the command exited with a
// code (that code) or could not start (an exit code of 127 or 126, as a
// shell's, after saying why in the stderr file); a command killed by a
// signal kills this process with the same signal, so Nomad records the
// task's end as it would have.
//
// Everything this process is sent (Nomad's kill_signal, a SIGHUP of
// `nomad alloc signal`) goes on to the command. The command dies with
// this process (PR_SET_PDEATHSIG on Linux) and shares its process group,
// which Nomad kills whole after kill_timeout.
func Run(t Task) int {
	if t.MaxFiles == 0 {
		t.MaxFiles = MaxFiles
	}
	if t.MaxBytes == 0 {
		t.MaxBytes = MaxBytes
	}
	// The stderr file first, and as fd 2: a failure from here on is
	// told where the task's stderr is read.
	stderr, err := OpenStderr(t.Stderr, t.MaxFiles, t.MaxBytes)
	if err != nil {
		fmt.Fprintf(os.Stderr, "nomad-serverless run-task: %v\n", err)
		return 126
	}
	stdout, err := Open(t.Stdout, t.MaxFiles, t.MaxBytes)
	if err != nil {
		fmt.Fprintf(stderr, "nomad-serverless run-task: %v\n", err)
		return 126
	}
	path, err := lookup(t.Dir, t.Command)
	if err != nil {
		fmt.Fprintf(stderr, "nomad-serverless run-task: %v\n", err)
		return 127
	}
	cmd := exec.Command(path, t.Args...)
	cmd.Args[0] = t.Command
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
	cmd.SysProcAttr = childAttr()
	cmd.WaitDelay = waitDelay

	// Catch every signal before the command exists, so none sent in
	// between is lost (or kills this process with the command left).
	signals := make(chan os.Signal, 16)
	signal.Notify(signals)
	defer signal.Stop(signals)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "nomad-serverless run-task: start %s: %v\n", t.Command, err)
		return 126
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	for {
		select {
		case s := <-signals:
			if forwarded(s) {
				// The command may be gone already; Wait says how it ended.
				_ = cmd.Process.Signal(s)
			}
		case err := <-done:
			var exit *exec.ExitError
			if err != nil && !errors.As(err, &exit) && !errors.Is(err, exec.ErrWaitDelay) {
				fmt.Fprintf(stderr, "nomad-serverless run-task: wait for %s: %v\n", t.Command, err)
			}
			return endAs(cmd.ProcessState)
		}
	}
}

// forwarded tells whether a signal this process receives is the
// command's: not SIGCHLD (the command's own ending, which Wait sees) and
// not SIGURG (the Go runtime's preemption, sent to this process by itself).
func forwarded(s os.Signal) bool {
	return s != syscall.SIGCHLD && s != syscall.SIGURG
}

// endAs ends this process as the command ended: with its exit code, or
// by the signal that killed it (the process's own default action, not a
// code that only looks like one), so Nomad's task events read the same.
func endAs(ps *os.ProcessState) int {
	if ps == nil {
		return 126
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig := ws.Signal()
		signal.Reset(sig)
		_ = syscall.Kill(os.Getpid(), sig)
		// A signal whose default is to ignore it (or one still pending
		// while this thread runs) ends here: as a shell would say it.
		time.Sleep(100 * time.Millisecond)
		return 128 + int(sig)
	}
	return ps.ExitCode()
}

// lookup finds the command where Nomad's executor would (its lookupBin):
// the task's local/ directory, the task directory, an absolute path, then
// PATH; and makes it executable for everyone as Nomad does (an artifact
// is often fetched without the bit).
func lookup(taskDir, command string) (string, error) {
	path := ""
	for _, p := range []string{filepath.Join(taskDir, "local", command), filepath.Join(taskDir, command)} {
		if _, err := os.Stat(p); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if _, err := os.Stat(command); err == nil && filepath.IsAbs(command) {
			path = command
		} else if p, err := exec.LookPath(command); err == nil {
			path = p
		} else {
			return "", fmt.Errorf("binary %q could not be found (looked in %s, %s and PATH)", command, filepath.Join(taskDir, "local"), taskDir)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return "", fmt.Errorf("binary %q: %w", command, err)
	}
	if perm := fi.Mode().Perm(); perm&0o555 != 0o555 {
		// Nomad's executor runs as root and always manages; as the
		// task's user this can fail on a file the command could run
		// anyway, so only a file that stays unrunnable is an error.
		if err := os.Chmod(path, perm|0o555); err != nil && perm&0o111 == 0 {
			return "", fmt.Errorf("make %q executable: %w", path, err)
		}
	}
	return path, nil
}
