package fakecluster

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// alloc is one allocation: the api.Allocation Nomad answers (its Job the
// version that placed it) and what the fake keeps beside it. Its fields
// are guarded by Nomad.mu; its processes belong to its runner.
type alloc struct {
	api.Allocation
	slot           int    // the index in its name
	jobCreateIndex uint64 // the incarnation of the job that placed it
	finishedAt     time.Time
	runner         *allocRunner
	pids           map[string]int       // task -> its current process
	cpu            map[string]cpuSample // task -> its process's last CPU measure
}

func (a *alloc) terminal() bool {
	return slices.Contains([]string{api.AllocClientStatusComplete, api.AllocClientStatusFailed, api.AllocClientStatusLost}, a.ClientStatus)
}

// allocsOfLocked lists the allocations of the job's current incarnation (a
// purged job registered again does not own the old one's), oldest first.
func (n *Nomad) allocsOfLocked(j *nomadJob) []*alloc {
	var out []*alloc
	for _, a := range n.allocs {
		if a.Namespace == j.ns && a.JobID == deref(j.job.ID) && a.jobCreateIndex == deref(j.job.CreateIndex) {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b *alloc) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	return out
}

// reconcileLocked is the scheduler: per group it stops allocations beyond
// the count (highest index first), replaces failed ones after the
// reschedule delay, and places new ones up to the count, in one plan at
// one index with a Job PlanResult event beside the allocations'
// (fixture 011).
func (n *Nomad) reconcileLocked(j *nomadJob) {
	if n.closed || n.jobs[jobKey(j.ns, deref(j.job.ID))] != j {
		return // closing, or purged meanwhile
	}
	var planIdx uint64
	plan := func() uint64 {
		if planIdx == 0 {
			planIdx = n.nextIndex()
		}
		return planIdx
	}
	for _, tg := range j.job.TaskGroups {
		name, desired := deref(tg.Name), deref(tg.Count)
		if deref(j.job.Stop) {
			desired = 0
		}
		var live, failed []*alloc
		used := map[int]bool{}
		for _, a := range n.allocsOfLocked(j) {
			switch {
			case a.TaskGroup != name || a.DesiredStatus != api.AllocDesiredStatusRun:
			case !a.terminal():
				live = append(live, a)
				used[a.slot] = true
			case a.NextAllocation == "":
				failed = append(failed, a)
			}
		}
		// Failed allocations beyond the count are not replaced.
		for len(live)+len(failed) > desired && len(failed) > 0 {
			n.stopAllocLocked(failed[len(failed)-1], "alloc not needed due to job update", plan())
			failed = failed[:len(failed)-1]
		}
		if len(live) > desired {
			slices.SortFunc(live, func(a, b *alloc) int { return b.slot - a.slot })
			for _, a := range live[:len(live)-desired] {
				n.stopAllocLocked(a, "alloc not needed due to job update", plan())
			}
			continue
		}
		// The allocations that stay move to the job's new version in place
		// (revision jobs change only their count and scaling).
		for _, a := range live {
			if deref(a.Job.Version) != deref(j.job.Version) {
				a.Job, a.ModifyIndex, a.AllocModifyIndex, a.ModifyTime = copyJob(j.job), plan(), plan(), time.Now().UnixNano()
				n.publishLocked(plan(), allocEvent("PlanResult", a))
			}
		}
		missing := desired - len(live)
		for _, f := range failed[:min(missing, len(failed))] {
			missing--
			if wait := time.Until(f.finishedAt.Add(n.rescheduleDelay(j, tg))); wait > 0 {
				n.afterLocked(wait, func() { n.reconcileLocked(j) })
				continue
			}
			slot := f.slot
			if used[slot] {
				slot = freeSlot(used)
			}
			used[slot] = true
			f.NextAllocation = n.placeLocked(j, tg, slot, f.ID, plan()).ID
		}
		for ; missing > 0; missing-- {
			slot := freeSlot(used)
			used[slot] = true
			n.placeLocked(j, tg, slot, "", plan())
		}
	}
	n.setJobStatusLocked(j)
	if planIdx != 0 {
		n.publishLocked(planIdx, jobEvent("PlanResult", j))
	}
}

func freeSlot(used map[int]bool) int {
	for i := 0; ; i++ {
		if !used[i] {
			return i
		}
	}
}

// rescheduleDelay is the delay before a failed allocation is replaced: the
// cluster's RescheduleDelay when set, else the group's reschedule policy
// (as canonicalized; doubling per earlier replacement up to MaxDelay when
// exponential).
func (n *Nomad) rescheduleDelay(j *nomadJob, tg *api.TaskGroup) time.Duration {
	if n.opts.RescheduleDelay > 0 {
		return n.opts.RescheduleDelay
	}
	p := tg.ReschedulePolicy
	d := deref(p.Delay)
	if deref(p.DelayFunction) == "exponential" {
		for _, a := range n.allocsOfLocked(j) {
			if a.PreviousAllocation != "" && d < deref(p.MaxDelay) {
				d = min(2*d, deref(p.MaxDelay))
			}
		}
	}
	return d
}

// afterLocked runs f with n.mu held after d, unless the cluster closes
// first (call with n.mu held).
func (n *Nomad) afterLocked(d time.Duration, f func()) {
	n.wg.Add(1)
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		defer n.wg.Done()
		n.mu.Lock()
		_, live := n.timers[t]
		delete(n.timers, t)
		if live {
			f()
		}
		n.mu.Unlock()
		n.changed.Notify()
	})
	n.timers[t] = true
}

