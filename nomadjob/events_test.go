package nomadjob

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

// streamExchange answers an event stream request from index with text
// (newline-delimited JSON, as Nomad streams it).
func streamExchange(name, index, text string) fixtures.Exchange {
	return fixtures.Exchange{
		Name: name,
		Request: fixtures.Request{
			Method: http.MethodGet, Path: "/v1/event/stream",
			Query: fixtures.Query{"index": {index}, "topic": {"Job", "Allocation", "Evaluation"}},
		},
		Response: fixtures.Response{
			Status:  http.StatusOK,
			Headers: map[string]string{"Content-Type": "application/json"},
			Body:    fixtures.TextBody(text),
		},
	}
}

// collect follows the stream as serve's feed does, reopening it from the
// index StreamEvents returns after a break or a transient error, until an
// event at index stopAt arrives (then it returns ctx's error) or an error
// that retrying will not mend.
func collect(t *testing.T, c *Client, since, stopAt uint64) ([]Event, error) {
	t.Helper()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	var mu sync.Mutex
	var evs []Event
	fn := func(e Event) {
		mu.Lock()
		defer mu.Unlock()
		evs = append(evs, e)
		if e.Index >= stopAt {
			cancel()
		}
	}
	var err error
	for range 10 {
		since, err = c.StreamEvents(ctx, since, fn)
		if ctx.Err() != nil || !(errors.Is(err, ErrStreamEnded) || IsTransient(err)) {
			return evs, err
		}
	}
	t.Fatalf("stream reopened 10 times without reaching index %d: %v", stopAt, err)
	return nil, nil
}

type allocWant struct {
	index            uint64
	id               string
	status           string
	http, admin      int
	running, stopped bool
}

func checkStream(t *testing.T, evs []Event) {
	t.Helper()
	var allocs []allocWant
	var revs []Event
	for _, e := range evs {
		switch e.Kind {
		case EventAllocationUpdated:
			a := e.Allocation
			if a.Revision != "hello-00001" || a.Namespace != "default" || a.Address != "127.0.0.1" {
				t.Errorf("allocation event %+v", a)
			}
			allocs = append(allocs, allocWant{e.Index, a.ID[:8], a.ClientStatus, a.HTTPPort, a.AdminPort, a.Running, a.Stopped})
		default:
			revs = append(revs, e)
		}
	}
	want := []allocWant{
		{11, "7aeda235", "pending", 24721, 30598, false, false},
		{13, "7aeda235", "running", 24721, 30598, true, false},
		{18, "7aeda235", "running", 24721, 30598, true, false},
		{18, "060fbdaa", "pending", 21508, 24496, false, false},
		{20, "7aeda235", "running", 24721, 30598, true, false},
		{20, "060fbdaa", "running", 21508, 24496, true, false},
		{21, "060fbdaa", "running", 21508, 24496, true, false},
	}
	if len(allocs) != len(want) {
		t.Fatalf("allocation events:\n%+v\nwant\n%+v", allocs, want)
	}
	for i := range want {
		if allocs[i] != want[i] {
			t.Errorf("allocation event %d = %+v, want %+v", i, allocs[i], want[i])
		}
	}
	if len(revs) != 2 {
		t.Fatalf("revision events = %+v, want 2", revs)
	}
	if revs[0].Kind != EventRevisionRegistered || revs[0].Index != 11 || revs[0].Revision.Name != "hello-00001" || revs[0].Revision.Count != 1 {
		t.Errorf("first revision event = %+v", revs[0])
	}
	if revs[1].Kind != EventRevisionUpdated || revs[1].Index != 15 || revs[1].Revision.Count != 2 || revs[1].Revision.Service != "hello" {
		t.Errorf("second revision event = %+v", revs[1])
	}
}

func TestStreamEvents(t *testing.T) {
	stream := string(fixtures.ReadFile(t, "nomad-1.6/011-event-stream.ndjson"))
	c, r := newTestClient(t, streamExchange("stream", "0", stream))
	evs, err := collect(t, c, 0, 21)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("StreamEvents returned %v, want context.Canceled", err)
	}
	checkStream(t, evs)
	if ns := r.Received()[0].Query.Get("namespace"); ns != "*" {
		t.Errorf("stream namespace = %q, want *", ns)
	}
}

