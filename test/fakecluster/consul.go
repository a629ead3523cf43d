package fakecluster

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/datapath/broadcast"
)

// The fake Consul's version and single node (a dev agent).
const (
	consulVersion  = "1.16.1"
	consulNodeName = "fake"
	consulNodeID   = "8913a489-5e34-67ee-85fa-9802d69988a4"
	consulDC       = "dc1"
)

// Consul is the fake Consul agent. Every read Consul can block on honours
// index and wait. It is safe for concurrent use.
type Consul struct {
	opts Options
	srv  *server
	quit chan struct{}

	changed broadcast.Signal // wakes blocking queries

	mu        sync.Mutex
	closed    bool
	index     uint64 // the raft index: every write takes the next one
	kv        map[string]*consulapi.KVPair
	kvTomb    map[string]uint64    // key -> index of its deletion
	kvIndex   uint64               // the last write to the KV table
	lockDelay map[string]time.Time // key -> end of its lock delay
	sessions  map[string]*session

	services     map[string]*consulapi.AgentService // by ID, on the agent's node
	external     map[string]*externalNode           // agentless nodes by name (catalog API)
	checks       map[string]*consulCheck            // by check ID
	nameIndex    map[string]uint64                  // service name -> its last change
	serviceIndex uint64                             // the last write to the catalog

	config      map[string]map[string]*configEntry // kind -> name
	configIndex uint64

	wg sync.WaitGroup // check runners
}

func newConsul(opts Options) *Consul {
	c := &Consul{
		opts: opts, quit: make(chan struct{}),
		index: 10, // a fresh dev agent has written a few entries already
		kv:    map[string]*consulapi.KVPair{}, kvTomb: map[string]uint64{}, lockDelay: map[string]time.Time{},
		sessions: map[string]*session{}, services: map[string]*consulapi.AgentService{}, checks: map[string]*consulCheck{},
		external:  map[string]*externalNode{},
		nameIndex: map[string]uint64{}, config: map[string]map[string]*configEntry{},
	}
	forbidden := "Permission denied: token with AccessorID '00000000-0000-0000-0000-000000000002' lacks permission"
	c.srv = newServer("Consul", forbidden, map[string]http.HandlerFunc{
		"GET /v1/agent/self": c.agentSelf, "PUT /v1/agent/service/register": c.serviceRegister,
		"PUT /v1/agent/service/deregister/{id}": c.serviceDeregister,
		"GET /v1/agent/services":                c.agentServices, "GET /v1/agent/service/{id}": c.agentService,
		"GET /v1/health/service/{name}": c.healthService, "GET /v1/health/checks/{service}": c.healthChecks,
		"GET /v1/health/state/{state}": c.healthState, "GET /v1/catalog/service/{name}": c.catalogService,
		"GET /v1/kv/{key...}": c.kvGet, "PUT /v1/kv/{key...}": c.kvPut, "DELETE /v1/kv/{key...}": c.kvDelete,
		"PUT /v1/session/create": c.sessionCreate, "PUT /v1/session/renew/{id}": c.sessionRenew,
		"PUT /v1/session/destroy/{id}": c.sessionDestroy, "GET /v1/session/list": c.sessionList,
		"PUT /v1/config": c.configSet, "GET /v1/config/{kind}": c.configList,
		"GET /v1/config/{kind}/{name}": c.configGet, "DELETE /v1/config/{kind}/{name}": c.configDelete,
		"GET /v1/discovery-chain/{name}": c.discoveryChain,
		"PUT /v1/catalog/register":       c.catalogRegister, "PUT /v1/catalog/deregister": c.catalogDeregister,
		"GET /v1/catalog/nodes": c.catalogNodes, "GET /v1/catalog/node-services/{node}": c.catalogNodeServices,
	})
	return c
}

// Addr is the agent's address as CONSUL_HTTP_ADDR takes it.
func (c *Consul) Addr() string { return c.srv.url() }

// ClientConfig is the API client's default configuration with the address
// of this agent.
func (c *Consul) ClientConfig() *consulapi.Config {
	cfg := consulapi.DefaultConfig()
	cfg.Address = c.Addr()
	return cfg
}

