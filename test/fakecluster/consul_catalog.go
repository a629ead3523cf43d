package fakecluster

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-bexpr"
)

type consulService struct {
	ID          string
	Name        string
	Tags        []string
	Address     string
	Port        int
	Meta        map[string]string
	CreateIndex uint64
	ModifyIndex uint64
}

type consulCheck struct {
	CheckID     string
	Name        string
	Status      string
	Output      string
	Notes       string
	ServiceID   string
	ServiceName string
	Type        string // http, tcp, ttl, or what else was declared
	Interval    time.Duration
	Timeout     time.Duration
	CreateIndex uint64
	ModifyIndex uint64

	http            string
	method          string
	header          map[string][]string
	tcp             string
	alias           string // AliasService: the service whose health it mirrors
	deregisterAfter time.Duration
	criticalSince   time.Time
	cancel          context.CancelFunc
}

func (chk *consulCheck) stop() {
	if chk.cancel != nil {
		chk.cancel()
	}
}

// ServiceInstance is one registered service instance with its health, as
// tests inspect it.
type ServiceInstance struct {
	ID      string
	Name    string
	Tags    []string
	Address string
	Port    int
	Meta    map[string]string
	// Status is the aggregate of the instance's checks: passing, warning
	// or critical (passing when it has none).
	Status string
}

