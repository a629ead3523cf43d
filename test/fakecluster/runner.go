package fakecluster

import (
	"bufio"
	"cmp"
	"crypto/sha1"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
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
	a        api.Allocation // as placed; the runner reads only what does not change
	slot     int
	tg       *api.TaskGroup
	dir      string
	setupErr error
	stopCh   chan struct{}
	stopOnce sync.Once

	syncMu  sync.Mutex
	pending []func(a *alloc) // changes not yet reported to the server
}

// clientSyncInterval is how often a Nomad client sends its allocations'
// changes to the servers, in one batch (allocSyncIntv): the servers' view
// trails what runs, and Consul may list an instance passing while Nomad
// still says pending.
const clientSyncInterval = 200 * time.Millisecond

func newAllocRunner(n *Nomad, a *alloc, setupErr error) *allocRunner {
	return &allocRunner{
		n: n, a: a.Allocation, slot: a.slot,
		tg: jobGroup(a.Job, a.TaskGroup), dir: filepath.Join(n.opts.DataDir, "alloc", a.ID), setupErr: setupErr,
		stopCh: make(chan struct{}),
	}
}

func (r *allocRunner) stop() { r.stopOnce.Do(func() { close(r.stopCh) }) }

// report queues a change of the allocation for the next sync.
func (r *allocRunner) report(f func(a *alloc)) {
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
	if len(fs) > 0 {
		r.n.updateAlloc(r.a.ID, func(a *alloc) {
			for _, f := range fs {
				f(a)
			}
		})
	}
}

// event records a task event (Nomad keeps the last 10) and then lets f
// change the task's state.
func (r *allocRunner) event(task string, e *api.TaskEvent, f func(ts *api.TaskState)) {
	r.report(func(a *alloc) {
		ts := a.TaskStates[task]
		if ts == nil {
			ts = &api.TaskState{State: "pending"}
			a.TaskStates[task] = ts
		}
		if e != nil {
			ts.Events = append(ts.Events, e)
			ts.Events = ts.Events[max(0, len(ts.Events)-10):]
			ts.Failed = ts.Failed || e.FailsTask
		}
		if f != nil {
			f(ts)
		}
	})
}

func dead(ts *api.TaskState) { ts.State, ts.FinishedAt = "dead", time.Now() }

// taskEvent makes a task event with Nomad's display message; set fills the
// type's own fields.
func taskEvent(typ, display string, set func(e *api.TaskEvent)) *api.TaskEvent {
	e := &api.TaskEvent{Type: typ, Time: time.Now().UnixNano(), Details: map[string]string{}, DisplayMessage: display}
	if set != nil {
		set(e)
	}
	return e
}

// run runs the allocation's tasks to their end, reporting their changes
// every clientSyncInterval and once more at the end.
func (r *allocRunner) run() {
	done := make(chan struct{})
	var syncer sync.WaitGroup
	syncer.Go(func() {
		t := time.NewTicker(clientSyncInterval)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				r.sync()
			}
		}
	})
	r.runTasks()
	close(done)
	syncer.Wait() // one batch at a time, in order
	r.sync()
}

