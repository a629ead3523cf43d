package nomadjob

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// EventKind says what an Event reports.
type EventKind string

const (
	// EventRevisionRegistered: a revision job's first version appeared.
	EventRevisionRegistered EventKind = "revision-registered"
	// EventRevisionUpdated: a later version (a scale call, a scaling
	// settings update, a re-registration).
	EventRevisionUpdated EventKind = "revision-updated"
	// EventRevisionDeregistered: the job was stopped or purged.
	EventRevisionDeregistered EventKind = "revision-deregistered"
	// EventAllocationUpdated: an allocation of a revision changed
	// (placed, started, stopped, failed, ...).
	EventAllocationUpdated EventKind = "allocation-updated"
	// EventEvaluationUpdated: Nomad created or updated an evaluation of a
	// revision job (a scale-up's: the wake timelines read its create
	// time).
	EventEvaluationUpdated EventKind = "evaluation-updated"
)

// Event is one change to a revision or its allocations, from Nomad's event
// stream.
type Event struct {
	Kind EventKind
	// Index is the Nomad index of the change.
	Index uint64
	// Revision is set for revision events. For a job deregistered
	// without a payload, only Name, Service, Generation and Namespace are
	// known.
	Revision RevisionInfo
	// Purged is true when a deregistered job is gone for good.
	Purged bool
	// Submitted is when the job version of a revision event was written
	// (Nomad sets it at every register and every scale call that changes
	// the count): when a scale-up reached Nomad.
	Submitted time.Time
	// Allocation is set for allocation events.
	Allocation AllocationEvent
	// Evaluation is set for evaluation events.
	Evaluation EvaluationEvent
}

// EvaluationEvent is an evaluation of a revision job.
type EvaluationEvent struct {
	ID       string `json:"id"`
	Revision string `json:"revision"`
	// Created is its create time (the Nomad servers' clock).
	Created time.Time `json:"created"`
}

// AllocationEvent is the state of one allocation after a change.
type AllocationEvent struct {
	ID        string `json:"id"`
	Revision  string `json:"revision"`
	Namespace string `json:"namespace"`
	// Address and the sidecar's host ports (0 until placed).
	Address   string `json:"address,omitempty"`
	HTTPPort  int    `json:"http_port,omitempty"`
	AdminPort int    `json:"admin_port,omitempty"`

	ClientStatus  string `json:"client_status"`
	DesiredStatus string `json:"desired_status"`
	// Running: Nomad runs its tasks and means to keep it. Stopped: it is
	// gone or on its way out (told to stop, complete, failed or lost).
	Running bool `json:"running"`
	Stopped bool `json:"stopped"`

	// For the wake timelines: the evaluation that placed it, when it was
	// created (placed, the servers' clock), and from its task events
	// (the client's clock) when its client received it and started the
	// sidecar's and the user's task (zero: not yet).
	EvalID         string    `json:"eval_id,omitempty"`
	Created        time.Time `json:"created,omitzero"`
	Received       time.Time `json:"received,omitzero"`
	SidecarStarted time.Time `json:"sidecar_started,omitzero"`
	AppStarted     time.Time `json:"app_started,omitzero"`
	// InitDone is when the last of the app's init steps exited, once
	// the app started: the latest successful exit of a task of the
	// user's before the app's start (zero: none, or not yet known).
	InitDone time.Time `json:"init_done,omitzero"`
}

// Starting reports whether the allocation is placed and meant to run but
// not yet reported running.
func (a AllocationEvent) Starting() bool { return allocStarting(a.ClientStatus, a.DesiredStatus) }

// ErrStreamEnded: an event stream that was open ended (Nomad closed it, the
// connection broke, or a line did not decode). Reopen it; events may have
// been missed if Nomad no longer holds the ones after the last index.
var ErrStreamEnded = errors.New("Nomad event stream ended")

// StreamEvents follows Nomad's event stream (topics Job, Allocation and
// Evaluation, all namespaces) once: it opens the stream from index since and calls fn,
// in order, for every change to a revision job of ours or one of its
// allocations, until the stream ends or ctx does. It returns the index to
// resume from and why it stopped: ctx's error; an *Error when the stream
// could not be opened (IsTransient says whether to retry); otherwise an
// error wrapping ErrStreamEnded.
//
// Nomad keeps only its last few events (event_buffer_size, 100 by
// default) and silently starts a stream asking for an older index at the
// oldest it has: a caller that cannot afford to miss a change (a cache of
// every revision) lists again before reopening, rather than resuming.
func (c *Client) StreamEvents(ctx context.Context, since uint64, fn func(Event)) (uint64, error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch, err := c.openStream(sctx, since)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			return since, cerr
		}
		return since, c.wrap(watchOp, api.AllNamespacesNamespace, capRead, err)
	}
	index, err := c.drain(ctx, ch, since, newEventFilter(), fn)
	if cerr := ctx.Err(); cerr != nil {
		return index, cerr
	}
	return index, fmt.Errorf("%w at index %d: %w", ErrStreamEnded, index, err)
}