// Down closes the agent's listener and every open connection until Up;
// checks keep running.
func (c *Consul) Down() { c.srv.down() }

// Up serves again on the same address.
func (c *Consul) Up() error { return c.srv.up() }

// SetFault makes the agent answer matching requests with f; Fault{} clears
// it.
func (c *Consul) SetFault(f Fault) { c.srv.setFault(f) }

// nextIndex takes the next raft index (call with c.mu held; wake blocking
// queries with changed.Notify once unlocked).
func (c *Consul) nextIndex() uint64 {
	c.index++
	return c.index
}

func (c *Consul) close() {
	close(c.quit) // blocking queries watch it
	c.srv.down()
	c.mu.Lock()
	c.closed = true // no check starts after this
	for _, chk := range c.checks {
		chk.stop()
	}
	for id := range c.sessions {
		c.destroySessionLocked(id)
	}
	c.mu.Unlock()
	c.wg.Wait()
}

// readHeaders are the headers of a read at index; writeHeaders of a write.
func readHeaders(index uint64) map[string]string {
	return map[string]string{"X-Consul-Index": strconv.FormatUint(max(index, 1), 10), "X-Consul-Knownleader": "true",
		"X-Consul-Lastcontact": "0", "X-Consul-Default-Acl-Policy": "allow"}
}

var writeHeaders = map[string]string{"X-Consul-Default-Acl-Policy": "allow"}

// badRequest answers a request Consul cannot decode.
func badRequest(w http.ResponseWriter, err error) {
	writeText(w, writeHeaders, http.StatusBadRequest, "Request decode failed: "+err.Error())
}

func (c *Consul) agentSelf(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, nil, map[string]any{
		"Config": map[string]any{"Datacenter": consulDC, "NodeName": consulNodeName, "NodeID": consulNodeID,
			"Server": true, "Version": consulVersion, "Revision": "", "PrimaryDatacenter": consulDC},
		"Member": map[string]any{"Name": consulNodeName, "Addr": "127.0.0.1", "Port": 8301, "Status": 1,
			"Tags": map[string]string{"dc": consulDC, "role": "consul", "build": consulVersion}},
		"Meta": map[string]string{"consul-network-segment": "", "consul-version": consulVersion},
	})
}

// ---- KV ----

// kvIndexLocked is the index of a key or prefix: the newest change to a
// matching key, deletions included, else the KV table's.
func (c *Consul) kvIndexLocked(key string, prefix bool) uint64 {
	var idx uint64
	match := func(k string) bool { return k == key || prefix && strings.HasPrefix(k, key) }
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
	return cmp.Or(idx, c.kvIndex)
}

// kvGet answers a key, the keys under a prefix (recurse), or their names
// (keys, cut after the first separator past the prefix). None is a 404
// with an empty body and the index to block on.
func (c *Consul) kvGet(w http.ResponseWriter, r *http.Request) {
	key, q := r.PathValue("key"), r.URL.Query()
	recurse, keysOnly, sep := q.Has("recurse"), q.Has("keys"), q.Get("separator")
	out, idx := block(r, &c.changed, c.quit, func() ([]any, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		var out []any
		for _, k := range slices.Sorted(maps.Keys(c.kv)) {
			switch {
			case keysOnly && strings.HasPrefix(k, key):
				if i := strings.Index(k[len(key):], sep); sep != "" && i >= 0 {
					k = k[:len(key)+i+len(sep)]
				}
				if len(out) == 0 || out[len(out)-1] != k {
					out = append(out, k)
				}
			case !keysOnly && (k == key || recurse && strings.HasPrefix(k, key)):
				e := *c.kv[k]
				out = append(out, e)
			}
		}
		return out, c.kvIndexLocked(key, recurse || keysOnly)
	})
	if len(out) == 0 {
		setHeaders(w, readHeaders(idx))
		w.WriteHeader(http.StatusNotFound)
		return
	}
	writeJSON(w, readHeaders(idx), out)
}

