package consulroute

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// fakeConsul is an in-memory test double of the parts of Consul's HTTP API
// this package uses: config entries (with Consul's protocol and weight
// checks), KV (blocking reads, cas, acquire/release with lock delay),
// sessions and agent service registrations. Every write bumps one index, as
// Raft does. It is for behaviour across many calls (idempotency, two locks);
// the exact wire format is asserted against the recordings elsewhere.
type fakeConsul struct {
	t  testing.TB
	mu sync.Mutex
	// changed is closed and replaced on every write (wakes blocking reads).
	changed  chan struct{}
	index    uint64
	entries  map[string]map[string]*fakeEntry // kind -> name
	kv       map[string]*fakeKV
	kvIndex  uint64 // last write to the KV table, deletes included
	sessions map[string]*fakeSession
	delayed  map[string]time.Time // key -> end of its lock delay
	services map[string]map[string]any
	nextID   int
	// writes logs every mutating request ("PUT config service-splitter
	// hello", "DELETE config ...", "PUT kv key").
	writes []string
	// configReads logs every read of config entries ("GET service-resolver
	// hello-00001"; a listing has no name: "GET service-resolver").
	configReads []string
	// afterWrite runs after each config entry write or delete, with mu
	// held; tests use it to check invariants at every step.
	afterWrite func(f *fakeConsul)
	// beforeKVPut runs (without mu) before a plain or cas KV write is
	// applied; tests use it to interleave two writers deterministically.
	beforeKVPut func(key string)
	// failRenew makes session renewals answer 500 (Consul unreachable for
	// the session's purposes).
	failRenew bool
}

type fakeEntry struct {
	body           map[string]any
	create, modify uint64
}

type fakeKV struct {
	value                           []byte
	session                         string
	lockIndex, create, modify, flag uint64
}

type fakeSession struct {
	id, name, behavior string
	lockDelay          time.Duration
}

func newFakeConsul(t testing.TB) (*fakeConsul, string) {
	f := &fakeConsul{
		t: t, changed: make(chan struct{}), index: 10,
		entries: map[string]map[string]*fakeEntry{}, kv: map[string]*fakeKV{},
		sessions: map[string]*fakeSession{}, delayed: map[string]time.Time{},
		services: map[string]map[string]any{},
	}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv.URL
}

// bump must be called with mu held after a write.
func (f *fakeConsul) bump() uint64 {
	f.index++
	close(f.changed)
	f.changed = make(chan struct{})
	return f.index
}

func (f *fakeConsul) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	p := r.URL.Path
	switch {
	case p == "/v1/config" && r.Method == "PUT":
		f.putEntry(w, body)
	case strings.HasPrefix(p, "/v1/config/"):
		kind, name, _ := strings.Cut(strings.TrimPrefix(p, "/v1/config/"), "/")
		if r.Method == "GET" {
			f.mu.Lock()
			f.configReads = append(f.configReads, strings.TrimSpace("GET "+kind+" "+name))
			f.mu.Unlock()
		}
		switch {
		case r.Method == "GET" && name == "":
			f.listEntries(w, kind)
		case r.Method == "GET":
			f.getEntry(w, kind, name)
		case r.Method == "DELETE":
			f.deleteEntry(w, kind, name)
		default:
			http.Error(w, "method", 405)
		}
	case strings.HasPrefix(p, "/v1/kv/"):
		f.serveKV(w, r, strings.TrimPrefix(p, "/v1/kv/"), body)
	case strings.HasPrefix(p, "/v1/session/"):
		f.serveSession(w, strings.TrimPrefix(p, "/v1/session/"), body)
	case p == "/v1/agent/service/register":
		var reg map[string]any
		_ = json.Unmarshal(body, &reg)
		id, _ := reg["ID"].(string)
		f.mu.Lock()
		f.services[id] = reg
		f.writes = append(f.writes, "PUT register "+id)
		f.bump()
		f.mu.Unlock()
	case strings.HasPrefix(p, "/v1/agent/service/deregister/"):
		id := strings.TrimPrefix(p, "/v1/agent/service/deregister/")
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, ok := f.services[id]; !ok {
			http.Error(w, fmt.Sprintf("Unknown service ID %q. Ensure that the service ID is passed, not the service name.", id), 404)
			return
		}
		delete(f.services, id)
		f.writes = append(f.writes, "PUT deregister "+id)
		f.bump()
	default:
		f.t.Errorf("fake consul: unexpected %s %s", r.Method, r.URL)
		http.Error(w, "not faked", 501)
	}
}

