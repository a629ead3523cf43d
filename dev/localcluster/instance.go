package localcluster

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// instance is one allocation: a test app and its sidecar. Its mutable
// fields are guarded by Cluster.mu; the processes belong to run.
type instance struct {
	c   *Cluster
	rev *revision
	id  string

	// guarded by c.mu
	timing   InstanceTiming
	passing  bool
	stopping bool
	started  bool
	delay    time.Duration // shutdown delay chosen by stop

	stopCh chan struct{} // closed by stop
}

func newInstance(c *Cluster, r *revision, seq int, scaleCalled time.Time) *instance {
	id := allocID(seq)
	return &instance{
		c:   c,
		rev: r,
		id:  id,
		timing: InstanceTiming{
			Revision:    r.rev.Name,
			Alloc:       id,
			Address:     "127.0.0.1",
			ScaleCalled: scaleCalled,
		},
		stopCh: make(chan struct{}),
	}
}

// allocID looks like a Nomad allocation ID; the serial number keeps it
// unique and readable in logs.
func allocID(seq int) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return fmt.Sprintf("%08x-0000-4000-8000-%s", seq, hex.EncodeToString(b[:]))
}

// consulInstance is the instance as Consul would list it; call with c.mu held.
func (in *instance) consulInstance() consulroute.Instance {
	return consulroute.Instance{
		ID:        "_nomad-task-" + in.id + "-group-" + spec.GroupName + "-" + in.rev.rev.Name + "-" + spec.PortHTTP,
		Revision:  in.rev.rev.Name,
		Address:   in.timing.Address,
		Port:      in.timing.Port,
		AdminPort: in.timing.AdminPort,
	}
}

func (in *instance) allocation(running bool) catalog.Allocation {
	return catalog.Allocation{
		ID:        in.id,
		Revision:  in.rev.rev.Name,
		Address:   in.timing.Address,
		Port:      in.timing.Port,
		AdminPort: in.timing.AdminPort,
		Running:   running,
	}
}

func (in *instance) timingLocked() InstanceTiming { return in.timing }

// stop takes the instance out of service (call with c.mu held): its
// allocation stops being Running at once, and run signals its processes
// after delay.
func (in *instance) stop(now time.Time, delay time.Duration) {
	if in.stopping {
		return
	}
	in.stopping = true
	in.passing = false
	in.delay = delay
	in.timing.Stopping = now
	if in.started {
		in.c.cat.SetAllocation(in.allocation(false))
	}
	close(in.stopCh)
}

// proc is one started process and the channel closed when it exits.
type proc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	err  error // valid after done
}

// run is the instance's whole life: start, serve, stop.
func (in *instance) run() {
	c := in.c
	log := c.log.With("revision", in.rev.rev.Name, "alloc", in.id)

	c.mu.Lock()
	rev, app := in.rev.rev, in.rev.app
	c.mu.Unlock()

	ports, err := c.ports.take(3)
	if err != nil {
		c.instanceDied(in, fmt.Errorf("pick ports: %w", err))
		in.finish(nil, nil)
		return
	}
	defer c.ports.release(ports)
	appPort, port, adminPort := ports[0], ports[1], ports[2]

	appProc, err := in.start("app", app.Command, app.appEnv(rev, appPort))
	if err != nil {
		c.instanceDied(in, err)
		in.finish(nil, nil)
		return
	}
	sideProc, err := in.start("sidecar", nil, app.sidecarEnv(rev, in.id, port, appPort, adminPort))
	if err != nil {
		c.instanceDied(in, err)
		in.finish(appProc, nil)
		return
	}

	c.mu.Lock()
	in.started = true
	in.timing.Started = time.Now()
	in.timing.Port, in.timing.AdminPort, in.timing.AppPort = port, adminPort, appPort
	in.timing.AppPID, in.timing.SidecarPID = appProc.cmd.Process.Pid, sideProc.cmd.Process.Pid
	if !in.stopping {
		c.cat.SetAllocation(in.allocation(true))
		c.goLocked(in.check)
		c.goLocked(in.watchListening)
	}
	c.mu.Unlock()
	log.Debug("started", "port", port, "app_port", appPort, "admin_port", adminPort)

	select {
	case <-in.stopCh:
		c.mu.Lock()
		delay := in.delay
		c.mu.Unlock()
		if delay > 0 {
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-c.ctx.Done():
				t.Stop()
			case <-appProc.done:
			case <-sideProc.done:
			}
		}
	case <-appProc.done:
		c.instanceDied(in, fmt.Errorf("app exited: %v", appProc.err))
	case <-sideProc.done:
		c.instanceDied(in, fmt.Errorf("sidecar exited: %v", sideProc.err))
	}
	in.finish(appProc, sideProc)
}

