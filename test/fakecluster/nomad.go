package fakecluster

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/go-bexpr"
	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/datapath/broadcast"
)

// The fake Nomad's single client node.
const (
	fakeNodeID   = "abf57d6e-db6b-cfca-8088-1138f35a9429"
	fakeNodeName = "fake"
)

// Nomad is the fake Nomad agent (server and one client node in one, like
// `nomad agent -dev`). It is safe for concurrent use.
type Nomad struct {
	opts   Options
	consul *Consul
	srv    *server
	quit   chan struct{}

	changed broadcast.Signal // wakes event streams

	mu          sync.Mutex
	closed      bool
	index       uint64
	jobs        map[string]*nomadJob // namespace + "/" + ID
	allocs      map[string]*alloc
	allocsIndex uint64       // the last write to the allocations table
	events      []eventBatch // the event buffer, oldest first
	scaleLog    []ScaleRequest
	ports       map[int]bool // host ports of live allocations
	timers      map[*time.Timer]bool

	wg    sync.WaitGroup // allocation runners and timers
	outMu sync.Mutex     // serialises TaskOutput lines
}

type nomadJob struct {
	ns      string
	job     *api.Job
	scaling map[string][]*api.ScalingEvent // per group, newest first
}

// ScaleRequest is one scale call Nomad accepted, as tests inspect it
// (every call, even beyond the 20 events Nomad keeps per group).
type ScaleRequest struct {
	Time          time.Time
	Namespace     string
	Job           string
	Group         string
	Count         *int // nil: the call only recorded a message
	PreviousCount int
	Message       string
	Error         bool
	Meta          map[string]any
}

func newNomad(opts Options, consul *Consul) *Nomad {
	n := &Nomad{
		opts: opts, consul: consul, quit: make(chan struct{}), index: 10,
		jobs: map[string]*nomadJob{}, allocs: map[string]*alloc{}, ports: map[int]bool{}, timers: map[*time.Timer]bool{},
	}
	n.srv = newServer("Nomad", api.PermissionDeniedErrorContent, map[string]http.HandlerFunc{
		"PUT /v1/jobs": n.register, "POST /v1/jobs": n.register, "GET /v1/jobs": n.list,
		"GET /v1/job/{id}": n.read, "DELETE /v1/job/{id}": n.deregister,
		"GET /v1/job/{id}/allocations": n.jobAllocations, "GET /v1/job/{id}/scale": n.scaleStatus,
		"PUT /v1/job/{id}/scale": n.scale, "POST /v1/job/{id}/scale": n.scale,
		"GET /v1/allocation/{id}": n.allocation, "GET /v1/allocations": n.allocationList,
		"PUT /v1/allocation/{id}/stop": n.allocStop, "POST /v1/allocation/{id}/stop": n.allocStop,
		"GET /v1/event/stream": n.eventStream, "GET /v1/client/allocation/{id}/stats": n.allocStats,
	})
	return n
}

// Addr is the agent's address as NOMAD_ADDR takes it.
func (n *Nomad) Addr() string { return n.srv.url() }

// ClientConfig is the API client's default configuration with the address
// of this agent.
func (n *Nomad) ClientConfig() *api.Config {
	cfg := api.DefaultConfig()
	cfg.Address = n.Addr()
	return cfg
}

// Down closes the agent's listener and every open connection (event
// streams break) until Up; allocations keep running.
func (n *Nomad) Down() { n.srv.down() }

// Up serves again on the same address.
func (n *Nomad) Up() error { return n.srv.up() }

// SetFault makes the agent answer matching requests with f; Fault{} clears
// it.
func (n *Nomad) SetFault(f Fault) { n.srv.setFault(f) }

func jobKey(ns, id string) string { return ns + "/" + id }

// nextIndex takes the next raft index (call with n.mu held).
func (n *Nomad) nextIndex() uint64 {
	n.index++
	return n.index
}

func queryHeaders(index uint64) map[string]string {
	return map[string]string{"X-Nomad-Index": strconv.FormatUint(index, 10), "X-Nomad-Knownleader": "true", "X-Nomad-Lastcontact": "0"}
}

// writeResult answers a write as Nomad does (its response and QueryMeta).
func writeResult(w http.ResponseWriter, evalID string, evalIndex, jobModifyIndex, index uint64, extra map[string]any) {
	resp := map[string]any{"EvalID": evalID, "EvalCreateIndex": evalIndex, "JobModifyIndex": jobModifyIndex,
		"Index": index, "LastContact": 0, "KnownLeader": false, "NextToken": ""}
	maps.Copy(resp, extra)
	writeJSON(w, map[string]string{"X-Nomad-Index": strconv.FormatUint(index, 10)}, resp)
}