// Services lists the registered instances of a service name ("" for all),
// sorted by ID.
func (c *Consul) Services(name string) []ServiceInstance {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ServiceInstance
	for _, s := range c.services {
		if name != "" && s.Name != name {
			continue
		}
		out = append(out, ServiceInstance{ID: s.ID, Name: s.Name, Tags: slices.Clone(s.Tags), Address: s.Address,
			Port: s.Port, Meta: maps.Clone(s.Meta), Status: c.aggregateLocked(s.ID)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (c *Consul) aggregateLocked(serviceID string) string {
	return c.aggregateOfLocked(serviceID, "")
}

// aggregateOfLocked is the worst status of a service's checks, leaving out
// the check skip (an alias check does not mirror itself).
func (c *Consul) aggregateOfLocked(serviceID, skip string) string {
	status := consulapi.HealthPassing
	for _, chk := range c.checks {
		if chk.ServiceID != serviceID || chk.CheckID == skip {
			continue
		}
		switch chk.Status {
		case consulapi.HealthCritical:
			return consulapi.HealthCritical
		case consulapi.HealthWarning:
			status = consulapi.HealthWarning
		}
	}
	return status
}

// httpError is an error with the HTTP status Consul answers it with.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, a ...any) error {
	return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf(format, a...)}
}

func (c *Consul) serviceRegister(w http.ResponseWriter, r *http.Request) {
	var reg consulapi.AgentServiceRegistration
	if !decodeJSON(w, r, &reg) {
		return
	}
	replace := r.URL.Query().Get("replace-existing-checks") == "true"
	if err := c.Register(&reg, replace); err != nil {
		status := http.StatusInternalServerError
		if he, ok := err.(*httpError); ok {
			status = he.status
		}
		writeText(w, writeHeaders, status, err.Error())
		return
	}
	for k, v := range writeHeaders {
		w.Header().Set(k, v)
	}
	w.WriteHeader(http.StatusOK)
}

// Register adds or replaces a service instance and its checks, as
// PUT /v1/agent/service/register does. The fake Nomad registers its
// allocations' services through it. A check that already exists keeps its
// status (Consul does not reset a check that is re-registered unchanged);
// a new one starts as its Status says, else critical. With replaceChecks,
// the service's checks not in reg are removed.
func (c *Consul) Register(reg *consulapi.AgentServiceRegistration, replaceChecks bool) error {
	if reg == nil || reg.Name == "" {
		return badRequest("Missing service name")
	}
	id := cmp.Or(reg.ID, reg.Name)
	var defs consulapi.AgentServiceChecks
	if reg.Check != nil {
		defs = append(defs, reg.Check)
	}
	defs = append(defs, reg.Checks...)
	var checks []*consulCheck
	for i, d := range defs {
		chk, err := c.checkFromDefinition(id, reg.Name, d, i, len(defs))
		if err != nil {
			return err
		}
		checks = append(checks, chk)
	}

	c.mu.Lock()
	idx := c.nextIndex()
	s := c.services[id]
	if s == nil {
		s = &consulService{ID: id, CreateIndex: idx}
		c.services[id] = s
	} else if s.Name != reg.Name {
		c.nameIndex[s.Name] = idx
	}
	s.Name, s.Tags, s.Address, s.Port = reg.Name, slices.Clone(reg.Tags), reg.Address, reg.Port
	s.Meta = maps.Clone(reg.Meta)
	s.ModifyIndex = idx
	keep := map[string]bool{}
	for _, chk := range checks {
		keep[chk.CheckID] = true
		chk.ServiceName = reg.Name
		chk.CreateIndex, chk.ModifyIndex = idx, idx
		if old, ok := c.checks[chk.CheckID]; ok {
			old.stop()
			chk.Status, chk.Output, chk.CreateIndex = old.Status, old.Output, old.CreateIndex
			chk.criticalSince = old.criticalSince
		}
		if chk.Status == consulapi.HealthCritical && chk.criticalSince.IsZero() {
			chk.criticalSince = time.Now()
		}
		c.checks[chk.CheckID] = chk
		c.startCheckLocked(chk)
	}
	if replaceChecks {
		for cid, chk := range c.checks {
			if chk.ServiceID == id && !keep[cid] {
				chk.stop()
				delete(c.checks, cid)
				c.invalidateSessionsOfLocked(cid)
			}
		}
	}
	c.nameIndex[reg.Name] = idx
	c.serviceIndex = idx
	c.refreshAliasesLocked()
	c.mu.Unlock()
	c.changed.Notify()
	return nil
}

// refreshAliasesLocked sets every alias check to the health of the service
// it mirrors, as Consul's agent does on each change of that service: the
// worst status of its checks (passing when it has none), critical when no
// such service is registered. A change is a write, like a check result.
func (c *Consul) refreshAliasesLocked() {
	for _, chk := range c.checks {
		if chk.alias == "" {
			continue
		}
		status, output := consulapi.HealthCritical, fmt.Sprintf("Service %s could not be found on node %s", chk.alias, consulNodeName)
		if _, ok := c.services[chk.alias]; ok {
			status, output = c.aggregateOfLocked(chk.alias, chk.CheckID), "All checks passing."
			if status != consulapi.HealthPassing {
				output = "Aliased service is not passing"
			}
		}
		chk.Output = output
		if chk.Status == status {
			continue
		}
		idx := c.nextIndex()
		chk.Status, chk.ModifyIndex = status, idx
		c.nameIndex[chk.ServiceName] = idx
		c.serviceIndex = idx
		if status == consulapi.HealthCritical {
			chk.criticalSince = time.Now()
		} else {
			chk.criticalSince = time.Time{}
		}
	}
}

// checkFromDefinition validates one check as the agent does and gives it
// the agent's default ID and name.
func (c *Consul) checkFromDefinition(serviceID, serviceName string, d *consulapi.AgentServiceCheck, i, n int) (*consulCheck, error) {
	chk := &consulCheck{CheckID: d.CheckID, Name: d.Name, ServiceID: serviceID, Notes: d.Notes,
		Status: consulapi.HealthCritical, http: d.HTTP, method: d.Method, header: d.Header, tcp: d.TCP}
	if chk.CheckID == "" {
		chk.CheckID = "service:" + serviceID
		if n > 1 {
			chk.CheckID = fmt.Sprintf("service:%s:%d", serviceID, i+1)
		}
	}
	if chk.Name == "" {
		chk.Name = fmt.Sprintf("Service '%s' check", serviceName)
	}
	if d.Status != "" {
		switch d.Status {
		case consulapi.HealthPassing, consulapi.HealthWarning, consulapi.HealthCritical:
			chk.Status = d.Status
		default:
			return nil, badRequest("Invalid check status: %q", d.Status)
		}
	}
	var err error
	if chk.Interval, err = parseConsulDuration(d.Interval); err != nil {
		return nil, badRequest("Invalid check interval: %v", err)
	}
	if chk.Timeout, err = parseConsulDuration(d.Timeout); err != nil {
		return nil, badRequest("Invalid check timeout: %v", err)
	}
	if chk.deregisterAfter, err = parseConsulDuration(d.DeregisterCriticalServiceAfter); err != nil {
		return nil, badRequest("Invalid DeregisterCriticalServiceAfter: %v", err)
	}
	switch {
	case d.HTTP != "":
		chk.Type = "http"
	case d.TCP != "":
		chk.Type = "tcp"
	case d.TTL != "":
		chk.Type = "ttl"
	case d.GRPC != "":
		chk.Type = "grpc"
	case len(d.Args) > 0:
		chk.Type = "script"
	case d.AliasService != "":
		chk.Type, chk.alias = "alias", d.AliasService
	default:
		return nil, badRequest("Invalid check: TTL must be > 0 for TTL checks")
	}
	if (chk.Type == "http" || chk.Type == "tcp" || chk.Type == "script" || chk.Type == "grpc") && chk.Interval <= 0 {
		return nil, badRequest("Interval must be > 0 for Script, HTTP, H2PING, or TCP checks")
	}
	if chk.Timeout <= 0 {
		chk.Timeout = 10 * time.Second
	}
	return chk, nil
}

// agentServices is GET /v1/agent/services: every instance the (one) agent
// holds, by ID. A filter is refused rather than ignored, so a caller that
// comes to rely on one is noticed here.
func (c *Consul) agentServices(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("filter") {
		writeText(w, writeHeaders, http.StatusBadRequest, "fake cluster: agent services filter not supported")
		return
	}
	c.mu.Lock()
	out := map[string]*consulapi.AgentService{}
	for _, s := range c.services {
		out[s.ID] = agentService(s)
	}
	c.mu.Unlock()
	writeJSON(w, writeHeaders, out)
}

// agentService answers GET /v1/agent/service/{id}; an unknown ID is a 404
// with the agent's own text (Consul 1.16).
func (c *Consul) agentService(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c.mu.Lock()
	s, ok := c.services[id]
	var out *consulapi.AgentService
	if ok {
		out = agentService(s)
		// The single lookup carries a hash of the registration (Consul
		// 1.16, fixture 061), for a blocking query on it; nothing of ours
		// blocks on it, so any value that changes with the registration
		// does.
		out.ContentHash = strconv.FormatUint(s.ModifyIndex, 16)
	}
	c.mu.Unlock()
	if !ok {
		writeText(w, writeHeaders, http.StatusNotFound, "unknown service ID: "+id)
		return
	}
	writeJSON(w, writeHeaders, out)
}

// agentService is s as the agent's service endpoints list it: tags and
// meta are never null (an empty list and map), and the Raft indexes are
// left to the catalog's endpoints (fixture 061).
func agentService(s *consulService) *consulapi.AgentService {
	out := &consulapi.AgentService{ID: s.ID, Service: s.Name, Tags: slices.Clone(s.Tags), Meta: maps.Clone(s.Meta),
		Port: s.Port, Address: s.Address, Weights: consulapi.AgentWeights{Passing: 1, Warning: 1},
		Datacenter: "dc1"}
	if out.Tags == nil {
		out.Tags = []string{}
	}
	if out.Meta == nil {
		out.Meta = map[string]string{}
	}
	return out
}

func (c *Consul) serviceDeregister(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if !c.Deregister(id) {
		writeText(w, writeHeaders, http.StatusNotFound, fmt.Sprintf("Unknown service ID %q. Ensure that the service ID is passed, not the service name.", id))
		return
	}
	for k, v := range writeHeaders {
		w.Header().Set(k, v)
	}
	w.WriteHeader(http.StatusOK)
}

// Deregister removes a service instance and its checks; false when there
// was none.
func (c *Consul) Deregister(id string) bool {
	c.mu.Lock()
	ok := c.deregisterLocked(id)
	if ok {
		c.refreshAliasesLocked()
	}
	c.mu.Unlock()
	if ok {
		c.changed.Notify()
	}
	return ok
}

func (c *Consul) deregisterLocked(id string) bool {
	s, ok := c.services[id]
	if !ok {
		return false
	}
	idx := c.nextIndex()
	delete(c.services, id)
	for cid, chk := range c.checks {
		if chk.ServiceID == id {
			chk.stop()
			delete(c.checks, cid)
			c.invalidateSessionsOfLocked(cid)
		}
	}
	c.nameIndex[s.Name] = idx
	c.serviceIndex = idx
	return true
}

// startCheckLocked runs an HTTP or TCP check at its interval (or the
// cluster's CheckInterval), first after a random stagger within it as
// Consul does (call with c.mu held).
func (c *Consul) startCheckLocked(chk *consulCheck) {
	if (chk.Type != "http" && chk.Type != "tcp") || c.closed {
		return
	}
	// close cancels every check in c.checks (and none starts after it), so
	// the check's own context is all the loop needs to watch.
	ctx, cancel := context.WithCancel(context.Background())
	chk.cancel = cancel
	interval := chk.Interval
	if c.opts.CheckInterval > 0 {
		interval = c.opts.CheckInterval
	}
	timeout := min(chk.Timeout, max(interval, 500*time.Millisecond))
	kind, target, method, header := chk.Type, chk.http, chk.method, chk.header
	if kind == "tcp" {
		target = chk.tcp
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer cancel()
		t := time.NewTimer(rand.N(interval) + time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			var status, output string
			if kind == "http" {
				status, output = runHTTPCheck(ctx, target, method, header, timeout)
			} else {
				status, output = runTCPCheck(ctx, target, timeout)
			}
			if ctx.Err() != nil {
				return
			}
			c.setCheckStatus(chk, status, output)
			t.Reset(interval)
		}
	}()
}

// setCheckStatus records a check's result. A change of status is a write
// (new index, blocking queries wake); a new output alone is not, as in
// Consul, which syncs output-only changes lazily.
func (c *Consul) setCheckStatus(chk *consulCheck, status, output string) {
	c.mu.Lock()
	cur, ok := c.checks[chk.CheckID]
	if !ok || cur != chk {
		c.mu.Unlock()
		return
	}
	changed := cur.Status != status
	cur.Output = output
	if changed {
		idx := c.nextIndex()
		cur.Status, cur.ModifyIndex = status, idx
		c.nameIndex[cur.ServiceName] = idx
		c.serviceIndex = idx
		if status == consulapi.HealthCritical {
			cur.criticalSince = time.Now()
			c.invalidateSessionsOfLocked(cur.CheckID)
		} else {
			cur.criticalSince = time.Time{}
		}
	}
	if status == consulapi.HealthCritical && cur.deregisterAfter > 0 && time.Since(cur.criticalSince) > cur.deregisterAfter {
		c.log.Debug("deregistering a service critical for too long", "service", cur.ServiceID, "after", cur.deregisterAfter)
		c.deregisterLocked(cur.ServiceID)
		changed = true
	}
	if changed {
		c.refreshAliasesLocked()
	}
	c.mu.Unlock()
	if changed {
		c.changed.Notify()
	}
}

// checkClient runs HTTP checks: no keep-alive, so a check opens a fresh
// connection each time as Consul's does (it disables keep-alives).
var checkClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true, Proxy: nil}}

