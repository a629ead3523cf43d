package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// The feeders keep the control plane's catalog in step with Nomad and
// Consul. The catalog is only a cache: a restarted `serve` rebuilds it from a
// listing, then follows changes.

// nomadSource is what the Nomad feeder needs (nomadjob.Client).
type nomadSource interface {
	ListRevisions(ctx context.Context) ([]nomadjob.RevisionStub, uint64, error)
	Revision(ctx context.Context, revision string) (nomadjob.RevisionInfo, error)
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	StreamEvents(ctx context.Context, since uint64, fn func(nomadjob.Event)) (uint64, error)
}

// catalogRevision converts what Nomad's job says of a revision.
func catalogRevision(r nomadjob.RevisionInfo) catalog.Revision {
	return catalog.Revision{
		Name: r.Name, Service: r.Service, Namespace: r.Namespace, Generation: r.Generation,
		Concurrency: r.Concurrency, Timeout: r.Timeout, Scaling: r.Scaling, Desired: r.Count,
		FloorMin: r.FloorMin,
	}
}

// partialRevision converts what the job listing says of a revision: its
// scaling is a placeholder and its count the instances the summary counts
// (catalog.Revision.Partial).
func partialRevision(s nomadjob.RevisionStub) catalog.Revision {
	return catalog.Revision{
		Name: s.Name, Service: s.Service, Namespace: s.Namespace, Generation: s.Generation,
		Concurrency: s.Concurrency, Timeout: s.Timeout, Scaling: spec.DefaultScaling(),
		Desired: s.Running + s.Starting + s.Queued, Partial: true,
	}
}

// streamResetAfter: a stream that stayed open this long starts the
// reconnect backoff over.
const streamResetAfter = 30 * time.Second

// fullReadConcurrency bounds the job reads of the second phase (and the
// allocation reads of the first) at once.
const fullReadConcurrency = 4

