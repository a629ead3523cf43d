package testbin

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StopTimeout bounds how long Stop waits after SIGTERM before SIGKILL.
const StopTimeout = 10 * time.Second

// Proc is a process started by Start. Its combined output is kept and
// printed when the test fails; it is stopped (SIGTERM, then SIGKILL after
// StopTimeout) in the test's cleanup if still running.
type Proc struct {
	Cmd  *exec.Cmd
	name string
	out  *Buffer
	done chan struct{}
	err  error // the Wait error, valid after done closes
}

// Start runs bin with args and the current environment plus env (env wins).
func Start(tb testing.TB, bin string, args []string, env map[string]string) *Proc {
	tb.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = mergeEnv(os.Environ(), env)
	out := &Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	// Own process group, so a signal sent to the test does not reach it
	// twice, and Stop can end its children too (they would otherwise hold
	// its output pipes open); on Linux it also gets SIGTERM if the test
	// process dies without stopping it (a panic, -timeout).
	cmd.SysProcAttr = sysProcAttr()
	cmd.WaitDelay = 5 * time.Second
	name := bin
	if len(args) > 0 {
		name += " " + args[0]
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("testbin: start %s: %v", name, err)
	}
	p := &Proc{Cmd: cmd, name: name, out: out, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		close(p.done)
	}()
	tb.Cleanup(func() {
		p.Stop(tb)
		if tb.Failed() {
			tb.Logf("testbin: output of %s (pid %d):\n%s", p.name, cmd.Process.Pid, p.Output())
		}
	})
	return p
}

func mergeEnv(base []string, env map[string]string) []string {
	out := make([]string, 0, len(base)+len(env))
	for _, kv := range base {
		k, _, _ := bytes.Cut([]byte(kv), []byte("="))
		if _, ok := env[string(k)]; !ok {
			out = append(out, kv)
		}
	}
	for k, v := range env {
		out = append(out, k+"="+v)
	}
	return out
}

// PID is the process ID.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// Output is everything the process wrote to stdout and stderr so far.
func (p *Proc) Output() string { return p.out.String() }

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Signal sends sig to the process.
func (p *Proc) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Wait waits up to timeout for the process to exit and returns its exit code
// (-1 if killed by a signal).
func (p *Proc) Wait(timeout time.Duration) (int, error) {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.Cmd.ProcessState.ExitCode(), nil
	case <-t.C:
		return 0, fmt.Errorf("%s (pid %d) still running after %s", p.name, p.PID(), timeout)
	}
}

// Stop sends SIGTERM, waits up to StopTimeout, then SIGKILLs. It returns
// the exit code (-1 when killed). Stopping an exited process is a no-op.
func (p *Proc) Stop(tb testing.TB) int {
	tb.Helper()
	select {
	case <-p.done:
		return p.Cmd.ProcessState.ExitCode()
	default:
	}
	_ = p.Signal(syscall.SIGTERM)
	if code, err := p.Wait(StopTimeout); err == nil {
		// Children left behind by the process go with its group.
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		return code
	}
	tb.Errorf("testbin: %s (pid %d) ignored SIGTERM for %s; killing it", p.name, p.PID(), StopTimeout)
	_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
	<-p.done
	return -1
}

// WaitPort waits until 127.0.0.1:port accepts a TCP connection, failing the
// test if the process exits first or timeout (scaled by Bound) passes.
func (p *Proc) WaitPort(tb testing.TB, port int, timeout time.Duration) {
	tb.Helper()
	if err := WaitPort(port, timeout, p.done); err != nil {
		tb.Fatalf("testbin: %s (pid %d): %v\noutput:\n%s", p.name, p.PID(), err, p.Output())
	}
}

// WaitPort waits until 127.0.0.1:port accepts a TCP connection; it gives up
// after timeout (scaled by Bound) or when stop closes (stop may be nil).
func WaitPort(port int, timeout time.Duration, stop <-chan struct{}) error {
	timeout = Bound(timeout)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not accepting connections after %s: %w", addr, timeout, err)
		}
		select {
		case <-stop:
			return errors.New("process exited before " + addr + " accepted connections")
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Eventually calls cond every poll until it reports done and returns how
// long that took; after timeout (scaled by Bound) it fails the test with
// what and the state cond last reported.
func Eventually(tb testing.TB, timeout, poll time.Duration, what string, cond func() (done bool, state string)) time.Duration {
	tb.Helper()
	timeout = Bound(timeout)
	start := time.Now()
	for {
		done, state := cond()
		if done {
			return time.Since(start)
		}
		if time.Since(start) > timeout {
			tb.Fatalf("%s: not within %s; last state: %s", what, timeout, state)
		}
		time.Sleep(poll)
	}
}

// Buffer is an io.Writer safe for concurrent writers (a process's two
// output pipes, several tasks) and readers; the zero value is empty.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String is everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