// finish stops the processes (sidecar first, so it drains requests to a
// still-running app), then forgets the allocation.
func (in *instance) finish(appProc, sideProc *proc) {
	c := in.c
	c.mu.Lock()
	if !in.stopping {
		in.stopping = true
		in.passing = false
		in.timing.Stopping = time.Now()
		if in.started {
			c.cat.SetAllocation(in.allocation(false))
		}
		close(in.stopCh)
	}
	drain := in.rev.app.DrainTimeout
	c.mu.Unlock()

	var errs []error
	if sideProc != nil {
		errs = append(errs, c.terminate(sideProc, drain+c.opts.StopTimeout))
	}
	if appProc != nil {
		errs = append(errs, c.terminate(appProc, c.opts.StopTimeout))
	}

	c.mu.Lock()
	in.timing.Stopped = time.Now()
	if err := errors.Join(errs...); err != nil {
		in.timing.ExitErr = err.Error()
	}
	c.cat.DeleteAllocation(in.id)
	c.mu.Unlock()
}

// terminate sends SIGTERM, waits up to grace, then SIGKILLs and waits a
// little more; the error says when the process had to be killed.
func (c *Cluster) terminate(p *proc, grace time.Duration) error {
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("%s (pid %d) did not exit after SIGKILL", p.name, p.cmd.Process.Pid)
	}
	return fmt.Errorf("%s did not exit within %s of SIGTERM; killed", p.name, grace)
}

// start launches one role (`testapp` or `sidecar`) of the binary, or, for
// the app, command when it is set.
func (in *instance) start(role string, command []string, env map[string]string) (*proc, error) {
	c := in.c
	sub := map[string]string{"app": "testapp", "sidecar": "sidecar"}[role]
	cmd := exec.Command(c.opts.Binary, sub)
	if role == "app" && len(command) > 0 {
		cmd = exec.Command(command[0], command[1:]...)
	}
	cmd.Env = mergeEnv(os.Environ(), env)
	prefix := fmt.Sprintf("[%s %s %s] ", in.rev.rev.Name, in.id[:8], role)
	w := &lineWriter{mu: &c.outMu, w: c.opts.Output, prefix: prefix}
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = sysProcAttr()
	// Bound Wait when a grandchild keeps the output pipe open.
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", cmd, err)
	}
	p := &proc{name: role, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		_ = w.Flush()
		close(p.done)
	}()
	return p, nil
}

// check is the simulated Consul check: every CheckInterval, a probe of the
// sidecar; the first one CheckInterval after the allocation runs.
func (in *instance) check() {
	c := in.c
	c.mu.Lock()
	port := in.timing.Port
	c.mu.Unlock()
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	tick := time.NewTicker(c.opts.CheckInterval)
	defer tick.Stop()
	timeout := min(c.opts.CheckInterval, 2*time.Second)
	for {
		select {
		case <-in.stopCh:
			return
		case <-c.ctx.Done():
			return
		case <-tick.C:
		}
		ok := probe(c.ctx, c.checkClient, url, timeout)
		c.setPassing(in, ok, time.Now())
	}
}

// probe sends the sidecar's readiness probe; any 2xx passes, as in Consul.
func probe(ctx context.Context, client *http.Client, url string, timeout time.Duration) bool {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// watchListening records when the app's and the sidecar's ports first
// accept a connection (for the cold-start split). A TCP connect does not
// touch the sidecar's readiness, so it does not change what it measures.
func (in *instance) watchListening() {
	c := in.c
	c.mu.Lock()
	appAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(in.timing.AppPort))
	sideAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(in.timing.Port))
	c.mu.Unlock()
	var appAt, sideAt time.Time
	deadline := time.Now().Add(time.Minute)
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for (appAt.IsZero() || sideAt.IsZero()) && time.Now().Before(deadline) {
		select {
		case <-in.stopCh:
			return
		case <-c.ctx.Done():
			return
		case <-tick.C:
		}
		if appAt.IsZero() && dialOK(appAddr) {
			appAt = time.Now()
			c.mu.Lock()
			in.timing.AppListening = appAt
			c.mu.Unlock()
		}
		if sideAt.IsZero() && dialOK(sideAddr) {
			sideAt = time.Now()
			c.mu.Lock()
			in.timing.SidecarListening = sideAt
			c.mu.Unlock()
		}
	}
}

func dialOK(addr string) bool {
	conn, err := net.DialTimeout("tcp", addr, 50*time.Millisecond)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
