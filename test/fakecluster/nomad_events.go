package fakecluster

import (
	"bufio"
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// eventBufferSize is Nomad's default event_buffer_size: the events it keeps
// for streams that resume from an index. A stream asking for an older
// index starts at the oldest kept, silently.
const eventBufferSize = 100

// eventWire is one event as Nomad's stream writes it.
type eventWire struct {
	Topic      string
	Type       string
	Key        string
	Namespace  string
	FilterKeys []string
	Index      uint64
	Payload    json.RawMessage
}

type eventBatch struct {
	Index  uint64
	Events []eventWire
}

func event(topic api.Topic, typ, key, ns string, filterKeys []string, payload any) eventWire {
	b, _ := json.Marshal(payload) // the API types always encode
	return eventWire{Topic: string(topic), Type: typ, Key: key, Namespace: ns, FilterKeys: filterKeys, Payload: b}
}

func jobEvent(typ string, j *nomadJob) eventWire {
	return event(api.TopicJob, typ, deref(j.job.ID), j.ns, nil, map[string]any{"Job": j.job})
}

// allocEvent carries the allocation without its job.
func allocEvent(typ string, a *alloc) eventWire {
	return event(api.TopicAllocation, typ, a.ID, a.Namespace, []string{a.JobID, ""}, map[string]any{"Allocation": a.marshal(false)})
}

// deregisterEvalEvent is the evaluation event Nomad 1.6 sends when a job is
// deregistered. For a purge it is the only event: the state store emits
// nothing for a deleted job, so a follower of the Job topic alone never
// hears of it (fixture 058).
func deregisterEvalEvent(j *nomadJob, index uint64) eventWire {
	id := newUUID()
	return event(api.TopicEvaluation, "JobDeregistered", id, j.ns, []string{deref(j.job.ID), ""}, map[string]any{"Evaluation": map[string]any{
		"ID": id, "Namespace": j.ns, "Priority": deref(j.job.Priority), "Type": deref(j.job.Type),
		"TriggeredBy": "job-deregister", "JobID": deref(j.job.ID), "JobModifyIndex": index,
		"Status": "pending", "CreateIndex": index, "ModifyIndex": index,
	}})
}

// publishLocked appends events at index to the buffer, keeping the last
// eventBufferSize (call with n.mu held; the caller wakes streams after
// unlocking).
func (n *Nomad) publishLocked(index uint64, events ...eventWire) {
	for i := range events {
		events[i].Index = index
	}
	if k := len(n.events); k > 0 && n.events[k-1].Index == index {
		n.events[k-1].Events = append(n.events[k-1].Events, events...)
		return
	}
	n.events = append(n.events, eventBatch{Index: index, Events: events})
	total := 0
	for i := len(n.events) - 1; i >= 0; i-- {
		if total += len(n.events[i].Events); total > eventBufferSize && i < len(n.events)-1 {
			n.events = slices.Clone(n.events[i+1:])
			break
		}
	}
}

// eventStream is GET /v1/event/stream: newline-delimited JSON, one line per
// index with the matching events (topics with keys, namespace), from the
// requested index (the oldest buffered when 0 or older), then live; "{}"
// heartbeats keep an idle stream open.
func (n *Nomad) eventStream(w http.ResponseWriter, r *http.Request) {
	ns := requestNamespace(r)
	topics := map[string][]string{} // topic -> keys; "*" any
	for _, t := range r.URL.Query()["topic"] {
		topic, key, _ := strings.Cut(t, ":")
		topics[topic] = append(topics[topic], cmp.Or(key, "*"))
	}
	if len(topics) == 0 {
		topics["*"] = []string{"*"}
	}
	match := func(e eventWire) bool {
		keys, ok := topics[e.Topic]
		if !ok {
			keys = topics["*"]
		}
		return (ns == api.AllNamespacesNamespace || e.Namespace == ns) && slices.ContainsFunc(keys, func(k string) bool {
			return k == "*" || k == e.Key || slices.Contains(e.FilterKeys, k)
		})
	}
	next, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	flush := func() bool {
		err := bw.Flush()
		if f, ok := w.(http.Flusher); ok && err == nil {
			f.Flush()
		}
		return err == nil
	}
	flush()
	tick := time.NewTicker(n.opts.HeartbeatInterval)
	defer tick.Stop()
	for {
		changed := n.changed.Changed()
		n.mu.Lock()
		var lines [][]byte
		for _, b := range n.events {
			if b.Index < next {
				continue
			}
			next = b.Index + 1
			if evs := slices.DeleteFunc(slices.Clone(b.Events), func(e eventWire) bool { return !match(e) }); len(evs) > 0 {
				line, _ := json.Marshal(eventBatch{Index: b.Index, Events: evs})
				lines = append(lines, line)
			}
		}
		n.mu.Unlock()
		for _, line := range lines {
			_, _ = bw.Write(append(line, '\n'))
		}
		if len(lines) > 0 && !flush() {
			return
		}
		select {
		case <-changed:
		case <-tick.C:
			if _, _ = bw.WriteString("{}\n"); !flush() {
				return
			}
		case <-r.Context().Done():
			return
		case <-n.quit:
			return
		}
	}
}
