//go:build linux

package devagents

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// prSetChildSubreaper is PR_SET_CHILD_SUBREAPER (linux/prctl.h), which the
// syscall package does not name.
const prSetChildSubreaper = 36

// sweepTimeout bounds the final kill of everything left below the guard;
// SIGKILL takes effect at once, so this is only a safety bound.
const sweepTimeout = 10 * time.Second

// Guarded runs body under a guard (see the comment at the top of guard.go)
// and returns the exit code to exit with. Call it first in TestMain (or
// main), before flags are parsed or anything is started:
//
//	os.Exit(devagents.Guarded(opts, func(g *devagents.Guard) int { flag.Parse(); return m.Run() }))
//
// In the process that was started, it runs the program again as the
// guarded child, waits for it, cleans up after it and returns its exit code
// without calling body. In that child, it calls body with the link to the
// guard. If the guard cannot be set up, it says why on Report and runs body
// unguarded.
func Guarded(o GuardOptions, body func(*Guard) int) int {
	if v, ok := os.LookupEnv(guardEnv); ok {
		return body(guardedChild(v))
	}
	o = o.withDefaults()
	code, err := runGuard(o)
	if err != nil {
		fmt.Fprintf(o.Report, "%s: not guarding (%v); running unguarded\n", o.Name, err)
		return body(nil)
	}
	return code
}

// guardedChild is the child's side: the pipe the guard passed, kept from
// the processes the child starts (close on exec: were a child to inherit it,
// the guard could not tell the pipe's end), and the variable removed so they
// do not take themselves for guarded.
func guardedChild(fdText string) *Guard {
	os.Unsetenv(guardEnv)
	fd, err := strconv.Atoi(fdText)
	if err != nil || fd < 3 {
		return nil
	}
	syscall.CloseOnExec(fd)
	return &Guard{w: os.NewFile(uintptr(fd), "guard")}
}

// reaped is a process the guard waited for.
type reaped struct {
	pid    int
	status syscall.WaitStatus
}

// registration is one StopFirst.
type registration struct {
	pid   int
	name  string
	start string // /proc start time when registered; "" if already gone
}

// guardRun is one guard's state; it lives in runGuard's frame.
type guardRun struct {
	o      GuardOptions
	reaped <-chan reaped // closed once the guard has no child left
	sigs   chan os.Signal
	// signals counts the signals received; a second one (or SIGQUIT,
	// which `go test` sends a minute after -timeout and kills a few
	// seconds later) means hurry: no more grace.
	signals int
	quit    bool
	said    bool // whether the guard has written its first line
}

func (g *guardRun) hurry() bool { return g.quit || g.signals > 1 }

func (g *guardRun) noteSignal(sig os.Signal) {
	g.signals++
	g.quit = g.quit || sig == syscall.SIGQUIT
}

func (g *guardRun) say(format string, args ...any) {
	g.said = true
	fmt.Fprintf(g.o.Report, g.o.Name+": "+format+"\n", args...)
}