func (r *allocRunner) runTasks() {
	var sidecars, mains []*api.Task
	typ, setupErr := api.TaskSetupFailure, r.setupErr
	for _, t := range r.tg.Tasks {
		lc := t.Lifecycle
		switch {
		case lc == nil:
			mains = append(mains, t)
		case lc.Hook == api.TaskLifecycleHookPrestart && lc.Sidecar:
			sidecars = append(sidecars, t)
		default:
			// Init steps, poststart and poststop tasks are Nomad's to
			// order; the e2e suite runs them on real agents.
			typ, setupErr = api.TaskSetupFailure, fmt.Errorf("fake cluster: task %s: lifecycle hook %q (sidecar %v) is not simulated; run it on real agents (make e2e)", t.Name, lc.Hook, lc.Sidecar)
		}
		if t.Driver != "raw_exec" {
			typ, setupErr = api.TaskDriverFailure, fmt.Errorf("fake cluster: driver %q is not available on the fake client (raw_exec only)", t.Driver)
		}
	}
	if setupErr == nil {
		setupErr = os.MkdirAll(filepath.Join(r.dir, "alloc", "logs"), 0o755)
	}
	for _, t := range r.tg.Tasks {
		if setupErr != nil {
			r.event(t.Name, taskEvent(typ, setupErr.Error(), func(e *api.TaskEvent) {
				e.SetupError, e.DriverError, e.FailsTask = setupErr.Error(), setupErr.Error(), true
			}), dead)
		} else {
			r.event(t.Name, taskEvent(api.TaskReceived, "Task received by client", nil), nil)
			r.event(t.Name, taskEvent(api.TaskSetup, "Building Task Directory", func(e *api.TaskEvent) {
				e.Message, e.Details["message"] = "Building Task Directory", "Building Task Directory"
			}), nil)
		}
	}
	if setupErr != nil {
		return
	}
	services := r.registerServices()

	failed := make(chan string, len(r.tg.Tasks))
	var side, main []*taskRunner
	start := func(t *api.Task) *taskRunner {
		tr := &taskRunner{r: r, task: t, failed: failed, killCh: make(chan struct{}), started: make(chan bool, 1), done: make(chan struct{})}
		go tr.run()
		return tr
	}
	for _, t := range sidecars {
		side = append(side, start(t))
	}
	// Main tasks start once every prestart sidecar runs.
	ready := true
	for _, tr := range side {
		select {
		case ok := <-tr.started:
			ready = ready && ok
		case <-r.stopCh:
			ready = false
		}
	}
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
	if failedTask == "" {
		delay := deref(r.tg.ShutdownDelay)
		if d := r.n.opts.ShutdownDelay; d != 0 {
			delay = max(d, 0)
		}
		select {
		case <-time.After(delay):
		case <-r.n.quit:
		}
	}
	// The leader first, then the other main tasks, then sidecars, as
	// Nomad's alloc runner stops them; after a failure, every other task.
	var leader, rest []*taskRunner
	for _, tr := range main {
		if tr.task.Leader {
			leader = append(leader, tr)
		} else {
			rest = append(rest, tr)
		}
	}
	for _, group := range [][]*taskRunner{leader, rest, side} {
		for _, tr := range group {
			if tr.task.Name != failedTask {
				tr.kill(failedTask)
			}
		}
		for _, tr := range group {
			<-tr.done
		}
	}
	if !ready { // main tasks that never started
		r.report(func(a *alloc) {
			for _, t := range mains {
				if ts := a.TaskStates[t.Name]; ts != nil && ts.State == "pending" {
					dead(ts)
				}
			}
		})
	}
}

// registerServices registers the group's services with their checks,
// interpolated for this allocation, as Nomad's group service hook does
// before the tasks start, and returns their IDs.
func (r *allocRunner) registerServices() []string {
	vars := r.vars(nil, "")
	port := func(label string) int {
		for _, p := range r.a.AllocatedResources.Shared.Ports {
			if p.Label == label {
				return p.Value
			}
		}
		n, _ := strconv.Atoi(label)
		return n
	}
	var ids []string
	for _, s := range r.tg.Services {
		name, label := interpolate(s.Name, vars), interpolate(s.PortLabel, vars)
		id := "_nomad-task-" + r.a.ID + "-group-" + r.a.TaskGroup + "-" + name + "-" + label
		reg := &consulapi.AgentServiceRegistration{ID: id, Name: name, Port: port(label), Address: "127.0.0.1",
			Meta: map[string]string{"external-source": "nomad"}}
		for _, t := range s.Tags {
			reg.Tags = append(reg.Tags, interpolate(t, vars))
		}
		for k, v := range s.Meta {
			reg.Meta[interpolate(k, vars)] = interpolate(v, vars)
		}
		for _, c := range s.Checks {
			checkLabel := interpolate(cmp.Or(c.PortLabel, s.PortLabel), vars)
			sum := sha1.Sum([]byte(id + "\x00" + c.Name + "\x00" + c.Type + "\x00" + checkLabel))
			def := &consulapi.AgentServiceCheck{CheckID: "_nomad-check-" + hex.EncodeToString(sum[:]), Name: c.Name,
				Interval: c.Interval.String(), Timeout: c.Timeout.String(), Status: c.InitialStatus}
			if c.Type == "http" {
				path := interpolate(c.Path, vars)
				def.HTTP = cmp.Or(c.Protocol, "http") + "://127.0.0.1:" + strconv.Itoa(port(checkLabel)) + "/" + strings.TrimPrefix(path, "/")
				def.Method, def.Header = c.Method, c.Header
			} else {
				// Other checks are registered but never run: a TTL check
				// nobody updates keeps its initial status.
				def.TTL, def.Interval = "10s", ""
			}
			reg.Checks = append(reg.Checks, def)
		}
		if r.n.consul.Register(reg, true) == nil {
			ids = append(ids, id)
		}
	}
	return ids
}