// runHTTPCheck is Consul's HTTP check: 2xx passes, 429 warns, anything else
// or no answer is critical; the output names the request and quotes the
// body (up to 4 KiB).
func runHTTPCheck(ctx context.Context, target, method string, header map[string][]string, timeout time.Duration) (string, string) {
	method = cmp.Or(method, http.MethodGet)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, target, nil)
	if err != nil {
		return consulapi.HealthCritical, err.Error()
	}
	for k, vs := range header {
		for _, v := range vs {
			req.Header.Add(k, v)
		}
	}
	if req.Header.Get("User-Agent") == "" {
		req.Header.Set("User-Agent", "Consul Health Check")
	}
	if req.Header.Get("Accept") == "" {
		req.Header.Set("Accept", "text/plain, text/*, */*")
	}
	resp, err := checkClient.Do(req)
	if err != nil {
		return consulapi.HealthCritical, err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	out := fmt.Sprintf("HTTP %s %s: %s Output: %s", method, target, resp.Status, strings.TrimSpace(string(body)))
	switch {
	case resp.StatusCode >= 200 && resp.StatusCode <= 299:
		return consulapi.HealthPassing, out
	case resp.StatusCode == http.StatusTooManyRequests:
		return consulapi.HealthWarning, out
	}
	return consulapi.HealthCritical, out
}

