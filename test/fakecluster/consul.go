package fakecluster

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/datapath/broadcast"
)

// ConsulVersion is the version the fake Consul reports.
const ConsulVersion = "1.16.1"

// consulNode is the single node of the fake Consul (a dev agent).
const (
	consulNodeName = "fake"
	consulNodeID   = "8913a489-5e34-67ee-85fa-9802d69988a4"
	consulDC       = "dc1"
)

// Consul is the fake Consul agent: KV with check-and-set and sessions,
// sessions with TTLs, config entries with the validation Consul does for
// routing (splitter weights, L7 protocol), the compiled discovery chain,
// the agent's service and check registrations, the health endpoint, and
// HTTP/TCP checks that really run. Every read that Consul can block on
// honours index and wait. It is safe for concurrent use.
type Consul struct {
	opts Options
	log  *slog.Logger
	srv  *server
	quit chan struct{}

	changed broadcast.Signal

	mu     sync.Mutex
	closed bool
	// index is the raft index: every write takes the next one.
	index uint64

	kv        map[string]*kvEntry
	kvTomb    map[string]uint64    // key -> index of its deletion
	kvIndex   uint64               // last write to the KV table
	lockDelay map[string]time.Time // key -> end of its lock delay

	sessions map[string]*session

	services     map[string]*consulService // by ID
	checks       map[string]*consulCheck   // by check ID
	nameIndex    map[string]uint64         // service name -> last change
	serviceIndex uint64                    // last write to the catalog

	config      map[string]map[string]*configEntry // kind -> name -> entry
	configIndex uint64

	wg sync.WaitGroup // check runners and session timers
}

func newConsul(opts Options) *Consul {
	c := &Consul{
		opts:      opts,
		log:       opts.Logger.With("agent", "consul"),
		quit:      make(chan struct{}),
		index:     10, // a fresh dev agent has written a few entries already
		kv:        map[string]*kvEntry{},
		kvTomb:    map[string]uint64{},
		lockDelay: map[string]time.Time{},
		sessions:  map[string]*session{},
		services:  map[string]*consulService{},
		checks:    map[string]*consulCheck{},
		nameIndex: map[string]uint64{},
		config:    map[string]map[string]*configEntry{},
	}
	c.srv = newServer("consul", c.handler(), "Permission denied: token with AccessorID '00000000-0000-0000-0000-000000000002' lacks permission")
	return c
}

// Addr is the agent's address as CONSUL_HTTP_ADDR takes it
// (http://127.0.0.1:port).
func (c *Consul) Addr() string { return c.srv.url() }

// ClientConfig is the API client's default configuration (so the
// environment still applies) with the address of this agent.
func (c *Consul) ClientConfig() *consulapi.Config {
	cfg := consulapi.DefaultConfig()
	cfg.Address = c.Addr()
	return cfg
}

// Down closes the agent's listener and every open connection: requests get
// "connection refused" until Up. Checks keep running, as a real agent's do
// when only its API is unreachable.
func (c *Consul) Down() { c.srv.down() }

// Up serves again on the same address.
func (c *Consul) Up() error { return c.srv.up() }

// SetFault makes the agent answer matching requests with f; Fault{} clears
// it.
func (c *Consul) SetFault(f Fault) { c.srv.setFault(f) }

// nextIndex takes the next raft index (call with c.mu held; the caller
// wakes blocking queries with changed.notify once it has unlocked).
func (c *Consul) nextIndex() uint64 {
	c.index++
	return c.index
}

