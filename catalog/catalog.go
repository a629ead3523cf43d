// Package catalog is the control plane's in-memory picture of the cluster:
// revisions and their allocations (fed from Nomad), ready instances (fed from
// Consul health), and services with their routes and domains (fed from Consul
// config entries and KV). It does no I/O of its own: adapters in cmd (or a
// test's local cluster) feed it, and the gateway, activator and autoscaler
// read it. Nothing in it is authoritative; a restarted control plane rebuilds
// it from Nomad and Consul.
package catalog

import (
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Revision is what the control plane needs to know of one revision job.
type Revision struct {
	Name       string `json:"name"`
	Service    string `json:"service"`
	Namespace  string `json:"namespace"`
	Generation int    `json:"generation"`
	// Concurrency is the per-instance hard limit (0 = none); Timeout bounds
	// a request. Both come from the job and never change.
	Concurrency int           `json:"concurrency"`
	Timeout     time.Duration `json:"timeout"`
	// Scaling is the service's scaling as applied to this revision.
	Scaling spec.Scaling `json:"scaling"`
	// Desired is the job's group count in Nomad.
	Desired int `json:"desired"`
}

// Allocation is one Nomad allocation of a revision, with the sidecar's ports
// on the node. Running is true from the moment Nomad reports its tasks
// running until it is told to stop; the activator probes it from then on
// without waiting for Consul.
type Allocation struct {
	ID        string `json:"id"`
	Revision  string `json:"revision"`
	Address   string `json:"address"`
	Port      int    `json:"port"`
	AdminPort int    `json:"admin_port"`
	Running   bool   `json:"running"`
	// Starting: placed and meant to run, its client has not reported it
	// running yet. Its ports are known, so the gateway probes its sidecar
	// at once rather than after Nomad's client reports (in batches, 200 ms
	// to a second later).
	Starting bool `json:"starting,omitempty"`
}

// Service is a service's route and extra domains.
type Service struct {
	Name      string            `json:"name"`
	Namespace string            `json:"namespace"`
	Domains   []string          `json:"domains,omitempty"`
	Route     consulroute.Route `json:"route"`
	// HTTPSRedirect sends the service's plain HTTP requests to HTTPS
	// (spec.HTTPS).
	HTTPSRedirect bool `json:"https_redirect,omitempty"`
	// Internal serves the service on the gateway's internal listener
	// only (spec.VisibilityInternal).
	Internal bool `json:"internal,omitempty"`
	// Rollout is the service's latest rollout as its record says; the
	// leader's rollout driver starts one it sees pending.
	Rollout *consulroute.RolloutRoute `json:"rollout,omitempty"`
}

// Catalog is safe for concurrent use. Readers get copies; Changed lets a
// reader rebuild its own view (for example the gateway's routing table) only
// when something changed, so request paths never take the catalog's lock.
type Catalog struct {
	mu        sync.Mutex
	revisions map[string]Revision
	// allocs holds the allocations by revision, then by ID, so the
	// gateway's rebuild (Allocations for every revision) and DeleteRevision
	// touch one revision's allocations, not all of them; allocRev finds an
	// allocation's revision by ID.
	allocs   map[string]map[string]Allocation
	allocRev map[string]string
	ready    map[string][]consulroute.Instance // by revision
	services map[string]Service                // by service name
	changed  chan struct{}
	// revList caches Revisions' sorted result until the next change: the
	// autoscaler reads it every tick over thousands of revisions.
	revList []Revision
}

// New returns an empty catalog.
func New() *Catalog {
	return &Catalog{
		revisions: map[string]Revision{},
		allocs:    map[string]map[string]Allocation{},
		allocRev:  map[string]string{},
		ready:     map[string][]consulroute.Instance{},
		services:  map[string]Service{},
		changed:   make(chan struct{}),
	}
}

// Changed returns a channel that is closed at the next change.
func (c *Catalog) Changed() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.changed
}

// notify must be called with mu held.
func (c *Catalog) notify() {
	c.revList = nil
	close(c.changed)
	c.changed = make(chan struct{})
}