func runTCPCheck(ctx context.Context, addr string, timeout time.Duration) (string, string) {
	d := net.Dialer{Timeout: timeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return consulapi.HealthCritical, err.Error()
	}
	conn.Close()
	return consulapi.HealthPassing, fmt.Sprintf("TCP connect %s: Success", addr)
}

// ---- health ----

type nodeWire struct {
	ID              string
	Node            string
	Address         string
	Datacenter      string
	TaggedAddresses map[string]string
	Meta            map[string]string
	CreateIndex     uint64
	ModifyIndex     uint64
}

func theNode() nodeWire {
	return nodeWire{
		ID: consulNodeID, Node: consulNodeName, Address: "127.0.0.1", Datacenter: consulDC,
		TaggedAddresses: map[string]string{"lan": "127.0.0.1", "lan_ipv4": "127.0.0.1", "wan": "127.0.0.1", "wan_ipv4": "127.0.0.1"},
		Meta:            map[string]string{"consul-network-segment": "", "consul-version": ConsulVersion},
		CreateIndex:     11, ModifyIndex: 11,
	}
}

type taggedAddr struct {
	Address string
	Port    int
}

type serviceWire struct {
	ID                string
	Service           string
	Tags              []string
	Address           string
	TaggedAddresses   map[string]taggedAddr
	Meta              map[string]string
	Port              int
	Weights           map[string]int
	EnableTagOverride bool
	Proxy             map[string]any
	Connect           map[string]any
	PeerName          string
	CreateIndex       uint64
	ModifyIndex       uint64
}