// placeLocked creates an allocation at the plan's index, gives it its
// ports and starts its runner.
func (n *Nomad) placeLocked(j *nomadJob, tg *api.TaskGroup, slot int, previous string, idx uint64) *alloc {
	now := time.Now().UnixNano()
	a := &alloc{Allocation: api.Allocation{
		ID: newUUID(), Namespace: j.ns, EvalID: newUUID(), Name: fmt.Sprintf("%s.%s[%d]", deref(j.job.ID), deref(tg.Name), slot),
		NodeID: fakeNodeID, NodeName: fakeNodeName, JobID: deref(j.job.ID), Job: copyJob(j.job), TaskGroup: deref(tg.Name),
		DesiredStatus: api.AllocDesiredStatusRun, ClientStatus: api.AllocClientStatusPending, TaskStates: map[string]*api.TaskState{},
		PreviousAllocation: previous, CreateIndex: idx, ModifyIndex: idx, AllocModifyIndex: idx, CreateTime: now, ModifyTime: now,
	}, slot: slot, jobCreateIndex: deref(j.job.CreateIndex)}
	ar := &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{}, Shared: api.AllocatedSharedResources{DiskMB: 300}}
	for _, t := range tg.Tasks {
		res := cmp.Or(t.Resources, &api.Resources{})
		ar.Tasks[t.Name] = &api.AllocatedTaskResources{Cpu: api.AllocatedCpuResources{CpuShares: int64(deref(res.CPU))},
			Memory: api.AllocatedMemoryResources{MemoryMB: int64(deref(res.MemoryMB))}}
	}
	ports, err := n.allocatePortsLocked(tg)
	if len(ports) > 0 {
		nr := &api.NetworkResource{Mode: "host", IP: "127.0.0.1"}
		for _, p := range ports {
			nr.DynamicPorts = append(nr.DynamicPorts, api.Port{Label: p.Label, Value: p.Value, To: p.To, HostNetwork: "default"})
		}
		ar.Shared.Ports, ar.Shared.Networks = ports, []*api.NetworkResource{nr}
	}
	a.AllocatedResources = ar
	n.allocs[a.ID] = a
	n.allocsIndex = idx
	n.publishLocked(idx, allocEvent("PlanResult", a))
	a.runner = newAllocRunner(n, a, err)
	n.wg.Go(a.runner.run)
	return a
}

// allocatePortsLocked gives the group's ports host ports on 127.0.0.1:
// reserved ones as declared, dynamic ones free and not handed to another
// live allocation. Every network is treated as host networking. A dynamic
// port is one the kernel gives a listener on every address, as tasks (the
// sidecar) bind it: a port free on 127.0.0.1 alone may be held on another
// loopback address, by a client connection or its TIME_WAIT for a minute,
// and refuse the task's bind all that time (e2e rehearsals failed so).
func (n *Nomad) allocatePortsLocked(tg *api.TaskGroup) ([]api.PortMapping, error) {
	var out []api.PortMapping
	var dynamic []api.Port
	for _, nw := range tg.Networks {
		for _, p := range nw.ReservedPorts {
			out = append(out, api.PortMapping{Label: p.Label, Value: p.Value, To: p.To, HostIP: "127.0.0.1"})
		}
		dynamic = append(dynamic, nw.DynamicPorts...)
	}
	for attempt := 0; len(dynamic) > 0; attempt++ {
		if attempt == 20 {
			return out, fmt.Errorf("fake cluster: no %d free ports on 127.0.0.1", len(dynamic))
		}
		var got []int
		for range dynamic {
			if ln, err := net.Listen("tcp", ":0"); err == nil {
				defer ln.Close()
				got = append(got, ln.Addr().(*net.TCPAddr).Port)
			}
		}
		if len(got) < len(dynamic) || slices.ContainsFunc(got, func(p int) bool { return n.ports[p] }) {
			continue
		}
		for i, p := range dynamic {
			n.ports[got[i]] = true
			out = append(out, api.PortMapping{Label: p.Label, Value: got[i], To: p.To, HostIP: "127.0.0.1"})
		}
		break
	}
	return out, nil
}

