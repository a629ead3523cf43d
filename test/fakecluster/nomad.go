package fakecluster

import (
	"cmp"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/datapath/broadcast"
)

// NomadVersion is the version the fake Nomad reports.
const NomadVersion = "1.6.5"

// The fake Nomad's single client node.
const (
	fakeNodeID   = "abf57d6e-db6b-cfca-8088-1138f35a9429"
	fakeNodeName = "fake"
)

// scalingEventsKept is how many scaling events Nomad keeps per group
// (structs.JobTrackedScalingEvents).
const scalingEventsKept = 20

// Nomad is the fake Nomad agent (server and one client node in one, like
// `nomad agent -dev`): jobs with versions and optimistic concurrency,
// scaling with the scaling block's bounds and scaling events, allocations
// placed by a tiny scheduler and run for real by the raw_exec driver, and
// the event stream. It is safe for concurrent use.
type Nomad struct {
	opts   Options
	log    *slog.Logger
	consul *Consul
	srv    *server
	quit   chan struct{}

	changed broadcast.Signal // wakes event streams

	mu     sync.Mutex
	closed bool
	index  uint64
	jobs   map[string]*nomadJob // namespace + "/" + ID
	allocs map[string]*alloc
	// allocsIndex is the last write to the allocations table.
	allocsIndex uint64
	events      []eventBatch // the event buffer, oldest first
	scaleLog    []ScaleRequest
	ports       map[int]bool // host ports handed to live allocations
	timers      map[*time.Timer]bool

	wg    sync.WaitGroup // allocation runners and timers
	outMu sync.Mutex     // serialises TaskOutput lines
}

type nomadJob struct {
	ns  string
	job *api.Job
	// scaling holds each group's scaling events, newest first.
	scaling map[string][]*api.ScalingEvent
	// reschedules counts replacements of failed allocations, for the
	// exponential reschedule delay.
	reschedules int
}

// ScaleRequest is one scale call Nomad accepted, as tests inspect it: every
// call, even beyond the 20 events Nomad keeps per group.
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
		opts:   opts,
		log:    opts.Logger.With("agent", "nomad"),
		consul: consul,
		quit:   make(chan struct{}),
		index:  10,
		jobs:   map[string]*nomadJob{},
		allocs: map[string]*alloc{},
		ports:  map[int]bool{},
		timers: map[*time.Timer]bool{},
	}
	n.srv = newServer("nomad", n.handler(), api.PermissionDeniedErrorContent)
	return n
}

// Addr is the agent's address as NOMAD_ADDR takes it.
func (n *Nomad) Addr() string { return n.srv.url() }

// ClientConfig is the API client's default configuration (so the
// environment still applies) with the address of this agent.
func (n *Nomad) ClientConfig() *api.Config {
	cfg := api.DefaultConfig()
	cfg.Address = n.Addr()
	return cfg
}

// Down closes the agent's listener and every open connection (event
// streams break): requests get "connection refused" until Up. Allocations
// keep running, as they do when a real server is unreachable.
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
	return map[string]string{
		"X-Nomad-Index":       strconv.FormatUint(index, 10),
		"X-Nomad-Knownleader": "true",
		"X-Nomad-Lastcontact": "0",
	}
}

func indexHeader(index uint64) map[string]string {
	return map[string]string{"X-Nomad-Index": strconv.FormatUint(index, 10)}
}

// requestNamespace is the namespace query parameter, "default" when absent.
func requestNamespace(r *http.Request) string {
	return cmp.Or(r.URL.Query().Get("namespace"), api.DefaultNamespace)
}

func (n *Nomad) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/agent/self", n.agentSelf)
	mux.HandleFunc("GET /v1/status/leader", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, nil, "127.0.0.1:4647")
	})
	mux.HandleFunc("PUT /v1/jobs", n.register)
	mux.HandleFunc("POST /v1/jobs", n.register)
	mux.HandleFunc("GET /v1/jobs", n.list)
	mux.HandleFunc("GET /v1/job/{id}", n.read)
	mux.HandleFunc("DELETE /v1/job/{id}", n.deregister)
	mux.HandleFunc("GET /v1/job/{id}/allocations", n.jobAllocations)
	mux.HandleFunc("GET /v1/job/{id}/scale", n.scaleStatus)
	mux.HandleFunc("PUT /v1/job/{id}/scale", n.scale)
	mux.HandleFunc("POST /v1/job/{id}/scale", n.scale)
	mux.HandleFunc("GET /v1/allocation/{id}", n.allocation)
	mux.HandleFunc("PUT /v1/allocation/{id}/stop", n.allocStop)
	mux.HandleFunc("POST /v1/allocation/{id}/stop", n.allocStop)
	mux.HandleFunc("GET /v1/allocations", n.allocationList)
	mux.HandleFunc("GET /v1/event/stream", n.eventStream)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeText(w, nil, http.StatusNotFound, fmt.Sprintf("fake cluster: Nomad endpoint %s %s is not implemented by the fake", r.Method, r.URL.Path))
	})
	return mux
}

