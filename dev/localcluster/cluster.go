// Package localcluster is a stand-in for Nomad and Consul made of real
// processes on 127.0.0.1: each instance of a revision is a test app and a
// queue-proxy sidecar (both `nomad-serverless` subcommands), started and
// stopped when the autoscaler calls Scale. It feeds a catalog.Catalog the way
// the production adapters do:
//
//   - like Nomad, an allocation appears Running as soon as both processes are
//     started, and stops being Running before its processes are signalled
//     (the shutdown delay);
//   - like Consul, an instance is listed ready only after a check on its
//     sidecar (K-Network-Probe: queue) passes, at CheckInterval, so anything
//     faster than that comes from the activator probing allocations itself.
//
// Component tests (gateway, autoscaler) and `nomad-serverless dev -demo` use
// it. Every port comes from the OS, every wait is bounded, and Close stops
// every process it started.
package localcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Options configure a Cluster.
type Options struct {
	// Binary is the nomad-serverless executable; it must have the
	// `testapp` and `sidecar` commands (tests get it from testbin.Path).
	Binary string
	// CheckInterval is the simulated Consul check interval: an instance is
	// listed ready only after a check passes, the first one CheckInterval
	// after the allocation runs. Default 1s.
	CheckInterval time.Duration
	// ShutdownDelay is, like Nomad's shutdown_delay, the time between an
	// instance leaving the ready list (its allocation no longer Running)
	// and SIGTERM to its sidecar. Default 0.
	ShutdownDelay time.Duration
	// StopTimeout bounds each process's exit after SIGTERM before SIGKILL,
	// on top of the sidecar's drain timeout. Default 5s.
	StopTimeout time.Duration
	// MaxRestarts bounds how many instances of one revision may die
	// unexpectedly and be replaced; after that the revision stays short
	// (and the failure is logged) instead of looping. Default 5.
	MaxRestarts int
	// Output receives every process's stdout and stderr, each line prefixed
	// with the instance; nil discards it.
	Output io.Writer
	Logger *slog.Logger
}

// App is how one revision's test app behaves and how its sidecar is set up.
// Zero values are the test app's defaults.
type App struct {
	// StartDelay is how long the app waits before listening.
	StartDelay time.Duration
	// ReadyDelay is how long after listening its readiness endpoint keeps
	// failing.
	ReadyDelay time.Duration
	// Sleep is how long the app takes to answer each request; CPU is how
	// much CPU it burns for each.
	Sleep time.Duration
	CPU   time.Duration
	// Name is echoed in the app's X-Testapp-Name response header.
	Name string
	// Env is extra environment for the app (any test app setting not named
	// above).
	Env map[string]string

	// Command, when set, is the app's program and arguments instead of the
	// binary's testapp: a test's own app (a gRPC server, say) that gets
	// the same environment (PORT, K_SERVICE, K_REVISION, Env). The test
	// app's settings above are still passed, and mean nothing to it.
	Command []string
	// Protocol is what the app speaks, as a task's protocol: "" (HTTP/1.1)
	// or spec.ProtocolH2C; the sidecar speaks it to the app.
	Protocol string

	// Readiness is the sidecar's readiness probe of the app; nil is an HTTP
	// probe of the test app's /ready (which honours ReadyDelay).
	Readiness *spec.Probe
	// DrainGrace and DrainTimeout configure the sidecar's drain on SIGTERM;
	// defaults 0 and 5s (short, so tests stay fast).
	DrainGrace   time.Duration
	DrainTimeout time.Duration
	// QueueDepth is the sidecar's queue; 0 uses the sidecar's default.
	QueueDepth int
	// SidecarEnv is extra environment for the sidecar.
	SidecarEnv map[string]string
}

// Cluster runs revisions as local processes. It is safe for concurrent use;
// Scale returns at once and the processes start in the background, as a
// Nomad allocation would.
type Cluster struct {
	cat  *catalog.Catalog
	opts Options
	log  *slog.Logger

	ctx    context.Context // canceled by Close
	cancel context.CancelFunc
	wg     sync.WaitGroup // every goroutine the cluster starts

	checkClient *http.Client // the simulated Consul checks
	ports       portSet
	outMu       sync.Mutex // serializes process output lines

	mu        sync.Mutex
	closed    bool
	revisions map[string]*revision
	seq       int // allocation serial numbers, for IDs
}

// revision is the cluster's state for one revision; guarded by Cluster.mu.
type revision struct {
	rev       catalog.Revision
	app       App
	desired   int
	live      []*instance // not stopping, oldest first
	all       []*instance // every instance ever started, for timings
	events    []ScaleEvent
	restarts  int
	lastReady []consulroute.Instance
}

