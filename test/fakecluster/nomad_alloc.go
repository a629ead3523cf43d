package fakecluster

import (
	"cmp"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// alloc is one allocation. Its fields are guarded by Nomad.mu; its
// processes belong to its runner.
type alloc struct {
	ID                 string
	Name               string
	Index              int
	Namespace          string
	JobID              string
	TaskGroup          string
	EvalID             string
	Job                *api.Job // the job version that placed it
	JobCreateIndex     uint64
	DesiredStatus      string
	DesiredDescription string
	ClientStatus       string
	ClientDescription  string
	TaskStates         map[string]*api.TaskState
	Ports              []allocPort
	CreateIndex        uint64
	ModifyIndex        uint64
	AllocModifyIndex   uint64
	CreateTime         int64
	ModifyTime         int64
	PreviousAllocation string
	NextAllocation     string
	finishedAt         time.Time
	runner             *allocRunner
	pids               map[string]int // task -> its current process
}

func (a *alloc) terminal() bool {
	switch a.ClientStatus {
	case api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost:
		return true
	}
	return false
}

// allocsOfLocked lists the allocations of the job's current incarnation (a
// purged job registered again does not own the old one's allocations).
func (n *Nomad) allocsOfLocked(j *nomadJob) []*alloc {
	var out []*alloc
	for _, a := range n.allocs {
		if a.Namespace == j.ns && a.JobID == deref(j.job.ID) && a.JobCreateIndex == deref(j.job.CreateIndex) {
			out = append(out, a)
		}
	}
	sort.Slice(out, func(i, k int) bool { return out[i].CreateIndex < out[k].CreateIndex })
	return out
}

// reconcileLocked is the scheduler: for each group it stops allocations
// beyond the count (highest index first), replaces failed ones after the
// reschedule delay, and places new ones up to the count. The plan is
// applied at one index, with a Job PlanResult event beside the allocations'
// (fixture 011).
func (n *Nomad) reconcileLocked(j *nomadJob) {
	if n.closed {
		return
	}
	if cur := n.jobs[jobKey(j.ns, deref(j.job.ID))]; cur != j {
		return // purged meanwhile
	}
	var planIdx uint64
	plan := func() uint64 {
		if planIdx == 0 {
			planIdx = n.nextIndex()
		}
		return planIdx
	}
	for _, tg := range j.job.TaskGroups {
		name := deref(tg.Name)
		desired := deref(tg.Count)
		if deref(j.job.Stop) {
			desired = 0
		}
		var live, failed []*alloc
		used := map[int]bool{}
		for _, a := range n.allocsOfLocked(j) {
			if a.TaskGroup != name || a.DesiredStatus != api.AllocDesiredStatusRun {
				continue
			}
			if !a.terminal() {
				live = append(live, a)
				used[a.Index] = true
			} else if a.NextAllocation == "" {
				failed = append(failed, a)
			}
		}
		// Failed allocations beyond the count are not replaced.
		for len(live)+len(failed) > desired && len(failed) > 0 {
			last := failed[len(failed)-1]
			failed = failed[:len(failed)-1]
			n.stopAllocLocked(last, "alloc not needed due to job update", plan())
		}
		if len(live) > desired {
			sort.Slice(live, func(i, k int) bool { return live[i].Index > live[k].Index })
			for _, a := range live[:len(live)-desired] {
				n.stopAllocLocked(a, "alloc not needed due to job update", plan())
			}
			continue
		}
		// The allocations that stay are updated in place to the job's new
		// version (no task changes: revision jobs change only their count
		// and scaling), which Nomad's plan records for each of them.
		for _, a := range live {
			if deref(a.Job.Version) != deref(j.job.Version) {
				idx := plan()
				a.Job = copyJob(j.job)
				a.ModifyIndex, a.AllocModifyIndex = idx, idx
				a.ModifyTime = time.Now().UnixNano()
				n.publishLocked(idx, allocEvent("PlanResult", a))
			}
		}
		missing := desired - len(live)
		for _, f := range failed {
			if missing == 0 {
				break
			}
			missing--
			delay := n.rescheduleDelay(j, tg)
			if wait := time.Until(f.finishedAt.Add(delay)); wait > 0 {
				n.afterLocked(wait, func() {
					n.mu.Lock()
					n.reconcileLocked(j)
					n.mu.Unlock()
					n.changed.Notify()
				})
				continue
			}
			j.reschedules++
			idx := f.Index
			if used[idx] {
				idx = freeIndex(used)
			}
			used[idx] = true
			na := n.placeLocked(j, tg, idx, f.ID, plan())
			f.NextAllocation = na.ID
		}
		for ; missing > 0; missing-- {
			idx := freeIndex(used)
			used[idx] = true
			n.placeLocked(j, tg, idx, "", plan())
		}
	}
	n.setJobStatusLocked(j)
	if planIdx != 0 {
		n.publishLocked(planIdx, jobEvent("PlanResult", j))
	}
}

func freeIndex(used map[int]bool) int {
	for i := 0; ; i++ {
		if !used[i] {
			return i
		}
	}
}

// rescheduleDelay is the delay before replacing a failed allocation: the
// cluster's RescheduleDelay when set, else the group's reschedule policy
// (constant, or doubling per replacement up to MaxDelay).
func (n *Nomad) rescheduleDelay(j *nomadJob, tg *api.TaskGroup) time.Duration {
	if n.opts.RescheduleDelay > 0 {
		return n.opts.RescheduleDelay
	}
	p := tg.ReschedulePolicy
	if p == nil {
		return 30 * time.Second
	}
	d := deref(p.Delay)
	if deref(p.DelayFunction) == "exponential" {
		for i := 0; i < j.reschedules && d < deref(p.MaxDelay); i++ {
			d *= 2
		}
		if m := deref(p.MaxDelay); m > 0 {
			d = min(d, m)
		}
	}
	return d
}

// afterLocked runs f after d unless the cluster closes first (call with
// n.mu held; f must take the lock itself).
func (n *Nomad) afterLocked(d time.Duration, f func()) {
	n.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer n.wg.Done()
		n.mu.Lock()
		_, live := n.timers[t]
		delete(n.timers, t)
		n.mu.Unlock()
		if live {
			f()
		}
	})
	n.timers[t] = true
}