// feedNomad keeps the catalog equal to Nomad: it lists every revision and
// its allocations, then follows Nomad's event stream from the listing's
// index, so nothing between the two is missed. Whenever the stream ends it
// lists again before reopening it, rather than resuming from its last
// index: Nomad keeps only its last few events and silently skips older
// ones, and a change missed here (a revision registered while the stream
// was down) would stay missing until serve restarts. It returns ctx's
// error, or an error Nomad will keep giving (a permission error).
//
// A listing is two phases (issue 45: reading every job took 40 s at
// 10,000 revisions before the gateway could route any). The first is one
// listing of Nomad's jobs with their meta, and the allocations of the
// revisions whose summary shows instances: every revision goes into the
// catalog with what routing needs (catalog.Revision.Partial), and the
// gateway routes at once. The second reads, in the background and a few
// at a time, the job of every revision the catalog holds only partly (the
// ones with instances first), for its scaling and tags; an event of the
// revision met meanwhile makes its read unneeded. A revision the catalog
// already holds whole, whose job has not changed since (the same job
// modify index), is kept as it is: a listing after the stream broke reads
// only the jobs that changed.
//
// listed, when not nil, is called once, after the first phase of the
// first listing is in the catalog: from then on a revision missing from it
// is one Nomad does not run (the stand-in keeper waits for that before it
// removes anything). read, when not nil, is called once, when the second
// phase of the first listing is done: every revision is then whole.
//
// wakes, when not nil, hears of the events that time a wake (noteWake).
func feedNomad(ctx context.Context, src nomadSource, cat *catalog.Catalog, tags *revisionTags, wakes wakeNotes, listed, read func(), log *slog.Logger) error {
	known := newJobReads()
	for attempt := 0; ; {
		start := time.Now()
		since, pending, err := listNomad(ctx, src, cat, tags, known, log)
		if err != nil {
			return err
		}
		if listed != nil {
			log.Info("Nomad's revisions are in the catalog; reading their jobs in the background for scaling and tags",
				"revisions", len(cat.Revisions()), "to_read", len(pending), "took", time.Since(start).Round(time.Millisecond))
			listed()
			listed = nil
		}
		readCtx, stopReads := context.WithCancel(ctx)
		readsDone := make(chan bool, 1) // true: every pending job was read
		go func(done func()) {
			readStart := time.Now()
			n := readJobs(readCtx, src, cat, tags, known, pending, log)
			whole := readCtx.Err() == nil
			if whole && len(pending) > 0 {
				log.Info("read the jobs of the revisions listed", "revisions", n, "took", time.Since(readStart).Round(time.Millisecond))
			}
			if whole && done != nil {
				done()
			}
			readsDone <- whole
		}(read)
		opened := time.Now()
		next, err := src.StreamEvents(ctx, since, func(ev nomadjob.Event) {
			noteWake(cat, wakes, ev)
			applyNomadEvent(cat, tags, known, ev)
		})
		// A listing again (or the end) takes over what is left to read.
		stopReads()
		if <-readsDone {
			read = nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !errors.Is(err, nomadjob.ErrStreamEnded) && !nomadjob.IsTransient(err) {
			return err
		}
		if time.Since(opened) > streamResetAfter {
			attempt = 0
		}
		wait := backoffStep(attempt)
		attempt++
		log.Warn("Nomad event stream ended; listing again before following it", "index", next, "retry_in", wait, "err", err)
		if !sleepCtx(ctx, wait) {
			return ctx.Err()
		}
	}
}

// jobReads is which revisions of the catalog are whole (their job read, or
// their last event applied) and which partial, each with the job modify
// index it was known at. It is safe for concurrent use: the event stream
// and the second phase's reads both set revisions, under its lock, so a
// read never overwrites what a newer event set.
type jobReads struct {
	mu      sync.Mutex
	whole   map[string]uint64
	partial map[string]uint64
}

func newJobReads() *jobReads {
	return &jobReads{whole: map[string]uint64{}, partial: map[string]uint64{}}
}

// pendingRead is a revision whose job the second phase reads.
type pendingRead struct {
	name      string
	instances bool // the summary shows instances: read first
}

// listNomad runs the first phase of a listing: one listing of the jobs
// with meta, and the allocations of the revisions that have instances, into
// the catalog, removing what Nomad no longer has. It returns the listing's
// index and the revisions whose job the second phase must read. It retries
// until the listing succeeds or ctx ends.
func listNomad(ctx context.Context, src nomadSource, cat *catalog.Catalog, tags *revisionTags, known *jobReads, log *slog.Logger) (uint64, []pendingRead, error) {
	for attempt := 0; ; attempt++ {
		stubs, idx, err := src.ListRevisions(ctx)
		if err == nil {
			var pending []pendingRead
			if pending, err = reconcileNomad(ctx, src, cat, tags, known, stubs, log); err == nil {
				return idx, pending, nil
			}
		}
		if ctx.Err() != nil {
			return 0, nil, ctx.Err()
		}
		log.Warn("list revisions from Nomad; retrying", "err", err)
		if !sleepCtx(ctx, backoffStep(attempt)) {
			return 0, nil, ctx.Err()
		}
	}
}

// reconcileNomad makes the catalog's revisions and allocations those of a
// listing (the first phase) and returns the revisions whose job is still
// to read, those with instances first. A revision whose allocations could
// not be read keeps the ones the catalog has. A stub without meta (a Nomad
// older than 1.6) has its job read here, before the catalog counts as
// listed; it fails only when such a read fails and may succeed later.
func reconcileNomad(ctx context.Context, src nomadSource, cat *catalog.Catalog, tags *revisionTags, known *jobReads, stubs []nomadjob.RevisionStub, log *slog.Logger) ([]pendingRead, error) {
	listed := map[string]bool{}
	var pending []pendingRead
	var withInstances, noMeta []nomadjob.RevisionStub
	known.mu.Lock()
	for _, s := range stubs {
		if s.Stopped {
			continue
		}
		listed[s.Name] = true
		if !s.AtRest() {
			withInstances = append(withInstances, s)
		}
		if !s.MetaListed {
			noMeta = append(noMeta, s)
			continue
		}
		if idx, ok := known.whole[s.Name]; ok && idx == s.JobModifyIndex {
			if _, in := cat.Revision(s.Name); in {
				continue // whole, and its job has not changed since
			}
		}
		delete(known.whole, s.Name)
		known.partial[s.Name] = s.JobModifyIndex
		cat.SetRevision(partialRevision(s))
		pending = append(pending, pendingRead{name: s.Name, instances: !s.AtRest()})
	}
	for name := range known.whole {
		if !listed[name] {
			delete(known.whole, name)
		}
	}
	for name := range known.partial {
		if !listed[name] {
			delete(known.partial, name)
		}
	}
	known.mu.Unlock()
	for _, r := range cat.Revisions() {
		if !listed[r.Name] {
			cat.DeleteRevision(r.Name)
			tags.delete(r.Name)
		}
	}

	// Jobs the listing had no meta of, then allocations, a few at a time.
	errs := make([]error, len(noMeta))
	eachBounded(len(noMeta), func(i int) {
		s := noMeta[i]
		info, err := src.Revision(ctx, s.Name)
		switch {
		case errors.Is(err, nomadjob.ErrNotFound):
		case err != nil && (nomadjob.IsTransient(err) || ctx.Err() != nil):
			errs[i] = err
		case err != nil:
			log.Warn("skip a revision whose job cannot be read", "revision", s.Name, "err", err)
		default:
			known.setWhole(cat, tags, info)
		}
	})
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	eachBounded(len(withInstances), func(i int) {
		readAllocations(ctx, src, cat, withInstances[i].Name, log)
	})
	for _, s := range stubs {
		if !s.Stopped && s.AtRest() {
			for _, a := range cat.Allocations(s.Name) {
				cat.DeleteAllocation(a.ID)
			}
		}
	}
	// Revisions with instances first: the autoscaler waits for them.
	sort.SliceStable(pending, func(i, j int) bool { return pending[i].instances && !pending[j].instances })
	return pending, nil
}

// readAllocations makes the catalog's allocations of a revision Nomad's.
func readAllocations(ctx context.Context, src nomadSource, cat *catalog.Catalog, revision string, log *slog.Logger) {
	allocs, err := src.Allocations(ctx, revision)
	if err != nil {
		log.Warn("list allocations", "revision", revision, "err", err)
		return
	}
	live := map[string]bool{}
	for _, a := range allocs {
		if a.Stopped() {
			continue
		}
		live[a.ID] = true
		cat.SetAllocation(catalog.Allocation{ID: a.ID, Revision: a.Revision, Address: a.Address,
			Port: a.HTTPPort, AdminPort: a.AdminPort, Running: a.Running, Starting: a.Starting()})
	}
	for _, a := range cat.Allocations(revision) {
		if !live[a.ID] {
			cat.DeleteAllocation(a.ID)
		}
	}
}

// eachBounded calls f(0) ... f(n-1), fullReadConcurrency at a time, and
// returns when every call has.
func eachBounded(n int, f func(i int)) {
	sem := make(chan struct{}, fullReadConcurrency)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			f(i)
		})
	}
	wg.Wait()
}

