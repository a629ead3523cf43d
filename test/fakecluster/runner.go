package fakecluster

import (
	"bytes"
	"cmp"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/nomad/api"
)

// allocRunner is the client side of one allocation: it registers the
// group's services in Consul, starts the prestart sidecar tasks and then
// the main tasks with the raw_exec driver, restarts them by the restart
// policy, and on stop deregisters the services, waits the shutdown delay,
// kills the main tasks and then the sidecars.
type allocRunner struct {
	n        *Nomad
	log      *slog.Logger
	id       string
	a        *alloc // read-only copy of what the runner needs
	tg       *api.TaskGroup
	dir      string
	stopCh   chan struct{}
	stopOnce sync.Once

	// pending are the changes not yet reported to the server (see
	// Options.ClientSyncInterval); syncMu guards it.
	syncMu  sync.Mutex
	pending []func(a *alloc)
}

func newAllocRunner(n *Nomad, a *alloc) *allocRunner {
	cp := *a
	cp.Ports = append([]allocPort(nil), a.Ports...)
	cp.TaskStates = nil
	cp.runner = nil
	return &allocRunner{
		n: n, id: a.ID, a: &cp, tg: jobGroup(cp.Job, cp.TaskGroup),
		log:    n.log.With("alloc", a.ID[:8], "job", a.JobID),
		dir:    filepath.Join(n.opts.DataDir, "alloc", a.ID),
		stopCh: make(chan struct{}),
	}
}

func (r *allocRunner) stop() { r.stopOnce.Do(func() { close(r.stopCh) }) }

// setTask changes one task's state and publishes the allocation.
func (r *allocRunner) setTask(task string, f func(ts *api.TaskState)) {
	r.report(func(a *alloc) {
		ts := a.TaskStates[task]
		if ts == nil {
			ts = &api.TaskState{State: "pending"}
			a.TaskStates[task] = ts
		}
		f(ts)
	})
}

func (r *allocRunner) event(task string, e *api.TaskEvent, f func(ts *api.TaskState)) {
	r.setTask(task, func(ts *api.TaskState) {
		ts.Events = append(ts.Events, e)
		if len(ts.Events) > 10 { // Nomad keeps the last 10 events
			ts.Events = ts.Events[len(ts.Events)-10:]
		}
		if e.FailsTask {
			ts.Failed = true
		}
		if f != nil {
			f(ts)
		}
	})
}

// failAll marks every task dead and failed with the same event (the
// allocation cannot start at all).
func (r *allocRunner) failAll(e func() *api.TaskEvent) {
	r.report(func(a *alloc) {
		for _, t := range r.tg.Tasks {
			ev := e()
			a.TaskStates[t.Name] = &api.TaskState{State: "dead", Failed: true, FinishedAt: time.Now(), Events: []*api.TaskEvent{ev}}
		}
	})
}

// report queues a change of the allocation for the next sync with the
// server, or applies it at once when syncing is off.
func (r *allocRunner) report(f func(a *alloc)) {
	if r.n.opts.ClientSyncInterval < 0 {
		r.n.updateAlloc(r.id, f)
		return
	}
	r.syncMu.Lock()
	r.pending = append(r.pending, f)
	r.syncMu.Unlock()
}

// sync reports every queued change in one update, as a Nomad client's
// batched allocation update does.
func (r *allocRunner) sync() {
	r.syncMu.Lock()
	fs := r.pending
	r.pending = nil
	r.syncMu.Unlock()
	if len(fs) == 0 {
		return
	}
	r.n.updateAlloc(r.id, func(a *alloc) {
		for _, f := range fs {
			f(a)
		}
	})
}

// run runs the allocation's tasks to their end, reporting their changes
// every ClientSyncInterval and once more at the end.
func (r *allocRunner) run() {
	every := r.n.opts.ClientSyncInterval
	if every <= 0 {
		r.runTasks()
		r.sync()
		return
	}
	done, synced := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(synced)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r.sync()
			}
		}
	}()
	r.runTasks()
	close(done)
	<-synced // one batch at a time, in order
	r.sync()
}

