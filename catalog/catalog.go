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
	// FloorMin is the lowest count Nomad accepts for it (its scaling
	// block's min): 0, or the revision's min for one registered before
	// the autoscaler held min alone.
	FloorMin int `json:"floor_min,omitempty"`
	// Unreachable: no route can send the revision a request, and none is
	// about to. The catalog works it out from its service's record on
	// every read (see reachability); the autoscaler lets such a revision
	// go to zero whatever its min (Knative's reachability), since only
	// requests named for it by X-Serverless-Revision can reach it, and a
	// request at zero wakes it.
	Unreachable bool `json:"unreachable,omitempty"`
	// Partial is true while only what Nomad's job listing carries is
	// known of the revision (serve's first phase at start, or a revision
	// that changed while the event stream was down): name, service,
	// namespace, generation, concurrency and timeout from the job's meta.
	// Scaling is then spec.DefaultScaling() as a placeholder, Desired the
	// instances the job summary counts (running, starting, queued), and
	// its Consul tags are unknown. The read of the job replaces it within
	// seconds; until then the autoscaler does not decide the revision,
	// the stand-in keeper leaves its stand-in as it is, and a wake raises
	// it to at least one instance (never lowering a count).
	Partial bool `json:"partial,omitempty"`
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
	// Latest is the service's newest revision that was ever ready, as its
	// record says ("" before the first): a newer one is a deploy's, not
	// ready yet.
	Latest string `json:"latest,omitempty"`
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
	// version counts changes; log holds the latest (log[0] is the change
	// that made version logStart+1), so a reader can apply only what
	// changed since it last read (ChangedSince).
	version, logStart uint64
	log               []change
	partial           int // revisions with Partial set
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

// notify records a change of a revision (its job, allocations or
// instances) or of a service, and wakes the waiters. Call with mu held.
func (c *Catalog) notify(revision, service string) {
	c.revList = nil
	c.version++
	if len(c.log) >= maxChangeLog {
		// Drop the older half: a reader that far behind reads it all
		// again (ChangedSince says so).
		n := copy(c.log, c.log[len(c.log)/2:])
		c.logStart += uint64(len(c.log) - n)
		c.log = c.log[:n]
	}
	c.log = append(c.log, change{revision: revision, service: service})
	close(c.changed)
	c.changed = make(chan struct{})
}

// maxChangeLog bounds the change log. Readers (the gateway) read it at
// least every few seconds, when a bulk deploy makes tens of changes a
// second.
const maxChangeLog = 1 << 14

// change is one entry of the change log: a revision or a service.
type change struct{ revision, service string }

// Version is the number of changes so far; ChangedSince takes it.
func (c *Catalog) Version() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.version
}

// ChangedSince returns the revisions (a job, its allocations or its
// instances) and services that changed after version since, each once,
// and the version they bring the reader to. complete is false when the
// log no longer reaches back that far (more than maxChangeLog changes
// since): the reader must then read everything again. A name listed may
// be gone (deleted) or changed back; readers look it up.
func (c *Catalog) ChangedSince(since uint64) (revisions, services []string, now uint64, complete bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if since < c.logStart || since > c.version {
		return nil, nil, c.version, false
	}
	seenRev, seenSvc := map[string]bool{}, map[string]bool{}
	for _, ch := range c.log[since-c.logStart:] {
		if ch.revision != "" && !seenRev[ch.revision] {
			seenRev[ch.revision] = true
			revisions = append(revisions, ch.revision)
		}
		if ch.service != "" && !seenSvc[ch.service] {
			seenSvc[ch.service] = true
			services = append(services, ch.service)
		}
	}
	return revisions, services, c.version, true
}

// Service returns one service.
func (c *Catalog) Service(name string) (Service, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	s, ok := c.services[name]
	return s, ok
}

// SetRevision adds or replaces a revision. Setting one as it is changes
// nothing and wakes no one: Nomad sends a job's events again (an
// evaluation, a listing after the stream ended), and every waiter on
// Changed does work in proportion to the whole catalog.
func (c *Catalog) SetRevision(r Revision) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r.Unreachable = false // worked out on every read, never stored
	old, ok := c.revisions[r.Name]
	if ok && reflect.DeepEqual(old, r) {
		return
	}
	if ok && old.Partial {
		c.partial--
	}
	if r.Partial {
		c.partial++
	}
	c.revisions[r.Name] = r
	c.notify(r.Name, "")
}