// placeLocked creates an allocation at the plan's index and starts its
// runner.
func (n *Nomad) placeLocked(j *nomadJob, tg *api.TaskGroup, index int, previous string, idx uint64) *alloc {
	now := time.Now().UnixNano()
	a := &alloc{
		ID: newUUID(), Index: index, Namespace: j.ns, JobID: deref(j.job.ID), TaskGroup: deref(tg.Name),
		Name:   fmt.Sprintf("%s.%s[%d]", deref(j.job.ID), deref(tg.Name), index),
		EvalID: newUUID(),
		Job:    copyJob(j.job), JobCreateIndex: deref(j.job.CreateIndex),
		DesiredStatus: api.AllocDesiredStatusRun, ClientStatus: api.AllocClientStatusPending,
		TaskStates:  map[string]*api.TaskState{},
		CreateIndex: idx, ModifyIndex: idx, AllocModifyIndex: idx, CreateTime: now, ModifyTime: now,
		PreviousAllocation: previous,
	}
	n.allocs[a.ID] = a
	n.allocsIndex = idx
	ports, err := n.allocatePortsLocked(jobGroup(a.Job, a.TaskGroup))
	a.Ports = ports
	n.publishLocked(idx, allocEvent("PlanResult", a))
	if err != nil {
		a.ClientStatus, a.ClientDescription = api.AllocClientStatusFailed, "Failed tasks"
		a.finishedAt = time.Now()
		for _, t := range jobGroup(a.Job, a.TaskGroup).Tasks {
			a.TaskStates[t.Name] = &api.TaskState{State: "dead", Failed: true, Events: []*api.TaskEvent{
				newTaskEvent(api.TaskSetupFailure, "", func(e *api.TaskEvent) { e.SetupError = err.Error(); e.FailsTask = true }),
			}}
		}
		n.publishLocked(idx, allocEvent("AllocationUpdated", a))
		return a
	}
	a.runner = newAllocRunner(n, a)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		a.runner.run()
	}()
	return a
}