func (r *allocRunner) runTasks() {
	var sidecars, mains []*api.Task
	for _, t := range r.tg.Tasks {
		switch lc := t.Lifecycle; {
		case lc == nil || lc.Hook == "":
			mains = append(mains, t)
		case lc.Hook == api.TaskLifecycleHookPrestart && lc.Sidecar:
			sidecars = append(sidecars, t)
		default:
			msg := fmt.Sprintf("fake cluster: task %q: lifecycle hook %q (sidecar %v) is not supported; only prestart sidecars and main tasks", t.Name, lc.Hook, lc.Sidecar)
			r.failAll(func() *api.TaskEvent {
				return newTaskEvent(api.TaskSetupFailure, "", func(e *api.TaskEvent) { e.SetupError = msg; e.FailsTask = true })
			})
			return
		}
	}
	unsupported := ""
	for _, t := range r.tg.Tasks {
		switch {
		case len(t.Artifacts) > 0:
			unsupported = fmt.Sprintf("fake cluster: task %q: artifacts are not supported", t.Name)
		case len(t.Templates) > 0:
			unsupported = fmt.Sprintf("fake cluster: task %q: templates are not supported", t.Name)
		}
	}
	for _, s := range r.tg.Services {
		if s.Connect != nil {
			unsupported = fmt.Sprintf("fake cluster: service %q: Consul Connect is not supported", s.Name)
		}
	}
	if unsupported != "" {
		r.failAll(func() *api.TaskEvent {
			return newTaskEvent(api.TaskSetupFailure, "", func(e *api.TaskEvent) { e.SetupError = unsupported; e.FailsTask = true })
		})
		return
	}
	for _, t := range r.tg.Tasks {
		if t.Driver != "raw_exec" {
			msg := fmt.Sprintf("fake cluster: driver %q is not available on the fake client (raw_exec only)", t.Driver)
			r.failAll(func() *api.TaskEvent {
				return newTaskEvent(api.TaskDriverFailure, "", func(e *api.TaskEvent) { e.DriverError = msg; e.FailsTask = true })
			})
			return
		}
	}
	r.report(func(a *alloc) {
		for _, t := range r.tg.Tasks {
			a.TaskStates[t.Name] = &api.TaskState{State: "pending", Events: []*api.TaskEvent{
				newTaskEvent(api.TaskReceived, "", nil),
				newTaskEvent(api.TaskSetup, "Building Task Directory", func(e *api.TaskEvent) { e.Details = map[string]string{"message": "Building Task Directory"} }),
			}}
		}
	})
	if err := os.MkdirAll(filepath.Join(r.dir, "alloc", "logs"), 0o755); err != nil {
		r.failAll(func() *api.TaskEvent {
			return newTaskEvent(api.TaskSetupFailure, "", func(e *api.TaskEvent) { e.SetupError = err.Error(); e.FailsTask = true })
		})
		return
	}

	services, err := r.registerServices()
	if err != nil {
		r.log.Warn("registering the group's services failed", "err", err)
	}

	failed := make(chan string, len(r.tg.Tasks))
	var runners []*taskRunner
	start := func(t *api.Task) *taskRunner {
		tr := newTaskRunner(r, t, failed)
		runners = append(runners, tr)
		go tr.run()
		return tr
	}
	var side []*taskRunner
	for _, t := range sidecars {
		side = append(side, start(t))
	}
	// Main tasks start once every prestart sidecar is running.
	ready := true
	for _, tr := range side {
		select {
		case <-tr.started:
		case <-r.stopCh:
			ready = false
		}
		if !ready || tr.gaveUp.Load() {
			ready = false
			break
		}
	}
	var main []*taskRunner
	if ready {
		for _, t := range mains {
			main = append(main, start(t))
		}
	}

	var failedTask string
	select {
	case <-r.stopCh:
	case failedTask = <-failed:
	}

	// Leave Consul first, so nothing routes to the instance while it stops.
	for _, id := range services {
		r.n.consul.Deregister(id)
	}
	if failedTask != "" {
		for _, tr := range runners {
			if tr.task.Name != failedTask {
				tr.kill(failedTask)
			}
		}
		for _, tr := range runners {
			<-tr.done
		}
		r.finishUnstarted(mains, ready)
		return
	}
	if d := r.shutdownDelay(); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-r.n.quit:
			t.Stop()
		}
	}
	for _, tr := range main {
		tr.kill("")
	}
	for _, tr := range main {
		<-tr.done
	}
	for _, tr := range side {
		tr.kill("")
	}
	for _, tr := range side {
		<-tr.done
	}
	r.finishUnstarted(mains, ready)
}