func runGuard(o GuardOptions) (int, error) {
	if _, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0); errno != 0 {
		return 0, fmt.Errorf("prctl(PR_SET_CHILD_SUBREAPER): %w", errno)
	}
	exe, err := os.Executable()
	if err != nil {
		return 0, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return 0, err
	}
	cmd := exec.Command(exe, os.Args[1:]...)
	cmd.Args[0] = os.Args[0]
	cmd.Env = append(os.Environ(), guardEnv+"=3") // ExtraFiles[0] is fd 3
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.ExtraFiles = []*os.File{w}
	// Caught, not left to their default (which would end the guard): a
	// Ctrl-C reaches the guard and the child alike, and the guard's job
	// starts when the child has gone.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGQUIT)
	defer signal.Stop(sigs)
	if err := cmd.Start(); err != nil {
		r.Close()
		w.Close()
		return 0, fmt.Errorf("run %s again as the guarded child: %w", exe, err)
	}
	w.Close() // the child holds the only write end: EOF is its end
	child := cmd.Process.Pid

	regs := readRegistrations(r)
	// One goroutine waits for every child: the guarded one, and whatever
	// is orphaned to the guard (the subreaper), so nothing stays a zombie.
	// ECHILD means nothing is left below the guard: every live descendant
	// has a parent below it, or would have been reparented to it.
	exits := make(chan reaped)
	go func() {
		defer close(exits)
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, 0, nil)
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			if err != nil {
				return
			}
			exits <- reaped{pid, ws}
		}
	}()
	g := &guardRun{o: o, reaped: exits, sigs: sigs}

	var status syscall.WaitStatus
	for waiting := true; waiting; {
		select {
		case e, ok := <-exits:
			if !ok {
				return 1, nil // cannot happen: the child is ours until reaped
			}
			if e.pid == child {
				status, waiting = e.status, false
			}
		case sig := <-sigs:
			g.noteSignal(sig)
			_ = syscall.Kill(child, sig.(syscall.Signal))
		}
	}
	code, how := exitCode(status)

	var stopped []string
	for _, reg := range regs.list() {
		if g.alive(reg) {
			if !g.said {
				g.say("the guarded process ended (%s) and left processes running; stopping them", how)
			}
			stopped = append(stopped, g.stopGracefully(reg))
		}
	}
	killed, left := g.sweep()
	if len(killed) > 0 {
		if !g.said {
			g.say("the guarded process ended (%s) and left processes running; stopping them", how)
		}
		g.say("killed %d processes left behind:\n  %s", len(killed), strings.Join(killed, "\n  "))
	}
	if left > 0 {
		g.say("%d processes still there after %s", left, sweepTimeout)
	}
	if code == 0 && (len(stopped) > 0 || len(killed) > 0 || left > 0) {
		g.say("the guarded process exited 0 but left processes behind: failing the run")
		code = 1
	}
	return code, nil
}

// exitCode is the child's code (128+signal when a signal ended it, as a
// shell says) and how it ended, in words.
func exitCode(ws syscall.WaitStatus) (int, string) {
	switch {
	case ws.Exited():
		return ws.ExitStatus(), fmt.Sprintf("exit status %d", ws.ExitStatus())
	case ws.Signaled():
		return 128 + int(ws.Signal()), "killed by signal: " + ws.Signal().String()
	}
	return 1, "status " + strconv.Itoa(int(ws))
}

// registrations collects what the child sent until its end of the pipe
// closes.
type registrations struct {
	mu   sync.Mutex
	regs []registration
	eof  chan struct{}
}

func readRegistrations(r *os.File) *registrations {
	rs := &registrations{eof: make(chan struct{})}
	go func() {
		defer close(rs.eof)
		defer r.Close()
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			var reg registration
			if n, _ := fmt.Sscanf(sc.Text(), "stop-first %d %s", &reg.pid, &reg.name); n == 2 {
				// The process runs now (StopFirst follows its start):
				// its start time tells it from a later one with its PID.
				if st, ok := readStat(reg.pid); ok {
					reg.start = st.start
				}
				rs.mu.Lock()
				rs.regs = append(rs.regs, reg)
				rs.mu.Unlock()
			}
		}
	}()
	return rs
}

// list returns the registrations, last first, once the pipe is closed (or
// after a moment if something still holds it).
func (rs *registrations) list() []registration {
	select {
	case <-rs.eof:
	case <-time.After(2 * time.Second):
	}
	rs.mu.Lock()
	defer rs.mu.Unlock()
	out := make([]registration, 0, len(rs.regs))
	for i := len(rs.regs) - 1; i >= 0; i-- {
		out = append(out, rs.regs[i])
	}
	return out
}

// alive reports whether the registered process still runs (and is the one
// registered, not a newer one with its PID).
func (g *guardRun) alive(reg registration) bool {
	st, ok := readStat(reg.pid)
	return ok && reg.start != "" && st.start == reg.start && st.state != "Z"
}