func (c *Consul) close() {
	close(c.quit) // blocking queries watch it, so none outlives the cluster
	c.srv.down()
	c.mu.Lock()
	c.closed = true // no check starts after this (a handler may still run)
	for _, chk := range c.checks {
		chk.stop()
	}
	for _, s := range c.sessions {
		if s.timer != nil {
			s.timer.Stop()
		}
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// readHeaders are the headers Consul sends with a read at index.
func readHeaders(index uint64) map[string]string {
	return map[string]string{
		"X-Consul-Index":                 strconv.FormatUint(max(index, 1), 10),
		"X-Consul-Knownleader":           "true",
		"X-Consul-Lastcontact":           "0",
		"X-Consul-Effective-Consistency": "leader",
		"X-Consul-Default-Acl-Policy":    "allow",
		"X-Consul-Query-Backend":         "blocking-query",
	}
}

var writeHeaders = map[string]string{"X-Consul-Default-Acl-Policy": "allow"}

func (c *Consul) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/agent/self", c.agentSelf)
	mux.HandleFunc("GET /v1/status/leader", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, nil, "127.0.0.1:8300")
	})
	mux.HandleFunc("PUT /v1/agent/service/register", c.serviceRegister)
	mux.HandleFunc("PUT /v1/agent/service/deregister/{id}", c.serviceDeregister)
	mux.HandleFunc("GET /v1/agent/services", c.agentServices)
	mux.HandleFunc("GET /v1/agent/service/{id}", c.agentService)
	mux.HandleFunc("GET /v1/health/service/{name}", c.healthService)
	mux.HandleFunc("GET /v1/health/checks/{service}", c.healthChecks)
	mux.HandleFunc("GET /v1/health/state/{state}", c.healthState)
	mux.HandleFunc("GET /v1/catalog/service/{name}", c.catalogService)
	mux.HandleFunc("GET /v1/kv/{key...}", c.kvGet)
	mux.HandleFunc("PUT /v1/kv/{key...}", c.kvPut)
	mux.HandleFunc("DELETE /v1/kv/{key...}", c.kvDelete)
	mux.HandleFunc("PUT /v1/session/create", c.sessionCreate)
	mux.HandleFunc("PUT /v1/session/renew/{id}", c.sessionRenew)
	mux.HandleFunc("PUT /v1/session/destroy/{id}", c.sessionDestroy)
	mux.HandleFunc("GET /v1/session/list", c.sessionList)
	mux.HandleFunc("PUT /v1/config", c.configSet)
	mux.HandleFunc("GET /v1/config/{kind}", c.configList)
	mux.HandleFunc("GET /v1/config/{kind}/{name}", c.configGet)
	mux.HandleFunc("DELETE /v1/config/{kind}/{name}", c.configDelete)
	mux.HandleFunc("GET /v1/discovery-chain/{name}", c.discoveryChain)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeText(w, nil, http.StatusNotFound, fmt.Sprintf("fake cluster: Consul endpoint %s %s is not implemented by the fake", r.Method, r.URL.Path))
	})
	return mux
}

func (c *Consul) agentSelf(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, nil, map[string]any{
		"Config": map[string]any{
			"Datacenter": consulDC, "NodeName": consulNodeName, "NodeID": consulNodeID,
			"Server": true, "Version": ConsulVersion, "Revision": "", "PrimaryDatacenter": consulDC,
		},
		"Member": map[string]any{
			"Name": consulNodeName, "Addr": "127.0.0.1", "Port": 8301, "Status": 1,
			"Tags": map[string]string{"dc": consulDC, "role": "consul", "build": ConsulVersion},
		},
		"Meta": map[string]string{"consul-network-segment": "", "consul-version": ConsulVersion},
	})
}

// readBody reads a request body, bounded.
func readBody(r *http.Request) ([]byte, error) {
	return io.ReadAll(io.LimitReader(r.Body, 32<<20))
}