// stopAllocLocked tells an allocation to stop at the plan's index (the
// scheduler's part); its runner then shuts it down (the client's part).
func (n *Nomad) stopAllocLocked(a *alloc, why string, idx uint64) {
	if a.DesiredStatus == api.AllocDesiredStatusStop {
		return
	}
	a.DesiredStatus, a.DesiredDescription = api.AllocDesiredStatusStop, why
	a.ModifyIndex, a.AllocModifyIndex, a.ModifyTime = idx, idx, time.Now().UnixNano()
	n.allocsIndex = idx
	n.publishLocked(idx, allocEvent("PlanResult", a))
	a.runner.stop()
}

// updateAlloc applies a client-side change (task states) to an allocation,
// sets its client status as Nomad's client does and publishes it. Once it
// is terminal its ports are freed and the scheduler looks at the job.
func (n *Nomad) updateAlloc(id string, f func(a *alloc)) {
	n.mu.Lock()
	defer n.changed.Notify()
	defer n.mu.Unlock()
	a, ok := n.allocs[id]
	if !ok {
		return
	}
	wasTerminal := a.terminal()
	f(a)
	if len(a.TaskStates) > 0 {
		a.ClientStatus, a.ClientDescription = clientStatus(a.TaskStates)
	}
	idx := n.nextIndex()
	a.ModifyIndex, a.ModifyTime, n.allocsIndex = idx, time.Now().UnixNano(), idx
	n.publishLocked(idx, allocEvent("AllocationUpdated", a))
	j := n.jobs[jobKey(a.Namespace, a.JobID)]
	if j == nil || deref(j.job.CreateIndex) != a.jobCreateIndex {
		j = nil
	}
	if a.terminal() && !wasTerminal {
		a.finishedAt = time.Now()
		for _, p := range a.AllocatedResources.Shared.Ports {
			delete(n.ports, p.Value)
		}
		if j != nil {
			n.reconcileLocked(j)
		}
	}
	if j != nil {
		n.setJobStatusLocked(j)
	}
}

// clientStatus is Nomad's client rule: failed if a task failed, pending if
// one has not started, running if one runs, complete when all are dead.
func clientStatus(states map[string]*api.TaskState) (string, string) {
	var failed, pending, running bool
	for _, s := range states {
		failed = failed || s.State == "dead" && s.Failed
		pending = pending || s.State == "pending"
		running = running || s.State == "running"
	}
	switch {
	case failed:
		return api.AllocClientStatusFailed, "Failed tasks"
	case pending:
		return api.AllocClientStatusPending, "No tasks have started"
	case running:
		return api.AllocClientStatusRunning, "Tasks are running"
	}
	return api.AllocClientStatusComplete, "All tasks have completed"
}

// marshal is the allocation as Nomad answers it, taken with n.mu held;
// without its job, as events carry it.
func (a *alloc) marshal(withJob bool) json.RawMessage {
	cp := a.Allocation
	if !withJob {
		cp.Job = nil
	}
	b, _ := json.Marshal(cp) // the API types always encode
	return b
}

func (n *Nomad) jobAllocations(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	all := r.URL.Query().Get("all") == "true"
	n.writeAllocStubs(w, func(a *alloc) bool {
		// Without all, only the job's current incarnation.
		j := n.jobs[jobKey(ns, id)]
		return a.Namespace == ns && a.JobID == id && (all || j != nil && a.jobCreateIndex == deref(j.job.CreateIndex))
	})
}

// allocationList answers GET /v1/allocations: the allocations of a
// namespace ("*" for all) whose ID starts with prefix.
func (n *Nomad) allocationList(w http.ResponseWriter, r *http.Request) {
	ns, prefix := requestNamespace(r), r.URL.Query().Get("prefix")
	n.writeAllocStubs(w, func(a *alloc) bool {
		return (ns == api.AllNamespacesNamespace || a.Namespace == ns) && strings.HasPrefix(a.ID, prefix)
	})
}