// taskRunner runs one task's process, restarting it by the restart policy
// until it is killed or the policy gives up.
type taskRunner struct {
	r      *allocRunner
	task   *api.Task
	failed chan<- string

	killCh   chan struct{}
	killOnce sync.Once
	sibling  string    // set before killCh closes when a sibling failed
	started  chan bool // true once it first runs, false if it never will
	done     chan struct{}
}

func (t *taskRunner) kill(sibling string) {
	t.killOnce.Do(func() {
		t.sibling = sibling
		close(t.killCh)
	})
}

func (t *taskRunner) run() {
	defer close(t.done)
	name := t.task.Name
	started := false
	defer func() {
		if !started {
			t.started <- false
		}
	}()
	p := cmp.Or(t.task.RestartPolicy, t.r.tg.RestartPolicy, &api.RestartPolicy{})
	attempts, interval := 2, cmp.Or(deref(p.Interval), 30*time.Minute)
	delay, mode := cmp.Or(deref(p.Delay), 15*time.Second), cmp.Or(deref(p.Mode), "fail")
	if p.Attempts != nil {
		attempts = *p.Attempts
	}
	var restarts []time.Time
	for {
		select {
		case <-t.killCh:
			t.r.event(name, nil, func(ts *api.TaskState) {
				if ts.State != "dead" {
					dead(ts)
				}
			})
			return
		default:
		}
		proc, err := t.start()
		if err != nil {
			msg := "failed to launch command with executor: " + err.Error()
			t.r.event(name, taskEvent(api.TaskDriverFailure, msg, func(e *api.TaskEvent) { e.DriverError = msg }), nil)
		} else {
			t.r.event(name, taskEvent(api.TaskStarted, "Task started by client", nil), func(ts *api.TaskState) {
				ts.State = "running"
				if ts.StartedAt.IsZero() {
					ts.StartedAt = time.Now()
				}
			})
			if !started {
				started = true
				t.started <- true
			}
			select {
			case <-proc.done:
				t.r.event(name, terminated(proc.cmd.ProcessState), nil)
			case <-t.killCh:
				t.stopProcess(proc)
				return
			}
		}
		// The task ended on its own: restart it, or give up.
		now := time.Now()
		for len(restarts) > 0 && now.Sub(restarts[0]) >= interval {
			restarts = restarts[1:]
		}
		if len(restarts) >= attempts {
			reason := fmt.Sprintf("Exceeded allowed attempts %d in interval %v and mode is %q", attempts, interval, mode)
			t.r.event(name, taskEvent(api.TaskNotRestarting, reason, func(e *api.TaskEvent) { e.RestartReason, e.FailsTask = reason, true }), dead)
			t.failed <- name
			return
		}
		restarts = append(restarts, now)
		t.r.event(name, taskEvent(api.TaskRestarting, fmt.Sprintf("Task restarting in %v", delay), func(e *api.TaskEvent) {
			e.RestartReason, e.StartDelay = api.AllocRestartReasonWithinPolicy, int64(delay)
		}), func(ts *api.TaskState) {
			ts.State, ts.LastRestart = "pending", time.Now()
			ts.Restarts++
		})
		select {
		case <-time.After(delay):
		case <-t.killCh:
		}
	}
}