func (n *Nomad) agentSelf(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, nil, map[string]any{
		"config": map[string]any{
			"Version":    map[string]any{"Version": NomadVersion, "VersionPrerelease": "", "VersionMetadata": "", "Revision": "", "BuildDate": nil},
			"Region":     "global",
			"Datacenter": "dc1",
		},
		"member": map[string]any{
			"Addr": "127.0.0.1", "Name": fakeNodeName + ".global", "Port": 4648, "Status": "alive",
			"DelegateCur": 4, "DelegateMax": 5, "DelegateMin": 2, "ProtocolCur": 2, "ProtocolMax": 5, "ProtocolMin": 1,
			"Tags": map[string]string{"role": "nomad", "region": "global", "dc": "dc1", "build": NomadVersion, "port": "4647",
				"revision": "", "vsn": "1", "raft_vsn": "3", "bootstrap": "1", "expect": "1", "id": fakeNodeID, "rpc_addr": "127.0.0.1"},
		},
	})
}

// ---- register ----

// writeResponse is Nomad's reply to a job write (structs.JobRegisterResponse
// and JobDeregisterResponse with their QueryMeta), as the API writes it.
type writeResponse struct {
	EvalID          string
	EvalCreateIndex uint64
	JobModifyIndex  uint64
	Warnings        *string `json:",omitempty"`
	VolumeEvalID    *string `json:",omitempty"`
	VolumeEvalIndex *uint64 `json:",omitempty"`
	Index           uint64
	LastContact     int64
	KnownLeader     bool
	NextToken       string
}

func registerResponse(evalID string, evalIndex, jobModifyIndex, index uint64) writeResponse {
	return writeResponse{EvalID: evalID, EvalCreateIndex: evalIndex, JobModifyIndex: jobModifyIndex, Index: index, Warnings: new("")}
}