func TestStreamEventsResumesAfterBreak(t *testing.T) {
	lines := strings.SplitAfter(string(fixtures.ReadFile(t, "nomad-1.6/011-event-stream.ndjson")), "\n")
	// The first connection breaks after the event at index 15; StreamEvents
	// must say to resume from 16, and the rest arrives exactly once. A
	// server error on the way is transient, so it is retried too.
	first := strings.Join(lines[:4], "")
	if !strings.Contains(lines[3], `"Index":15`) {
		t.Fatalf("fixture changed: line 4 is not index 15: %.80s", lines[3])
	}
	failed := streamExchange("stream-500", "16", "")
	failed.Response.Status = http.StatusInternalServerError
	failed.Response.Body = fixtures.TextBody("rpc error: no cluster leader")
	c, r := newTestClient(t,
		streamExchange("stream-from-0", "0", first),
		failed,
		streamExchange("stream-from-16", "16", strings.Join(lines[4:], "")))
	evs, err := collect(t, c, 0, 21)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("StreamEvents returned %v", err)
	}
	checkStream(t, evs)
	r.AssertAllUsed(t)
}

func TestStreamEventsStopsOnPermissionError(t *testing.T) {
	denied := streamExchange("stream-403", "5", "")
	denied.Response.Status = http.StatusForbidden
	denied.Response.Body = fixtures.TextBody("Permission denied")
	c, _ := newTestClient(t, denied)
	_, err := collect(t, c, 5, 1)
	if !errors.Is(err, ErrPermission) || !strings.Contains(err.Error(), "watch Nomad events") || !strings.Contains(err.Error(), "read-job") {
		t.Errorf("err = %v, want a permission error naming the operation and read-job", err)
	}
}

func TestStreamEventsSkipsOtherJobs(t *testing.T) {
	stream := strings.Join([]string{
		`{"Index":30,"Events":[{"Topic":"Job","Type":"JobRegistered","Key":"redis-00001","Namespace":"default","Index":30,"Payload":{"Job":{"ID":"redis-00001","Namespace":"default","Version":0,"Meta":{"owner":"ops"},"TaskGroups":[{"Name":"app","Count":1}]}}}]}`,
		`{"Index":31,"Events":[{"Topic":"Allocation","Type":"AllocationUpdated","Key":"a1","Namespace":"default","Index":31,"Payload":{"Allocation":{"ID":"a1","JobID":"redis-00001","Namespace":"default","TaskGroup":"app","ClientStatus":"running","DesiredStatus":"run"}}}]}`,
		`{"Index":32,"Events":[{"Topic":"Allocation","Type":"AllocationUpdated","Key":"a2","Namespace":"default","Index":32,"Payload":{"Allocation":{"ID":"a2","JobID":"web","Namespace":"default","TaskGroup":"app","ClientStatus":"running","DesiredStatus":"run"}}}]}`,
		// A purge sends nothing on the Job topic, only the evaluation
		// (as Nomad 1.6.5 does); other evaluations of revisions come
		// with their create time (the wake timelines), and of other
		// jobs are skipped.
		`{"Index":33,"Events":[{"Topic":"Evaluation","Type":"EvaluationUpdated","Key":"e0","Namespace":"default","Index":33,"Payload":{"Evaluation":{"ID":"e0","Namespace":"default","JobID":"hello-00001","TriggeredBy":"job-scaling","Status":"complete","CreateTime":1764657806819108864}}}]}`,
		`{"Index":33,"Events":[{"Topic":"Evaluation","Type":"EvaluationUpdated","Key":"e3","Namespace":"default","Index":33,"Payload":{"Evaluation":{"ID":"e3","Namespace":"default","JobID":"redis","TriggeredBy":"job-scaling","Status":"complete","CreateTime":1764657806819108864}}}]}`,
		`{"Index":33,"Events":[{"Topic":"Evaluation","Type":"JobDeregistered","Key":"e1","Namespace":"default","Index":33,"Payload":{"Evaluation":{"ID":"e1","Namespace":"default","JobID":"hello-00002","TriggeredBy":"job-deregister","Status":"pending"}}}]}`,
		`{"Index":33,"Events":[{"Topic":"Evaluation","Type":"JobDeregistered","Key":"e2","Namespace":"default","Index":33,"Payload":{"Evaluation":{"ID":"e2","Namespace":"default","JobID":"redis-00001","TriggeredBy":"job-deregister","Status":"pending"}}}]}`,
		`{"Index":34,"Events":[{"Topic":"Allocation","Type":"AllocationUpdated","Key":"a3","Namespace":"default","Index":34,"Payload":{"Allocation":{"ID":"a3","JobID":"hello-00002","Namespace":"default","TaskGroup":"app","ClientStatus":"complete","DesiredStatus":"stop","TaskStates":{"user":{"State":"dead"},"queue-proxy":{"State":"dead"}}}}}]}`,
		"",
	}, "\n")
	c, _ := newTestClient(t, streamExchange("stream", "30", stream))
	evs, err := collect(t, c, 30, 34)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("StreamEvents returned %v", err)
	}
	if len(evs) != 3 {
		t.Fatalf("events = %+v, want the evaluation of hello-00001, the purge of hello-00002 and its stopped allocation only", evs)
	}
	if e := evs[0]; e.Kind != EventEvaluationUpdated || e.Evaluation.ID != "e0" || e.Evaluation.Revision != "hello-00001" ||
		e.Evaluation.Created.UnixNano() != 1764657806819108864 {
		t.Errorf("evaluation event = %+v", e)
	}
	evs = evs[1:]
	if e := evs[0]; e.Kind != EventRevisionDeregistered || e.Revision.Name != "hello-00002" || e.Revision.Service != "hello" || !e.Revision.Stopped {
		t.Errorf("purge event = %+v", e)
	}
	if a := evs[1].Allocation; evs[1].Kind != EventAllocationUpdated || a.ID != "a3" || !a.Stopped || a.Running {
		t.Errorf("allocation event = %+v", evs[1])
	}
}