// finishUnstarted marks main tasks that never started (the allocation
// stopped or failed while its sidecars were starting) dead.
func (r *allocRunner) finishUnstarted(mains []*api.Task, started bool) {
	if started {
		return
	}
	r.report(func(a *alloc) {
		for _, t := range mains {
			if ts := a.TaskStates[t.Name]; ts != nil && ts.State == "pending" {
				ts.State, ts.FinishedAt = "dead", time.Now()
			}
		}
	})
}

// shutdownDelay is the group's shutdown_delay, or the cluster's override.
func (r *allocRunner) shutdownDelay() time.Duration {
	switch d := r.n.opts.ShutdownDelay; {
	case d > 0:
		return d
	case d < 0:
		return 0
	}
	return deref(r.tg.ShutdownDelay)
}

// registerServices registers the group's Consul services with their checks,
// interpolated for this allocation, as Nomad's group service hook does
// before the tasks start. It returns the registered service IDs.
func (r *allocRunner) registerServices() ([]string, error) {
	vars := allocVars(r.a, nil, "", filepath.Join(r.dir, "alloc"))
	port := func(label string) int {
		for _, p := range r.a.Ports {
			if p.Label == label {
				return p.Value
			}
		}
		if n, err := strconv.Atoi(label); err == nil {
			return n
		}
		return 0
	}
	var ids []string
	var errs []error
	for _, s := range r.tg.Services {
		if s.Provider != "" && s.Provider != api.ServiceProviderConsul {
			errs = append(errs, fmt.Errorf("service %s: provider %q is not supported by the fake cluster", s.Name, s.Provider))
			continue
		}
		name := interpolate(s.Name, vars)
		label := interpolate(s.PortLabel, vars)
		id := "_nomad-task-" + r.id + "-group-" + r.a.TaskGroup + "-" + name + "-" + label
		reg := &consulapi.AgentServiceRegistration{
			ID: id, Name: name, Port: port(label), Address: "127.0.0.1",
			Meta: map[string]string{"external-source": "nomad"},
		}
		for _, t := range s.Tags {
			reg.Tags = append(reg.Tags, interpolate(t, vars))
		}
		for k, v := range s.Meta {
			reg.Meta[interpolate(k, vars)] = interpolate(v, vars)
		}
		for _, c := range s.Checks {
			reg.Checks = append(reg.Checks, r.checkDefinition(id, c, label, port, vars))
		}
		if err := r.n.consul.Register(reg, true); err != nil {
			errs = append(errs, fmt.Errorf("service %s: %w", name, err))
			continue
		}
		ids = append(ids, id)
	}
	return ids, errors.Join(errs...)
}