// requestNamespace is the namespace query parameter, "default" when absent.
func requestNamespace(r *http.Request) string {
	return cmp.Or(r.URL.Query().Get("namespace"), api.DefaultNamespace)
}

func (n *Nomad) register(w http.ResponseWriter, r *http.Request) {
	var req api.JobRegisterRequest
	if err := readJSON(r, &req); err != nil || req.Job == nil || deref(req.Job.ID) == "" {
		writeText(w, nil, http.StatusBadRequest, fmt.Sprintf("fake cluster: a job with an ID must be given (%v)", err))
		return
	}
	job := req.Job
	if deref(job.Namespace) == "" {
		job.Namespace = new(requestNamespace(r))
	}
	ns := *job.Namespace
	job.Canonicalize()
	job.NodePool = new(cmp.Or(deref(job.NodePool), "default"))
	if len(job.Datacenters) == 0 {
		job.Datacenters = []string{"*"}
	}

	n.mu.Lock()
	defer n.changed.Notify()
	defer n.mu.Unlock()
	if n.closed {
		writeText(w, nil, http.StatusServiceUnavailable, "fake cluster: closed")
		return
	}
	existing := n.jobs[jobKey(ns, *job.ID)]
	if req.EnforceIndex {
		var msg string
		switch jmi := req.JobModifyIndex; {
		case existing != nil && jmi == 0:
			msg = "job already exists"
		case existing != nil && jmi != deref(existing.job.JobModifyIndex):
			msg = fmt.Sprintf("job exists with conflicting job modify index: %d", deref(existing.job.JobModifyIndex))
		case existing == nil && jmi != 0:
			msg = "job does not exist"
		}
		if msg != "" {
			writeText(w, nil, http.StatusInternalServerError, fmt.Sprintf("Enforcing job modify index %d: %s", req.JobModifyIndex, msg))
			return
		}
	}
	if existing != nil && req.PreserveCounts {
		for _, tg := range job.TaskGroups {
			if old := jobGroup(existing.job, deref(tg.Name)); old != nil {
				tg.Count = new(deref(old.Count))
			}
		}
	}
	idx := n.nextIndex()
	if existing != nil && !specChanged(existing.job, job) {
		// Nomad writes nothing and only creates an evaluation.
		writeResult(w, newUUID(), idx, deref(existing.job.JobModifyIndex), idx, map[string]any{"Warnings": ""})
		return
	}
	job.SubmitTime = new(time.Now().UnixNano())
	job.JobModifyIndex, job.ModifyIndex, job.CreateIndex, job.Version = new(idx), new(idx), new(idx), new(uint64(0))
	job.Status, job.StatusDescription, job.Stable = new(""), new(""), new(false)
	if existing != nil {
		job.CreateIndex, job.Version = existing.job.CreateIndex, new(deref(existing.job.Version)+1)
	} else {
		existing = &nomadJob{ns: ns, scaling: map[string][]*api.ScalingEvent{}}
		n.jobs[jobKey(ns, *job.ID)] = existing
	}
	for _, tg := range job.TaskGroups {
		if s := tg.Scaling; s != nil {
			s.ID, s.CreateIndex = newUUID(), idx
			if og := jobGroup(existing.job, deref(tg.Name)); og != nil && og.Scaling != nil && og.Scaling.ID != "" {
				s.ID, s.CreateIndex = og.Scaling.ID, og.Scaling.CreateIndex
			}
			s.ModifyIndex, s.Namespace, s.Type = idx, "", cmp.Or(s.Type, "horizontal")
			s.Target = map[string]string{"Namespace": ns, "Job": *job.ID, "Group": deref(tg.Name)}
		}
	}
	existing.job = job
	n.setJobStatusLocked(existing)
	n.publishLocked(idx, jobEvent("JobRegistered", existing))
	n.reconcileLocked(existing)
	writeResult(w, newUUID(), idx, idx, idx, map[string]any{"Warnings": ""})
}