// kvPut writes a key: with cas only at that ModifyIndex (0: only if
// absent), with acquire only if no other session holds it and its lock
// delay has passed, with release only by its holder. flags is stored with
// the value (0 when absent, as Consul). It answers true or false.
func (c *Consul) kvPut(w http.ResponseWriter, r *http.Request) {
	key, q := r.PathValue("key"), r.URL.Query()
	body, err := readBody(r)
	if err != nil {
		badRequest(w, err)
		return
	}
	var flags uint64
	if f := q.Get("flags"); f != "" {
		if flags, err = strconv.ParseUint(f, 10, 64); err != nil {
			badRequest(w, fmt.Errorf("flags: %w", err))
			return
		}
	}
	acquire, release := q.Get("acquire"), q.Get("release")
	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	cur := c.kv[key]
	ok := casMatches(cur, q)
	switch {
	case acquire != "":
		if c.sessions[acquire] == nil {
			writeText(w, writeHeaders, http.StatusInternalServerError, fmt.Sprintf("invalid session %q", acquire))
			return
		}
		ok = ok && time.Now().After(c.lockDelay[key]) && (cur == nil || cur.Session == "" || cur.Session == acquire)
	case release != "":
		ok = ok && cur != nil && cur.Session == release
	}
	if ok {
		idx, e := c.nextIndex(), cur
		if e == nil {
			e = &consulapi.KVPair{Key: key, CreateIndex: idx}
			c.kv[key] = e
		}
		e.Value, e.Flags, e.ModifyIndex, c.kvIndex = body, flags, idx, idx
		delete(c.kvTomb, key)
		if acquire != "" && e.Session != acquire {
			e.LockIndex++
			e.Session = acquire
		} else if release != "" {
			e.Session = ""
		}
	}
	writeJSON(w, writeHeaders, ok)
}

// casMatches is Consul's check-and-set rule for a cas parameter: none
// matches anything, 0 only an absent key, else the key's ModifyIndex.
func casMatches(cur *consulapi.KVPair, q map[string][]string) bool {
	v := ""
	if vs := q["cas"]; len(vs) > 0 {
		v = vs[0]
	}
	if v == "" {
		return true
	}
	n, err := strconv.ParseUint(v, 10, 64)
	return err == nil && (n == 0 && cur == nil || cur != nil && cur.ModifyIndex == n)
}

func (c *Consul) kvDelete(w http.ResponseWriter, r *http.Request) {
	key, q := r.PathValue("key"), r.URL.Query()
	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	if cur := c.kv[key]; q.Has("cas") && cur != nil && !casMatches(cur, q) {
		writeJSON(w, writeHeaders, false)
		return
	}
	idx := c.nextIndex()
	for k := range c.kv {
		if k == key || q.Has("recurse") && strings.HasPrefix(k, key) {
			delete(c.kv, k)
			c.kvTomb[k] = idx
		}
	}
	c.kvIndex = idx
	writeJSON(w, writeHeaders, true)
}

// ---- sessions ----

type session struct {
	consulapi.SessionEntry
	ModifyIndex uint64
	ttl         time.Duration
	timer       *time.Timer
}

// checkIDs is every check the session is bound to.
func (s *session) checkIDs() []string {
	ids := slices.Clone(s.NodeChecks)
	for _, sc := range s.ServiceChecks {
		ids = append(ids, sc.ID)
	}
	return ids
}

// serfCheckID is the node's own check, a session's default.
const serfCheckID = "serfHealth"