// A purge, as Nomad 1.6.5 streams it (fixture 058): nothing on the Job
// topic, only the JobDeregistered evaluation, which must still say the
// revision is gone; the evaluation's later updates and the allocation of
// this one-task job (not a revision's shape) are skipped.
func TestStreamEventsSeesAPurgeThroughItsEvaluation(t *testing.T) {
	stream := string(fixtures.ReadFile(t, "nomad-1.6/058-event-stream-purge.ndjson"))
	if strings.Contains(stream, `"Topic":"Job"`) {
		t.Fatal("fixture changed: the recorded purge has a Job-topic event")
	}
	c, _ := newTestClient(t, streamExchange("stream", "16", stream))
	var evs []Event
	next, err := c.StreamEvents(testCtx(t), 16, func(e Event) { evs = append(evs, e) })
	if !errors.Is(err, ErrStreamEnded) || next != 21 {
		t.Fatalf("StreamEvents = %d, %v; want the stream read to its end (index 20)", next, err)
	}
	evs = slices.DeleteFunc(evs, func(e Event) bool { return e.Kind == EventEvaluationUpdated })
	if len(evs) != 1 {
		t.Fatalf("events = %+v, want the deregistration of hello-00001 only (and evaluation updates)", evs)
	}
	if e := evs[0]; e.Kind != EventRevisionDeregistered || e.Index != 16 || e.Revision.Name != "hello-00001" ||
		e.Revision.Service != "hello" || e.Revision.Generation != 1 || e.Revision.Namespace != "default" || !e.Revision.Stopped {
		t.Errorf("purge event = %+v", e)
	}
}

// A purge as Nomad 2.0.5 streams it (nomad-2.0/058): unlike 1.6 it sends
// the job on the Job topic (Type JobDeregistered, Deleted true, the job as
// it last was: Stop false) in the same index as the JobDeregistered
// evaluation, and no allocation event for the stop at all (the allocation
// is gone with the job). The revision must still read as deregistered,
// and nothing may read as a running revision.
func TestStreamEventsSeesAPurgeNomad20(t *testing.T) {
	stream := string(fixtures.ReadFile(t, "nomad-2.0/058-event-stream-purge.ndjson"))
	if !strings.Contains(stream, `"Topic":"Job","Type":"JobDeregistered"`) || !strings.Contains(stream, `"Deleted":true`) {
		t.Fatal("fixture changed: the recorded purge has no Job-topic deregistration")
	}
	c, _ := newTestClient(t, streamExchange("stream", "36", stream))
	var evs []Event
	next, err := c.StreamEvents(testCtx(t), 36, func(e Event) { evs = append(evs, e) })
	if !errors.Is(err, ErrStreamEnded) || next != 41 {
		t.Fatalf("StreamEvents = %d, %v; want the stream read to its end (index 40)", next, err)
	}
	evs = slices.DeleteFunc(evs, func(e Event) bool { return e.Kind == EventEvaluationUpdated })
	if len(evs) == 0 {
		t.Fatal("no event for the purge")
	}
	for _, e := range evs {
		if e.Kind != EventRevisionDeregistered || e.Index != 39 || e.Revision.Name != "hello-00001" || e.Revision.Service != "hello" ||
			e.Revision.Generation != 1 || e.Revision.Namespace != "default" || !e.Revision.Stopped {
			t.Errorf("purge event = %+v, want the deregistration of hello-00001 at 39", e)
		}
	}
	// The Job-topic event says purged; the evaluation's after it cannot.
	if len(evs) != 2 || !evs[0].Purged || evs[1].Purged {
		t.Errorf("events = %+v, want the job's deregistration (purged), then the evaluation's", evs)
	}
}