// specChanged reports whether a submitted job differs from the stored one
// in anything but the fields the server manages.
func specChanged(old, submitted *api.Job) bool {
	spec := func(j *api.Job) any {
		cp := copyJob(j)
		cp.Status, cp.StatusDescription, cp.Stable, cp.Version = nil, nil, nil, nil
		cp.SubmitTime, cp.CreateIndex, cp.ModifyIndex, cp.JobModifyIndex = nil, nil, nil, nil
		for _, tg := range cp.TaskGroups {
			if s := tg.Scaling; s != nil {
				s.ID, s.CreateIndex, s.ModifyIndex, s.Target, s.Namespace = "", 0, 0, nil, ""
			}
		}
		var out any
		b, _ := json.Marshal(cp)
		_ = json.Unmarshal(b, &out)
		return out
	}
	return !reflect.DeepEqual(spec(old), spec(submitted))
}

// copyJob deep-copies a job through JSON (an api.Job always encodes).
func copyJob(j *api.Job) *api.Job {
	var out api.Job
	b, _ := json.Marshal(j)
	_ = json.Unmarshal(b, &out)
	return &out
}

func jobGroup(j *api.Job, name string) *api.TaskGroup {
	if j == nil {
		return nil
	}
	for _, tg := range j.TaskGroups {
		if deref(tg.Name) == name {
			return tg
		}
	}
	return nil
}

// setJobStatusLocked computes the job's status as Nomad does: running while
// an allocation is not terminal, dead once stopped (or scaled to nothing)
// and every allocation is, pending before the first placement.
func (n *Nomad) setJobStatusLocked(j *nomadJob) {
	status := "pending"
	total := 0
	for _, tg := range j.job.TaskGroups {
		total += deref(tg.Count)
	}
	switch {
	case slices.ContainsFunc(n.allocsOfLocked(j), func(a *alloc) bool { return !a.terminal() }):
		status = "running"
	case deref(j.job.Stop) || total == 0:
		status = "dead"
	}
	j.job.Status = new(status)
}

func (n *Nomad) read(w http.ResponseWriter, r *http.Request) {
	n.mu.Lock()
	j := n.jobs[jobKey(requestNamespace(r), r.PathValue("id"))]
	if j == nil {
		idx := n.index
		n.mu.Unlock()
		writeText(w, queryHeaders(idx), http.StatusNotFound, "job not found")
		return
	}
	n.setJobStatusLocked(j)
	out := copyJob(j.job)
	n.mu.Unlock()
	writeJSON(w, queryHeaders(deref(out.ModifyIndex)), out)
}

// list answers /v1/jobs: a namespace's jobs ("*": all) whose ID starts with
// prefix and that match filter, evaluated as Nomad does (go-bexpr over the
// job).
func (n *Nomad) list(w http.ResponseWriter, r *http.Request) {
	ns, q := requestNamespace(r), r.URL.Query()
	var filter *bexpr.Evaluator
	if expr := q.Get("filter"); expr != "" {
		var err error
		if filter, err = bexpr.CreateEvaluator(expr); err != nil {
			writeText(w, nil, http.StatusBadRequest, "failed to read filter expression: "+err.Error())
			return
		}
	}
	n.mu.Lock()
	stubs := []*api.JobListStub{}
	for _, j := range n.jobs {
		if ns != api.AllNamespacesNamespace && j.ns != ns || !strings.HasPrefix(deref(j.job.ID), q.Get("prefix")) {
			continue
		}
		n.setJobStatusLocked(j)
		if filter != nil {
			if ok, err := filter.Evaluate(j.job); err != nil || !ok {
				continue
			}
		}
		stub := n.stubLocked(j)
		if q.Get("meta") == "true" { // Nomad 1.6 and later
			stub.Meta = maps.Clone(j.job.Meta)
		}
		stubs = append(stubs, stub)
	}
	idx := n.index
	n.mu.Unlock()
	slices.SortFunc(stubs, func(a, b *api.JobListStub) int {
		return cmp.Or(cmp.Compare(a.ID, b.ID), cmp.Compare(a.Namespace, b.Namespace))
	})
	writeJSON(w, queryHeaders(idx), stubs)
}