func (n *Nomad) register(w http.ResponseWriter, r *http.Request) {
	var req api.JobRegisterRequest
	if err := readJSON(r, &req); err != nil {
		writeText(w, nil, http.StatusBadRequest, err.Error())
		return
	}
	if req.Job == nil {
		writeText(w, nil, http.StatusBadRequest, "Job must be specified")
		return
	}
	job := req.Job
	if job.Namespace == nil || *job.Namespace == "" {
		job.Namespace = new(requestNamespace(r))
	}
	ns := *job.Namespace
	if q := r.URL.Query().Get("namespace"); q != "" && q != ns {
		writeText(w, nil, http.StatusInternalServerError, fmt.Sprintf("mismatched request namespace in request: %q, %q", q, ns))
		return
	}
	if job.ID == nil || *job.ID == "" {
		writeText(w, nil, http.StatusBadRequest, "Job ID does not match name")
		return
	}
	job.Canonicalize()
	if deref(job.NodePool) == "" {
		job.NodePool = new("default")
	}
	if len(job.Datacenters) == 0 {
		job.Datacenters = []string{"*"}
	}
	if err := validateJob(job); err != nil {
		writeText(w, nil, http.StatusInternalServerError, err.Error())
		return
	}

	n.mu.Lock()
	if n.closed {
		n.mu.Unlock()
		writeText(w, nil, http.StatusServiceUnavailable, "fake cluster: closed")
		return
	}
	key := jobKey(ns, *job.ID)
	existing := n.jobs[key]
	if req.EnforceIndex {
		jmi := req.JobModifyIndex
		switch {
		case existing != nil && jmi == 0:
			n.mu.Unlock()
			writeText(w, nil, http.StatusInternalServerError, "Enforcing job modify index 0: job already exists")
			return
		case existing != nil && jmi != deref(existing.job.JobModifyIndex):
			// The message reads the job under the lock: a scale may
			// replace it the moment the lock is let go.
			msg := fmt.Sprintf("Enforcing job modify index %d: job exists with conflicting job modify index: %d", jmi, deref(existing.job.JobModifyIndex))
			n.mu.Unlock()
			writeText(w, nil, http.StatusInternalServerError, msg)
			return
		case existing == nil && jmi != 0:
			n.mu.Unlock()
			writeText(w, nil, http.StatusInternalServerError, fmt.Sprintf("Enforcing job modify index %d: job does not exist", jmi))
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
	evalID := newUUID()
	if existing != nil && !specChanged(existing.job, job) {
		// Nomad writes nothing and only creates an evaluation.
		resp := registerResponse(evalID, idx, deref(existing.job.JobModifyIndex), idx)
		n.mu.Unlock()
		writeJSON(w, indexHeader(idx), resp)
		return
	}
	now := time.Now().UnixNano()
	job.SubmitTime = new(now)
	job.JobModifyIndex, job.ModifyIndex = new(idx), new(idx)
	job.Status, job.StatusDescription, job.Stable = new(""), new(""), new(false)
	if existing != nil {
		job.CreateIndex = new(deref(existing.job.CreateIndex))
		job.Version = new(deref(existing.job.Version) + 1)
	} else {
		job.CreateIndex = new(idx)
		job.Version = new(uint64(0))
		existing = &nomadJob{ns: ns, scaling: map[string][]*api.ScalingEvent{}}
		n.jobs[key] = existing
	}
	for _, tg := range job.TaskGroups {
		if tg.Scaling == nil {
			continue
		}
		var old *api.ScalingPolicy
		if og := jobGroup(existing.job, deref(tg.Name)); og != nil {
			old = og.Scaling
		}
		if old != nil && old.ID != "" {
			tg.Scaling.ID, tg.Scaling.CreateIndex = old.ID, old.CreateIndex
		} else {
			tg.Scaling.ID, tg.Scaling.CreateIndex = newUUID(), idx
		}
		tg.Scaling.ModifyIndex = idx
		tg.Scaling.Namespace = ""
		tg.Scaling.Target = map[string]string{"Namespace": ns, "Job": *job.ID, "Group": deref(tg.Name)}
		if tg.Scaling.Type == "" {
			tg.Scaling.Type = "horizontal"
		}
	}
	existing.job = job
	n.setJobStatusLocked(existing)
	n.publishLocked(idx, jobEvent("JobRegistered", existing))
	n.reconcileLocked(existing)
	resp := registerResponse(evalID, idx, idx, idx)
	n.mu.Unlock()
	n.changed.Notify()
	writeJSON(w, indexHeader(idx), resp)
}

// validateJob is the part of Nomad's job validation the fake needs: what
// it cannot run it refuses here, in Nomad's words where Nomad has them.
func validateJob(job *api.Job) error {
	var errs []string
	if t := deref(job.Type); t != api.JobTypeService {
		errs = append(errs, fmt.Sprintf("fake cluster: job type %q is not supported (service only)", t))
	}
	if len(job.TaskGroups) == 0 {
		errs = append(errs, "Missing job task groups")
	}
	for _, tg := range job.TaskGroups {
		name := deref(tg.Name)
		count := deref(tg.Count)
		if count < 0 {
			errs = append(errs, fmt.Sprintf("Task group %s validation failed: Task group count can't be negative", name))
		}
		if s := tg.Scaling; s != nil {
			if s.Min != nil && int64(count) < *s.Min {
				errs = append(errs, fmt.Sprintf("Task group %s validation failed: Scaling policy invalid: task group count must not be less than minimum count in scaling policy", name))
			}
			if s.Max != nil && int64(count) > *s.Max {
				errs = append(errs, fmt.Sprintf("Task group %s validation failed: Scaling policy invalid: task group count must not be greater than maximum count in scaling policy", name))
			}
		}
		if len(tg.Tasks) == 0 {
			errs = append(errs, fmt.Sprintf("Task group %s validation failed: Missing tasks for task group", name))
		}
	}
	if len(errs) == 0 {
		return nil
	}
	noun := "error"
	if len(errs) > 1 {
		noun = "errors"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d %s occurred:", len(errs), noun)
	for _, e := range errs {
		b.WriteString("\n\t* " + e)
	}
	return fmt.Errorf("%s\n\n", b.String())
}

// specChanged reports whether a submitted job differs from the stored one
// in anything but the fields the server manages.
func specChanged(old, submitted *api.Job) bool {
	return !reflect.DeepEqual(specOf(old), specOf(submitted))
}

func specOf(j *api.Job) any {
	cp := copyJob(j)
	cp.Status, cp.StatusDescription, cp.Stable, cp.Version = nil, nil, nil, nil
	cp.SubmitTime, cp.CreateIndex, cp.ModifyIndex, cp.JobModifyIndex = nil, nil, nil, nil
	cp.NomadTokenID = nil
	for _, tg := range cp.TaskGroups {
		if s := tg.Scaling; s != nil {
			s.ID, s.CreateIndex, s.ModifyIndex, s.Target, s.Namespace = "", 0, 0, nil, ""
		}
	}
	b, _ := json.Marshal(cp)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

// copyJob deep-copies a job through JSON.
func copyJob(j *api.Job) *api.Job {
	if j == nil {
		return nil
	}
	b, err := json.Marshal(j)
	if err != nil {
		panic(fmt.Sprintf("fake cluster: copy job: %v", err))
	}
	var out api.Job
	if err := json.Unmarshal(b, &out); err != nil {
		panic(fmt.Sprintf("fake cluster: copy job: %v", err))
	}
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
// any allocation is not terminal, dead once stopped (or scaled to nothing)
// and every allocation is, pending before the first placement.
func (n *Nomad) setJobStatusLocked(j *nomadJob) {
	status := "pending"
	live := false
	for _, a := range n.allocsOfLocked(j) {
		if !a.terminal() {
			live = true
			break
		}
	}
	total := 0
	for _, tg := range j.job.TaskGroups {
		total += deref(tg.Count)
	}
	switch {
	case live:
		status = "running"
	case deref(j.job.Stop) || total == 0:
		status = "dead"
	}
	j.job.Status = new(status)
}

// ---- read, list ----

func (n *Nomad) read(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	n.mu.Lock()
	j := n.jobs[jobKey(ns, id)]
	var out *api.Job
	var idx uint64
	if j != nil {
		n.setJobStatusLocked(j)
		out = copyJob(j.job)
		idx = deref(j.job.ModifyIndex)
	} else {
		idx = n.index
	}
	n.mu.Unlock()
	if out == nil {
		writeText(w, queryHeaders(idx), http.StatusNotFound, "job not found")
		return
	}
	writeJSON(w, queryHeaders(idx), out)
}

func (n *Nomad) list(w http.ResponseWriter, r *http.Request) {
	ns := requestNamespace(r)
	q := r.URL.Query()
	var filter jobFilter
	if expr := q.Get("filter"); expr != "" {
		f, err := parseJobFilter(expr)
		if err != nil {
			writeText(w, nil, http.StatusBadRequest, err.Error())
			return
		}
		filter = f
	}
	prefix := q.Get("prefix")
	n.mu.Lock()
	stubs := []*api.JobListStub{}
	for _, j := range n.jobs {
		if ns != api.AllNamespacesNamespace && j.ns != ns {
			continue
		}
		if !strings.HasPrefix(deref(j.job.ID), prefix) {
			continue
		}
		n.setJobStatusLocked(j)
		if filter != nil && !filter(j.job, j.ns) {
			continue
		}
		stubs = append(stubs, n.stubLocked(j))
	}
	idx := n.index
	n.mu.Unlock()
	sort.Slice(stubs, func(i, k int) bool {
		if stubs[i].ID != stubs[k].ID {
			return stubs[i].ID < stubs[k].ID
		}
		return stubs[i].Namespace < stubs[k].Namespace
	})
	writeJSON(w, queryHeaders(idx), stubs)
}

func (n *Nomad) stubLocked(j *nomadJob) *api.JobListStub {
	job := j.job
	return &api.JobListStub{
		ID: deref(job.ID), ParentID: deref(job.ParentID), Name: deref(job.Name), Namespace: j.ns,
		Datacenters: append([]string(nil), job.Datacenters...), Type: deref(job.Type), Priority: deref(job.Priority),
		Periodic: job.Periodic != nil, ParameterizedJob: job.ParameterizedJob != nil, Stop: deref(job.Stop),
		Status: deref(job.Status), StatusDescription: deref(job.StatusDescription),
		JobSummary:  n.summaryLocked(j),
		CreateIndex: deref(job.CreateIndex), ModifyIndex: deref(job.ModifyIndex), JobModifyIndex: deref(job.JobModifyIndex),
		SubmitTime: deref(job.SubmitTime),
	}
}

// summaryLocked counts the job's allocations by client status per group,
// as Nomad's job summary does.
func (n *Nomad) summaryLocked(j *nomadJob) *api.JobSummary {
	s := &api.JobSummary{JobID: deref(j.job.ID), Namespace: j.ns, Summary: map[string]api.TaskGroupSummary{},
		Children: &api.JobChildrenSummary{}, CreateIndex: deref(j.job.CreateIndex), ModifyIndex: n.index}
	for _, tg := range j.job.TaskGroups {
		s.Summary[deref(tg.Name)] = api.TaskGroupSummary{}
	}
	for _, a := range n.allocsOfLocked(j) {
		g := s.Summary[a.TaskGroup]
		switch a.ClientStatus {
		case api.AllocClientStatusPending:
			g.Starting++
		case api.AllocClientStatusRunning:
			g.Running++
		case api.AllocClientStatusComplete:
			g.Complete++
		case api.AllocClientStatusFailed:
			g.Failed++
		case api.AllocClientStatusLost:
			g.Lost++
		}
		s.Summary[a.TaskGroup] = g
	}
	return s
}

// ---- deregister ----

func (n *Nomad) deregister(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	purge := r.URL.Query().Get("purge") == "true"
	n.mu.Lock()
	j := n.jobs[jobKey(ns, id)]
	if j == nil {
		// Nomad answers an unknown job with an empty success.
		n.mu.Unlock()
		writeJSON(w, indexHeader(0), deregisterResponse(registerResponse("", 0, 0, 0)))
		return
	}
	idx := n.nextIndex()
	resp := deregisterResponse(registerResponse(newUUID(), idx, idx, idx))
	if purge {
		delete(n.jobs, jobKey(ns, id))
		n.publishLocked(idx, deregisterEvalEvent(j, idx))
		n.stopAllocsLocked(j, "alloc not needed due to job purge")
	} else {
		if !deref(j.job.Stop) {
			j.job = copyJob(j.job)
			j.job.Stop = new(true)
			j.job.Version = new(deref(j.job.Version) + 1)
			j.job.JobModifyIndex, j.job.ModifyIndex = new(idx), new(idx)
			j.job.SubmitTime = new(time.Now().UnixNano())
		}
		n.setJobStatusLocked(j)
		n.publishLocked(idx, jobEvent("JobDeregistered", j), deregisterEvalEvent(j, idx))
		n.reconcileLocked(j)
	}
	n.mu.Unlock()
	n.changed.Notify()
	writeJSON(w, indexHeader(idx), resp)
}

func deregisterResponse(r writeResponse) writeResponse {
	r.Warnings, r.VolumeEvalID, r.VolumeEvalIndex = nil, new(""), new(uint64(0))
	return r
}

// ---- scale ----

func (n *Nomad) scaleStatus(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	n.mu.Lock()
	j := n.jobs[jobKey(ns, id)]
	if j == nil {
		idx := n.index
		n.mu.Unlock()
		writeText(w, queryHeaders(idx), http.StatusNotFound, "job not found")
		return
	}
	resp := api.JobScaleStatusResponse{JobID: id, Namespace: ns, JobCreateIndex: deref(j.job.CreateIndex),
		JobModifyIndex: deref(j.job.JobModifyIndex), JobStopped: deref(j.job.Stop), TaskGroups: map[string]api.TaskGroupScaleStatus{}}
	for _, tg := range j.job.TaskGroups {
		name := deref(tg.Name)
		st := api.TaskGroupScaleStatus{Desired: deref(tg.Count)}
		for _, a := range n.allocsOfLocked(j) {
			if a.TaskGroup != name || a.DesiredStatus != api.AllocDesiredStatusRun || a.terminal() {
				continue
			}
			st.Placed++
			if a.ClientStatus == api.AllocClientStatusRunning {
				st.Running++
			}
		}
		for _, e := range j.scaling[name] {
			st.Events = append(st.Events, *e)
		}
		resp.TaskGroups[name] = st
	}
	idx := n.index
	n.mu.Unlock()
	writeJSON(w, queryHeaders(idx), resp)
}

func (n *Nomad) scale(w http.ResponseWriter, r *http.Request) {
	id, ns := r.PathValue("id"), requestNamespace(r)
	var req api.ScalingRequest
	if err := readJSON(r, &req); err != nil {
		writeText(w, nil, http.StatusBadRequest, err.Error())
		return
	}
	if req.Namespace != "" {
		ns = req.Namespace
	}
	group := req.Target["Group"]
	if group == "" {
		writeText(w, nil, http.StatusBadRequest, "missing task group name for scaling action")
		return
	}
	if req.Count != nil && *req.Count < 0 {
		writeText(w, nil, http.StatusBadRequest, "scaling action count can't be negative")
		return
	}
	n.mu.Lock()
	j := n.jobs[jobKey(ns, id)]
	if j == nil {
		n.mu.Unlock()
		writeText(w, nil, http.StatusNotFound, fmt.Sprintf("job %q not found", id))
		return
	}
	tg := jobGroup(j.job, group)
	if tg == nil {
		n.mu.Unlock()
		writeText(w, nil, http.StatusBadRequest, fmt.Sprintf("task group %q specified for scaling does not exist in job", group))
		return
	}
	prev := int64(deref(tg.Count))
	if req.Count != nil && tg.Scaling != nil {
		if tg.Scaling.Min != nil && *req.Count < *tg.Scaling.Min {
			msg := fmt.Sprintf("group count was less than scaling policy minimum: %d < %d", *req.Count, *tg.Scaling.Min)
			n.mu.Unlock()
			writeText(w, nil, http.StatusBadRequest, msg)
			return
		}
		if tg.Scaling.Max != nil && *tg.Scaling.Max < *req.Count {
			msg := fmt.Sprintf("group count was greater than scaling policy maximum: %d > %d", *req.Count, *tg.Scaling.Max)
			n.mu.Unlock()
			writeText(w, nil, http.StatusBadRequest, msg)
			return
		}
	}
	now := time.Now()
	resp := registerResponse("", 0, deref(j.job.ModifyIndex), 0)
	ev := &api.ScalingEvent{Count: req.Count, PreviousCount: prev, Error: req.Error, Message: req.Message,
		Meta: maps.Clone(req.Meta), Time: uint64(now.UnixNano())}
	if req.Count != nil {
		idx := n.nextIndex()
		job := copyJob(j.job)
		jobGroup(job, group).Count = new(int(*req.Count))
		job.SubmitTime = new(now.UnixNano())
		job.Version = new(deref(job.Version) + 1)
		job.JobModifyIndex, job.ModifyIndex = new(idx), new(idx)
		j.job = job
		resp.JobModifyIndex = idx
		resp.EvalID, resp.EvalCreateIndex = newUUID(), idx
		ev.EvalID = new(resp.EvalID)
		n.setJobStatusLocked(j)
		n.publishLocked(idx, jobEvent("JobRegistered", j))
		n.reconcileLocked(j)
	}
	idx := n.nextIndex()
	ev.CreateIndex = idx
	j.scaling[group] = append([]*api.ScalingEvent{ev}, j.scaling[group]...)
	if len(j.scaling[group]) > scalingEventsKept {
		j.scaling[group] = j.scaling[group][:scalingEventsKept]
	}
	var count *int
	if req.Count != nil {
		count = new(int(*req.Count))
	}
	if len(n.scaleLog) < 100000 {
		n.scaleLog = append(n.scaleLog, ScaleRequest{Time: now, Namespace: ns, Job: id, Group: group, Count: count,
			PreviousCount: int(prev), Message: req.Message, Error: req.Error, Meta: maps.Clone(req.Meta)})
	}
	resp.Index = idx
	n.mu.Unlock()
	n.changed.Notify()
	writeJSON(w, indexHeader(idx), resp)
}

// ---- test inspection ----

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
// not), as "namespace/ID", sorted.
func (n *Nomad) JobIDs() []string {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make([]string, 0, len(n.jobs))
	for k := range n.jobs {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
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
	n.mu.Lock()
	defer n.mu.Unlock()
	j := n.jobs[jobKey(namespace, id)]
	if j == nil {
		return 0, false
	}
	tg := jobGroup(j.job, group)
	if tg == nil {
		return 0, false
	}
	return deref(tg.Count), true
}

// close stops serving and stops every allocation without shutdown delays,
// then waits for every runner and timer.
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
	close(n.quit) // event streams watch it, so none outlives the cluster
	n.srv.down()
	n.wg.Wait()
}