// readJobs is the second phase: it reads the job of every pending
// revision, fullReadConcurrency at a time, and makes it whole in the
// catalog unless an event did meanwhile. A read that fails is tried again
// (with backoff) until it succeeds or ctx ends. It returns how many
// revisions it made whole.
func readJobs(ctx context.Context, src nomadSource, cat *catalog.Catalog, tags *revisionTags, known *jobReads, pending []pendingRead, log *slog.Logger) int {
	var made atomic.Int64
	for attempt := 0; len(pending) > 0; attempt++ {
		failed := make([]bool, len(pending))
		eachBounded(len(pending), func(i int) {
			name := pending[i].name
			if !known.isPartial(name) || ctx.Err() != nil {
				return // an event made it whole, or it is gone
			}
			info, err := src.Revision(ctx, name)
			switch {
			case ctx.Err() != nil:
			case errors.Is(err, nomadjob.ErrNotFound):
				known.setGone(cat, tags, name) // purged since the listing
			case err != nil && nomadjob.IsTransient(err):
				failed[i] = true
			case err != nil:
				// Malformed: it stays partial, routed on what its meta
				// says, and never scaled; say so.
				log.Warn("read a revision's job: it stays without its scaling and tags", "revision", name, "err", err)
			default:
				if known.setRead(cat, tags, info) {
					made.Add(1)
				} else if known.isPartial(name) {
					failed[i] = true // read an older job than listed: again
				}
			}
		})
		if ctx.Err() != nil {
			return int(made.Load())
		}
		var again []pendingRead
		for i, f := range failed {
			if f {
				again = append(again, pending[i])
			}
		}
		if len(again) > 0 {
			wait := backoffStep(attempt)
			log.Warn("read revisions' jobs; retrying", "revisions", len(again), "retry_in", wait)
			if !sleepCtx(ctx, wait) {
				return int(made.Load())
			}
		}
		pending = again
	}
	return int(made.Load())
}

