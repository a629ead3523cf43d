package main

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// proc is a process the benchmark started (the test app, a sidecar, a
// gateway). Its output is kept for error messages.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

// startProc runs bin args with the current environment plus env, in a
// process group of its own.
func startProc(name, bin string, args []string, env map[string]string) (*proc, error) {
	return startProcAttr(name, bin, args, env, &syscall.SysProcAttr{Setpgid: true})
}

// startProcAttr is startProc with the caller's process attributes (a peer
// proxy also dies with the benchmark: Pdeathsig).
func startProcAttr(name, bin string, args []string, env map[string]string, attr *syscall.SysProcAttr) (*proc, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = os.Environ()
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	out := &syncBuffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = attr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// waitPort waits until 127.0.0.1:port accepts connections.
func (p *proc) waitPort(port int, timeout time.Duration) error {
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(timeout)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before listening on %s:\n%s", p.name, addr, p.out.String())
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not listening on %s after %s:\n%s", p.name, addr, timeout, p.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits up to timeout, then kills.
func (p *proc) stop(timeout time.Duration) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// peakRSS is the process's high-water resident set (VmHWM), in bytes.
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, err
			}
			return kb << 10, nil
		}
	}
	return 0, errors.New("no VmHWM in /proc/" + strconv.Itoa(pid) + "/status")
}

// cpuTime is the user+system CPU time the process has used.
func cpuTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	_, cpu, err := parseStat(b)
	return cpu, err
}

// parseStat reads a /proc/<pid>/stat line: the process group and the
// user+system CPU time.
func parseStat(b []byte) (pgrp int, cpu time.Duration, err error) {
	// Fields after the command name (which may hold spaces) in parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("bad /proc stat")
	}
	f := strings.Fields(string(b[i+1:]))
	// pgrp, utime and stime are fields 5, 14 and 15 (1-based), i.e. f[2],
	// f[11], f[12].
	if len(f) < 13 {
		return 0, 0, errors.New("short /proc stat")
	}
	g, err0 := strconv.Atoi(f[2])
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err0 != nil || err1 != nil || err2 != nil {
		return 0, 0, errors.New("bad /proc stat times")
	}
	// USER_HZ is 100 on Linux.
	return g, time.Duration(u+s) * 10 * time.Millisecond, nil
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
