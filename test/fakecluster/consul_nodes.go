package fakecluster

import (
	"cmp"
	"maps"
	"net/http"
	"slices"
	"strings"

	consulapi "github.com/hashicorp/consul/api"
)

// externalNode is a node registered through the catalog API, with no
// agent (Consul's "external services"): its services and checks are as
// registered, never run and never synced. The control plane's stand-ins
// live on such nodes.
type externalNode struct {
	node     consulapi.Node
	services map[string]*consulapi.AgentService // by ID
	checks   map[string]consulapi.HealthCheck   // by check ID
}

// catalogRegister is PUT /v1/catalog/register: a node (created, or
// updated unless SkipNodeUpdate), and optionally one service and its
// checks on it. Only external nodes: registering on the agent's own node
// goes through the agent in every test.
func (c *Consul) catalogRegister(w http.ResponseWriter, r *http.Request) {
	var reg consulapi.CatalogRegistration
	if err := readJSON(r, &reg); err != nil {
		writeText(w, readHeaders(0), http.StatusBadRequest, "Request decode failed: "+err.Error())
		return
	}
	if reg.Node == "" || reg.Node == consulNodeName {
		writeText(w, readHeaders(0), http.StatusBadRequest, "Must provide node (the fake registers only agentless nodes)")
		return
	}
	c.mu.Lock()
	n, ok := c.external[reg.Node]
	if !ok {
		n = &externalNode{services: map[string]*consulapi.AgentService{}, checks: map[string]consulapi.HealthCheck{}}
		c.external[reg.Node] = n
	}
	idx := c.nextIndex()
	if !ok || !reg.SkipNodeUpdate {
		n.node = consulapi.Node{Node: reg.Node, Address: reg.Address, Datacenter: consulDC, Meta: maps.Clone(reg.NodeMeta),
			CreateIndex: cmp.Or(n.node.CreateIndex, idx), ModifyIndex: idx}
	}
	checks := slices.Clone(reg.Checks)
	if chk := reg.Check; chk != nil {
		checks = append(checks, &consulapi.HealthCheck{CheckID: chk.CheckID, Name: chk.Name, Status: chk.Status,
			Output: chk.Output, ServiceID: chk.ServiceID, ServiceName: chk.ServiceName})
	}
	if s := reg.Service; s != nil {
		cp := *s
		cp.ID = cmp.Or(cp.ID, cp.Service)
		cp.Tags, cp.Meta = slices.Clone(cp.Tags), maps.Clone(cp.Meta)
		cp.CreateIndex, cp.ModifyIndex = idx, idx
		if old, ok := n.services[cp.ID]; ok {
			cp.CreateIndex = old.CreateIndex
			c.nameIndex[old.Service] = idx
		}
		n.services[cp.ID] = &cp
		c.nameIndex[cp.Service] = idx
	}
	for _, chk := range checks {
		hc := consulapi.HealthCheck{Node: reg.Node, CheckID: chk.CheckID, Name: chk.Name, Status: cmp.Or(chk.Status, consulapi.HealthCritical),
			Output: chk.Output, ServiceID: chk.ServiceID, ServiceName: chk.ServiceName, ServiceTags: []string{}, CreateIndex: idx, ModifyIndex: idx}
		if s, ok := n.services[chk.ServiceID]; ok {
			hc.ServiceName, hc.ServiceTags = s.Service, slices.Clone(s.Tags)
		}
		n.checks[hc.CheckID] = hc
	}
	c.serviceIndex = idx
	c.mu.Unlock()
	c.changed.Notify()
	writeJSON(w, readHeaders(idx), true)
}

// catalogDeregister is PUT /v1/catalog/deregister: a service (with its
// checks), a check, or a whole node; absent ones are not an error.
func (c *Consul) catalogDeregister(w http.ResponseWriter, r *http.Request) {
	var dereg consulapi.CatalogDeregistration
	if err := readJSON(r, &dereg); err != nil || dereg.Node == "" {
		writeText(w, readHeaders(0), http.StatusBadRequest, "Must provide node")
		return
	}
	c.mu.Lock()
	idx := c.nextIndex()
	if n, ok := c.external[dereg.Node]; ok {
		gone := func(id string) {
			if s, ok := n.services[id]; ok {
				c.nameIndex[s.Service] = idx
				delete(n.services, id)
			}
			for cid, chk := range n.checks {
				if chk.ServiceID == id {
					delete(n.checks, cid)
				}
			}
		}
		switch {
		case dereg.ServiceID != "":
			gone(dereg.ServiceID)
		case dereg.CheckID != "":
			delete(n.checks, dereg.CheckID)
		default:
			for id := range n.services {
				gone(id)
			}
			delete(c.external, dereg.Node)
		}
	}
	c.serviceIndex = idx
	c.mu.Unlock()
	c.changed.Notify()
	writeJSON(w, readHeaders(idx), true)
}