// watchOp names the event stream in errors.
const watchOp = "watch Nomad events"

// openStream opens Nomad's event stream for topics Job, Allocation and
// Evaluation in every namespace, from index. Evaluation is there for one
// event only: Nomad 1.6 sends nothing on the Job topic when a job is purged
// (its state store emits no event for a deleted job), only an evaluation
// with Type JobDeregistered; without it a purged revision would stay in
// every cache that follows the stream.
func (c *Client) openStream(ctx context.Context, index uint64) (<-chan *api.Events, error) {
	topics := map[api.Topic][]string{api.TopicJob: nil, api.TopicAllocation: nil, api.TopicEvaluation: nil}
	return c.api.EventStream().Stream(ctx, topics, index, c.query(ctx, api.AllNamespacesNamespace))
}

// drain delivers events from an open stream until it breaks or ctx ends.
// It returns the index to resume from.
func (c *Client) drain(ctx context.Context, ch <-chan *api.Events, index uint64, f *eventFilter, fn func(Event)) (uint64, error) {
	for {
		select {
		case <-ctx.Done():
			return index, ctx.Err()
		case evs, ok := <-ch:
			if !ok {
				return index, io.EOF
			}
			if evs.Err != nil {
				return index, evs.Err
			}
			for _, e := range evs.Events {
				if ev, ok := f.translate(c, e); ok {
					fn(ev)
				}
			}
			// Nomad starts a stream at the first event at or after the
			// requested index: resume just past what was delivered.
			if evs.Index >= index {
				index = evs.Index + 1
			}
			if err := ctx.Err(); err != nil {
				return index, err
			}
		}
	}
}

// eventFilter remembers which jobs the stream has shown not to be ours, so
// their allocations are skipped too. It is used by one StreamEvents call.
type eventFilter struct {
	notOurs map[string]bool // namespace/job ID
}

func newEventFilter() *eventFilter { return &eventFilter{notOurs: map[string]bool{}} }

func (f *eventFilter) translate(c *Client, e api.Event) (Event, bool) {
	switch e.Topic {
	case api.TopicJob:
		return f.job(c, e)
	case api.TopicAllocation:
		return f.allocation(c, e)
	case api.TopicEvaluation:
		return f.evaluation(e)
	}
	return Event{}, false
}

// evaluation turns the evaluation Nomad creates when a job is deregistered
// (Type JobDeregistered: `nomad job stop`, with or without -purge) into a
// deregistration of the revision it names. It is the only event a purge
// produces (a stop without purge also sends the stopped job on the Job
// topic, and the two agree). Every other evaluation is skipped. Whether the
// job is gone for good is not in the evaluation, so Purged stays false: the
// revision is gone from traffic either way.
//
// Every other evaluation of a revision job becomes an EventEvaluationUpdated
// with its create time, for the wake timelines.
func (f *eventFilter) evaluation(e api.Event) (Event, bool) {
	ev, err := e.Evaluation()
	if err != nil || ev == nil {
		return Event{}, false
	}
	ns := cmp.Or(ev.Namespace, eventNamespace(e))
	svc, gen, ok := spec.ParseRevisionName(ev.JobID)
	if !ok || f.notOurs[ns+"/"+ev.JobID] {
		return Event{}, false
	}
	if e.Type != "JobDeregistered" {
		return Event{Kind: EventEvaluationUpdated, Index: e.Index,
			Evaluation: EvaluationEvent{ID: ev.ID, Revision: ev.JobID, Created: unixTime(ev.CreateTime)}}, true
	}
	return Event{Kind: EventRevisionDeregistered, Index: e.Index,
		Revision: RevisionInfo{Name: ev.JobID, Service: svc, Generation: gen, Namespace: ns, Stopped: true}}, true
}

func (f *eventFilter) job(c *Client, e api.Event) (Event, bool) {
	job, deleted, err := e.DeregisteredJob()
	if err != nil {
		c.log.Warn("skipping a Nomad job event that does not decode", "key", e.Key, "index", e.Index, "err", err)
		return Event{}, false
	}
	ev := Event{Index: e.Index}
	deregistered := e.Type == "JobDeregistered" || e.Type == "JobBatchDeregistered"
	if job == nil {
		// A purge may come without the job: go by the name alone.
		svc, gen, ok := spec.ParseRevisionName(e.Key)
		ns := eventNamespace(e)
		if !deregistered || !ok || f.notOurs[ns+"/"+e.Key] {
			return Event{}, false
		}
		ev.Kind, ev.Purged = EventRevisionDeregistered, true
		ev.Revision = RevisionInfo{Name: e.Key, Service: svc, Generation: gen, Namespace: ns, Stopped: true}
		return ev, true
	}
	info, err := RevisionFromJob(job)
	if errors.Is(err, ErrNotOurs) {
		f.notOurs[deref(job.Namespace, eventNamespace(e))+"/"+jobID(job)] = true
		return Event{}, false
	}
	if err != nil {
		c.log.Warn("skipping an event of a malformed revision job", "job", jobID(job), "index", e.Index, "err", err)
		return Event{}, false
	}
	c.remember(info.Name, info.Namespace)
	ev.Revision = info
	ev.Submitted = unixTime(deref(job.SubmitTime, 0))
	switch {
	case deregistered:
		ev.Kind, ev.Purged = EventRevisionDeregistered, deleted
		ev.Revision.Stopped = true
	case info.Stopped:
		ev.Kind = EventRevisionDeregistered
	case deref(job.Version, 1) == 0:
		ev.Kind = EventRevisionRegistered
	default:
		ev.Kind = EventRevisionUpdated
	}
	return ev, true
}

