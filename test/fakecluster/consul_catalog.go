package fakecluster

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	"github.com/hashicorp/go-bexpr"
)

// consulCheck is a registered check: what Consul answers for it and how it
// runs (an HTTP check, or an alias of another service's health; a TTL check
// keeps its status).
type consulCheck struct {
	consulapi.HealthCheck
	interval, timeout time.Duration
	http, method      string
	header            map[string][]string
	alias             string
	cancel            context.CancelFunc
}

func (chk *consulCheck) stop() {
	if chk.cancel != nil {
		chk.cancel()
	}
}

// checkWire is a check as the health endpoints write it.
type checkWire struct {
	consulapi.HealthCheck
	Interval, Timeout string
}

func (chk *consulCheck) wire() checkWire {
	dur := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	}
	return checkWire{HealthCheck: chk.HealthCheck, Interval: dur(chk.interval), Timeout: dur(chk.timeout)}
}

// serfCheck is the node's own check, always passing.
var serfCheck = checkWire{HealthCheck: consulapi.HealthCheck{Node: consulNodeName, CheckID: serfCheckID, Name: "Serf Health Status",
	Status: consulapi.HealthPassing, Output: "Agent alive and reachable", ServiceTags: []string{}, CreateIndex: 11, ModifyIndex: 11}}

// ServiceInstance is one registered service instance with its health, as
// tests inspect it.
type ServiceInstance struct {
	// Node is the node that holds it: the agent's, or an agentless one
	// registered through the catalog API.
	Node    string
	ID      string
	Name    string
	Tags    []string
	Address string
	Port    int
	Meta    map[string]string
	// Status is the worst of its checks' (passing when it has none).
	Status string
}

// Services lists the registered instances of a service name ("" for all),
// sorted by ID.
func (c *Consul) Services(name string) []ServiceInstance {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []ServiceInstance
	for _, s := range c.servicesLocked(name, nil) {
		out = append(out, ServiceInstance{Node: consulNodeName, ID: s.ID, Name: s.Service, Tags: slices.Clone(s.Tags), Address: s.Address,
			Port: s.Port, Meta: maps.Clone(s.Meta), Status: c.aggregateLocked(s.ID, "")})
	}
	for _, e := range c.externalLocked(name, nil) {
		s := e.service
		out = append(out, ServiceInstance{Node: e.node.Node, ID: s.ID, Name: s.Service, Tags: slices.Clone(s.Tags), Address: s.Address,
			Port: s.Port, Meta: maps.Clone(s.Meta), Status: e.status})
	}
	return out
}

// servicesLocked lists the instances of a service name ("" for all) that
// carry every tag, sorted by ID.
func (c *Consul) servicesLocked(name string, tags []string) []*consulapi.AgentService {
	return sortedServices(c.services, name, tags)
}

// checksOfLocked lists a service instance's checks (all checks when id is
// ""), sorted by ID.
func (c *Consul) checksOfLocked(id string) []checkWire {
	var out []checkWire
	for _, chk := range c.checks {
		if id == "" || chk.ServiceID == id {
			out = append(out, chk.wire())
		}
	}
	slices.SortFunc(out, func(a, b checkWire) int { return cmp.Compare(a.CheckID, b.CheckID) })
	return out
}

// aggregateLocked is the worst status of a service's checks, leaving out
// the check skip (an alias check does not mirror itself).
func (c *Consul) aggregateLocked(serviceID, skip string) string {
	status := consulapi.HealthPassing
	for _, chk := range c.checks {
		if chk.ServiceID == serviceID && chk.CheckID != skip {
			switch chk.Status {
			case consulapi.HealthCritical:
				return consulapi.HealthCritical
			case consulapi.HealthWarning:
				status = consulapi.HealthWarning
			}
		}
	}
	return status
}

func (c *Consul) serviceRegister(w http.ResponseWriter, r *http.Request) {
	var reg consulapi.AgentServiceRegistration
	if err := readJSON(r, &reg); err != nil {
		badRequest(w, err)
		return
	}
	if err := c.Register(&reg, r.URL.Query().Get("replace-existing-checks") == "true"); err != nil {
		writeText(w, writeHeaders, http.StatusBadRequest, err.Error())
		return
	}
	setHeaders(w, writeHeaders)
}