// stubLocked is the job's list stub with its summary: its allocations by
// client status per group.
func (n *Nomad) stubLocked(j *nomadJob) *api.JobListStub {
	job := j.job
	sum := &api.JobSummary{JobID: deref(job.ID), Namespace: j.ns, Summary: map[string]api.TaskGroupSummary{},
		Children: &api.JobChildrenSummary{}, CreateIndex: deref(job.CreateIndex), ModifyIndex: n.index}
	for _, tg := range job.TaskGroups {
		sum.Summary[deref(tg.Name)] = api.TaskGroupSummary{}
	}
	for _, a := range n.allocsOfLocked(j) {
		g := sum.Summary[a.TaskGroup]
		switch a.ClientStatus {
		case api.AllocClientStatusPending:
			g.Starting++
		case api.AllocClientStatusRunning:
			g.Running++
		case api.AllocClientStatusComplete:
			g.Complete++
		case api.AllocClientStatusFailed:
			g.Failed++
		}
		sum.Summary[a.TaskGroup] = g
	}
	return &api.JobListStub{
		ID: deref(job.ID), ParentID: deref(job.ParentID), Name: deref(job.Name), Namespace: j.ns,
		Datacenters: job.Datacenters, Type: deref(job.Type), Priority: deref(job.Priority),
		Periodic: job.Periodic != nil, ParameterizedJob: job.ParameterizedJob != nil, Stop: deref(job.Stop),
		Status: deref(job.Status), StatusDescription: deref(job.StatusDescription), JobSummary: sum,
		CreateIndex: deref(job.CreateIndex), ModifyIndex: deref(job.ModifyIndex), JobModifyIndex: deref(job.JobModifyIndex),
		SubmitTime: deref(job.SubmitTime),
	}
}

// deregister stops a job (a new version with Stop set), or with purge
// removes it; either way its allocations stop.
func (n *Nomad) deregister(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	volume := map[string]any{"VolumeEvalID": "", "VolumeEvalIndex": 0}
	n.mu.Lock()
	defer n.changed.Notify()
	defer n.mu.Unlock()
	j := n.jobs[jobKey(ns, id)]
	if j == nil {
		writeResult(w, "", 0, 0, 0, volume) // an unknown job: an empty success
		return
	}
	idx := n.nextIndex()
	if r.URL.Query().Get("purge") == "true" {
		delete(n.jobs, jobKey(ns, id))
		n.publishLocked(idx, deregisterEvalEvent(j, idx))
		for _, a := range n.allocsOfLocked(j) {
			n.stopAllocLocked(a, "alloc not needed due to job purge", idx)
		}
	} else {
		if !deref(j.job.Stop) {
			j.job = copyJob(j.job)
			j.job.Stop, j.job.Version = new(true), new(deref(j.job.Version)+1)
			j.job.JobModifyIndex, j.job.ModifyIndex = new(idx), new(idx)
			j.job.SubmitTime = new(time.Now().UnixNano())
		}
		n.setJobStatusLocked(j)
		n.publishLocked(idx, jobEvent("JobDeregistered", j), deregisterEvalEvent(j, idx))
		n.reconcileLocked(j)
	}
	writeResult(w, newUUID(), idx, idx, idx, volume)
}

func (n *Nomad) scaleStatus(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	n.mu.Lock()
	defer n.mu.Unlock()
	j := n.jobs[jobKey(ns, id)]
	if j == nil {
		writeText(w, queryHeaders(n.index), http.StatusNotFound, "job not found")
		return
	}
	resp := api.JobScaleStatusResponse{JobID: id, Namespace: ns, JobCreateIndex: deref(j.job.CreateIndex),
		JobModifyIndex: deref(j.job.JobModifyIndex), JobStopped: deref(j.job.Stop), TaskGroups: map[string]api.TaskGroupScaleStatus{}}
	for _, tg := range j.job.TaskGroups {
		name := deref(tg.Name)
		st := api.TaskGroupScaleStatus{Desired: deref(tg.Count)}
		for _, a := range n.allocsOfLocked(j) {
			if a.TaskGroup == name && a.DesiredStatus == api.AllocDesiredStatusRun && !a.terminal() {
				st.Placed++
				if a.ClientStatus == api.AllocClientStatusRunning {
					st.Running++
				}
			}
		}
		for _, e := range j.scaling[name] {
			st.Events = append(st.Events, *e)
		}
		resp.TaskGroups[name] = st
	}
	writeJSON(w, queryHeaders(n.index), resp)
}