// allocatePortsLocked gives the group's network its ports: reserved ports
// as declared, dynamic ones free on 127.0.0.1 and not handed to another
// live allocation. Only host networking is supported.
func (n *Nomad) allocatePortsLocked(tg *api.TaskGroup) ([]allocPort, error) {
	if tg == nil || len(tg.Networks) == 0 {
		return nil, nil
	}
	if len(tg.Networks) > 1 {
		return nil, fmt.Errorf("fake cluster: only one network per group is supported")
	}
	net0 := tg.Networks[0]
	if net0.Mode != "" && net0.Mode != "host" {
		return nil, fmt.Errorf("fake cluster: network mode %q is not supported (host networking only)", net0.Mode)
	}
	var out []allocPort
	for _, p := range net0.ReservedPorts {
		out = append(out, allocPort{Label: p.Label, Value: p.Value, To: p.To})
	}
	dyn, err := n.freePortsLocked(len(net0.DynamicPorts))
	if err != nil {
		return nil, err
	}
	for i, p := range net0.DynamicPorts {
		out = append(out, allocPort{Label: p.Label, Value: dyn[i], To: p.To})
	}
	return out, nil
}

func (n *Nomad) freePortsLocked(count int) ([]int, error) {
	for attempt := 0; attempt < 20; attempt++ {
		var lns []net.Listener
		var ports []int
		ok := true
		for range count {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				ok = false
				break
			}
			lns = append(lns, ln)
			ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
		}
		for _, ln := range lns {
			ln.Close()
		}
		if !ok {
			continue
		}
		clash := false
		for _, p := range ports {
			if n.ports[p] {
				clash = true
			}
		}
		if clash {
			continue
		}
		for _, p := range ports {
			n.ports[p] = true
		}
		return ports, nil
	}
	return nil, fmt.Errorf("fake cluster: no %d free ports on 127.0.0.1", count)
}

// stopAllocLocked tells an allocation to stop at the plan's index (the
// scheduler's part); its runner then shuts it down (the client's part).
func (n *Nomad) stopAllocLocked(a *alloc, why string, idx uint64) {
	if a.DesiredStatus == api.AllocDesiredStatusStop {
		return
	}
	a.DesiredStatus, a.DesiredDescription = api.AllocDesiredStatusStop, why
	a.ModifyIndex, a.AllocModifyIndex = idx, idx
	a.ModifyTime = time.Now().UnixNano()
	n.allocsIndex = idx
	n.publishLocked(idx, allocEvent("PlanResult", a))
	if a.runner != nil {
		a.runner.stop()
	}
}

func (n *Nomad) stopAllocsLocked(j *nomadJob, why string) {
	var idx uint64
	for _, a := range n.allocsOfLocked(j) {
		if a.DesiredStatus == api.AllocDesiredStatusStop {
			continue
		}
		if idx == 0 {
			idx = n.nextIndex()
		}
		n.stopAllocLocked(a, why, idx)
	}
}

// updateAlloc applies a client-side change (task states) to an
// allocation, recomputes its client status as Nomad's client does, and
// publishes it. When the allocation becomes terminal its ports are freed
// and the scheduler looks at the job again.
func (n *Nomad) updateAlloc(id string, f func(a *alloc)) {
	n.mu.Lock()
	a, ok := n.allocs[id]
	if !ok {
		n.mu.Unlock()
		return
	}
	wasTerminal := a.terminal()
	f(a)
	if len(a.TaskStates) > 0 && a.ClientStatus != api.AllocClientStatusLost {
		a.ClientStatus, a.ClientDescription = clientStatus(a.TaskStates)
	}
	idx := n.nextIndex()
	a.ModifyIndex = idx
	a.ModifyTime = time.Now().UnixNano()
	n.allocsIndex = idx
	n.publishLocked(idx, allocEvent("AllocationUpdated", a))
	if a.terminal() && !wasTerminal {
		a.finishedAt = time.Now()
		for _, p := range a.Ports {
			delete(n.ports, p.Value)
		}
		if j := n.jobs[jobKey(a.Namespace, a.JobID)]; j != nil && deref(j.job.CreateIndex) == a.JobCreateIndex {
			n.reconcileLocked(j)
		}
	}
	if j := n.jobs[jobKey(a.Namespace, a.JobID)]; j != nil {
		n.setJobStatusLocked(j)
	}
	n.mu.Unlock()
	n.changed.Notify()
}

