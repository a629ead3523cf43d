package fakecluster

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// eventBufferSize is Nomad's default event_buffer_size: the events it
// keeps for streams that resume from an index. A stream asking for an
// older index starts at the oldest kept, silently.
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

func jobEvent(typ string, j *nomadJob) eventWire {
	payload, _ := json.Marshal(map[string]any{"Job": j.job})
	return eventWire{Topic: string(api.TopicJob), Type: typ, Key: deref(j.job.ID), Namespace: j.ns, Payload: payload}
}

// deregisterEvalEvent is the evaluation event Nomad 1.6 sends when a job is
// deregistered (Type JobDeregistered). For a purge it is the only event:
// Nomad's state store emits nothing for a deleted job, so a follower of the
// Job topic alone never hears of it.
func deregisterEvalEvent(j *nomadJob, index uint64) eventWire {
	id := newUUID()
	payload, _ := json.Marshal(map[string]any{"Evaluation": map[string]any{
		"ID": id, "Namespace": j.ns, "Priority": deref(j.job.Priority), "Type": deref(j.job.Type),
		"TriggeredBy": "job-deregister", "JobID": deref(j.job.ID), "JobModifyIndex": index,
		"Status": "pending", "CreateIndex": index, "ModifyIndex": index,
	}})
	return eventWire{Topic: string(api.TopicEvaluation), Type: "JobDeregistered", Key: id, Namespace: j.ns,
		FilterKeys: []string{deref(j.job.ID), ""}, Payload: payload}
}

func allocEvent(typ string, a *alloc) eventWire {
	// Allocation events carry the allocation without its job.
	payload, _ := json.Marshal(map[string]any{"Allocation": allocNoJob{a.wire(false)}})
	return eventWire{Topic: string(api.TopicAllocation), Type: typ, Key: a.ID, Namespace: a.Namespace,
		FilterKeys: []string{a.JobID, ""}, Payload: payload}
}

// allocNoJob drops the Job key from an allocation's JSON.
type allocNoJob struct{ w allocWire }

func (a allocNoJob) MarshalJSON() ([]byte, error) {
	b, err := json.Marshal(a.w)
	if err != nil {
		return nil, err
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	delete(m, "Job")
	return json.Marshal(m)
}

// publishLocked appends events at index to the buffer (call with n.mu
// held; the caller notifies streams after unlocking).
func (n *Nomad) publishLocked(index uint64, events ...eventWire) {
	for i := range events {
		events[i].Index = index
	}
	if k := len(n.events); k > 0 && n.events[k-1].Index > index {
		panic(fmt.Sprintf("fake cluster: event at index %d published after index %d", index, n.events[k-1].Index))
	}
	if k := len(n.events); k > 0 && n.events[k-1].Index == index {
		n.events[k-1].Events = append(n.events[k-1].Events, events...)
		return
	}
	n.events = append(n.events, eventBatch{Index: index, Events: events})
	total := 0
	for i := len(n.events) - 1; i >= 0; i-- {
		total += len(n.events[i].Events)
		if total > eventBufferSize && i < len(n.events)-1 {
			n.events = append([]eventBatch(nil), n.events[i+1:]...)
			break
		}
	}
}

// streamFilter is a subscription's topics (topic -> keys; "*" any) and
// namespace ("*" any).
type streamFilter struct {
	topics    map[string][]string
	namespace string
}

func parseStreamFilter(r *http.Request) streamFilter {
	f := streamFilter{topics: map[string][]string{}, namespace: requestNamespace(r)}
	for _, t := range r.URL.Query()["topic"] {
		topic, key, ok := strings.Cut(t, ":")
		if !ok || key == "" {
			key = "*"
		}
		f.topics[topic] = append(f.topics[topic], key)
	}
	if len(f.topics) == 0 {
		f.topics["*"] = []string{"*"}
	}
	return f
}

func (f streamFilter) match(e eventWire) bool {
	if f.namespace != api.AllNamespacesNamespace && e.Namespace != f.namespace {
		return false
	}
	keys, ok := f.topics[e.Topic]
	if !ok {
		keys, ok = f.topics["*"]
	}
	if !ok {
		return false
	}
	for _, k := range keys {
		if k == "*" || k == e.Key {
			return true
		}
		for _, fk := range e.FilterKeys {
			if k == fk {
				return true
			}
		}
	}
	return false
}

// eventStream is GET /v1/event/stream: newline-delimited JSON, one line
// per index with the matching events, from the requested index (the oldest
// buffered when 0 or older than the buffer), then live; "{}" heartbeats
// keep an idle stream open.
func (n *Nomad) eventStream(w http.ResponseWriter, r *http.Request) {
	filter := parseStreamFilter(r)
	next, _ := strconv.ParseUint(r.URL.Query().Get("index"), 10, 64)
	flusher, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	flush := func() bool {
		if err := bw.Flush(); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	flush()
	heartbeat := n.opts.HeartbeatInterval
	if heartbeat <= 0 {
		heartbeat = 10 * time.Second
	}
	tick := time.NewTicker(heartbeat)
	defer tick.Stop()
	for {
		changed := n.changed.Changed()
		n.mu.Lock()
		var out []eventBatch
		for _, b := range n.events {
			if b.Index < next {
				continue
			}
			var evs []eventWire
			for _, e := range b.Events {
				if filter.match(e) {
					evs = append(evs, e)
				}
			}
			next = b.Index + 1
			if len(evs) > 0 {
				out = append(out, eventBatch{Index: b.Index, Events: evs})
			}
		}
		n.mu.Unlock()
		for _, b := range out {
			line, err := json.Marshal(b)
			if err != nil {
				return
			}
			_, _ = bw.Write(append(line, '\n'))
		}
		if len(out) > 0 && !flush() {
			return
		}
		select {
		case <-changed:
		case <-tick.C:
			_, _ = bw.WriteString("{}\n")
			if !flush() {
				return
			}
		case <-r.Context().Done():
			return
		case <-n.quit:
			return
		}
	}
}