// New returns a cluster that feeds cat.
func New(cat *catalog.Catalog, opts Options) (*Cluster, error) {
	if cat == nil {
		return nil, errors.New("localcluster: catalog is nil")
	}
	if opts.Binary == "" {
		return nil, errors.New("localcluster: Options.Binary is empty: give the path of a built nomad-serverless binary")
	}
	if st, err := os.Stat(opts.Binary); err != nil {
		return nil, fmt.Errorf("localcluster: binary %s: %w", opts.Binary, err)
	} else if st.IsDir() || st.Mode()&0o111 == 0 {
		return nil, fmt.Errorf("localcluster: binary %s is not an executable file", opts.Binary)
	}
	if opts.CheckInterval < 0 || opts.ShutdownDelay < 0 || opts.StopTimeout < 0 || opts.MaxRestarts < 0 {
		return nil, errors.New("localcluster: durations and MaxRestarts must not be negative")
	}
	if opts.CheckInterval == 0 {
		opts.CheckInterval = time.Second
	}
	if opts.StopTimeout == 0 {
		opts.StopTimeout = 5 * time.Second
	}
	if opts.MaxRestarts == 0 {
		opts.MaxRestarts = 5
	}
	if opts.Output == nil {
		opts.Output = io.Discard
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	return &Cluster{
		cat:    cat,
		opts:   opts,
		log:    log.With("component", "localcluster"),
		ctx:    ctx,
		cancel: cancel,
		// No keep-alive: a check every interval needs no pooled connection
		// that could outlive the instance.
		checkClient: &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		revisions:   map[string]*revision{},
	}, nil
}

// Catalog is the catalog the cluster feeds.
func (c *Cluster) Catalog() *catalog.Catalog { return c.cat }

// AddRevision declares a revision (at zero instances) and how its app
// behaves; it writes the revision to the catalog. Missing fields get the
// spec defaults (namespace, timeout, scaling).
func (c *Cluster) AddRevision(rev catalog.Revision, app App) error {
	if rev.Name == "" {
		return errors.New("localcluster: add revision: name is empty")
	}
	if rev.Service == "" {
		svc, gen, ok := spec.ParseRevisionName(rev.Name)
		if !ok {
			return fmt.Errorf("localcluster: add revision %s: Service is empty and the name is not <service>-<00001>", rev.Name)
		}
		rev.Service, rev.Generation = svc, gen
	}
	if rev.Namespace == "" {
		rev.Namespace = spec.DefaultNamespace
	}
	if rev.Timeout == 0 {
		rev.Timeout = spec.DefaultTimeout
	}
	if rev.Scaling == (spec.Scaling{}) {
		rev.Scaling = spec.DefaultScaling()
	}
	if rev.Concurrency < 0 {
		return fmt.Errorf("localcluster: add revision %s: concurrency %d is negative", rev.Name, rev.Concurrency)
	}
	if app.DrainTimeout == 0 {
		app.DrainTimeout = 5 * time.Second
	}
	if app.DrainGrace > app.DrainTimeout {
		return fmt.Errorf("localcluster: add revision %s: drain grace %s is longer than drain timeout %s", rev.Name, app.DrainGrace, app.DrainTimeout)
	}
	rev.Desired = 0
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return errors.New("localcluster: add revision: cluster is closed")
	}
	if _, ok := c.revisions[rev.Name]; ok {
		return fmt.Errorf("localcluster: add revision %s: already added", rev.Name)
	}
	c.revisions[rev.Name] = &revision{rev: rev, app: app}
	c.cat.SetRevision(rev)
	return nil
}

// UpdateScaling replaces a revision's scaling settings in the catalog, as a
// deploy that changes only scaling would.
func (c *Cluster) UpdateScaling(name string, s spec.Scaling) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.revisions[name]
	if !ok {
		return fmt.Errorf("localcluster: update scaling of %s: no such revision", name)
	}
	r.rev.Scaling = s
	c.cat.SetRevision(r.rev)
	return nil
}

// SetRoute publishes a service's route and domains, as consulroute would.
// Every revision it names must have been added, and splits must add to 100.
func (c *Cluster) SetRoute(s catalog.Service) error {
	if s.Name == "" {
		return errors.New("localcluster: set route: service name is empty")
	}
	if s.Namespace == "" {
		s.Namespace = spec.DefaultNamespace
	}
	if s.Route.Service == "" {
		s.Route.Service = s.Name
	}
	if s.Route.Namespace == "" {
		s.Route.Namespace = s.Namespace
	}
	total := 0
	for _, sp := range s.Route.Splits {
		if sp.Percent <= 0 {
			return fmt.Errorf("localcluster: set route of %s: split to %s has percent %d, want above 0", s.Name, sp.Revision, sp.Percent)
		}
		total += sp.Percent
	}
	if len(s.Route.Splits) > 0 && total != 100 {
		return fmt.Errorf("localcluster: set route of %s: splits add to %d, want 100", s.Name, total)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, name := range s.Route.Revisions() {
		if _, ok := c.revisions[name]; !ok {
			return fmt.Errorf("localcluster: set route of %s: revision %s was not added", s.Name, name)
		}
	}
	c.cat.SetService(s)
	return nil
}

// Scale sets a revision's instance count (it satisfies autoscaler.Scaler).
// It returns at once: new instances start in the background and appear in
// the catalog as Running when their processes are started; removed ones
// leave the ready list at once and are stopped after ShutdownDelay.
func (c *Cluster) Scale(ctx context.Context, name string, count int, reason string, meta map[string]string) error {
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("localcluster: scale %s: %w", name, err)
	}
	if count < 0 {
		return fmt.Errorf("localcluster: scale %s to %d: count must not be negative", name, count)
	}
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fmt.Errorf("localcluster: scale %s: cluster is closed", name)
	}
	r, ok := c.revisions[name]
	if !ok {
		return fmt.Errorf("localcluster: scale %s: no such revision (add it first)", name)
	}
	r.events = append(r.events, ScaleEvent{At: now, From: r.desired, To: count, Reason: reason, Meta: maps.Clone(meta)})
	c.log.Info("scale", "revision", name, "from", r.desired, "to", count, "reason", reason)
	r.desired = count
	r.rev.Desired = count
	c.cat.SetRevision(r.rev)
	c.reconcileLocked(r, now)
	return nil
}