// clientStatus is Nomad's client rule: failed if a task failed, pending if
// one has not started, running if one runs, complete when all are dead.
func clientStatus(states map[string]*api.TaskState) (string, string) {
	var failed, pending, running, dead bool
	for _, s := range states {
		switch s.State {
		case "running":
			running = true
		case "pending":
			pending = true
		case "dead":
			if s.Failed {
				failed = true
			} else {
				dead = true
			}
		}
	}
	switch {
	case failed:
		return api.AllocClientStatusFailed, "Failed tasks"
	case pending:
		return api.AllocClientStatusPending, "No tasks have started"
	case running:
		return api.AllocClientStatusRunning, "Tasks are running"
	case dead:
		return api.AllocClientStatusComplete, "All tasks have completed"
	}
	return api.AllocClientStatusPending, ""
}

// ---- wire shapes ----

// taskStateWire is api.TaskState as Nomad writes it: unset times are null.
type taskStateWire struct {
	State       string
	Failed      bool
	Restarts    uint64
	LastRestart *time.Time
	StartedAt   *time.Time
	FinishedAt  *time.Time
	Events      []*api.TaskEvent
	TaskHandle  any
}

func timeOrNil(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

func taskStatesWire(states map[string]*api.TaskState) map[string]*taskStateWire {
	if len(states) == 0 {
		return nil
	}
	out := make(map[string]*taskStateWire, len(states))
	for name, s := range states {
		evs := make([]*api.TaskEvent, len(s.Events))
		for i, e := range s.Events {
			cp := *e
			evs[i] = &cp
		}
		out[name] = &taskStateWire{State: s.State, Failed: s.Failed, Restarts: s.Restarts,
			LastRestart: timeOrNil(s.LastRestart), StartedAt: timeOrNil(s.StartedAt), FinishedAt: timeOrNil(s.FinishedAt), Events: evs}
	}
	return out
}

type allocatedWire struct {
	api.AllocatedResources
	TaskLifecycles map[string]*api.TaskLifecycle
}

type allocWire struct {
	api.Allocation
	AllocatedResources *allocatedWire
	TaskStates         map[string]*taskStateWire
}

type allocStubWire struct {
	api.AllocationListStub
	TaskStates map[string]*taskStateWire
}

func (a *alloc) network() *api.NetworkResource {
	nr := &api.NetworkResource{Mode: "host", IP: "127.0.0.1"}
	for _, p := range a.Ports {
		nr.DynamicPorts = append(nr.DynamicPorts, api.Port{Label: p.Label, Value: p.Value, To: p.To, HostNetwork: "default"})
	}
	return nr
}

// wire is the allocation as GET /v1/allocation/:id answers it.
func (a *alloc) wire(withJob bool) allocWire {
	tg := jobGroup(a.Job, a.TaskGroup)
	ar := &allocatedWire{
		AllocatedResources: api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{},
			Shared: api.AllocatedSharedResources{DiskMB: 300}},
		TaskLifecycles: map[string]*api.TaskLifecycle{},
	}
	cpu, mem := 0, 0
	taskRes := map[string]*api.Resources{}
	if tg != nil {
		for _, t := range tg.Tasks {
			c, m := 0, 0
			if t.Resources != nil {
				c, m = deref(t.Resources.CPU), deref(t.Resources.MemoryMB)
			}
			cpu, mem = cpu+c, mem+m
			ar.Tasks[t.Name] = &api.AllocatedTaskResources{Cpu: api.AllocatedCpuResources{CpuShares: int64(c)},
				Memory: api.AllocatedMemoryResources{MemoryMB: int64(m)}}
			ar.TaskLifecycles[t.Name] = t.Lifecycle
			taskRes[t.Name] = &api.Resources{CPU: new(c), MemoryMB: new(m)}
		}
	}
	if len(a.Ports) > 0 {
		ar.Shared.Networks = []*api.NetworkResource{a.network()}
		for _, p := range a.Ports {
			ar.Shared.Ports = append(ar.Shared.Ports, api.PortMapping{Label: p.Label, Value: p.Value, To: p.To, HostIP: "127.0.0.1"})
		}
	}
	w := allocWire{
		Allocation: api.Allocation{
			ID: a.ID, Namespace: a.Namespace, EvalID: a.EvalID, Name: a.Name, NodeID: fakeNodeID, NodeName: fakeNodeName,
			JobID: a.JobID, TaskGroup: a.TaskGroup,
			Resources:     &api.Resources{CPU: new(cpu), MemoryMB: new(mem), DiskMB: new(300), Networks: ar.Shared.Networks},
			TaskResources: taskRes,
			DesiredStatus: a.DesiredStatus, DesiredDescription: a.DesiredDescription,
			ClientStatus: a.ClientStatus, ClientDescription: a.ClientDescription,
			PreviousAllocation: a.PreviousAllocation, NextAllocation: a.NextAllocation,
			CreateIndex: a.CreateIndex, ModifyIndex: a.ModifyIndex, AllocModifyIndex: a.AllocModifyIndex,
			CreateTime: a.CreateTime, ModifyTime: a.ModifyTime,
		},
		AllocatedResources: ar,
		TaskStates:         taskStatesWire(a.TaskStates),
	}
	if withJob {
		w.Job = copyJob(a.Job)
	}
	return w
}