func (r *allocRunner) checkDefinition(serviceID string, c api.ServiceCheck, serviceLabel string, port func(string) int, vars map[string]string) *consulapi.AgentServiceCheck {
	label := serviceLabel
	if c.PortLabel != "" {
		label = interpolate(c.PortLabel, vars)
	}
	sum := sha1.Sum([]byte(serviceID + "\x00" + c.Name + "\x00" + c.Type + "\x00" + label))
	def := &consulapi.AgentServiceCheck{
		CheckID: "_nomad-check-" + hex.EncodeToString(sum[:]), Name: c.Name,
		Interval: c.Interval.String(), Timeout: c.Timeout.String(),
		Status: c.InitialStatus,
	}
	if c.Timeout == 0 {
		def.Timeout = ""
	}
	addr := "127.0.0.1:" + strconv.Itoa(port(label))
	switch c.Type {
	case "http":
		scheme := cmp.Or(c.Protocol, "http")
		path := interpolate(c.Path, vars)
		if !strings.HasPrefix(path, "/") {
			path = "/" + path
		}
		def.HTTP = scheme + "://" + addr + path
		def.Method = c.Method
		def.Header = c.Header
	case "tcp":
		def.TCP = addr
	default:
		// Script, gRPC and other checks are registered but never run:
		// a TTL check nobody updates keeps its initial status.
		r.log.Warn("check type not run by the fake cluster; it keeps its initial status", "check", c.Name, "type", c.Type)
		def.TTL = c.Interval.String()
		if c.Interval == 0 {
			def.TTL = "10s"
		}
		def.Interval = ""
	}
	return def
}

// taskRunner runs one task's process, restarting it by the restart policy
// until it is killed or the policy gives up.
type taskRunner struct {
	r      *allocRunner
	task   *api.Task
	failed chan<- string

	killCh    chan struct{}
	killOnce  sync.Once
	sibling   string // set before killCh closes when a sibling failed
	started   chan struct{}
	startOnce sync.Once
	done      chan struct{}
	gaveUp    atomic.Bool // the restart policy gave up; set before started closes
}

func newTaskRunner(r *allocRunner, t *api.Task, failed chan<- string) *taskRunner {
	return &taskRunner{r: r, task: t, failed: failed,
		killCh: make(chan struct{}), started: make(chan struct{}), done: make(chan struct{})}
}

func (t *taskRunner) kill(sibling string) {
	t.killOnce.Do(func() {
		t.sibling = sibling
		close(t.killCh)
	})
}

func (t *taskRunner) markStarted() { t.startOnce.Do(func() { close(t.started) }) }

func (t *taskRunner) restartPolicy() (attempts int, interval, delay time.Duration, mode string) {
	p := t.task.RestartPolicy
	if p == nil {
		p = t.r.tg.RestartPolicy
	}
	attempts, interval, delay, mode = 2, 30*time.Minute, 15*time.Second, "fail"
	if p != nil {
		if p.Attempts != nil {
			attempts = *p.Attempts
		}
		if p.Interval != nil {
			interval = *p.Interval
		}
		if p.Delay != nil {
			delay = *p.Delay
		}
		if p.Mode != nil {
			mode = *p.Mode
		}
	}
	return
}