func (k *jobReads) isPartial(name string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.partial[name]
	return ok
}

// setRead makes a read job's revision whole in the catalog if it is still
// partial there and the job is at least as new as the listing that made it
// so. It reports whether it did.
func (k *jobReads) setRead(cat *catalog.Catalog, tags *revisionTags, info nomadjob.RevisionInfo) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	idx, ok := k.partial[info.Name]
	if !ok || info.JobModifyIndex < idx {
		return false
	}
	if _, in := cat.Revision(info.Name); !in {
		delete(k.partial, info.Name)
		return false
	}
	k.setWholeLocked(cat, tags, info)
	return true
}

// setWhole sets a revision from its whole job (an event's, or a read).
func (k *jobReads) setWhole(cat *catalog.Catalog, tags *revisionTags, info nomadjob.RevisionInfo) {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.setWholeLocked(cat, tags, info)
}

func (k *jobReads) setWholeLocked(cat *catalog.Catalog, tags *revisionTags, info nomadjob.RevisionInfo) {
	delete(k.partial, info.Name)
	if info.Stopped {
		delete(k.whole, info.Name)
		cat.DeleteRevision(info.Name)
		tags.delete(info.Name)
		return
	}
	k.whole[info.Name] = info.JobModifyIndex
	// Tags first: the stand-in keeper reacts to the catalog's change.
	tags.set(info.Name, info.ServiceTags)
	cat.SetRevision(catalogRevision(info))
}

// setGone forgets a revision Nomad no longer has.
func (k *jobReads) setGone(cat *catalog.Catalog, tags *revisionTags, name string) {
	k.mu.Lock()
	defer k.mu.Unlock()
	delete(k.partial, name)
	delete(k.whole, name)
	cat.DeleteRevision(name)
	tags.delete(name)
}

// applyNomadEvent folds one Nomad event into the catalog (and the
// revisions' tags, for their stand-ins). An event carries the whole job:
// the revision is whole from then on. known may be nil (benchmarks).
func applyNomadEvent(cat *catalog.Catalog, tags *revisionTags, known *jobReads, ev nomadjob.Event) {
	if known == nil {
		known = newJobReads()
	}
	switch ev.Kind {
	case nomadjob.EventRevisionRegistered, nomadjob.EventRevisionUpdated:
		known.setWhole(cat, tags, ev.Revision)
	case nomadjob.EventRevisionDeregistered:
		known.setGone(cat, tags, ev.Revision.Name)
	case nomadjob.EventAllocationUpdated:
		a := ev.Allocation
		switch {
		case a.Stopped && allocTerminal(a.ClientStatus):
			cat.DeleteAllocation(a.ID)
		case a.Stopped:
			// Told to stop but still running: stop routing to it now,
			// before Consul's deregistration lands.
			cat.SetAllocation(catalog.Allocation{ID: a.ID, Revision: a.Revision, Address: a.Address,
				Port: a.HTTPPort, AdminPort: a.AdminPort, Running: false})
		default:
			cat.SetAllocation(catalog.Allocation{ID: a.ID, Revision: a.Revision, Address: a.Address,
				Port: a.HTTPPort, AdminPort: a.AdminPort, Running: a.Running, Starting: a.Starting()})
		}
	}
}