func (a *alloc) stub() allocStubWire {
	return allocStubWire{
		AllocationListStub: api.AllocationListStub{
			ID: a.ID, EvalID: a.EvalID, Name: a.Name, Namespace: a.Namespace, NodeID: fakeNodeID, NodeName: fakeNodeName,
			JobID: a.JobID, JobType: deref(a.Job.Type), JobVersion: deref(a.Job.Version), TaskGroup: a.TaskGroup,
			DesiredStatus: a.DesiredStatus, DesiredDescription: a.DesiredDescription,
			ClientStatus: a.ClientStatus, ClientDescription: a.ClientDescription,
			NextAllocation: a.NextAllocation, CreateIndex: a.CreateIndex, ModifyIndex: a.ModifyIndex,
			CreateTime: a.CreateTime, ModifyTime: a.ModifyTime,
		},
		TaskStates: taskStatesWire(a.TaskStates),
	}
}

// ---- handlers ----

func (n *Nomad) jobAllocations(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	all := r.URL.Query().Get("all") == "true"
	n.writeAllocStubs(w, func(a *alloc) bool {
		if a.Namespace != ns || a.JobID != id {
			return false
		}
		// Without all, only the allocations of the job as registered now
		// (a purged and re-registered job starts afresh).
		j := n.jobs[jobKey(ns, id)]
		return all || j != nil && a.JobCreateIndex == deref(j.job.CreateIndex)
	})
}

// writeAllocStubs answers with the stubs of the allocations keep selects
// (keep runs with n.mu held), newest first.
func (n *Nomad) writeAllocStubs(w http.ResponseWriter, keep func(a *alloc) bool) {
	n.mu.Lock()
	out := []allocStubWire{}
	for _, a := range n.allocs {
		if keep(a) {
			out = append(out, a.stub())
		}
	}
	idx := max(n.allocsIndex, 1)
	n.mu.Unlock()
	sort.Slice(out, func(i, k int) bool { return out[i].CreateIndex > out[k].CreateIndex })
	writeJSON(w, queryHeaders(idx), out)
}

func (n *Nomad) allocation(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n.mu.Lock()
	a, ok := n.allocs[id]
	var out allocWire
	if ok {
		out = a.wire(true)
	}
	idx := max(n.allocsIndex, 1)
	n.mu.Unlock()
	if !ok {
		writeText(w, queryHeaders(idx), http.StatusNotFound, "alloc not found")
		return
	}
	writeJSON(w, queryHeaders(idx), out)
}

// allocationList answers GET /v1/allocations: the allocations of a
// namespace ("*" for all) whose ID starts with prefix, newest first.
func (n *Nomad) allocationList(w http.ResponseWriter, r *http.Request) {
	ns, prefix := requestNamespace(r), r.URL.Query().Get("prefix")
	n.writeAllocStubs(w, func(a *alloc) bool {
		return (ns == "*" || a.Namespace == ns) && strings.HasPrefix(a.ID, prefix)
	})
}

// allocStop answers `nomad alloc stop`: as Nomad does, the allocation is
// stopped (shutdown delay, kill timeout) and the scheduler places a
// replacement, since the job still wants its count.
func (n *Nomad) allocStop(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	n.mu.Lock()
	a, ok := n.allocs[id]
	if !ok {
		n.mu.Unlock()
		writeText(w, nil, http.StatusNotFound, "alloc not found")
		return
	}
	idx := n.nextIndex()
	n.stopAllocLocked(a, "alloc is being migrated", idx)
	if j := n.jobs[jobKey(a.Namespace, a.JobID)]; j != nil {
		n.reconcileLocked(j)
	}
	n.mu.Unlock()
	n.changed.Notify()
	writeJSON(w, indexHeader(idx), map[string]any{"EvalID": newUUID(), "Index": idx})
}