func (f *eventFilter) allocation(c *Client, e api.Event) (Event, bool) {
	a, err := e.Allocation()
	if err != nil || a == nil {
		c.log.Warn("skipping a Nomad allocation event that does not decode", "key", e.Key, "index", e.Index, "err", err)
		return Event{}, false
	}
	ns := a.Namespace
	if ns == "" {
		ns = eventNamespace(e)
	}
	if !isRevisionAlloc(a) || f.notOurs[ns+"/"+a.JobID] {
		return Event{}, false
	}
	ae := AllocationEvent{
		ID: a.ID, Revision: a.JobID, Namespace: ns,
		ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus,
	}
	ae.Address, ae.HTTPPort, ae.AdminPort = allocPorts(a.AllocatedResources, a.Resources)
	ae.Running = allocRunning(a.ClientStatus, a.DesiredStatus)
	ae.Stopped = allocStopped(a.ClientStatus, a.DesiredStatus)
	ae.EvalID, ae.Created = a.EvalID, unixTime(a.CreateTime)
	for name, ts := range a.TaskStates {
		if ts == nil {
			continue
		}
		for _, te := range ts.Events {
			if te == nil {
				continue
			}
			at := unixTime(te.Time)
			switch {
			case te.Type == api.TaskReceived && (ae.Received.IsZero() || at.Before(ae.Received)):
				ae.Received = at
			case te.Type == api.TaskStarted && name == spec.UserTaskName && ae.AppStarted.IsZero():
				ae.AppStarted = at
			case te.Type == api.TaskStarted && name == spec.SidecarTaskName && ae.SidecarStarted.IsZero():
				ae.SidecarStarted = at
			}
		}
	}
	ae.InitDone = initDone(a.TaskStates, ae.AppStarted)

	return Event{Kind: EventAllocationUpdated, Index: e.Index, Allocation: ae}, true
}

// initDone is when the app's init steps were done: the latest successful
// exit, before the app started, of a task other than the app and the
// queue-proxy. Allocation events carry no job, so the tasks' hooks are
// not known here; a task that ran to completion before the app started
// can only be a prestart task. Zero until the app started, so a batch
// of events that holds only the first of several init steps' exits is
// never taken for all of them.
func initDone(states map[string]*api.TaskState, appStarted time.Time) time.Time {
	var done time.Time
	if appStarted.IsZero() {
		return done
	}
	for name, ts := range states {
		if ts == nil || name == spec.UserTaskName || name == spec.SidecarTaskName {
			continue
		}
		for _, te := range ts.Events {
			if te == nil || te.Type != api.TaskTerminated || te.ExitCode != 0 {
				continue
			}
			if at := unixTime(te.Time); !at.After(appStarted) && at.After(done) {
				done = at
			}
		}
	}
	return done
}

// unixTime is a Nomad time in unix nanoseconds; zero for 0.
func unixTime(ns int64) time.Time {
	if ns <= 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// isRevisionAlloc recognises an allocation of a revision job without the
// job (Nomad leaves it out of allocation events): a revision name, group
// "app", tasks "user" and "queue-proxy".
func isRevisionAlloc(a *api.Allocation) bool {
	if _, _, ok := spec.ParseRevisionName(a.JobID); !ok || a.TaskGroup != spec.GroupName {
		return false
	}
	if a.Job != nil {
		_, ok := a.Job.Meta[spec.JobMetaService]
		return ok
	}
	if a.AllocatedResources != nil && len(a.AllocatedResources.Tasks) > 0 {
		_, user := a.AllocatedResources.Tasks[spec.UserTaskName]
		_, proxy := a.AllocatedResources.Tasks[spec.SidecarTaskName]
		return user && proxy
	}
	if len(a.TaskStates) > 0 {
		_, user := a.TaskStates[spec.UserTaskName]
		_, proxy := a.TaskStates[spec.SidecarTaskName]
		return user && proxy
	}
	return true
}

// eventNamespace is the namespace of an event, which Nomad sends beside
// the payload; api.Event does not decode it, so it is read from the
// payload object when there is one.
func eventNamespace(e api.Event) string {
	for _, k := range []string{"Job", "Allocation", "Evaluation"} {
		if m, ok := e.Payload[k].(map[string]any); ok {
			if ns, ok := m["Namespace"].(string); ok && ns != "" {
				return ns
			}
		}
	}
	return spec.DefaultNamespace
}