// Register adds or replaces a service instance and its checks, as
// PUT /v1/agent/service/register does; the fake Nomad registers its
// allocations' services through it. A check that exists keeps its status;
// a new one starts as its Status says, else critical. With replaceChecks
// the service's checks not in reg are removed.
func (c *Consul) Register(reg *consulapi.AgentServiceRegistration, replaceChecks bool) error {
	if reg == nil || reg.Name == "" {
		return fmt.Errorf("Missing service name")
	}
	id := cmp.Or(reg.ID, reg.Name)
	defs := reg.Checks
	if reg.Check != nil {
		defs = append(consulapi.AgentServiceChecks{reg.Check}, defs...)
	}
	var checks []*consulCheck
	for i, d := range defs {
		chk, err := checkFromDefinition(id, reg, d, i, len(defs))
		if err != nil {
			return err
		}
		checks = append(checks, chk)
	}

	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	idx := c.nextIndex()
	s := c.services[id]
	if s == nil {
		s = &consulapi.AgentService{ID: id, CreateIndex: idx}
		c.services[id] = s
	}
	addr := cmp.Or(reg.Address, "127.0.0.1")
	tagged := consulapi.ServiceAddress{Address: addr, Port: reg.Port}
	s.Service, s.Tags, s.Address, s.Port, s.Meta = reg.Name, slices.Clone(reg.Tags), reg.Address, reg.Port, maps.Clone(reg.Meta)
	s.TaggedAddresses = map[string]consulapi.ServiceAddress{"lan_ipv4": tagged, "wan_ipv4": tagged}
	s.Weights, s.Datacenter, s.ModifyIndex = consulapi.AgentWeights{Passing: 1, Warning: 1}, consulDC, idx
	keep := map[string]bool{}
	for _, chk := range checks {
		keep[chk.CheckID] = true
		chk.CreateIndex, chk.ModifyIndex = idx, idx
		if old, ok := c.checks[chk.CheckID]; ok {
			old.stop()
			chk.Status, chk.Output, chk.CreateIndex = old.Status, old.Output, old.CreateIndex
		}
		c.checks[chk.CheckID] = chk
		c.startCheckLocked(chk)
	}
	for cid, chk := range c.checks {
		if replaceChecks && chk.ServiceID == id && !keep[cid] {
			c.removeCheckLocked(cid)
		}
	}
	c.nameIndex[reg.Name], c.serviceIndex = idx, idx
	c.refreshAliasesLocked()
	return nil
}

// checkFromDefinition validates one check as the agent does and gives it
// the agent's default ID and name.
func checkFromDefinition(serviceID string, reg *consulapi.AgentServiceRegistration, d *consulapi.AgentServiceCheck, i, n int) (*consulCheck, error) {
	chk := &consulCheck{HealthCheck: consulapi.HealthCheck{Node: consulNodeName, CheckID: d.CheckID, Name: d.Name,
		Status: cmp.Or(d.Status, consulapi.HealthCritical), Notes: d.Notes, ServiceID: serviceID, ServiceName: reg.Name,
		ServiceTags: append([]string{}, reg.Tags...)}, http: d.HTTP, method: d.Method, header: d.Header, alias: d.AliasService}
	if chk.CheckID == "" {
		chk.CheckID = "service:" + serviceID
		if n > 1 {
			chk.CheckID = fmt.Sprintf("service:%s:%d", serviceID, i+1)
		}
	}
	chk.Name = cmp.Or(chk.Name, fmt.Sprintf("Service '%s' check", reg.Name))
	if !slices.Contains([]string{consulapi.HealthPassing, consulapi.HealthWarning, consulapi.HealthCritical}, chk.Status) {
		return nil, fmt.Errorf("Invalid check status: %q", d.Status)
	}
	interval, err1 := time.ParseDuration(cmp.Or(d.Interval, "0s"))
	timeout, err2 := time.ParseDuration(cmp.Or(d.Timeout, "0s"))
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("Invalid check duration: %v", err)
	}
	chk.interval, chk.timeout = interval, cmp.Or(timeout, 10*time.Second)
	switch {
	case d.HTTP != "":
		chk.Type = "http"
		if chk.interval <= 0 {
			return nil, fmt.Errorf("Interval must be > 0 for Script, HTTP, H2PING, or TCP checks")
		}
	case d.TTL != "":
		chk.Type = "ttl"
	case d.AliasService != "":
		chk.Type = "alias"
	default:
		return nil, fmt.Errorf("fake cluster: only HTTP, TTL and alias checks are supported")
	}
	return chk, nil
}