// writeAllocStubs answers the stubs of the allocations keep selects (keep
// runs with n.mu held), newest first.
func (n *Nomad) writeAllocStubs(w http.ResponseWriter, keep func(a *alloc) bool) {
	n.mu.Lock()
	var list []*alloc
	for _, a := range n.allocs {
		if keep(a) {
			list = append(list, a)
		}
	}
	slices.SortFunc(list, func(a, b *alloc) int { return cmp.Compare(b.CreateIndex, a.CreateIndex) })
	out := []api.AllocationListStub{}
	for _, a := range list {
		out = append(out, api.AllocationListStub{
			ID: a.ID, EvalID: a.EvalID, Name: a.Name, Namespace: a.Namespace, NodeID: a.NodeID, NodeName: a.NodeName,
			JobID: a.JobID, JobType: deref(a.Job.Type), JobVersion: deref(a.Job.Version), TaskGroup: a.TaskGroup,
			DesiredStatus: a.DesiredStatus, DesiredDescription: a.DesiredDescription, ClientStatus: a.ClientStatus,
			ClientDescription: a.ClientDescription, TaskStates: a.TaskStates, NextAllocation: a.NextAllocation,
			CreateIndex: a.CreateIndex, ModifyIndex: a.ModifyIndex, CreateTime: a.CreateTime, ModifyTime: a.ModifyTime,
		})
	}
	idx := max(n.allocsIndex, 1)
	b, _ := json.Marshal(out)
	n.mu.Unlock()
	writeJSON(w, queryHeaders(idx), json.RawMessage(b))
}

func (n *Nomad) allocation(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	a, ok := n.allocs[r.PathValue("id")]
	var out json.RawMessage
	if ok {
		out = a.marshal(true)
	}
	idx := max(n.allocsIndex, 1)
	n.mu.Unlock()
	if !ok {
		writeText(w, queryHeaders(idx), http.StatusNotFound, "alloc not found")
		return
	}
	writeJSON(w, queryHeaders(idx), out)
}

// allocStop answers `nomad alloc stop`: the allocation stops and, as the
// job still wants its count, the scheduler places a replacement.
func (n *Nomad) allocStop(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	defer n.changed.Notify()
	defer n.mu.Unlock()
	a, ok := n.allocs[r.PathValue("id")]
	if !ok {
		writeText(w, nil, http.StatusNotFound, "alloc not found")
		return
	}
	idx := n.nextIndex()
	n.stopAllocLocked(a, "alloc is being migrated", idx)
	if j := n.jobs[jobKey(a.Namespace, a.JobID)]; j != nil {
		n.reconcileLocked(j)
	}
	writeResult(w, newUUID(), idx, 0, idx, nil)
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
	PIDs               map[string]int // the tasks' processes while they run
}

// Allocations lists a job's allocations (every incarnation), oldest first.
func (n *Nomad) Allocations(namespace, job string) []AllocationInfo {
	n.mu.Lock()
	defer n.mu.Unlock()
	var list []*alloc
	for _, a := range n.allocs {
		if a.Namespace == namespace && a.JobID == job {
			list = append(list, a)
		}
	}
	slices.SortFunc(list, func(a, b *alloc) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	var out []AllocationInfo
	for _, a := range list {
		info := AllocationInfo{ID: a.ID, Job: a.JobID, Group: a.TaskGroup, Name: a.Name, DesiredStatus: a.DesiredStatus,
			ClientStatus: a.ClientStatus, PreviousAllocation: a.PreviousAllocation, Ports: map[string]int{}, PIDs: maps.Clone(a.pids)}
		for _, p := range a.AllocatedResources.Shared.Ports {
			info.Ports[p.Label] = p.Value
		}
		b, _ := json.Marshal(a.TaskStates)
		_ = json.Unmarshal(b, &info.TaskStates)
		out = append(out, info)
	}
	return out
}

// setPID records (pid > 0) or clears a task's process, for tests.
func (n *Nomad) setPID(allocID, task string, pid int) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if a, ok := n.allocs[allocID]; ok {
		if a.pids == nil {
			a.pids = map[string]int{}
		}
		a.pids[task] = pid
		if pid <= 0 {
			delete(a.pids, task)
		}
	}
}
