package fakecluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// shellRevision compiles a revision whose user task and sidecar are shell
// scripts (the sidecar's script gets "sidecar" as $0). The user task runs
// the shell itself, not through run-task (which only our binary has), with
// Nomad's log collection.
func shellRevision(t *testing.T, name string, gen int, user, sidecar string) *nomadapi.Job {
	t.Helper()
	s := spec.NewService(name)
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "/bin/sh", "args": []string{"-c", user}}
	s.Template.Task.KillTimeout = 2 * time.Second
	s.Scaling.Min, s.Scaling.Max, s.Scaling.Initial = 0, 3, 1
	job, err := nomadjob.Compile(spec.NewRevision(&s, gen), nomadjob.Options{Sidecar: nomadjob.SidecarOptions{Command: "/bin/sh"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range job.TaskGroups[0].Tasks {
		switch task.Name {
		case spec.SidecarTaskName:
			task.Config["args"] = []string{"-c", sidecar}
		case spec.UserTaskName:
			task.Config = map[string]any{"command": "/bin/sh", "args": []string{"-c", user}}
			task.LogConfig = nil
		}
	}
	return job
}

func eventOf(ts *nomadapi.TaskState, typ string) *nomadapi.TaskEvent {
	if ts == nil {
		return nil
	}
	for _, e := range ts.Events {
		if e.Type == typ {
			return e
		}
	}
	return nil
}

// A task that keeps exiting is restarted by the restart policy (3 times,
// 1s apart, as compiled), then fails with Nomad's words; its sibling is
// killed; the allocation fails and, after the reschedule delay, is
// replaced.
func TestFailingTaskFailsTheAllocationWithNomadsWords(t *testing.T) {
	opts, _ := fastOptions(t)
	opts.RescheduleDelay = 500 * time.Millisecond
	c := fakecluster.Start(t, opts)
	nc, _ := clients(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	job := shellRevision(t, "crash", 1, "echo boom >&2; exit 3", "exec sleep 60")
	if _, err := nc.Register(ctx, job, 0); err != nil {
		t.Fatal(err)
	}
	var failed nomadjob.Allocation
	eventually(t, 20*time.Second, "the allocation fails", func() (bool, string) {
		as, err := nc.Allocations(ctx, "crash-00001")
		for _, a := range as {
			if a.ClientStatus == "failed" {
				failed = a
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v %v", as, err)
	})
	if want := "task user: exited with code 3 (restarts exceeded after 3 restarts)"; failed.Failure != want || failed.Restarts != 3 {
		t.Errorf("failure %q after %d restarts, want %q after 3", failed.Failure, failed.Restarts, want)
	}
	// The allocation fails as soon as the user task does; its sibling is
	// killed just after.
	var info fakecluster.AllocationInfo
	eventually(t, 10*time.Second, "the sidecar killed", func() (bool, string) {
		for _, a := range c.Nomad.Allocations("default", "crash-00001") {
			if a.ID == failed.ID {
				info = a
			}
		}
		ts := info.TaskStates[spec.SidecarTaskName]
		return ts != nil && ts.State == "dead", fmt.Sprintf("%+v", ts)
	})
	user, proxy := info.TaskStates[spec.UserTaskName], info.TaskStates[spec.SidecarTaskName]
	if e := eventOf(user, nomadapi.TaskNotRestarting); e == nil || e.DisplayMessage != `Exceeded allowed attempts 3 in interval 1m0s and mode is "fail"` || !user.Failed || user.State != "dead" {
		t.Errorf("user task state %+v, last events %+v", user, user.Events)
	}
	if e := eventOf(user, nomadapi.TaskTerminated); e == nil || e.DisplayMessage != "Exit Code: 3" {
		t.Errorf("user task terminated event %+v", e)
	}
	if e := eventOf(proxy, nomadapi.TaskSiblingFailed); e == nil || e.DisplayMessage != `Task's sibling "user" failed` || proxy.State != "dead" {
		t.Errorf("sidecar state %+v", proxy)
	}
	eventually(t, 20*time.Second, "a replacement allocation", func() (bool, string) {
		for _, a := range c.Nomad.Allocations("default", "crash-00001") {
			if a.PreviousAllocation == failed.ID {
				return true, ""
			}
		}
		return false, fmt.Sprintf("%+v", c.Nomad.Allocations("default", "crash-00001"))
	})
	if err := nc.Scale(ctx, "crash-00001", 0, "stop the crash loop", nil); err != nil {
		t.Fatal(err)
	}
}

// On stop, the allocation leaves Consul first, then the shutdown delay
// passes, then the main task gets SIGINT (Nomad's default kill signal),
// and the sidecar is killed only after it.
func TestStopDeregistersWaitsThenKillsMainTasksBeforeTheSidecar(t *testing.T) {
	opts, out := fastOptions(t)
	opts.ShutdownDelay = 700 * time.Millisecond
	opts.DataDir = t.TempDir()
	c := fakecluster.Start(t, opts)
	nc, _ := clients(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	loop := `trap 'echo %s got INT; exit 0' INT; while :; do sleep 0.05; done`
	// Nomad collects no output of the queue-proxy (its log collection is
	// off): the stand-in writes where the real one does, to its own file.
	sidecarLoop := `trap 'echo sidecar got INT >> "$SERVERLESS_LOG_FILE.0"; exit 0' INT; while :; do sleep 0.05; done`
	job := shellRevision(t, "order", 1, fmt.Sprintf(loop, "user"), sidecarLoop)
	if _, err := nc.Register(ctx, job, 0); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "running and registered", func() (bool, string) {
		as := c.Nomad.Allocations("default", "order-00001")
		return len(as) == 1 && as[0].ClientStatus == "running" && len(c.Consul.Services("order-00001")) == 1, fmt.Sprintf("%+v", as)
	})
	var gone atomic.Int64
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		for watchCtx.Err() == nil {
			if len(c.Consul.Services("order-00001")) == 0 {
				gone.Store(time.Now().UnixNano())
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	}()
	stopAt := time.Now().UnixNano()
	if err := nc.Scale(ctx, "order-00001", 0, "stop", nil); err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "the allocation completes", func() (bool, string) {
		as := c.Nomad.Allocations("default", "order-00001")
		return len(as) == 1 && as[0].ClientStatus == "complete", fmt.Sprintf("%+v", as)
	})
	info := c.Nomad.Allocations("default", "order-00001")[0]
	userKill := eventOf(info.TaskStates[spec.UserTaskName], nomadapi.TaskKilling)
	userDone := eventOf(info.TaskStates[spec.UserTaskName], nomadapi.TaskKilled)
	proxyKill := eventOf(info.TaskStates[spec.SidecarTaskName], nomadapi.TaskKilling)
	if userKill == nil || userDone == nil || proxyKill == nil {
		t.Fatalf("kill events missing: %+v", info.TaskStates)
	}
	switch {
	case gone.Load() == 0 || gone.Load() > userKill.Time:
		t.Errorf("the service left Consul at %d, after the user task was signalled at %d", gone.Load(), userKill.Time)
	case time.Duration(userKill.Time-stopAt) < opts.ShutdownDelay:
		t.Errorf("the user task was signalled %s after the stop, before the %s shutdown delay", time.Duration(userKill.Time-stopAt), opts.ShutdownDelay)
	case proxyKill.Time < userDone.Time:
		t.Errorf("the sidecar was signalled before the user task was dead")
	}
	if e := eventOf(info.TaskStates[spec.UserTaskName], nomadapi.TaskTerminated); e == nil || e.ExitCode != 0 {
		t.Errorf("the user task did not exit 0 on its trap: %+v", e)
	}
	eventually(t, 2*time.Second, "both traps ran", func() (bool, string) {
		o := out.String()
		b, _ := os.ReadFile(filepath.Join(opts.DataDir, "alloc", info.ID, "alloc", "logs", spec.SidecarTaskName+".stderr.0"))
		return strings.Contains(o, "user got INT") && string(b) == "sidecar got INT\n" && !strings.Contains(o, "sidecar got"), fmt.Sprintf("task output %q, the sidecar's own log %q", o, b)
	})
}

// Faults: a down agent refuses connections until it is up again; a 403 is
// a permission error; the event stream comes back after an outage with
// what happened meanwhile.
func TestFaultsAndTheEventStreamAcrossAnOutage(t *testing.T) {
	opts, _ := fastOptions(t)
	c := fakecluster.Start(t, opts)
	nc, cc := clients(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var mu sync.Mutex
	var seen []string
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		// Reopen the stream whenever it ends, from the index it reached.
		var index uint64
		for watchCtx.Err() == nil {
			index, _ = nc.StreamEvents(watchCtx, index, func(e nomadjob.Event) {
				mu.Lock()
				defer mu.Unlock()
				if e.Kind != nomadjob.EventAllocationUpdated {
					seen = append(seen, string(e.Kind)+" "+e.Revision.Name)
				}
			})
			time.Sleep(50 * time.Millisecond)
		}
	}()
	if _, err := nc.Register(ctx, shellRevision(t, "faults", 1, "exec sleep 60", "exec sleep 60"), 0); err != nil {
		t.Fatal(err)
	}
	c.Nomad.Down()
	_, err := nc.Revisions(ctx, "default", "faults")
	if !errors.Is(err, nomadjob.ErrUnreachable) || !strings.Contains(err.Error(), "connection refused") || !strings.Contains(err.Error(), c.Nomad.Addr()) {
		t.Errorf("with Nomad down: %v", err)
	}
	c.Consul.Down()
	if _, _, err := cc.ReadRecord(ctx, "default", "faults"); !errors.Is(err, consulroute.ErrUnreachable) {
		t.Errorf("with Consul down: %v", err)
	}
	if err := c.Consul.Up(); err != nil {
		t.Fatal(err)
	}
	if err := c.Nomad.Up(); err != nil {
		t.Fatal(err)
	}
	if err := nc.Scale(ctx, "faults-00001", 2, "after the outage", nil); err != nil {
		t.Fatal(err)
	}
	c.Nomad.SetFault(fakecluster.Fault{Status: http.StatusForbidden, PathPrefix: "/v1/job/", Method: http.MethodPost})
	if err := nc.Scale(ctx, "faults-00001", 1, "forbidden", nil); err != nil {
		t.Errorf("a fault on POST changed a PUT: %v", err)
	}
	c.Nomad.SetFault(fakecluster.Fault{Status: http.StatusForbidden, PathPrefix: "/v1/job/"})
	if err := nc.Scale(ctx, "faults-00001", 1, "forbidden", nil); !errors.Is(err, nomadjob.ErrPermission) {
		t.Errorf("with a 403: %v", err)
	}
	c.Nomad.SetFault(fakecluster.Fault{})
	eventually(t, 15*time.Second, "the stream resumed and showed the scale made after the outage", func() (bool, string) {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, s := range seen {
			if s == "revision-updated faults-00001" {
				n++
			}
		}
		return n >= 2 && seen[0] == "revision-registered faults-00001", fmt.Sprint(seen)
	})
}

// The leader lock through consulroute: one holder at a time, handed on
// when the holder releases it, and when its session is destroyed only
// after Consul's lock delay.
func TestLockHandoverWithTheRealLock(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	newClient := func(replica string) *consulroute.Client {
		cl, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica(replica), consulroute.WithWaitTime(time.Second),
			consulroute.WithBackoff(50*time.Millisecond, 200*time.Millisecond), consulroute.WithLogger(slog.New(slog.DiscardHandler)))
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	a, b := newClient("a"), newClient("b")
	const key = "nomad-serverless/leader/test"
	var leading sync.Map
	run := func(cl *consulroute.Client, name string) context.CancelFunc {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() {
			defer close(done)
			_ = cl.NewLock(key, name, 10*time.Second).Run(ctx, func(lctx context.Context) {
				leading.Store(name, true)
				<-lctx.Done()
				leading.Delete(name)
			})
		}()
		return func() { cancel(); <-done }
	}
	isLeading := func(name string) bool { _, ok := leading.Load(name); return ok }
	stopA := run(a, "a")
	eventually(t, 5*time.Second, "a leads", func() (bool, string) { return isLeading("a"), "" })
	stopB := run(b, "b")
	defer stopB()
	time.Sleep(300 * time.Millisecond)
	if isLeading("b") {
		t.Fatal("b leads while a holds the lock")
	}
	stopA()
	eventually(t, 5*time.Second, "b leads after a released the lock", func() (bool, string) { return isLeading("b"), "" })
	if v, _ := c.Consul.KV(key); string(v) != "b" {
		t.Errorf("lock value %q, want b", v)
	}

	// b's session is destroyed behind its back: b steps down, and the key
	// is free again only after the lock delay (1s).
	sess := c.Consul.KVHolder(key)
	req, _ := http.NewRequest(http.MethodPut, c.Consul.Addr()+"/v1/session/destroy/"+sess, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	lost := time.Now()
	eventually(t, 5*time.Second, "b steps down", func() (bool, string) { return !isLeading("b"), "" })
	eventually(t, 10*time.Second, "b leads again with a new session", func() (bool, string) {
		return isLeading("b") && c.Consul.KVHolder(key) != "" && c.Consul.KVHolder(key) != sess, c.Consul.KVHolder(key)
	})
	if d := time.Since(lost); d < time.Second {
		t.Errorf("the key was taken again %s after its session was destroyed, within the lock delay", d)
	}
}

// A check's status change wakes blocking queries: WatchPassing sees the
// instance come and go as the target's answer changes.
func TestBlockingQueriesFollowCheckStatus(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 50 * time.Millisecond})
	_, cc := clients(t, c)
	var ready atomic.Bool
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !ready.Load() || r.Header.Get(spec.ProbeHeader) != spec.ProbeHeaderValue {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("queue"))
	}))
	defer target.Close()
	if err := c.Consul.Register(&consulapi.AgentServiceRegistration{
		ID: "w1", Name: "watch-00001", Address: "127.0.0.1", Port: 1234, Tags: []string{spec.TagServerless},
		Check: &consulapi.AgentServiceCheck{HTTP: target.URL, Interval: "1s", Header: map[string][]string{spec.ProbeHeader: {spec.ProbeHeaderValue}}},
	}, true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var mu sync.Mutex
	var history []int
	go func() {
		_ = cc.WatchPassing(ctx, func(p consulroute.Passing) {
			mu.Lock()
			history = append(history, len(p["watch-00001"]))
			mu.Unlock()
		})
	}()
	last := func() (int, string) {
		mu.Lock()
		defer mu.Unlock()
		if len(history) == 0 {
			return -1, "nothing yet"
		}
		return history[len(history)-1], fmt.Sprint(history)
	}
	eventually(t, 5*time.Second, "no ready instance at first", func() (bool, string) { n, h := last(); return n == 0, h })
	ready.Store(true)
	eventually(t, 5*time.Second, "one ready instance once the check passes", func() (bool, string) { n, h := last(); return n == 1, h })
	ready.Store(false)
	eventually(t, 5*time.Second, "none again once it fails", func() (bool, string) { n, h := last(); return n == 0, h })
}

// Close stops every process the cluster started.
func TestCloseStopsEveryProcess(t *testing.T) {
	opts, _ := fastOptions(t)
	c, err := fakecluster.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	nc, _ := clients(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	// The sidecar ignores SIGINT: Close must still end it.
	if _, err := nc.Register(ctx, shellRevision(t, "close", 1, "exec sleep 60", "trap '' INT; while :; do sleep 0.05; done"), 0); err != nil {
		t.Fatal(err)
	}
	var pids []int
	eventually(t, 10*time.Second, "both tasks run", func() (bool, string) {
		as := c.Nomad.Allocations("default", "close-00001")
		if len(as) != 1 || len(as[0].PIDs) != 2 {
			return false, fmt.Sprintf("%+v", as)
		}
		pids = []int{as[0].PIDs[spec.UserTaskName], as[0].PIDs[spec.SidecarTaskName]}
		return true, ""
	})
	start := time.Now()
	c.Close()
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("process %d still runs after Close", pid)
		}
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Close took %s", d)
	}
}