// The wake timelines' times, from the recorded stream (Nomad 1.6.5, a
// raw_exec revision with a prestart sidecar): a revision event carries its
// job's submit time; an allocation its evaluation and create time from its
// placement on, and its client's receipt and both tasks' starts (from the
// task events) once the client reported them, in that order.
func TestStreamEventsCarryWakeTimes(t *testing.T) {
	testWakeTimes(t, "nomad-1.6/011-event-stream.ndjson", 21)
}

// The same from Nomad 2.0.5's stream of the same steps (nomad-2.0/011):
// its payloads add fields (Paused task states, a default identity on every
// task) and drop zero ones, none of which the times come from.
func TestStreamEventsCarryWakeTimesNomad20(t *testing.T) {
	testWakeTimes(t, "nomad-2.0/011-event-stream.ndjson", 24)
}

func testWakeTimes(t *testing.T, fixture string, last uint64) {
	stream := string(fixtures.ReadFile(t, fixture))
	c, _ := newTestClient(t, streamExchange("stream", "0", stream))
	evs, err := collect(t, c, 0, last)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("StreamEvents returned %v", err)
	}
	started := 0
	for _, e := range evs {
		switch e.Kind {
		case EventRevisionRegistered, EventRevisionUpdated:
			if e.Submitted.IsZero() {
				t.Errorf("revision event at %d without the job's submit time", e.Index)
			}
		case EventAllocationUpdated:
			a := e.Allocation
			if a.EvalID == "" || a.Created.IsZero() {
				t.Errorf("allocation event %s at %d without its evaluation or create time: %+v", a.ID[:8], e.Index, a)
			}
			if !a.Running {
				continue
			}
			// Running once its prestart sidecar runs; the app's start
			// may come in a later update.
			if a.Received.IsZero() || a.SidecarStarted.IsZero() || a.Received.Before(a.Created) || a.SidecarStarted.Before(a.Received) ||
				!a.AppStarted.IsZero() && a.AppStarted.Before(a.SidecarStarted) {
				t.Errorf("running allocation %s: created %v, received %v, sidecar started %v, app started %v; want them in that order (prestart sidecar)",
					a.ID[:8], a.Created, a.Received, a.SidecarStarted, a.AppStarted)
			}
			if !a.AppStarted.IsZero() {
				started++
			}
		}
	}
	if started == 0 {
		t.Fatal("no allocation event with the app's task started in the stream")
	}
}

// The init steps' end is the latest successful exit of a user task before
// the app started; a failed try, the app, the queue-proxy and whatever ran
// after the app started (a poststop task) do not count, and nothing counts
// before the app started.
func TestInitDone(t *testing.T) {
	at := func(ms int64) int64 { return time.UnixMilli(1_700_000_000_000 + ms).UnixNano() }
	ev := func(typ string, ms int64, code int) *api.TaskEvent {
		return &api.TaskEvent{Type: typ, Time: at(ms), ExitCode: code}
	}
	states := map[string]*api.TaskState{
		"migrate":            {Events: []*api.TaskEvent{ev(api.TaskStarted, 10, 0), ev(api.TaskTerminated, 40, 1), ev(api.TaskTerminated, 90, 0)}},
		"seed":               {Events: []*api.TaskEvent{ev(api.TaskTerminated, 70, 0)}},
		"cleanup":            {Events: []*api.TaskEvent{ev(api.TaskTerminated, 500, 0)}},
		spec.SidecarTaskName: {Events: []*api.TaskEvent{ev(api.TaskTerminated, 95, 0)}},
		spec.UserTaskName:    {Events: []*api.TaskEvent{ev(api.TaskStarted, 100, 0)}},
	}
	if got, want := initDone(states, time.Unix(0, at(100))), time.Unix(0, at(90)); !got.Equal(want) {
		t.Errorf("initDone = %s, want the migration's successful exit %s", got, want)
	}
	if got := initDone(states, time.Time{}); !got.IsZero() {
		t.Errorf("initDone before the app started = %s, want zero", got)
	}
	if got := initDone(map[string]*api.TaskState{spec.UserTaskName: states[spec.UserTaskName]}, time.Unix(0, at(100))); !got.IsZero() {
		t.Errorf("initDone without init steps = %s, want zero", got)
	}
}