func (t *taskRunner) run() {
	defer close(t.done)
	defer t.markStarted()
	name := t.task.Name
	attempts, interval, delay, mode := t.restartPolicy()
	var restarts []time.Time
	for {
		select {
		case <-t.killCh:
			t.r.setTask(name, func(ts *api.TaskState) {
				if ts.State != "dead" {
					ts.State, ts.FinishedAt = "dead", time.Now()
				}
			})
			return
		default:
		}
		proc, err := t.start()
		if err != nil {
			t.r.event(name, newTaskEvent(api.TaskDriverFailure, "", func(e *api.TaskEvent) {
				e.DriverError = "failed to launch command with executor: " + err.Error()
			}), nil)
		} else {
			t.r.event(name, newTaskEvent(api.TaskStarted, "", nil), func(ts *api.TaskState) {
				ts.State = "running"
				if ts.StartedAt.IsZero() {
					ts.StartedAt = time.Now()
				}
			})
			t.markStarted()
			select {
			case <-proc.done:
				code, sig := exitStatus(proc.state)
				t.r.event(name, newTaskEvent(api.TaskTerminated, "", func(e *api.TaskEvent) { e.ExitCode, e.Signal = code, sig }), nil)
			case <-t.killCh:
				t.stopProcess(proc)
				return
			}
		}
		// The task ended on its own: restart it, or give up.
		now := time.Now()
		kept := restarts[:0]
		for _, at := range restarts {
			if now.Sub(at) < interval {
				kept = append(kept, at)
			}
		}
		restarts = kept
		if len(restarts) >= attempts {
			reason := fmt.Sprintf("Exceeded allowed attempts %d in interval %v and mode is %q", attempts, interval, mode)
			t.r.event(name, newTaskEvent(api.TaskNotRestarting, "", func(e *api.TaskEvent) {
				e.RestartReason, e.FailsTask = reason, true
			}), func(ts *api.TaskState) { ts.State, ts.FinishedAt = "dead", time.Now() })
			t.gaveUp.Store(true)
			t.failed <- name
			return
		}
		restarts = append(restarts, now)
		t.r.event(name, newTaskEvent(api.TaskRestarting, "", func(e *api.TaskEvent) {
			e.RestartReason, e.StartDelay = api.AllocRestartReasonWithinPolicy, int64(delay)
		}), func(ts *api.TaskState) {
			ts.State = "pending"
			ts.Restarts++
			ts.LastRestart = time.Now()
		})
		timer := time.NewTimer(delay)
		select {
		case <-timer.C:
		case <-t.killCh:
			timer.Stop()
		}
	}
}

// process is one started task process.
type process struct {
	cmd   *exec.Cmd
	done  chan struct{}
	state *os.ProcessState
	logs  []io.Closer
}