// wakeNotes is what the wake timelines need of Nomad's events
// (*activator.Gateway).
type wakeNotes interface {
	NoteScaledFromZero(revision string, at time.Time)
	NoteEvaluation(revision, id string, created time.Time)
	NoteAllocation(a activator.AllocationTimes)
}

// noteWake passes on what an event says of a wake: a revision's count
// raised from zero (read against the catalog before the event is applied)
// with the time Nomad wrote it, an evaluation's create time, an
// allocation's placement and task starts. Events come as Nomad streams
// them: nothing is asked of Nomad for this.
func noteWake(cat *catalog.Catalog, wakes wakeNotes, ev nomadjob.Event) {
	if wakes == nil {
		return
	}
	switch ev.Kind {
	case nomadjob.EventRevisionUpdated:
		if old, ok := cat.Revision(ev.Revision.Name); ok && old.Desired == 0 && ev.Revision.Count > 0 && !ev.Revision.Stopped {
			wakes.NoteScaledFromZero(ev.Revision.Name, ev.Submitted)
		}
	case nomadjob.EventEvaluationUpdated:
		wakes.NoteEvaluation(ev.Evaluation.Revision, ev.Evaluation.ID, ev.Evaluation.Created)
	case nomadjob.EventAllocationUpdated:
		if a := ev.Allocation; !a.Stopped && a.HTTPPort != 0 {
			wakes.NoteAllocation(activator.AllocationTimes{Revision: a.Revision, ID: a.ID, EvalID: a.EvalID,
				Placed: a.Created, Received: a.Received, SidecarStarted: a.SidecarStarted, AppStarted: a.AppStarted, InitDone: a.InitDone})
		}
	}
}

func allocTerminal(clientStatus string) bool {
	return clientStatus == "complete" || clientStatus == "failed" || clientStatus == "lost"
}

// consulSource is what the Consul feeders need (consulroute.Client).
type consulSource interface {
	WatchRecords(ctx context.Context, fn func([]consulroute.Record)) error
	WatchPassing(ctx context.Context, fn func(consulroute.Passing)) error
}

// feedRecords keeps the catalog's services (routes and domains) equal to the
// records in Consul KV. loaded, when not nil, is called once, after the
// first answer is in the catalog.
func feedRecords(ctx context.Context, src consulSource, cat *catalog.Catalog, loaded func(), log *slog.Logger) error {
	return src.WatchRecords(ctx, func(recs []consulroute.Record) {
		if loaded != nil {
			defer loaded()
			loaded = nil
		}
		seen := map[string]bool{}
		for _, rec := range recs {
			route, err := rec.Route()
			if err != nil {
				log.Warn("skip a service whose route is invalid", "service", rec.Service.Name, "err", err)
				continue
			}
			seen[rec.Service.Name] = true
			cat.SetService(catalog.Service{Name: rec.Service.Name, Namespace: rec.Namespace(), Domains: rec.Service.Domains, Route: route,
				HTTPSRedirect: rec.Service.HTTPS.Redirect, Internal: rec.Service.Internal(), Rollout: rec.Rollout, Latest: rec.Latest})
		}
		for _, s := range cat.Services() {
			if !seen[s.Name] {
				cat.DeleteService(s.Name)
			}
		}
	})
}