// refreshAliasesLocked sets every alias check to the health of the service
// it mirrors, as Consul's agent does on each change of it: the worst of its
// checks, critical when no such service is registered.
func (c *Consul) refreshAliasesLocked() {
	for _, chk := range c.checks {
		if chk.alias == "" {
			continue
		}
		status, output := consulapi.HealthCritical, fmt.Sprintf("Service %s could not be found on node %s", chk.alias, consulNodeName)
		if _, ok := c.services[chk.alias]; ok {
			status, output = c.aggregateLocked(chk.alias, chk.CheckID), "All checks passing."
			if status != consulapi.HealthPassing {
				output = "Aliased service is not passing"
			}
		}
		c.setStatusLocked(chk, status, output)
	}
}

// setStatusLocked records a check's result. A change of status is a write
// (new index, blocking queries wake, sessions bound to a check turning
// critical end); a new output alone is not, as Consul syncs it lazily.
func (c *Consul) setStatusLocked(chk *consulCheck, status, output string) bool {
	chk.Output = output
	if chk.Status == status {
		return false
	}
	idx := c.nextIndex()
	chk.Status, chk.ModifyIndex, c.nameIndex[chk.ServiceName], c.serviceIndex = status, idx, idx, idx
	if status == consulapi.HealthCritical {
		c.invalidateSessionsOfLocked(chk.CheckID)
	}
	return true
}

// agentServices is GET /v1/agent/services: every instance this (the one)
// agent holds, by ID. A filter is refused rather than ignored.
func (c *Consul) agentServices(w http.ResponseWriter, r *http.Request) {
	if r.URL.Query().Has("filter") {
		writeText(w, writeHeaders, http.StatusBadRequest, "fake cluster: agent services filter not supported")
		return
	}
	c.mu.Lock()
	out := map[string]*consulapi.AgentService{}
	for id, s := range c.services {
		out[id] = agentService(s)
	}
	c.mu.Unlock()
	writeJSON(w, writeHeaders, out)
}

// agentService answers GET /v1/agent/service/{id}, with a hash of the
// registration (fixture 061); an unknown ID is a 404 in the agent's words.
func (c *Consul) agentService(w http.ResponseWriter, r *http.Request) {
	c.mu.Lock()
	s, ok := c.services[r.PathValue("id")]
	var out *consulapi.AgentService
	if ok {
		out = agentService(s)
		out.ContentHash = strconv.FormatUint(s.ModifyIndex, 16)
	}
	c.mu.Unlock()
	if !ok {
		writeText(w, writeHeaders, http.StatusNotFound, "unknown service ID: "+r.PathValue("id"))
		return
	}
	writeJSON(w, writeHeaders, out)
}

// agentService is s as the agent's endpoints list it: tags and meta never
// null, no Raft indexes (fixture 061).
func agentService(s *consulapi.AgentService) *consulapi.AgentService {
	out := *s
	out.Tags, out.Meta, out.CreateIndex, out.ModifyIndex = append([]string{}, s.Tags...), maps.Clone(s.Meta), 0, 0
	if out.Meta == nil {
		out.Meta = map[string]string{}
	}
	return &out
}

func (c *Consul) serviceDeregister(w http.ResponseWriter, r *http.Request) {
	if !c.Deregister(r.PathValue("id")) {
		writeText(w, writeHeaders, http.StatusNotFound, fmt.Sprintf("Unknown service ID %q. Ensure that the service ID is passed, not the service name.", r.PathValue("id")))
		return
	}
	setHeaders(w, writeHeaders)
}

// Deregister removes a service instance and its checks; false when there
// was none.
func (c *Consul) Deregister(id string) bool {
	c.mu.Lock()
	defer c.changed.Notify()
	defer c.mu.Unlock()
	s, ok := c.services[id]
	if !ok {
		return false
	}
	delete(c.services, id)
	for cid, chk := range c.checks {
		if chk.ServiceID == id {
			c.removeCheckLocked(cid)
		}
	}
	idx := c.nextIndex()
	c.nameIndex[s.Service], c.serviceIndex = idx, idx
	c.refreshAliasesLocked()
	return true
}