// SetRevision adds or replaces a revision. Setting one as it is changes
// nothing and wakes no one: Nomad sends a job's events again (an
// evaluation, a listing after the stream ended), and every waiter on
// Changed does work in proportion to the whole catalog.
func (c *Catalog) SetRevision(r Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.revisions[r.Name]; ok && reflect.DeepEqual(old, r) {
		return
	}
	c.revisions[r.Name] = r
	c.notify()
}

// DeleteRevision forgets a revision, its allocations and its instances.
func (c *Catalog) DeleteRevision(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.revisions, name)
	delete(c.ready, name)
	for id := range c.allocs[name] {
		delete(c.allocRev, id)
	}
	delete(c.allocs, name)
	c.notify()
}

// SetAllocation adds or replaces an allocation.
func (c *Catalog) SetAllocation(a Allocation) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if rev, ok := c.allocRev[a.ID]; ok {
		if c.allocs[rev][a.ID] == a {
			return
		}
		if rev != a.Revision {
			c.forgetAllocation(rev, a.ID)
		}
	}
	byID := c.allocs[a.Revision]
	if byID == nil {
		byID = map[string]Allocation{}
		c.allocs[a.Revision] = byID
	}
	byID[a.ID] = a
	c.allocRev[a.ID] = a.Revision
	c.notify()
}

// forgetAllocation must be called with mu held.
func (c *Catalog) forgetAllocation(revision, id string) {
	delete(c.allocs[revision], id)
	if len(c.allocs[revision]) == 0 {
		delete(c.allocs, revision)
	}
	delete(c.allocRev, id)
}

// DeleteAllocation forgets an allocation.
func (c *Catalog) DeleteAllocation(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rev, ok := c.allocRev[id]
	if !ok {
		return
	}
	c.forgetAllocation(rev, id)
	c.notify()
}

// SetReady replaces the passing instances of a revision (as Consul lists them,
// instances tagged activator already left out).
func (c *Catalog) SetReady(revision string, instances []consulroute.Instance) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if slices.Equal(c.ready[revision], instances) {
		return
	}
	c.ready[revision] = slices.Clone(instances)
	c.notify()
}

// SetService adds or replaces a service's route and domains; setting one
// as it is changes nothing and wakes no one (the records feed sets every
// service on each change of any: 10,000 wake-ups, each a full rebuild, for
// one deploy at 10,000 services, issue 45).
func (c *Catalog) SetService(s Service) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.services[s.Name]; ok && reflect.DeepEqual(old, s) {
		return
	}
	c.services[s.Name] = s
	c.notify()
}

// DeleteService forgets a service.
func (c *Catalog) DeleteService(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.services, name)
	c.notify()
}

// Revision returns one revision.
func (c *Catalog) Revision(name string) (Revision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.revisions[name]
	return r, ok
}

// Revisions returns every revision, sorted by name. The slice is shared by
// every caller until the next change: read it, never modify it.
func (c *Catalog) Revisions() []Revision {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.revList == nil {
		c.revList = slices.Collect(maps.Values(c.revisions))
		slices.SortFunc(c.revList, func(a, b Revision) int { return strings.Compare(a.Name, b.Name) })
	}
	return c.revList
}

// Allocations returns the allocations of a revision, sorted by ID.
func (c *Catalog) Allocations(revision string) []Allocation {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Collect(maps.Values(c.allocs[revision]))
	slices.SortFunc(out, func(a, b Allocation) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Allocation returns one allocation by ID.
func (c *Catalog) Allocation(id string) (Allocation, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rev, ok := c.allocRev[id]
	if !ok {
		return Allocation{}, false
	}
	a, ok := c.allocs[rev][id]
	return a, ok
}

// Ready returns the passing instances of a revision.
func (c *Catalog) Ready(revision string) []consulroute.Instance {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.ready[revision])
}

// Services returns every service, sorted by name.
func (c *Catalog) Services() []Service {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := slices.Collect(maps.Values(c.services))
	slices.SortFunc(out, func(a, b Service) int { return strings.Compare(a.Name, b.Name) })
	return out
}