func writeJSON(w http.ResponseWriter, index uint64, v any) {
	w.Header().Set("Content-Type", "application/json")
	if index != 0 {
		w.Header().Set("X-Consul-Index", strconv.FormatUint(index, 10))
	}
	_ = json.NewEncoder(w).Encode(v)
}

// --- config entries ---

func (f *fakeConsul) entry(kind, name string) *fakeEntry {
	if m := f.entries[kind]; m != nil {
		return m[name]
	}
	return nil
}

// protocol is what Consul would compile for a service: its service-defaults
// protocol, tcp without one.
func (f *fakeConsul) protocol(name string) string {
	if e := f.entry("service-defaults", name); e != nil {
		if p, _ := e.body["Protocol"].(string); p != "" {
			return p
		}
	}
	return "tcp"
}

// targets are the services a splitter or router sends traffic to.
func targets(kind string, body map[string]any) []string {
	var out []string
	switch kind {
	case "service-splitter":
		splits, _ := body["Splits"].([]any)
		for _, s := range splits {
			m, _ := s.(map[string]any)
			if svc, _ := m["Service"].(string); svc != "" {
				out = append(out, svc)
			}
		}
	case "service-router":
		routes, _ := body["Routes"].([]any)
		for _, r := range routes {
			m, _ := r.(map[string]any)
			d, _ := m["Destination"].(map[string]any)
			if svc, _ := d["Service"].(string); svc != "" {
				out = append(out, svc)
			}
		}
	}
	return out
}

// refuse applies the checks Consul 1.16 makes when an entry is written
// (fixtures 038, 039), with its wording.
func (f *fakeConsul) refuse(kind, name string, body map[string]any) string {
	if kind != "service-splitter" && kind != "service-router" {
		return ""
	}
	if kind == "service-splitter" {
		var sum float64
		splits, _ := body["Splits"].([]any)
		for _, s := range splits {
			m, _ := s.(map[string]any)
			w, _ := m["Weight"].(float64)
			sum += w
		}
		if sum != 100 {
			return fmt.Sprintf("the sum of all split weights must be 100, not %f", sum)
		}
	}
	for _, svc := range append([]string{name}, targets(kind, body)...) {
		if p := f.protocol(svc); p != "http" {
			return fmt.Sprintf("discovery chain %q uses a protocol %q that does not permit advanced routing or splitting behavior", name, p)
		}
	}
	return ""
}

func (f *fakeConsul) putEntry(w http.ResponseWriter, body []byte) {
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		http.Error(w, err.Error(), 400)
		return
	}
	kind, _ := m["Kind"].(string)
	name, _ := m["Name"].(string)
	delete(m, "CreateIndex")
	delete(m, "ModifyIndex")
	f.mu.Lock()
	defer f.mu.Unlock()
	if msg := f.refuse(kind, name, m); msg != "" {
		http.Error(w, msg, 500)
		return
	}
	if f.entries[kind] == nil {
		f.entries[kind] = map[string]*fakeEntry{}
	}
	idx := f.bump()
	e := &fakeEntry{body: m, create: idx, modify: idx}
	if old := f.entries[kind][name]; old != nil {
		e.create = old.create
	}
	f.entries[kind][name] = e
	f.writes = append(f.writes, "PUT config "+kind+" "+name)
	if f.afterWrite != nil {
		f.afterWrite(f)
	}
	writeJSON(w, 0, true)
}

func (e *fakeEntry) out() map[string]any {
	m := map[string]any{}
	for k, v := range e.body {
		m[k] = v
	}
	m["CreateIndex"], m["ModifyIndex"] = e.create, e.modify
	return m
}

func (f *fakeConsul) listEntries(w http.ResponseWriter, kind string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	names := make([]string, 0, len(f.entries[kind]))
	for n := range f.entries[kind] {
		names = append(names, n)
	}
	sort.Strings(names)
	out := []any{}
	for _, n := range names {
		out = append(out, f.entries[kind][n].out())
	}
	writeJSON(w, f.index, out)
}