// DeleteRevision forgets a revision, its allocations and its instances.
func (c *Catalog) DeleteRevision(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.revisions[name]; ok && old.Partial {
		c.partial--
	}
	delete(c.revisions, name)
	delete(c.ready, name)
	for id := range c.allocs[name] {
		delete(c.allocRev, id)
	}
	delete(c.allocs, name)
	c.notify(name, "")
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
			c.notify(rev, "")
		}
	}
	byID := c.allocs[a.Revision]
	if byID == nil {
		byID = map[string]Allocation{}
		c.allocs[a.Revision] = byID
	}
	byID[a.ID] = a
	c.allocRev[a.ID] = a.Revision
	c.notify(a.Revision, "")
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
	c.notify(rev, "")
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
	c.notify(revision, "")
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
	c.notify("", s.Name)
}

// DeleteService forgets a service.
func (c *Catalog) DeleteService(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.services, name)
	c.notify("", name)
}

// Revision returns one revision.
func (c *Catalog) Revision(name string) (Revision, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.revisions[name]
	if ok {
		r.Unreachable = !c.reachable(r, c.newestRouted(r.Service))
	}
	return r, ok
}

// PartialRevisions counts the revisions whose job is not read yet
// (Revision.Partial).
func (c *Catalog) PartialRevisions() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.partial
}

// Revisions returns every revision, sorted by name. The slice is shared by
// every caller until the next change: read it, never modify it.
func (c *Catalog) Revisions() []Revision {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.revList == nil {
		c.revList = slices.Collect(maps.Values(c.revisions))
		slices.SortFunc(c.revList, func(a, b Revision) int { return strings.Compare(a.Name, b.Name) })
		newest := make(map[string]int, len(c.services))
		for name := range c.services {
			newest[name] = c.newestRouted(name)
		}
		for i := range c.revList {
			r := &c.revList[i]
			r.Unreachable = !c.reachable(*r, newest[r.Service])
		}
	}
	return c.revList
}

// reachable is Knative's revision reachability, from the service's record:
// a revision is reachable when its route gives it a share of the traffic,
// a tag names it, or a rollout in progress moves traffic to or from it;
// and also while nothing says otherwise: its service's record is not
// loaded, or it is newer than both the latest ready revision and every
// revision the route names (a deploy waiting for it to be ready before it
// takes the traffic), unless a rollout of it ended without giving it
// traffic. What is left are revisions the route no longer names and that
// no deploy waits for: the ones a deploy, a split change or a rollback by
// hand left behind, and a rolled-back canary. newest is
// newestRouted(r.Service). Call with mu held.
func (c *Catalog) reachable(r Revision, newest int) bool {
	s, ok := c.services[r.Service]
	if !ok {
		return true
	}
	if routeNames(s, r.Name) {
		return true
	}
	ro := s.Rollout
	switch {
	case ro.InProgress() && (ro.New == r.Name || ro.Previous == r.Name):
		return true
	case ro != nil && ro.New == r.Name:
		// The rollout of it ended without giving it traffic (rolled
		// back or stopped): newer than what is routed, and yet no
		// deploy waits for it.
		return false
	}
	return newest == 0 || r.Generation > newest
}

// newestRouted is the highest generation among the service's latest ready
// revision and the revisions its route names, of those the catalog knows,
// or 0. Call with mu held.
func (c *Catalog) newestRouted(service string) int {
	s, ok := c.services[service]
	if !ok {
		return 0
	}
	newest := 0
	note := func(name string) {
		if r, ok := c.revisions[name]; ok && r.Service == service {
			newest = max(newest, r.Generation)
		}
	}
	for _, sp := range s.Route.Splits {
		note(sp.Revision)
	}
	for _, rev := range s.Route.Tags {
		note(rev)
	}
	if s.Latest != "" {
		note(s.Latest)
	}
	return newest
}

// routeNames reports whether the service's route sends the revision
// traffic or names it by a tag.
func routeNames(s Service, revision string) bool {
	for _, sp := range s.Route.Splits {
		if sp.Revision == revision && sp.Percent > 0 {
			return true
		}
	}
	for _, rev := range s.Route.Tags {
		if rev == revision {
			return true
		}
	}
	return false
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