// readJSON reads a JSON request body into v.
func readJSON(r *http.Request, v any) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// decodeJSON reads a JSON request body into v; on failure it answers 400
// the way Consul does and reports false.
func decodeJSON(w http.ResponseWriter, r *http.Request, v any) bool {
	if err := readJSON(r, v); err != nil {
		writeText(w, writeHeaders, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return false
	}
	return true
}

// ---- KV ----

// kvEntry is a key as Consul stores it and, field for field, as it answers
// it. A write replaces Value rather than changing it in place, so a copy
// taken under the lock may share it.
type kvEntry struct {
	LockIndex   uint64
	Key         string
	Flags       uint64
	Value       []byte
	Session     string `json:",omitempty"`
	CreateIndex uint64
	ModifyIndex uint64
}

// kvQueryIndex is the index of a key (or prefix): the newest change to a
// matching key, deletions included, else the KV table's (call with c.mu
// held).
func (c *Consul) kvQueryIndex(key string, prefix bool) uint64 {
	var idx uint64
	match := func(k string) bool {
		if prefix {
			return strings.HasPrefix(k, key)
		}
		return k == key
	}
	for k, e := range c.kv {
		if match(k) {
			idx = max(idx, e.ModifyIndex)
		}
	}
	for k, t := range c.kvTomb {
		if match(k) {
			idx = max(idx, t)
		}
	}
	if idx == 0 {
		idx = c.kvIndex
	}
	return idx
}

func (c *Consul) kvGet(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	_, recurse := r.URL.Query()["recurse"]
	if _, keys := r.URL.Query()["keys"]; keys {
		c.kvKeys(w, r, key, r.URL.Query().Get("separator"))
		return
	}
	pairs, idx := block(r, &c.changed, c.quit, func() ([]kvEntry, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []kvEntry
		for k, e := range c.kv {
			if (recurse && strings.HasPrefix(k, key)) || k == key {
				out = append(out, *e)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
		return out, c.kvQueryIndex(key, recurse)
	})
	if len(pairs) == 0 {
		kvNotFound(w, idx)
		return
	}
	writeJSON(w, readHeaders(idx), pairs)
}

// kvNotFound is Consul's answer when no key matches: 404 with an empty
// body, and the index to block on.
func kvNotFound(w http.ResponseWriter, idx uint64) {
	for k, v := range readHeaders(idx) {
		w.Header().Set(k, v)
	}
	w.WriteHeader(http.StatusNotFound)
}

// kvKeys answers ?keys: the keys under prefix, sorted; with a separator,
// a key is cut after the first separator that follows the prefix, and
// duplicates are folded, as `consul kv get -keys` shows "folders".
func (c *Consul) kvKeys(w http.ResponseWriter, r *http.Request, prefix, sep string) {
	keys, idx := block(r, &c.changed, c.quit, func() ([]string, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		seen := map[string]bool{}
		var out []string
		for k := range c.kv {
			if !strings.HasPrefix(k, prefix) {
				continue
			}
			if sep != "" {
				if i := strings.Index(k[len(prefix):], sep); i >= 0 {
					k = k[:len(prefix)+i+len(sep)]
				}
			}
			if !seen[k] {
				seen[k] = true
				out = append(out, k)
			}
		}
		sort.Strings(out)
		return out, c.kvQueryIndex(prefix, true)
	})
	if len(keys) == 0 {
		kvNotFound(w, idx)
		return
	}
	writeJSON(w, readHeaders(idx), keys)
}

func (c *Consul) kvPut(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	q := r.URL.Query()
	body, err := readBody(r)
	if err != nil {
		writeText(w, writeHeaders, http.StatusBadRequest, err.Error())
		return
	}
	var flags uint64
	if v := q.Get("flags"); v != "" {
		if flags, err = strconv.ParseUint(v, 10, 64); err != nil {
			writeText(w, writeHeaders, http.StatusBadRequest, "Invalid flags: "+err.Error())
			return
		}
	}
	var cas *uint64
	if v := q.Get("cas"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeText(w, writeHeaders, http.StatusBadRequest, "Invalid cas index: "+err.Error())
			return
		}
		cas = &n
	}
	acquire, release := q.Get("acquire"), q.Get("release")
	if acquire != "" && release != "" {
		writeText(w, writeHeaders, http.StatusBadRequest, "Conflicting flags: acquire="+acquire+"&release="+release)
		return
	}

	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	cur := c.kv[key]
	now := time.Now()
	switch {
	case acquire != "":
		if _, ok := c.sessions[acquire]; !ok {
			writeText(w, writeHeaders, http.StatusInternalServerError, fmt.Sprintf("invalid session %q", acquire))
			return
		}
		if until, ok := c.lockDelay[key]; ok && now.Before(until) {
			writeJSON(w, writeHeaders, false)
			return
		}
		if cur != nil && cur.Session != "" && cur.Session != acquire {
			writeJSON(w, writeHeaders, false)
			return
		}
		if cas != nil && !casMatches(cur, *cas) {
			writeJSON(w, writeHeaders, false)
			return
		}
		idx := c.nextIndex()
		e := c.putLocked(key, body, flags, idx)
		if e.Session != acquire {
			e.LockIndex++
			e.Session = acquire
		}
		writeJSON(w, writeHeaders, true)
	case release != "":
		if cur == nil || cur.Session != release {
			writeJSON(w, writeHeaders, false)
			return
		}
		idx := c.nextIndex()
		e := c.putLocked(key, body, flags, idx)
		e.Session = ""
		writeJSON(w, writeHeaders, true)
	default:
		if cas != nil && !casMatches(cur, *cas) {
			writeJSON(w, writeHeaders, false)
			return
		}
		idx := c.nextIndex()
		c.putLocked(key, body, flags, idx)
		writeJSON(w, writeHeaders, true)
	}
}

// casMatches is Consul's check-and-set rule: 0 means "only if absent",
// anything else "only if the key's ModifyIndex is this".
func casMatches(cur *kvEntry, cas uint64) bool {
	if cas == 0 {
		return cur == nil
	}
	return cur != nil && cur.ModifyIndex == cas
}

// putLocked writes a key's value keeping its lock fields (call with c.mu
// held).
func (c *Consul) putLocked(key string, value []byte, flags, idx uint64) *kvEntry {
	e := c.kv[key]
	if e == nil {
		e = &kvEntry{Key: key, CreateIndex: idx}
		c.kv[key] = e
	}
	e.Value = append([]byte(nil), value...)
	e.Flags = flags
	e.ModifyIndex = idx
	delete(c.kvTomb, key)
	c.kvIndex = idx
	return e
}

func (c *Consul) kvDelete(w http.ResponseWriter, r *http.Request) {
	key := r.PathValue("key")
	q := r.URL.Query()
	_, recurse := q["recurse"]
	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	if v := q.Get("cas"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			writeText(w, writeHeaders, http.StatusBadRequest, "Invalid cas index: "+err.Error())
			return
		}
		cur := c.kv[key]
		if cur == nil {
			writeJSON(w, writeHeaders, true)
			return
		}
		if cur.ModifyIndex != n {
			writeJSON(w, writeHeaders, false)
			return
		}
	}
	idx := c.nextIndex()
	for k := range c.kv {
		if k == key || (recurse && strings.HasPrefix(k, key)) {
			delete(c.kv, k)
			c.kvTomb[k] = idx
		}
	}
	c.kvIndex = idx
	writeJSON(w, writeHeaders, true)
}

// ---- sessions ----

// Consul invalidates a session whose TTL passed without renewal only after
// twice the TTL (its SessionTTLMultiplier).
const sessionTTLMultiplier = 2

// maxLockDelay is the longest lock delay Consul applies
// (structs.MaxLockDelay); a longer one is cut to it.
const maxLockDelay = 60 * time.Second

type session struct {
	ID        string
	Name      string
	Behavior  string
	TTL       time.Duration
	LockDelay time.Duration
	// NodeChecks and ServiceChecks are the checks the session is bound to:
	// Consul invalidates it when one turns critical or is removed.
	NodeChecks    []string
	ServiceChecks []string
	CreateIndex   uint64
	ModifyIndex   uint64
	timer         *time.Timer
}

// checkIDs is every check the session is bound to.
func (s *session) checkIDs() []string {
	return append(slices.Clone(s.NodeChecks), s.ServiceChecks...)
}

func (s *session) wire() map[string]any {
	ttl := ""
	if s.TTL > 0 {
		ttl = s.TTL.String()
	}
	return map[string]any{
		"ID": s.ID, "Name": s.Name, "Node": consulNodeName, "LockDelay": int64(s.LockDelay),
		"Behavior": s.Behavior, "TTL": ttl, "Checks": []string{}, "NodeChecks": nonNil(s.NodeChecks), "ServiceChecks": s.serviceChecksWire(),
		"CreateIndex": s.CreateIndex, "ModifyIndex": s.ModifyIndex,
	}
}

func (s *session) serviceChecksWire() []map[string]string {
	if len(s.ServiceChecks) == 0 {
		return nil
	}
	out := make([]map[string]string, 0, len(s.ServiceChecks))
	for _, id := range s.ServiceChecks {
		out = append(out, map[string]string{"ID": id, "Namespace": ""})
	}
	return out
}

// parseConsulDuration reads a duration Consul accepts: "15s", "1000ms", or
// a number of nanoseconds.
func parseConsulDuration(v any) (time.Duration, error) {
	switch x := v.(type) {
	case nil:
		return 0, nil
	case string:
		if x == "" {
			return 0, nil
		}
		return time.ParseDuration(x)
	case float64:
		return time.Duration(x), nil
	}
	return 0, fmt.Errorf("not a duration: %v", v)
}

func (c *Consul) sessionCreate(w http.ResponseWriter, r *http.Request) {
	var body map[string]any
	b, err := readBody(r)
	if err == nil && len(strings.TrimSpace(string(b))) > 0 {
		err = json.Unmarshal(b, &body)
	}
	if err != nil {
		writeText(w, writeHeaders, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	s := &session{ID: newUUID(), Behavior: "release", LockDelay: 15 * time.Second}
	if v, ok := body["Name"].(string); ok {
		s.Name = v
	}
	if v, ok := body["Behavior"].(string); ok && v != "" {
		if v != "release" && v != "delete" {
			writeText(w, writeHeaders, http.StatusBadRequest, fmt.Sprintf("Invalid Behavior setting '%s'", v))
			return
		}
		s.Behavior = v
	}
	if v, ok := body["LockDelay"]; ok {
		d, err := parseConsulDuration(v)
		if err != nil {
			writeText(w, writeHeaders, http.StatusBadRequest, "Request decode failed: LockDelay: "+err.Error())
			return
		}
		s.LockDelay = min(d, maxLockDelay)
	}
	if err := s.parseChecks(body); err != nil {
		writeText(w, writeHeaders, http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	if v, ok := body["TTL"]; ok {
		d, err := parseConsulDuration(v)
		if err != nil {
			writeText(w, writeHeaders, http.StatusBadRequest, fmt.Sprintf("Request decode failed: TTL: %v", err))
			return
		}
		if d != 0 && (d < 10*time.Second || d > 24*time.Hour) {
			writeText(w, writeHeaders, http.StatusBadRequest, fmt.Sprintf("Invalid Session TTL '%s', must be between [10s=24h0m0s]", d))
			return
		}
		s.TTL = d
	}
	c.mu.Lock()
	// Consul validates the checks against its catalog in the same write
	// that creates the session (validateSessionChecksTxn).
	for _, id := range s.checkIDs() {
		if id == serfCheckID {
			continue // the node is alive: the fake has one node, always up
		}
		chk, ok := c.checks[id]
		switch {
		case !ok:
			c.mu.Unlock()
			writeText(w, writeHeaders, http.StatusInternalServerError, fmt.Sprintf("apply failed: Missing check '%s' registration", id))
			return
		case chk.Status == consulapi.HealthCritical:
			c.mu.Unlock()
			writeText(w, writeHeaders, http.StatusInternalServerError, fmt.Sprintf("apply failed: Check '%s' is in critical state", id))
			return
		}
	}
	idx := c.nextIndex()
	s.CreateIndex, s.ModifyIndex = idx, idx
	c.sessions[s.ID] = s
	c.armSessionLocked(s)
	c.mu.Unlock()
	c.changed.Notify()
	writeJSON(w, writeHeaders, map[string]string{"ID": s.ID})
}

// serfCheckID is the node's own check, every session's default.
const serfCheckID = "serfHealth"

// parseChecks reads the checks of a session create as Consul's HTTP
// handler does: NodeChecks (and the older Checks) default to the node's
// serfHealth, and a body that names either replaces the default
// (fixupEmptySessionChecks); ServiceChecks come on top.
func (s *session) parseChecks(body map[string]any) error {
	ids := func(name string) ([]string, bool, error) {
		v, ok := body[name]
		if !ok || v == nil {
			return nil, false, nil
		}
		list, isList := v.([]any)
		if !isList {
			return nil, true, fmt.Errorf("%s: not a list", name)
		}
		out := []string{}
		for _, e := range list {
			switch x := e.(type) {
			case string:
				out = append(out, x)
			case map[string]any: // ServiceChecks: {"ID": ..., "Namespace": ...}
				id, _ := x["ID"].(string)
				out = append(out, id)
			default:
				return nil, true, fmt.Errorf("%s: unexpected entry %v", name, e)
			}
		}
		return out, true, nil
	}
	checks, hasChecks, err := ids("Checks")
	if err != nil {
		return err
	}
	nodeChecks, hasNode, err := ids("NodeChecks")
	if err != nil {
		return err
	}
	serviceChecks, _, err := ids("ServiceChecks")
	if err != nil {
		return err
	}
	switch {
	case hasNode:
		s.NodeChecks = nodeChecks
	case hasChecks:
		// The deprecated field: its entries count as node checks here
		// (the fake has nothing else to tell them apart by).
		s.NodeChecks = checks
	default:
		s.NodeChecks = []string{serfCheckID}
	}
	s.ServiceChecks = serviceChecks
	return nil
}

// invalidateSessionsOfLocked ends every session bound to a check that
// turned critical or went away, as Consul does in the write that changes
// the check (call with c.mu held).
func (c *Consul) invalidateSessionsOfLocked(checkID string) {
	for id, s := range c.sessions {
		if slices.Contains(s.checkIDs(), checkID) {
			c.log.Debug("session invalidated by its check", "session", id, "check", checkID)
			c.destroySessionLocked(id)
		}
	}
}

// armSessionLocked (re)starts a session's TTL timer (call with c.mu held).
func (c *Consul) armSessionLocked(s *session) {
	if s.TTL == 0 {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	id := s.ID
	s.timer = time.AfterFunc(sessionTTLMultiplier*s.TTL, func() {
		c.mu.Lock()
		cur, ok := c.sessions[id]
		if ok && cur == s {
			c.log.Debug("session expired", "session", id, "name", s.Name)
			c.destroySessionLocked(id)
		}
		c.mu.Unlock()
		c.changed.Notify()
	})
}

// destroySessionLocked invalidates a session: the keys it holds are
// released (or deleted, for behavior delete) and enter its lock delay
// (call with c.mu held).
func (c *Consul) destroySessionLocked(id string) {
	s, ok := c.sessions[id]
	if !ok {
		return
	}
	if s.timer != nil {
		s.timer.Stop()
	}
	delete(c.sessions, id)
	idx := c.nextIndex()
	for k, e := range c.kv {
		if e.Session != id {
			continue
		}
		if s.Behavior == "delete" {
			delete(c.kv, k)
			c.kvTomb[k] = idx
		} else {
			e.Session = ""
			e.ModifyIndex = idx
		}
		c.kvIndex = idx
		if s.LockDelay > 0 {
			c.lockDelay[k] = time.Now().Add(s.LockDelay)
		}
	}
}

func (c *Consul) sessionRenew(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c.mu.Lock()
	s, ok := c.sessions[id]
	if ok {
		c.armSessionLocked(s)
	}
	var out []map[string]any
	if ok {
		out = append(out, s.wire())
	}
	c.mu.Unlock()
	if !ok {
		writeText(w, writeHeaders, http.StatusNotFound, fmt.Sprintf("Session id '%s' not found", id))
		return
	}
	writeJSON(w, writeHeaders, out)
}

func (c *Consul) sessionDestroy(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c.mu.Lock()
	c.destroySessionLocked(id)
	c.mu.Unlock()
	c.changed.Notify()
	writeJSON(w, writeHeaders, true)
}

// sessionList answers every live session, oldest first, as Consul does.
func (c *Consul) sessionList(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	all := make([]*session, 0, len(c.sessions))
	for _, s := range c.sessions {
		all = append(all, s)
	}
	slices.SortFunc(all, func(a, b *session) int { return cmp.Compare(a.CreateIndex, b.CreateIndex) })
	out := make([]map[string]any, 0, len(all))
	for _, s := range all {
		out = append(out, s.wire())
	}
	c.mu.Unlock()
	writeJSON(w, writeHeaders, out)
}

// ---- test inspection ----

// KV returns a key's value and whether it exists, as Consul holds it now.
func (c *Consul) KV(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.kv[key]
	if !ok {
		return nil, false
	}
	return append([]byte(nil), e.Value...), true
}

// KVHolder returns the session holding a key's lock ("" when none).
func (c *Consul) KVHolder(key string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.kv[key]; ok {
		return e.Session
	}
	return ""
}

// KVKeys lists the keys under prefix, sorted.
func (c *Consul) KVKeys(prefix string) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for k := range c.kv {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}