// removeCheckLocked removes a check, ending the sessions bound to it.
func (c *Consul) removeCheckLocked(id string) {
	c.checks[id].stop()
	delete(c.checks, id)
	c.invalidateSessionsOfLocked(id)
}

// startCheckLocked runs an HTTP check at its interval (or the cluster's
// CheckInterval), first after a random stagger within it as Consul does.
func (c *Consul) startCheckLocked(chk *consulCheck) {
	if chk.Type != "http" || c.closed {
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	chk.cancel = cancel
	interval := cmp.Or(c.opts.CheckInterval, chk.interval)
	timeout := min(chk.timeout, max(interval, 500*time.Millisecond))
	c.wg.Go(func() {
		defer cancel()
		t := time.NewTimer(rand.N(interval) + time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			status, output := runHTTPCheck(ctx, chk.http, chk.method, chk.header, timeout)
			c.mu.Lock()
			changed := ctx.Err() == nil && c.checks[chk.CheckID] == chk && c.setStatusLocked(chk, status, output)
			if changed {
				c.refreshAliasesLocked()
			}
			c.mu.Unlock()
			if changed {
				c.changed.Notify()
			}
			t.Reset(interval)
		}
	})
}

// checkClient runs HTTP checks without keep-alive, as Consul's does.
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
	req.Header = http.Header(header).Clone()
	if req.Header == nil {
		req.Header = http.Header{}
	}
	req.Header.Set("User-Agent", cmp.Or(req.Header.Get("User-Agent"), "Consul Health Check"))
	req.Header.Set("Accept", cmp.Or(req.Header.Get("Accept"), "text/plain, text/*, */*"))
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

// ---- health and catalog ----

// theNode is the agent's one node.
var theNode = consulapi.Node{ID: consulNodeID, Node: consulNodeName, Address: "127.0.0.1", Datacenter: consulDC,
	TaggedAddresses: map[string]string{"lan": "127.0.0.1", "lan_ipv4": "127.0.0.1", "wan": "127.0.0.1", "wan_ipv4": "127.0.0.1"},
	Meta:            map[string]string{"consul-network-segment": "", "consul-version": consulVersion}, CreateIndex: 11, ModifyIndex: 11}

// healthEntry is one instance as /v1/health/service writes it.
type healthEntry struct {
	Node    consulapi.Node
	Service struct {
		*consulapi.AgentService
		Proxy, Connect map[string]any
		PeerName       string
	}
	Checks []checkWire
}

// indexOfLocked is the blocking index of one service name's instances.
func (c *Consul) indexOfLocked(name string) uint64 {
	return cmp.Or(c.nameIndex[name], c.serviceIndex)
}

// healthService is /v1/health/service/{name}: its instances with their
// checks and the node's; with tag, only those with the tag; with passing,
// only those whose checks pass.
func (c *Consul) healthService(w http.ResponseWriter, r *http.Request) {
	name, q := r.PathValue("name"), r.URL.Query()
	passingOnly := q.Has("passing") && q.Get("passing") != "false" && q.Get("passing") != "0"
	entries, idx := block(r, &c.changed, c.quit, func() ([]healthEntry, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []healthEntry{}
		for _, s := range c.servicesLocked(name, q["tag"]) {
			if passingOnly && c.aggregateLocked(s.ID, "") != consulapi.HealthPassing {
				continue
			}
			e := healthEntry{Node: theNode, Checks: append([]checkWire{serfCheck}, c.checksOfLocked(s.ID)...)}
			cp := *s
			cp.Tags = append([]string{}, s.Tags...)
			e.Service.AgentService, e.Service.Connect = &cp, map[string]any{}
			e.Service.Proxy = map[string]any{"Mode": "", "MeshGateway": map[string]any{}, "Expose": map[string]any{}}
			out = append(out, e)
		}
		for _, x := range c.externalLocked(name, q["tag"]) {
			if passingOnly && x.status != consulapi.HealthPassing {
				continue
			}
			e := healthEntry{Node: x.node, Checks: append([]checkWire{}, x.checks...)}
			cp := *x.service
			cp.Tags = append([]string{}, x.service.Tags...)
			e.Service.AgentService, e.Service.Connect = &cp, map[string]any{}
			e.Service.Proxy = map[string]any{"Mode": "", "MeshGateway": map[string]any{}, "Expose": map[string]any{}}
			out = append(out, e)
		}
		return out, c.indexOfLocked(name)
	})
	writeJSON(w, readHeaders(idx), entries)
}

// healthState is /v1/health/state/{state}: every check in that state (any:
// all), the node's included, filtered by go-bexpr as Consul does.
func (c *Consul) healthState(w http.ResponseWriter, r *http.Request) {
	state := r.PathValue("state")
	if !slices.Contains([]string{"any", consulapi.HealthPassing, consulapi.HealthWarning, consulapi.HealthCritical}, state) {
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
		out := []checkWire{}
		for _, chk := range append(append([]checkWire{serfCheck}, c.checksOfLocked("")...), c.externalChecksLocked()...) {
			ok := state == "any" || chk.Status == state
			if ok && eval != nil {
				if ok, ferr = eval.Evaluate(chk.HealthCheck); ferr != nil {
					return nil, c.serviceIndex
				}
			}
			if ok {
				out = append(out, chk)
			}
		}
		return out, c.serviceIndex
	})
	if ferr != nil {
		writeText(w, readHeaders(idx), http.StatusInternalServerError, ferr.Error())
		return
	}
	writeJSON(w, readHeaders(idx), checks)
}