// AllocationInfo is an allocation as tests inspect it.
type AllocationInfo struct {
	ID                 string
	Job                string
	Group              string
	Name               string
	DesiredStatus      string
	ClientStatus       string
	PreviousAllocation string
	Ports              map[string]int
	TaskStates         map[string]*api.TaskState
	// PIDs are the tasks' processes while they run.
	PIDs map[string]int
}

// Allocations lists a job's allocations (every incarnation), oldest first.
func (n *Nomad) Allocations(namespace, job string) []AllocationInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []AllocationInfo
	var list []*alloc
	for _, a := range n.allocs {
		if a.Namespace == namespace && a.JobID == job {
			list = append(list, a)
		}
	}
	sort.Slice(list, func(i, k int) bool { return list[i].CreateIndex < list[k].CreateIndex })
	for _, a := range list {
		info := AllocationInfo{ID: a.ID, Job: a.JobID, Group: a.TaskGroup, Name: a.Name, DesiredStatus: a.DesiredStatus,
			ClientStatus: a.ClientStatus, PreviousAllocation: a.PreviousAllocation, Ports: map[string]int{},
			TaskStates: map[string]*api.TaskState{}, PIDs: map[string]int{}}
		for k, v := range a.pids {
			info.PIDs[k] = v
		}
		for _, p := range a.Ports {
			info.Ports[p.Label] = p.Value
		}
		b, _ := json.Marshal(a.TaskStates)
		_ = json.Unmarshal(b, &info.TaskStates)
		out = append(out, info)
	}
	return out
}

// newTaskEvent makes a task event with Nomad's display message for its
// type; set fills the type's fields.
func newTaskEvent(typ, msg string, set func(e *api.TaskEvent)) *api.TaskEvent {
	e := &api.TaskEvent{Type: typ, Time: time.Now().UnixNano(), Details: map[string]string{}, Message: msg}
	if set != nil {
		set(e)
	}
	e.DisplayMessage = displayMessage(e)
	return e
}

// displayMessage is what Nomad's client writes as an event's
// DisplayMessage.
func displayMessage(e *api.TaskEvent) string {
	switch e.Type {
	case api.TaskReceived:
		return "Task received by client"
	case api.TaskSetup:
		return e.Message
	case api.TaskStarted:
		return "Task started by client"
	case api.TaskSetupFailure:
		return cmp.Or(e.SetupError, "Task setup failed")
	case api.TaskDriverFailure:
		return cmp.Or(e.DriverError, "Failed to start task")
	case api.TaskKilling:
		if e.KillTimeout != 0 {
			return fmt.Sprintf("Sent interrupt. Waiting %v before force killing", e.KillTimeout)
		}
		return "Sent interrupt"
	case api.TaskKilled:
		return cmp.Or(e.KillError, "Task successfully killed")
	case api.TaskTerminated:
		s := "Exit Code: " + strconv.Itoa(e.ExitCode)
		if e.Signal != 0 {
			s += ", Signal: " + strconv.Itoa(e.Signal)
		}
		if e.Message != "" {
			s += fmt.Sprintf(", Exit Message: %q", e.Message)
		}
		return s
	case api.TaskRestarting:
		in := fmt.Sprintf("Task restarting in %v", time.Duration(e.StartDelay))
		if e.RestartReason != "" && e.RestartReason != api.AllocRestartReasonWithinPolicy {
			return e.RestartReason + " - " + in
		}
		return in
	case api.TaskNotRestarting:
		return cmp.Or(e.RestartReason, "Task exceeded restart policy")
	case api.TaskSiblingFailed:
		if e.FailedSibling != "" {
			return fmt.Sprintf("Task's sibling %q failed", e.FailedSibling)
		}
		return "Task's sibling failed"
	}
	return e.Message
}

// setPID records (pid > 0) or clears a task's process, for tests; it is not
// a change Nomad would publish.
func (n *Nomad) setPID(allocID, task string, pid int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	a, ok := n.allocs[allocID]
	if !ok {
		return
	}
	if a.pids == nil {
		a.pids = map[string]int{}
	}
	if pid > 0 {
		a.pids[task] = pid
	} else {
		delete(a.pids, task)
	}
}