// process is one started task process; done closes once it is reaped.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (t *taskRunner) start() (*process, error) {
	r := t.r
	taskDir := filepath.Join(r.dir, t.task.Name)
	for _, d := range []string{"local", "secrets"} {
		if err := os.MkdirAll(filepath.Join(taskDir, d), 0o755); err != nil {
			return nil, err
		}
	}
	vars := r.vars(t.task, taskDir)
	command := interpolate(fmt.Sprint(t.task.Config["command"]), vars)
	var args []string
	if list, ok := t.task.Config["args"].([]any); ok {
		for _, a := range list {
			args = append(args, interpolate(fmt.Sprint(a), vars))
		}
	}
	bin, err := exec.LookPath(command)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Dir, cmd.SysProcAttr, cmd.WaitDelay = taskDir, sysProcAttr(), time.Second
	// The host's environment, the NOMAD_* variables, the task's env: a
	// later value of a name wins.
	for _, kv := range os.Environ() {
		if k, _, _ := strings.Cut(kv, "="); !hostEnvDenylist.MatchString(k) {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	for k, v := range t.task.Env {
		cmd.Env = append(cmd.Env, interpolate(k, vars)+"="+interpolate(v, vars))
	}
	// Output goes to the allocation's log files and, line by line with a
	// prefix, to TaskOutput.
	var closers []io.Closer
	closeAll := func() {
		for _, c := range closers {
			c.Close()
		}
	}
	// With log collection off (logs { disabled = true }) Nomad points
	// both at /dev/null and starts no logmon: a nil stream is /dev/null.
	streams := []*io.Writer{&cmd.Stdout, &cmd.Stderr}
	if lc := t.task.LogConfig; lc != nil && lc.Disabled != nil && *lc.Disabled {
		streams = nil
	}
	for i, stream := range streams {
		name := t.task.Name + []string{".stdout.0", ".stderr.0"}[i]
		f, err := os.OpenFile(filepath.Join(r.dir, "alloc", "logs", name), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			closeAll()
			return nil, err
		}
		closers, *stream = append(closers, f), f
		if out := r.n.opts.TaskOutput; out != nil {
			pr, pw := io.Pipe()
			closers, *stream = append(closers, pw), io.MultiWriter(f, pw)
			r.n.wg.Go(func() {
				for sc := bufio.NewScanner(pr); sc.Scan(); {
					r.n.outMu.Lock()
					fmt.Fprintf(out, "[%s %s %s] %s\n", r.a.JobID, r.a.ID[:8], t.task.Name, sc.Text())
					r.n.outMu.Unlock()
				}
				_, _ = io.Copy(io.Discard, pr) // after a line too long to scan
			})
		}
	}
	if err := cmd.Start(); err != nil {
		closeAll()
		return nil, err
	}
	r.n.setPID(r.a.ID, t.task.Name, cmd.Process.Pid)
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		r.n.setPID(r.a.ID, t.task.Name, 0)
		closeAll()
		close(p.done)
	}()
	return p, nil
}

// stopProcess kills a running task: its kill signal (SIGINT unless the task
// says otherwise, as Nomad does for raw_exec), then SIGKILL to its process
// group after the kill timeout (at most 500ms while the cluster closes).
func (t *taskRunner) stopProcess(p *process) {
	name := t.task.Name
	timeout := cmp.Or(deref(t.task.KillTimeout), 5*time.Second)
	select {
	case <-t.r.n.quit:
		timeout = min(timeout, 500*time.Millisecond)
	default:
	}
	if t.sibling != "" {
		t.r.event(name, taskEvent(api.TaskSiblingFailed, fmt.Sprintf("Task's sibling %q failed", t.sibling), func(e *api.TaskEvent) {
			e.FailedSibling = t.sibling
		}), nil)
	}
	t.r.event(name, taskEvent(api.TaskKilling, fmt.Sprintf("Sent interrupt. Waiting %v before force killing", timeout), func(e *api.TaskEvent) {
		e.KillTimeout = timeout
	}), nil)
	sig := syscall.SIGINT
	if s, ok := map[string]syscall.Signal{"SIGTERM": syscall.SIGTERM, "SIGQUIT": syscall.SIGQUIT, "SIGHUP": syscall.SIGHUP,
		"SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2, "SIGKILL": syscall.SIGKILL}[strings.ToUpper(t.task.KillSignal)]; ok {
		sig = s
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(timeout):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) // anything it left behind
	t.r.event(name, terminated(p.cmd.ProcessState), nil)
	t.r.event(name, taskEvent(api.TaskKilled, "Task successfully killed", nil), dead)
}