func (t *taskRunner) start() (*process, error) {
	r := t.r
	cfg := t.task.Config
	taskDir := filepath.Join(r.dir, t.task.Name)
	for _, d := range []string{filepath.Join(taskDir, "local"), filepath.Join(taskDir, "secrets")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return nil, err
		}
	}
	vars := allocVars(r.a, t.task, taskDir, filepath.Join(r.dir, "alloc"))
	cfg, _ = interpolateValue(cfg, vars).(map[string]any)
	command, _ := cfg["command"].(string)
	if command == "" {
		return nil, errors.New("missing command in the raw_exec config")
	}
	var args []string
	switch a := cfg["args"].(type) {
	case []any:
		for _, v := range a {
			args = append(args, fmt.Sprint(v))
		}
	case []string:
		args = a
	}
	bin, err := lookupBin(taskDir, command)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir = taskDir
	cmd.Env = taskEnv(vars, t.task)
	cmd.SysProcAttr = sysProcAttr()
	logDir := filepath.Join(r.dir, "alloc", "logs")
	stdout, err := os.OpenFile(filepath.Join(logDir, t.task.Name+".stdout.0"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	stderr, err := os.OpenFile(filepath.Join(logDir, t.task.Name+".stderr.0"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		stdout.Close()
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{}), logs: []io.Closer{stdout, stderr}}
	if out := r.n.opts.TaskOutput; out != nil {
		prefix := fmt.Sprintf("[%s %s %s] ", r.a.JobID, r.id[:8], t.task.Name)
		lw := &lineWriter{w: out, mu: &r.n.outMu, prefix: prefix}
		cmd.Stdout, cmd.Stderr = io.MultiWriter(stdout, lw), io.MultiWriter(stderr, lw)
		p.logs = append(p.logs, lw)
	} else {
		cmd.Stdout, cmd.Stderr = stdout, stderr
	}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		for _, c := range p.logs {
			c.Close()
		}
		return nil, err
	}
	r.n.setPID(r.id, t.task.Name, cmd.Process.Pid)
	go func() {
		_ = cmd.Wait()
		r.n.setPID(r.id, t.task.Name, 0)
		p.state = cmd.ProcessState
		for _, c := range p.logs {
			c.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// lookupBin finds a raw_exec command: absolute as is, else in the task
// directory, else on PATH (as Nomad's executor does).
func lookupBin(taskDir, command string) (string, error) {
	if filepath.IsAbs(command) {
		if _, err := os.Stat(command); err != nil {
			return "", fmt.Errorf("file %s not found", command)
		}
		return command, nil
	}
	for _, p := range []string{filepath.Join(taskDir, "local", command), filepath.Join(taskDir, command)} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	p, err := exec.LookPath(command)
	if err != nil {
		return "", fmt.Errorf("file %s not found under path", command)
	}
	return p, nil
}

// stopProcess kills a running task: its kill signal (SIGINT unless the task
// says otherwise, as Nomad does for raw_exec), then SIGKILL to its process
// group after the kill timeout.
func (t *taskRunner) stopProcess(p *process) {
	name := t.task.Name
	timeout := deref(t.task.KillTimeout)
	if timeout <= 0 {
		timeout = 5 * time.Second
	}
	select {
	case <-t.r.n.quit:
		// The cluster is closing: no time for a graceful drain.
		timeout = min(timeout, 500*time.Millisecond)
	default:
	}
	if t.sibling != "" {
		t.r.event(name, newTaskEvent(api.TaskSiblingFailed, "", func(e *api.TaskEvent) { e.FailedSibling = t.sibling }), nil)
	}
	t.r.event(name, newTaskEvent(api.TaskKilling, "", func(e *api.TaskEvent) { e.KillTimeout = timeout }), nil)
	sig := syscall.SIGINT
	if s, ok := signals[strings.ToUpper(t.task.KillSignal)]; ok {
		sig = s
	}
	_ = p.cmd.Process.Signal(sig)
	timer := time.NewTimer(timeout)
	select {
	case <-p.done:
		timer.Stop()
	case <-timer.C:
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // anything it left behind
	code, s := exitStatus(p.state)
	t.r.event(name, newTaskEvent(api.TaskTerminated, "", func(e *api.TaskEvent) { e.ExitCode, e.Signal = code, s }), nil)
	t.r.event(name, newTaskEvent(api.TaskKilled, "", nil), func(ts *api.TaskState) {
		ts.State, ts.FinishedAt = "dead", time.Now()
	})
}

var signals = map[string]syscall.Signal{
	"SIGINT": syscall.SIGINT, "SIGTERM": syscall.SIGTERM, "SIGQUIT": syscall.SIGQUIT,
	"SIGHUP": syscall.SIGHUP, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGKILL": syscall.SIGKILL,
}

func exitStatus(st *os.ProcessState) (code, sig int) {
	if st == nil {
		return -1, 0
	}
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		return ws.ExitStatus(), int(ws.Signal())
	}
	return st.ExitCode(), 0
}

// lineWriter prefixes each line written to w; lines from different tasks
// do not interleave.
type lineWriter struct {
	w      io.Writer
	mu     *sync.Mutex
	prefix string
	buf    bytes.Buffer
	lmu    sync.Mutex
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.lmu.Lock()
	defer l.lmu.Unlock()
	l.buf.Write(p)
	for {
		i := bytes.IndexByte(l.buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := l.buf.Next(i + 1)
		l.mu.Lock()
		_, _ = io.WriteString(l.w, l.prefix)
		_, _ = l.w.Write(line)
		l.mu.Unlock()
	}
	return len(p), nil
}

func (l *lineWriter) Close() error {
	l.lmu.Lock()
	defer l.lmu.Unlock()
	if l.buf.Len() > 0 {
		l.mu.Lock()
		_, _ = io.WriteString(l.w, l.prefix)
		_, _ = l.w.Write(append(l.buf.Bytes(), '\n'))
		l.mu.Unlock()
		l.buf.Reset()
	}
	return nil
}