// stopGracefully sends SIGINT, waits up to Grace, then SIGKILLs the
// process group, and returns what happened.
func (g *guardRun) stopGracefully(reg registration) string {
	what := fmt.Sprintf("%s (pid %d)", reg.name, reg.pid)
	kill := func(why string) string {
		_ = syscall.Kill(-reg.pid, syscall.SIGKILL)
		_ = syscall.Kill(reg.pid, syscall.SIGKILL)
		g.say("%s: %s; killed its process group", what, why)
		return what + ": killed"
	}
	if g.hurry() {
		return kill("no time for grace")
	}
	g.say("stopping %s: SIGINT, up to %s", what, g.o.Grace)
	start := time.Now()
	_ = syscall.Kill(reg.pid, syscall.SIGINT)
	deadline := time.NewTimer(g.o.Grace)
	defer deadline.Stop()
	// A registered process the guard does not parent (one started below
	// a child) is reaped by its own parent: poll for it too.
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case e, ok := <-g.reaped:
			if !ok || e.pid == reg.pid {
				g.say("%s stopped after %s", what, time.Since(start).Round(time.Millisecond))
				return what + ": stopped"
			}
		case <-tick.C:
			if !g.alive(reg) {
				g.say("%s stopped after %s", what, time.Since(start).Round(time.Millisecond))
				return what + ": stopped"
			}
		case sig := <-g.sigs:
			if g.noteSignal(sig); g.hurry() {
				return kill("signal " + sig.String() + " while stopping")
			}
		case <-deadline.C:
			return kill(fmt.Sprintf("did not stop within %s after SIGINT", g.o.Grace))
		}
	}
}

// sweep SIGKILLs every process below the guard until it has no child left,
// and returns a line for each process killed and how many were still there
// after sweepTimeout.
func (g *guardRun) sweep() (killed []string, left int) {
	seen := map[int]bool{}
	pass := func() int {
		procs := descendants(os.Getpid())
		for _, p := range procs {
			if !seen[p.pid] {
				seen[p.pid] = true
				killed = append(killed, p.String())
			}
			_ = syscall.Kill(p.pid, syscall.SIGKILL)
		}
		return len(procs)
	}
	pass()
	deadline := time.NewTimer(sweepTimeout)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case _, ok := <-g.reaped:
			if !ok {
				return killed, 0
			}
		case <-tick.C:
			pass() // a process may have forked before its kill
		case sig := <-g.sigs:
			g.noteSignal(sig)
		case <-deadline.C:
			return killed, pass()
		}
	}
}

// procStat is what the guard reads of a process in /proc/<pid>/stat.
type procStat struct {
	pid, ppid int
	state     string
	start     string // start time in clock ticks since boot
	cmdline   string
}

func (p procStat) String() string {
	return fmt.Sprintf("pid %d (parent %d): %s", p.pid, p.ppid, p.cmdline)
}

// readStat reads /proc/<pid>/stat (comm, field 2, may hold spaces and
// parentheses: the fields are counted after its last ')').
func readStat(pid int) (procStat, bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procStat{}, false
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state), f[1] field 4 (ppid), f[19] field 22
	// (starttime).
	if len(f) < 20 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(f[1])
	return procStat{pid: pid, ppid: ppid, state: f[0], start: f[19]}, true
}

// descendants are the live (not zombie) processes below pid, with their
// command lines, found by walking every process's parent in /proc.
func descendants(root int) []procStat {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	children := map[int][]procStat{}
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil {
			continue
		}
		if st, ok := readStat(pid); ok {
			children[st.ppid] = append(children[st.ppid], st)
		}
	}
	var out []procStat
	queue := []int{root}
	for len(queue) > 0 {
		parent := queue[0]
		queue = queue[1:]
		for _, c := range children[parent] {
			queue = append(queue, c.pid)
			if c.state == "Z" {
				continue
			}
			c.cmdline = cmdline(c.pid)
			out = append(out, c)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// cmdline is a process's command line, shortened for a report.
func cmdline(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	s := strings.TrimSpace(strings.ReplaceAll(string(b), "\x00", " "))
	if len(s) > 160 {
		s = s[:160] + "..."
	}
	if s == "" {
		return "?"
	}
	return s
}

// DescribeDescendants returns a line for each live process below pid
// ("pid N (parent P): command line"), found as the guard finds them; for a
// test's record of what runs.
func DescribeDescendants(pid int) []string {
	var out []string
	for _, p := range descendants(pid) {
		out = append(out, p.String())
	}
	return out
}