// terminated is the Terminated event of a process that exited.
func terminated(st *os.ProcessState) *api.TaskEvent {
	code, sig := st.ExitCode(), 0
	if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		code, sig = ws.ExitStatus(), int(ws.Signal())
	}
	display := "Exit Code: " + strconv.Itoa(code)
	if sig != 0 {
		display += ", Signal: " + strconv.Itoa(sig)
	}
	return taskEvent(api.TaskTerminated, display, func(e *api.TaskEvent) { e.ExitCode, e.Signal = code, sig })
}

// interpolation matches the ${...} references Nomad resolves in task
// config, env, service names, tags, meta and check paths; unknown ones stay
// as written.
var interpolation = regexp.MustCompile(`\$\{([^{}]+)\}`)

func interpolate(s string, vars map[string]string) string {
	return interpolation.ReplaceAllStringFunc(s, func(m string) string {
		if v, ok := vars[strings.TrimSpace(m[2:len(m)-1])]; ok {
			return v
		}
		return m
	})
}

// hostEnvDenylist is Nomad's default env.denylist: host variables never
// passed to tasks.
var hostEnvDenylist = regexp.MustCompile(`^((CONSUL|NOMAD|VAULT)_(HTTP_)?TOKEN(_FILE)?|(CONSUL|NOMAD|VAULT)_LICENSE(_PATH)?|AWS_(ACCESS_KEY_ID|SECRET_ACCESS_KEY|SESSION_TOKEN)|GOOGLE_APPLICATION_CREDENTIALS)$`)

// vars are the NOMAD_* variables of a task (nil: the group's services).
func (r *allocRunner) vars(task *api.Task, taskDir string) map[string]string {
	a := r.a
	v := map[string]string{
		"NOMAD_ALLOC_ID": a.ID, "NOMAD_SHORT_ALLOC_ID": a.ID[:8], "NOMAD_ALLOC_NAME": a.Name, "NOMAD_ALLOC_INDEX": strconv.Itoa(r.slot),
		"NOMAD_GROUP_NAME": a.TaskGroup, "NOMAD_JOB_ID": a.JobID, "NOMAD_JOB_NAME": deref(a.Job.Name), "NOMAD_NAMESPACE": a.Namespace,
		"NOMAD_REGION": "global", "NOMAD_DC": "dc1", "NOMAD_ALLOC_DIR": filepath.Join(r.dir, "alloc"),
	}
	if task != nil {
		v["NOMAD_TASK_NAME"], v["NOMAD_TASK_DIR"], v["NOMAD_SECRETS_DIR"] = task.Name, taskDir+"/local", taskDir+"/secrets"
	}
	for _, p := range a.AllocatedResources.Shared.Ports {
		host, port := strconv.Itoa(p.Value), strconv.Itoa(cmp.Or(p.To, p.Value))
		v["NOMAD_IP_"+p.Label], v["NOMAD_PORT_"+p.Label], v["NOMAD_ADDR_"+p.Label] = "127.0.0.1", port, "127.0.0.1:"+port
		v["NOMAD_HOST_IP_"+p.Label], v["NOMAD_HOST_PORT_"+p.Label], v["NOMAD_HOST_ADDR_"+p.Label] = "127.0.0.1", host, "127.0.0.1:"+host
	}
	return v
}