type checkWire struct {
	Node        string
	CheckID     string
	Name        string
	Status      string
	Notes       string
	Output      string
	ServiceID   string
	ServiceName string
	ServiceTags []string
	Type        string
	Interval    string
	Timeout     string
	ExposedPort int
	Definition  map[string]any
	CreateIndex uint64
	ModifyIndex uint64
}

type healthEntry struct {
	Node    nodeWire
	Service serviceWire
	Checks  []checkWire
}

func serfCheck() checkWire {
	return checkWire{Node: consulNodeName, CheckID: "serfHealth", Name: "Serf Health Status", Status: consulapi.HealthPassing,
		Output: "Agent alive and reachable", ServiceTags: []string{}, Definition: map[string]any{}, CreateIndex: 11, ModifyIndex: 11}
}

func durString(d time.Duration) string {
	if d == 0 {
		return ""
	}
	return d.String()
}

func (c *Consul) healthService(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	q := r.URL.Query()
	_, passingOnly := q["passing"]
	if v := q.Get("passing"); v == "false" || v == "0" {
		passingOnly = false
	}
	tags := q["tag"]
	entries, idx := block(r, &c.changed, c.quit, func() ([]healthEntry, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []healthEntry{}
		for _, s := range c.services {
			if s.Name != name {
				continue
			}
			if !containsAll(s.Tags, tags) {
				continue
			}
			e := healthEntry{Node: theNode(), Service: s.wire(), Checks: []checkWire{serfCheck()}}
			passing := true
			own := c.checksOfLocked(s)
			for _, chk := range own {
				if chk.Status != consulapi.HealthPassing {
					passing = false
				}
			}
			e.Checks = append(e.Checks, own...)
			if passingOnly && !passing {
				continue
			}
			out = append(out, e)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].Service.ID < out[j].Service.ID })
		return out, c.indexOfLocked(name)
	})
	writeJSON(w, readHeaders(idx), entries)
}