// reconcileLocked starts or stops instances until the live count matches
// the desired count. Newest instances stop first, as Nomad removes the
// highest allocation indexes on a scale down.
func (c *Cluster) reconcileLocked(r *revision, now time.Time) {
	for len(r.live) < r.desired {
		c.seq++
		in := newInstance(c, r, c.seq, now)
		r.live = append(r.live, in)
		r.all = append(r.all, in)
		c.goLocked(in.run)
	}
	for len(r.live) > r.desired {
		in := r.live[len(r.live)-1]
		r.live = r.live[:len(r.live)-1]
		in.stop(now, c.opts.ShutdownDelay)
	}
	c.publishReadyLocked(r)
}

// goLocked runs f in a goroutine that Close waits for.
func (c *Cluster) goLocked(f func()) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		f()
	}()
}

// publishReadyLocked writes the revision's passing, live instances to the
// catalog, as Consul would list them.
func (c *Cluster) publishReadyLocked(r *revision) {
	var ready []consulroute.Instance
	for _, in := range r.live {
		if in.passing {
			ready = append(ready, in.consulInstance())
		}
	}
	slices.SortFunc(ready, func(a, b consulroute.Instance) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	if slices.Equal(ready, r.lastReady) {
		return
	}
	r.lastReady = ready
	c.cat.SetReady(r.rev.Name, ready)
}

// instanceDied is called by an instance whose process exited on its own: it
// leaves the live list and, within MaxRestarts, a replacement starts.
func (c *Cluster) instanceDied(in *instance, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := in.rev
	i := slices.Index(r.live, in)
	if i < 0 {
		return // it was being stopped anyway
	}
	r.live = slices.Delete(r.live, i, i+1)
	c.log.Warn("instance died", "revision", r.rev.Name, "alloc", in.id, "err", err)
	if c.closed {
		return
	}
	r.restarts++
	if r.restarts > c.opts.MaxRestarts {
		c.log.Error("instance died too often; not replacing it", "revision", r.rev.Name, "restarts", r.restarts)
		c.publishReadyLocked(r)
		return
	}
	c.reconcileLocked(r, time.Now())
}

// setPassing records a check result and republishes the ready list.
func (c *Cluster) setPassing(in *instance, passing bool, at time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if in.passing == passing {
		return
	}
	if passing && in.timing.FirstCheckPass.IsZero() {
		in.timing.FirstCheckPass = at
	}
	in.passing = passing
	if slices.Contains(in.rev.live, in) {
		c.publishReadyLocked(in.rev)
	}
}

// Close stops every process (SIGTERM, then SIGKILL after a bounded wait) and
// waits for the cluster's goroutines. The catalog keeps the revisions but
// loses every allocation and ready instance.
func (c *Cluster) Close() error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	now := time.Now()
	for _, r := range c.revisions {
		for _, in := range r.live {
			in.stop(now, 0)
		}
		r.live = nil
		c.publishReadyLocked(r)
	}
	c.mu.Unlock()
	c.cancel()
	c.wg.Wait()
	return nil
}

// Desired is a revision's current desired count.
func (c *Cluster) Desired(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if r, ok := c.revisions[name]; ok {
		return r.desired
	}
	return 0
}

// ScaleEvents lists every Scale call for a revision, oldest first.
func (c *Cluster) ScaleEvents(name string) []ScaleEvent {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.revisions[name]
	if !ok {
		return nil
	}
	return slices.Clone(r.events)
}

// Wakes counts the Scale calls that took a revision from zero to more.
func (c *Cluster) Wakes(name string) int {
	n := 0
	for _, e := range c.ScaleEvents(name) {
		if e.From == 0 && e.To > 0 {
			n++
		}
	}
	return n
}

// Timings lists every instance a revision ever had, oldest first, with the
// moments of its life.
func (c *Cluster) Timings(name string) []InstanceTiming {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.revisions[name]
	if !ok {
		return nil
	}
	out := make([]InstanceTiming, 0, len(r.all))
	for _, in := range r.all {
		out = append(out, in.timingLocked())
	}
	return out
}

// Running counts a revision's live instances whose processes are started.
func (c *Cluster) Running(name string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.revisions[name]
	if !ok {
		return 0
	}
	n := 0
	for _, in := range r.live {
		if !in.timing.Started.IsZero() {
			n++
		}
	}
	return n
}