// catalogNodes is GET /v1/catalog/nodes: the agent's node and every
// external one, filtered by node-meta (key:value, every one must match).
func (c *Consul) catalogNodes(w http.ResponseWriter, r *http.Request) {
	want := map[string]string{}
	for _, kv := range r.URL.Query()["node-meta"] {
		k, v, _ := strings.Cut(kv, ":")
		want[k] = v
	}
	out, idx := block(r, &c.changed, c.quit, func() ([]consulapi.Node, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out := []consulapi.Node{}
		for _, n := range append([]consulapi.Node{theNode}, c.externalNodesLocked()...) {
			match := true
			for k, v := range want {
				match = match && n.Meta[k] == v
			}
			if match {
				out = append(out, n)
			}
		}
		return out, c.serviceIndex
	})
	writeJSON(w, readHeaders(idx), out)
}

// catalogNodeServices is GET /v1/catalog/node-services/{node}: the node's
// services (Node and Services null for an unknown node, as Consul answers).
func (c *Consul) catalogNodeServices(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("node")
	out, idx := block(r, &c.changed, c.quit, func() (*consulapi.CatalogNodeServiceList, uint64) {
		c.mu.Lock()
		defer c.mu.Unlock()
		if name == consulNodeName {
			return &consulapi.CatalogNodeServiceList{Node: &theNode, Services: c.servicesLocked("", nil)}, c.serviceIndex
		}
		n, ok := c.external[name]
		if !ok {
			return &consulapi.CatalogNodeServiceList{}, c.serviceIndex
		}
		node := n.node
		return &consulapi.CatalogNodeServiceList{Node: &node, Services: sortedServices(n.services, "", nil)}, c.serviceIndex
	})
	writeJSON(w, readHeaders(idx), out)
}

// externalNodesLocked lists the external nodes, sorted by name.
func (c *Consul) externalNodesLocked() []consulapi.Node {
	var out []consulapi.Node
	for _, n := range c.external {
		out = append(out, n.node)
	}
	slices.SortFunc(out, func(a, b consulapi.Node) int { return cmp.Compare(a.Node, b.Node) })
	return out
}

// externalInstance is one service instance on an external node.
type externalInstance struct {
	node    consulapi.Node
	service *consulapi.AgentService
	checks  []checkWire
	status  string // the worst of its checks'
}

// externalLocked lists the instances of a service name ("" for all) on
// external nodes that carry every tag, by node and ID.
func (c *Consul) externalLocked(name string, tags []string) []externalInstance {
	var out []externalInstance
	for _, n := range c.externalNodesLocked() {
		ext := c.external[n.Node]
		for _, s := range sortedServices(ext.services, name, tags) {
			inst := externalInstance{node: n, service: s, status: consulapi.HealthPassing}
			for _, chk := range ext.checks {
				if chk.ServiceID != s.ID {
					continue
				}
				inst.checks = append(inst.checks, checkWire{HealthCheck: chk})
				switch {
				case chk.Status == consulapi.HealthCritical:
					inst.status = chk.Status
				case chk.Status == consulapi.HealthWarning && inst.status == consulapi.HealthPassing:
					inst.status = chk.Status
				}
			}
			slices.SortFunc(inst.checks, func(a, b checkWire) int { return cmp.Compare(a.CheckID, b.CheckID) })
			out = append(out, inst)
		}
	}
	return out
}

// externalChecksLocked lists every check on external nodes.
func (c *Consul) externalChecksLocked() []checkWire {
	var out []checkWire
	for _, n := range c.externalNodesLocked() {
		for _, chk := range c.external[n.Node].checks {
			out = append(out, checkWire{HealthCheck: chk})
		}
	}
	slices.SortFunc(out, func(a, b checkWire) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.CheckID, b.CheckID))
	})
	return out
}

// sortedServices picks, from services by ID, those of a name ("" for all)
// that carry every tag, sorted by ID.
func sortedServices(services map[string]*consulapi.AgentService, name string, tags []string) []*consulapi.AgentService {
	var out []*consulapi.AgentService
	for _, s := range services {
		if (name == "" || s.Service == name) && !slices.ContainsFunc(tags, func(t string) bool { return !slices.Contains(s.Tags, t) }) {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b *consulapi.AgentService) int { return cmp.Compare(a.ID, b.ID) })
	return out
}