// healthState is GET /v1/health/state/<state>: every check in that state
// (any: all), the node's serfHealth included, filtered as Consul filters
// it (go-bexpr over the check's fields: the same library and selectors as
// Consul 1.16), blocking on the checks' index.
func (c *Consul) healthState(w http.ResponseWriter, r *http.Request) {
	state := r.PathValue("state")
	switch state {
	case "any", consulapi.HealthPassing, consulapi.HealthWarning, consulapi.HealthCritical:
	default:
		writeText(w, readHeaders(0), http.StatusBadRequest, "Bad state "+state)
		return
	}
	var eval *bexpr.Evaluator
	if f := r.URL.Query().Get("filter"); f != "" {
		var err error
		if eval, err = bexpr.CreateEvaluator(f); err != nil {
			writeText(w, readHeaders(0), http.StatusBadRequest, "Failed to create boolean expression evaluator: "+err.Error())
			return
		}
	}
	var ferr error
	checks, idx := block(r, &c.changed, c.quit, func() ([]checkWire, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		all := []checkWire{serfCheck()}
		for _, s := range c.services {
			all = append(all, c.checksOfLocked(s)...)
		}
		out := []checkWire{}
		for _, chk := range all {
			if state != "any" && chk.Status != state {
				continue
			}
			if eval != nil {
				ok, err := eval.Evaluate(consulapi.HealthCheck{Node: chk.Node, CheckID: chk.CheckID, Name: chk.Name,
					Status: chk.Status, Notes: chk.Notes, Output: chk.Output, ServiceID: chk.ServiceID,
					ServiceName: chk.ServiceName, ServiceTags: chk.ServiceTags, Type: chk.Type})
				if err != nil {
					ferr = err
					return nil, c.serviceIndex
				}
				if !ok {
					continue
				}
			}
			out = append(out, chk)
		}
		sort.Slice(out, func(i, j int) bool { return out[i].CheckID < out[j].CheckID })
		return out, c.serviceIndex
	})
	if ferr != nil {
		writeText(w, readHeaders(idx), http.StatusInternalServerError, ferr.Error())
		return
	}
	writeJSON(w, readHeaders(idx), checks)
}

// checksOfLocked is the checks of one service instance, by check ID.
func (c *Consul) checksOfLocked(s *consulService) []checkWire {
	var own []checkWire
	for _, chk := range c.checks {
		if chk.ServiceID != s.ID {
			continue
		}
		own = append(own, checkWire{
			Node: consulNodeName, CheckID: chk.CheckID, Name: chk.Name, Status: chk.Status, Notes: chk.Notes,
			Output: chk.Output, ServiceID: s.ID, ServiceName: s.Name, ServiceTags: nonNil(s.Tags), Type: chk.Type,
			Interval: durString(chk.Interval), Timeout: durString(chk.Timeout), Definition: map[string]any{},
			CreateIndex: chk.CreateIndex, ModifyIndex: chk.ModifyIndex,
		})
	}
	sort.Slice(own, func(i, j int) bool { return own[i].CheckID < own[j].CheckID })
	return own
}