// scale changes a group's count within its scaling block's bounds (a new
// job version) and records a scaling event; a request without a count
// only records the event.
func (n *Nomad) scale(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	var req api.ScalingRequest
	if err := readJSON(r, &req); err != nil {
		writeText(w, nil, http.StatusBadRequest, err.Error())
		return
	}
	ns = cmp.Or(req.Namespace, ns)
	group := req.Target["Group"]
	n.mu.Lock()
	defer n.changed.Notify()
	defer n.mu.Unlock()
	j := n.jobs[jobKey(ns, id)]
	var tg *api.TaskGroup
	if j != nil {
		tg = jobGroup(j.job, group)
	}
	var msg string
	status := http.StatusBadRequest
	switch {
	case group == "":
		msg = "missing task group name for scaling action"
	case req.Count != nil && *req.Count < 0:
		msg = "scaling action count can't be negative"
	case j == nil:
		msg, status = fmt.Sprintf("job %q not found", id), http.StatusNotFound
	case tg == nil:
		msg = fmt.Sprintf("task group %q specified for scaling does not exist in job", group)
	case req.Count != nil && tg.Scaling != nil && tg.Scaling.Min != nil && *req.Count < *tg.Scaling.Min:
		msg = fmt.Sprintf("group count was less than scaling policy minimum: %d < %d", *req.Count, *tg.Scaling.Min)
	case req.Count != nil && tg.Scaling != nil && tg.Scaling.Max != nil && *tg.Scaling.Max < *req.Count:
		msg = fmt.Sprintf("group count was greater than scaling policy maximum: %d > %d", *req.Count, *tg.Scaling.Max)
	}
	if msg != "" {
		writeText(w, nil, status, msg)
		return
	}
	now := time.Now()
	prev := deref(tg.Count)
	ev := &api.ScalingEvent{Count: req.Count, PreviousCount: int64(prev), Error: req.Error, Message: req.Message,
		Meta: maps.Clone(req.Meta), Time: uint64(now.UnixNano())}
	evalID, evalIndex, jmi := "", uint64(0), deref(j.job.ModifyIndex)
	var count *int
	if req.Count != nil {
		count = new(int(*req.Count))
		evalIndex = n.nextIndex()
		job := copyJob(j.job)
		jobGroup(job, group).Count = count
		job.SubmitTime, job.Version = new(now.UnixNano()), new(deref(job.Version)+1)
		job.JobModifyIndex, job.ModifyIndex = new(evalIndex), new(evalIndex)
		j.job, jmi, evalID = job, evalIndex, newUUID()
		ev.EvalID = new(evalID)
		n.setJobStatusLocked(j)
		n.publishLocked(evalIndex, jobEvent("JobRegistered", j))
		n.reconcileLocked(j)
	}
	ev.CreateIndex = n.nextIndex()
	// Nomad keeps 20 events per group (structs.JobTrackedScalingEvents).
	j.scaling[group] = append([]*api.ScalingEvent{ev}, j.scaling[group][:min(len(j.scaling[group]), 19)]...)
	n.scaleLog = append(n.scaleLog, ScaleRequest{Time: now, Namespace: ns, Job: id, Group: group, Count: count,
		PreviousCount: prev, Message: req.Message, Error: req.Error, Meta: maps.Clone(req.Meta)})
	writeResult(w, evalID, evalIndex, jmi, ev.CreateIndex, map[string]any{"Warnings": ""})
}

// ScaleRequests lists every scale call Nomad accepted for a job (all jobs
// when job is ""), oldest first.
func (n *Nomad) ScaleRequests(job string) []ScaleRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	var out []ScaleRequest
	for _, s := range n.scaleLog {
		if job == "" || s.Job == job {
			out = append(out, s)
		}
	}
	return out
}

// JobIDs lists the jobs Nomad holds (stopped ones included, purged ones
// not) as "namespace/ID", sorted.
func (n *Nomad) JobIDs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Sorted(maps.Keys(n.jobs))
}

// Job returns a copy of a job as Nomad holds it, or nil.
func (n *Nomad) Job(namespace, id string) *api.Job {
	n.mu.Lock()
	defer n.mu.Unlock()
	j := n.jobs[jobKey(namespace, id)]
	if j == nil {
		return nil
	}
	n.setJobStatusLocked(j)
	return copyJob(j.job)
}

// Count is a job group's count, and whether the job and group exist.
func (n *Nomad) Count(namespace, id, group string) (int, bool) {
	j := n.Job(namespace, id)
	tg := jobGroup(j, group)
	if tg == nil {
		return 0, false
	}
	return deref(tg.Count), true
}

// close stops serving and every allocation without shutdown delays, then
// waits for every runner and timer.
func (n *Nomad) close() {
	n.mu.Lock()
	n.closed = true
	for t := range n.timers {
		if t.Stop() {
			n.wg.Done()
		}
	}
	clear(n.timers)
	for _, a := range n.allocs {
		if a.runner != nil {
			a.runner.stop()
		}
	}
	n.mu.Unlock()
	close(n.quit) // event streams watch it
	n.srv.down()
	n.wg.Wait()
}