func (f *fakeConsul) getEntry(w http.ResponseWriter, kind, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := f.entry(kind, name)
	if e == nil {
		w.Header().Set("X-Consul-Index", strconv.FormatUint(f.index, 10))
		http.Error(w, fmt.Sprintf("Config entry not found for %q / %q", kind, name), 404)
		return
	}
	writeJSON(w, f.index, e.out())
}

func (f *fakeConsul) deleteEntry(w http.ResponseWriter, kind, name string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if kind == "service-defaults" {
		// Consul recompiles the chains that use this service and refuses
		// the delete when one would lose its http protocol.
		for _, k := range []string{"service-splitter", "service-router"} {
			for n, e := range f.entries[k] {
				for _, svc := range append([]string{n}, targets(k, e.body)...) {
					if svc == name {
						http.Error(w, fmt.Sprintf("discovery chain %q uses a protocol %q that does not permit advanced routing or splitting behavior", n, "tcp"), 500)
						return
					}
				}
			}
		}
	}
	if f.entry(kind, name) != nil {
		delete(f.entries[kind], name)
		f.bump()
		f.writes = append(f.writes, "DELETE config "+kind+" "+name)
		if f.afterWrite != nil {
			f.afterWrite(f)
		}
	}
	writeJSON(w, 0, map[string]any{})
}

// --- KV ---

func (f *fakeConsul) kvOut(key string, p *fakeKV) map[string]any {
	m := map[string]any{"Key": key, "Value": p.value, "Flags": p.flag, "LockIndex": p.lockIndex,
		"CreateIndex": p.create, "ModifyIndex": p.modify}
	if p.session != "" {
		m["Session"] = p.session
	}
	return m
}

func (f *fakeConsul) serveKV(w http.ResponseWriter, r *http.Request, key string, body []byte) {
	q := r.URL.Query()
	switch r.Method {
	case "GET":
		f.getKV(w, r, key, q.Has("recurse"))
	case "PUT":
		if hook := f.beforeKVPut; hook != nil && !q.Has("acquire") && !q.Has("release") {
			hook(key)
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		ok := f.putKV(key, q, body)
		writeJSON(w, 0, ok)
	case "DELETE":
		f.mu.Lock()
		defer f.mu.Unlock()
		p := f.kv[key]
		if q.Has("cas") {
			cas, _ := strconv.ParseUint(q.Get("cas"), 10, 64)
			if p == nil || p.modify != cas {
				writeJSON(w, 0, false)
				return
			}
		}
		if p != nil {
			delete(f.kv, key)
			f.kvIndex = f.bump()
			f.writes = append(f.writes, "DELETE kv "+key)
		}
		writeJSON(w, 0, true)
	}
}

func (f *fakeConsul) putKV(key string, q map[string][]string, body []byte) bool {
	get := func(k string) (string, bool) {
		v, ok := q[k]
		if !ok || len(v) == 0 {
			return "", ok
		}
		return v[0], true
	}
	p := f.kv[key]
	if cas, ok := get("cas"); ok {
		n, _ := strconv.ParseUint(cas, 10, 64)
		if (n == 0 && p != nil) || (n != 0 && (p == nil || p.modify != n)) {
			return false
		}
	}
	if sid, ok := get("acquire"); ok {
		if f.sessions[sid] == nil {
			return false
		}
		if p != nil && p.session != "" && p.session != sid {
			return false
		}
		if until, ok := f.delayed[key]; ok && time.Now().Before(until) && (p == nil || p.session != sid) {
			return false
		}
		if p == nil {
			p = &fakeKV{}
			f.kv[key] = p
		}
		idx := f.bump()
		if p.session != sid {
			p.lockIndex++
		}
		if p.create == 0 {
			p.create = idx
		}
		p.session, p.value, p.modify = sid, body, idx
		f.kvIndex = idx
		f.writes = append(f.writes, "PUT kv "+key+" acquire")
		return true
	}
	if sid, ok := get("release"); ok {
		if p == nil || p.session != sid {
			return false
		}
		idx := f.bump()
		p.session, p.value, p.modify = "", body, idx
		f.kvIndex = idx
		f.writes = append(f.writes, "PUT kv "+key+" release")
		return true
	}
	if p == nil {
		p = &fakeKV{}
		f.kv[key] = p
	}
	idx := f.bump()
	if p.create == 0 {
		p.create = idx
	}
	p.value, p.modify = body, idx
	f.kvIndex = idx
	f.writes = append(f.writes, "PUT kv "+key)
	return true
}

// getKV answers a KV read, blocking while ?index= is not below the answer's
// index (Consul's blocking query), up to ?wait=.
func (f *fakeConsul) getKV(w http.ResponseWriter, r *http.Request, key string, recurse bool) {
	q := r.URL.Query()
	want, _ := strconv.ParseUint(q.Get("index"), 10, 64)
	wait := 5 * time.Minute
	if s := q.Get("wait"); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			wait = d
		}
	}
	deadline := time.NewTimer(wait)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		var out []any
		idx := f.kvIndex
		if recurse {
			keys := make([]string, 0)
			for k := range f.kv {
				if strings.HasPrefix(k, key) {
					keys = append(keys, k)
				}
			}
			sort.Strings(keys)
			for _, k := range keys {
				out = append(out, f.kvOut(k, f.kv[k]))
			}
		} else if p := f.kv[key]; p != nil {
			out = append(out, f.kvOut(key, p))
			idx = p.modify
		}
		idx = max(idx, 1)
		changed := f.changed
		f.mu.Unlock()

		if want == 0 || idx > want {
			if len(out) == 0 {
				w.Header().Set("X-Consul-Index", strconv.FormatUint(idx, 10))
				w.WriteHeader(404)
				return
			}
			writeJSON(w, idx, out)
			return
		}
		select {
		case <-changed:
		case <-deadline.C:
			want = 0 // answer with what is there, same index
		case <-r.Context().Done():
			return
		}
	}
}