// sessionCreate creates a session (behavior release; lock delay 15s, at
// most 60s; a TTL; bound to the node's serfHealth unless
// NodeChecks says otherwise, and to ServiceChecks), refused when a check
// it is bound to is critical or unknown (validateSessionChecksTxn).
func (c *Consul) sessionCreate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		consulapi.SessionEntry
		LockDelay string
	}
	err := readJSON(r, &req)
	s := &session{SessionEntry: req.SessionEntry}
	s.ID, s.Node = newUUID(), consulNodeName
	lockDelay, err1 := time.ParseDuration(cmp.Or(req.LockDelay, "15s"))
	ttl, err2 := time.ParseDuration(cmp.Or(s.TTL, "0s"))
	if err = errors.Join(err, err1, err2); err != nil {
		badRequest(w, err)
		return
	}
	s.LockDelay, s.ttl = min(lockDelay, 60*time.Second), ttl
	if s.Behavior = cmp.Or(s.Behavior, consulapi.SessionBehaviorRelease); s.Behavior != consulapi.SessionBehaviorRelease {
		writeText(w, writeHeaders, http.StatusBadRequest, "fake cluster: only sessions with behavior release are supported")
		return
	}
	if s.NodeChecks == nil {
		s.NodeChecks = []string{serfCheckID}
	}
	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	for _, id := range s.checkIDs() {
		chk, ok := c.checks[id]
		switch {
		case id == serfCheckID: // the one node is always alive
		case !ok:
			writeText(w, writeHeaders, http.StatusInternalServerError, fmt.Sprintf("apply failed: Missing check '%s' registration", id))
			return
		case chk.Status == consulapi.HealthCritical:
			writeText(w, writeHeaders, http.StatusInternalServerError, fmt.Sprintf("apply failed: Check '%s' is in critical state", id))
			return
		}
	}
	s.CreateIndex = c.nextIndex()
	s.ModifyIndex = s.CreateIndex
	c.sessions[s.ID] = s
	if s.ttl > 0 { // Consul invalidates a session not renewed for twice its TTL
		s.timer = time.AfterFunc(2*s.ttl, func() {
			c.mu.Lock()
			if c.sessions[s.ID] == s {
				c.destroySessionLocked(s.ID)
			}
			c.mu.Unlock()
			c.changed.Notify()
		})
	}
	writeJSON(w, writeHeaders, map[string]string{"ID": s.ID})
}

func (s *session) wire() map[string]any {
	return map[string]any{"ID": s.ID, "Name": s.Name, "Node": s.Node, "LockDelay": s.LockDelay, "Behavior": s.Behavior,
		"TTL": s.TTL, "Checks": []string{}, "NodeChecks": s.NodeChecks, "ServiceChecks": s.ServiceChecks,
		"CreateIndex": s.CreateIndex, "ModifyIndex": s.ModifyIndex}
}

// invalidateSessionsOfLocked ends every session bound to a check that
// turned critical or went away, in the write that changes the check.
func (c *Consul) invalidateSessionsOfLocked(checkID string) {
	for id, s := range c.sessions {
		if slices.Contains(s.checkIDs(), checkID) {
			c.destroySessionLocked(id)
		}
	}
}

// destroySessionLocked ends a session: the keys it holds are released and
// enter its lock delay.
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
		if e.Session == id {
			e.Session, e.ModifyIndex, c.kvIndex = "", idx, idx
			c.lockDelay[k] = time.Now().Add(s.LockDelay)
		}
	}
}

func (c *Consul) sessionRenew(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	s, ok := c.sessions[r.PathValue("id")]
	var out []map[string]any
	if ok {
		if s.timer != nil {
			s.timer.Reset(2 * s.ttl)
		}
		out = append(out, s.wire())
	}
	c.mu.Unlock()
	if !ok {
		writeText(w, writeHeaders, http.StatusNotFound, fmt.Sprintf("Session id '%s' not found", r.PathValue("id")))
		return
	}
	writeJSON(w, writeHeaders, out)
}

func (c *Consul) sessionDestroy(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	c.destroySessionLocked(r.PathValue("id"))
	c.mu.Unlock()
	c.changed.Notify()
	writeJSON(w, writeHeaders, true)
}

// sessionList answers every live session, oldest first.
func (c *Consul) sessionList(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	out := []map[string]any{}
	for _, s := range c.sessions {
		out = append(out, s.wire())
	}
	c.mu.Unlock()
	slices.SortFunc(out, func(a, b map[string]any) int {
		return cmp.Compare(a["CreateIndex"].(uint64), b["CreateIndex"].(uint64))
	})
	writeJSON(w, writeHeaders, out)
}

// KV returns a key's value and whether it exists.
func (c *Consul) KV(key string) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if e, ok := c.kv[key]; ok {
		return slices.Clone(e.Value), true
	}
	return nil, false
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
	for _, k := range slices.Sorted(maps.Keys(c.kv)) {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	return out
}