// feedReady keeps every revision's ready instances in the catalog with one
// Consul watch for all of them (consulroute.WatchPassing), however many
// revisions there are. An instance is ready when Consul says it passes and
// Nomad has its allocation (not yet terminal: complete, failed or lost), at
// the address and ports Nomad gave it. The join is what keeps an instance
// of a lost node, whose orphaned task still passes in Consul, out of
// traffic and out of the autoscaler's capacity. It recomputes on either
// side's change and returns when ctx ends.
//
// joined, when not nil, is called once, after the first join of a Consul
// answer with the allocations of Nomad's first listing (listed closes once
// that listing is in the catalog): from then on the ready sets are whole.
func feedReady(ctx context.Context, src consulSource, cat *catalog.Catalog, listed <-chan struct{}, joined func(), log *slog.Logger) error {
	// latest holds the newest answer only: the join needs no history.
	latest := make(chan consulroute.Passing, 1)
	watchDone := make(chan error, 1)
	go func() {
		watchDone <- src.WatchPassing(ctx, func(p consulroute.Passing) {
			select {
			case <-latest:
			default:
			}
			latest <- p
		})
	}()
	var passing consulroute.Passing
	afterListing := false
	for {
		changed := cat.Changed()
		if passing != nil {
			joinReady(cat, passing)
			if afterListing && joined != nil {
				joined()
				joined = nil
			}
		}
		select {
		case <-ctx.Done():
			<-watchDone
			return nil
		case <-listed:
			// The listing's changes may have been joined before it was
			// whole: join once more.
			listed, afterListing = nil, true
		case err := <-watchDone:
			if err != nil {
				log.Warn("watch passing instances", "err", err)
			}
			return err
		case passing = <-latest:
		case <-changed:
		}
	}
}

// joinReady sets each revision's ready instances: its passing service IDs
// whose allocation the catalog has. It is pure apart from the catalog.
func joinReady(cat *catalog.Catalog, passing consulroute.Passing) {
	for _, r := range cat.Revisions() {
		var ready []consulroute.Instance
		for _, id := range passing[r.Name] {
			allocID, ok := nomadjob.ServiceAllocID(id)
			if !ok {
				continue
			}
			a, ok := cat.Allocation(allocID)
			if !ok || a.Revision != r.Name {
				continue
			}
			ready = append(ready, consulroute.Instance{ID: id, Revision: r.Name, Address: a.Address, Port: a.Port, AdminPort: a.AdminPort})
		}
		cat.SetReady(r.Name, ready)
	}
}

// revisionTags holds each revision's Consul service tags, from its Nomad
// job, for its stand-ins: the catalog does not carry them. It is safe for
// concurrent use.
type revisionTags struct {
	mu   sync.Mutex
	tags map[string][]string
}

func newRevisionTags() *revisionTags { return &revisionTags{tags: map[string][]string{}} }

func (r *revisionTags) set(revision string, tags []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tags[revision] = append([]string(nil), tags...)
}

func (r *revisionTags) get(revision string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.tags[revision]
}

func (r *revisionTags) delete(revision string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.tags, revision)
}

func backoffStep(attempt int) time.Duration {
	d := 500 * time.Millisecond << min(attempt, 6)
	return min(d, 30*time.Second)
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// wakeRecorder keeps each wake's timeline as a scaling event of its
// revision with no count: Nomad writes it alone (no job version, no
// evaluation), `nomad job scaling-events` shows its message (the wake's
// total) and meta (every step), and `status` reads it back
// (rollout.Inspector). One write per wake, by the replica that held the
// request, whichever leads: nothing to push to the leader, nothing lost
// when leadership moves, and read with the deploy user's token that
// `status` already has.
type wakeRecorder struct{ nomad *nomadjob.Client }

func (r wakeRecorder) RecordWake(ctx context.Context, t spec.WakeTimeline) error {
	return r.nomad.RecordScalingEvent(ctx, t.Revision, t.Summary(), t.ScalingMeta())
}