// --- sessions ---

func (f *fakeConsul) serveSession(w http.ResponseWriter, rest string, body []byte) {
	op, id, _ := strings.Cut(rest, "/")
	f.mu.Lock()
	defer f.mu.Unlock()
	switch op {
	case "create":
		var req struct{ Name, TTL, Behavior, LockDelay string }
		_ = json.Unmarshal(body, &req)
		f.nextID++
		s := &fakeSession{id: fmt.Sprintf("00000000-0000-0000-0000-%012d", f.nextID), name: req.Name, behavior: req.Behavior}
		s.lockDelay, _ = time.ParseDuration(req.LockDelay)
		f.sessions[s.id] = s
		f.bump()
		writeJSON(w, 0, map[string]string{"ID": s.id})
	case "renew":
		if f.failRenew {
			http.Error(w, "rpc error: No cluster leader", 500)
			return
		}
		s := f.sessions[id]
		if s == nil {
			http.Error(w, "Session id '"+id+"' not found", 404)
			return
		}
		writeJSON(w, 0, []map[string]any{{"ID": s.id, "Name": s.name, "Behavior": s.behavior}})
	case "destroy":
		f.invalidateLocked(id)
		writeJSON(w, 0, true)
	default:
		http.Error(w, "not faked", 501)
	}
}

// invalidate ends a session as its TTL running out would: locks it held
// are released and enter their lock delay.
func (f *fakeConsul) invalidate(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.invalidateLocked(id)
}

func (f *fakeConsul) invalidateLocked(id string) {
	s := f.sessions[id]
	if s == nil {
		return
	}
	delete(f.sessions, id)
	for k, p := range f.kv {
		if p.session == id {
			p.session = ""
			p.modify = f.bump()
			f.kvIndex = p.modify
			f.delayed[k] = time.Now().Add(s.lockDelay)
		}
	}
	f.bump()
}

// holder is the session holding key ("" for none).
func (f *fakeConsul) holder(key string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.kv[key]; p != nil {
		return p.session
	}
	return ""
}

func (f *fakeConsul) writeLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.writes...)
}

func (f *fakeConsul) resetWriteLog() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = nil
}

// entryNames lists "kind/name" of every config entry, sorted.
func (f *fakeConsul) entryNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for k, m := range f.entries {
		for n := range m {
			out = append(out, k+"/"+n)
		}
	}
	sort.Strings(out)
	return out
}