// healthChecks is /v1/health/checks/{service}: the checks of its
// instances.
func (c *Consul) healthChecks(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("service")
	out, idx := block(r, &c.changed, c.quit, func() ([]checkWire, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []checkWire{}
		for _, s := range c.servicesLocked(name, nil) {
			out = append(out, c.checksOfLocked(s.ID)...)
		}
		for _, x := range c.externalLocked(name, nil) {
			out = append(out, x.checks...)
		}
		return out, c.indexOfLocked(name)
	})
	writeJSON(w, readHeaders(idx), out)
}

// catalogService is /v1/catalog/service/{name}: every instance with the
// given tags, whatever its health.
func (c *Consul) catalogService(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("name")
	out, idx := block(r, &c.changed, c.quit, func() ([]consulapi.CatalogService, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []consulapi.CatalogService{}
		for _, s := range c.servicesLocked(name, r.URL.Query()["tag"]) {
			out = append(out, consulapi.CatalogService{ID: theNode.ID, Node: theNode.Node, Address: theNode.Address,
				Datacenter: theNode.Datacenter, TaggedAddresses: theNode.TaggedAddresses, NodeMeta: theNode.Meta,
				ServiceID: s.ID, ServiceName: s.Service, ServiceAddress: s.Address, ServiceTaggedAddresses: s.TaggedAddresses,
				ServiceTags: append([]string{}, s.Tags...), ServiceMeta: s.Meta, ServicePort: s.Port,
				ServiceWeights: consulapi.Weights{Passing: 1, Warning: 1}, ServiceProxy: &consulapi.AgentServiceConnectProxyConfig{},
				CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex})
		}
		for _, x := range c.externalLocked(name, r.URL.Query()["tag"]) {
			s := x.service
			out = append(out, consulapi.CatalogService{Node: x.node.Node, Address: x.node.Address,
				Datacenter: x.node.Datacenter, TaggedAddresses: x.node.TaggedAddresses, NodeMeta: x.node.Meta,
				ServiceID: s.ID, ServiceName: s.Service, ServiceAddress: s.Address, ServiceTaggedAddresses: s.TaggedAddresses,
				ServiceTags: append([]string{}, s.Tags...), ServiceMeta: s.Meta, ServicePort: s.Port,
				ServiceWeights: consulapi.Weights{Passing: 1, Warning: 1}, ServiceProxy: &consulapi.AgentServiceConnectProxyConfig{},
				CreateIndex: s.CreateIndex, ModifyIndex: s.ModifyIndex})
		}
		return out, c.indexOfLocked(name)
	})
	writeJSON(w, readHeaders(idx), out)
}