// catalogEntry is one instance as /v1/catalog/service lists it: the node's
// fields and the service's, flattened, as Consul 1.16 writes them.
type catalogEntry struct {
	ID                       string
	Node                     string
	Address                  string
	Datacenter               string
	TaggedAddresses          map[string]string
	NodeMeta                 map[string]string
	ServiceKind              string
	ServiceID                string
	ServiceName              string
	ServiceTags              []string
	ServiceAddress           string
	ServiceTaggedAddresses   map[string]taggedAddr
	ServiceWeights           map[string]int
	ServiceMeta              map[string]string
	ServicePort              int
	ServiceEnableTagOverride bool
	ServiceProxy             map[string]any
	ServiceConnect           map[string]any
	CreateIndex              uint64
	ModifyIndex              uint64
}

// catalogService answers GET /v1/catalog/service/{name}: every registered
// instance, whatever its health (what `consul catalog services` and the
// e2e suite's leftover checks read).
func (c *Consul) catalogService(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	tags := r.URL.Query()["tag"]
	out, idx := block(r, &c.changed, c.quit, func() ([]catalogEntry, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		node := theNode()
		out := []catalogEntry{}
		for _, s := range c.services {
			if s.Name != name || !containsAll(s.Tags, tags) {
				continue
			}
			sw := s.wire()
			out = append(out, catalogEntry{
				ID: node.ID, Node: node.Node, Address: node.Address, Datacenter: node.Datacenter,
				TaggedAddresses: node.TaggedAddresses, NodeMeta: node.Meta,
				ServiceID: sw.ID, ServiceName: sw.Service, ServiceTags: sw.Tags, ServiceAddress: sw.Address,
				ServiceTaggedAddresses: sw.TaggedAddresses, ServiceWeights: sw.Weights, ServiceMeta: sw.Meta,
				ServicePort: sw.Port, ServiceProxy: sw.Proxy, ServiceConnect: sw.Connect,
				CreateIndex: sw.CreateIndex, ModifyIndex: sw.ModifyIndex,
			})
		}
		sort.Slice(out, func(i, j int) bool { return out[i].ServiceID < out[j].ServiceID })
		return out, c.indexOfLocked(name)
	})
	writeJSON(w, readHeaders(idx), out)
}

// healthChecks answers GET /v1/health/checks/{service}: the checks of every
// instance of the service.
func (c *Consul) healthChecks(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("service")
	out, idx := block(r, &c.changed, c.quit, func() ([]checkWire, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []checkWire{}
		for _, s := range c.services {
			if s.Name == name {
				out = append(out, c.checksOfLocked(s)...)
			}
		}
		sort.Slice(out, func(i, j int) bool { return out[i].CheckID < out[j].CheckID })
		return out, c.indexOfLocked(name)
	})
	writeJSON(w, readHeaders(idx), out)
}

// indexOfLocked is the blocking index of one service name's instances.
func (c *Consul) indexOfLocked(name string) uint64 {
	if idx, ok := c.nameIndex[name]; ok {
		return idx
	}
	return c.serviceIndex
}

func (s *consulService) wire() serviceWire {
	addr := cmp.Or(s.Address, "127.0.0.1")
	return serviceWire{
		ID: s.ID, Service: s.Name, Tags: nonNil(s.Tags), Address: s.Address,
		TaggedAddresses: map[string]taggedAddr{"lan_ipv4": {addr, s.Port}, "wan_ipv4": {addr, s.Port}},
		Meta:            s.Meta, Port: s.Port, Weights: map[string]int{"Passing": 1, "Warning": 1},
		Proxy:   map[string]any{"Mode": "", "MeshGateway": map[string]any{}, "Expose": map[string]any{}},
		Connect: map[string]any{}, CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex,
	}
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return slices.Clone(s)
}

func containsAll(have, want []string) bool {
	for _, w := range want {
		if !slices.Contains(have, w) {
			return false
		}
	}
	return true
}
