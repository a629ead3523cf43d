package devagents

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Command is a process to start: an agent (output to a log file) or the
// control plane (output through a writer).
type Command struct {
	// Name says what it is in messages ("consul", "serve").
	Name string
	Path string
	Args []string
	Env  []string
	// Output receives stdout and stderr; when nil they go to LogPath,
	// which is created.
	Output  io.Writer
	LogPath string
	// AppendLog appends to LogPath instead of truncating it, so an agent
	// started again keeps its earlier log before the new one.
	AppendLog bool
	// Stdin, when set, is the process's standard input (the read end of
	// a pipe, say); nil is /dev/null.
	Stdin *os.File
}

// Proc is a started process. It runs in its own process group, so a
// Ctrl-C at the terminal reaches only its parent (which stops everything in
// order) and a kill takes its children (Nomad's executors) with it. Every
// method is safe for concurrent use.
type Proc struct {
	Name    string
	LogPath string // "" when output goes to a writer
	cmd     *exec.Cmd
	done    chan struct{}
	err     error // valid once done is closed
}

// StartProc starts c. The process is reaped in the background; Done
// reports its end.
func StartProc(c Command) (*Proc, error) {
	cmd := exec.Command(c.Path, c.Args...)
	cmd.Env = c.Env
	if c.Stdin != nil {
		cmd.Stdin = c.Stdin
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	out := c.Output
	var logFile *os.File
	if out == nil {
		flags := os.O_RDWR | os.O_CREATE | os.O_TRUNC
		if c.AppendLog {
			flags = os.O_WRONLY | os.O_CREATE | os.O_APPEND
		}
		f, err := os.OpenFile(c.LogPath, flags, 0o666)
		if err != nil {
			return nil, fmt.Errorf("start %s: log file: %w", c.Name, err)
		}
		logFile, out = f, f
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("start %s (%s %s): %w", c.Name, c.Path, strings.Join(c.Args, " "), err)
	}
	p := &Proc{Name: c.Name, cmd: cmd, done: make(chan struct{})}
	if c.Output == nil {
		p.LogPath = c.LogPath
	}
	go func() {
		p.err = cmd.Wait()
		if logFile != nil {
			logFile.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// Pid is the process ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Done is closed when the process has ended.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Describe says how the process ended, with the end of its log. Call it
// once Done is closed.
func (p *Proc) Describe() string {
	msg := p.Name + " exited"
	if p.err != nil {
		msg = fmt.Sprintf("%s exited: %v", p.Name, p.err)
	}
	return msg + p.logTail()
}

// logTail is "\nlast lines of <log>:\n  ..." or "" without a log.
func (p *Proc) logTail() string {
	if p.LogPath == "" {
		return ""
	}
	return fmt.Sprintf("\nlast lines of %s:\n%s", p.LogPath, tail(p.LogPath, 15))
}

// Stop sends SIGINT (an agent leaves its cluster and, in dev mode, Nomad
// stops the allocations it runs), waits up to grace, then SIGKILLs the whole
// process group. It reports whether the process had to be killed.
func (p *Proc) Stop(grace time.Duration) (killed bool) {
	if p.Exited() {
		return false
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return false
	case <-t.C:
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return true
}

// tail returns the last n lines of a file, indented ("" if unreadable).
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}
