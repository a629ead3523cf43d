package controlplane

import (
	"context"
	"errors"
	"log/slog"
	"sync"
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
	AllRevisions(ctx context.Context) ([]nomadjob.RevisionStatus, uint64, error)
	Allocations(ctx context.Context, revision string) ([]nomadjob.Allocation, error)
	StreamEvents(ctx context.Context, since uint64, fn func(nomadjob.Event)) (uint64, error)
}

// catalogRevision converts what Nomad says of a revision job.
func catalogRevision(r nomadjob.RevisionInfo) catalog.Revision {
	return catalog.Revision{
		Name: r.Name, Service: r.Service, Namespace: r.Namespace, Generation: r.Generation,
		Concurrency: r.Concurrency, Timeout: r.Timeout, Scaling: r.Scaling, Desired: r.Count,
	}
}

// streamResetAfter: a stream that stayed open this long starts the
// reconnect backoff over.
const streamResetAfter = 30 * time.Second

// feedNomad keeps the catalog equal to Nomad: it lists every revision and
// its allocations, then follows Nomad's event stream from the listing's
// index, so nothing between the two is missed. Whenever the stream ends it
// lists again before reopening it, rather than resuming from its last
// index: Nomad keeps only its last few events and silently skips older
// ones, and a change missed here (a revision registered while the stream
// was down) would stay missing until serve restarts. It returns ctx's
// error, or an error Nomad will keep giving (a permission error).
//
// listed, when not nil, is called once, after the first listing is in the
// catalog: from then on a revision missing from it is one Nomad does not
// run (the stand-in keeper waits for that before it removes anything).
//
// wakes, when not nil, hears of the events that time a wake (noteWake).
func feedNomad(ctx context.Context, src nomadSource, cat *catalog.Catalog, tags *revisionTags, wakes wakeNotes, listed func(), log *slog.Logger) error {
	for attempt := 0; ; {
		since, err := listNomad(ctx, src, cat, tags, log)
		if err != nil {
			return err
		}
		if listed != nil {
			listed()
			listed = nil
		}
		opened := time.Now()
		next, err := src.StreamEvents(ctx, since, func(ev nomadjob.Event) {
			noteWake(cat, wakes, ev)
			applyNomadEvent(cat, tags, ev)
		})
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

// listNomad lists every revision and its allocations into the catalog,
// removing what Nomad no longer has, and returns the listing's index. It
// retries until the listing succeeds or ctx ends.
func listNomad(ctx context.Context, src nomadSource, cat *catalog.Catalog, tags *revisionTags, log *slog.Logger) (uint64, error) {
	for attempt := 0; ; attempt++ {
		revs, idx, err := src.AllRevisions(ctx)
		if err == nil {
			reconcileNomad(ctx, src, cat, tags, revs, log)
			return idx, nil
		}
		if ctx.Err() != nil {
			return 0, ctx.Err()
		}
		log.Warn("list revisions from Nomad; retrying", "err", err)
		if !sleepCtx(ctx, backoffStep(attempt)) {
			return 0, ctx.Err()
		}
	}
}

// reconcileNomad makes the catalog's revisions and allocations those of a
// listing. A revision whose allocations could not be read keeps the ones
// the catalog has.
func reconcileNomad(ctx context.Context, src nomadSource, cat *catalog.Catalog, tags *revisionTags, revs []nomadjob.RevisionStatus, log *slog.Logger) {
	listed := map[string]bool{}
	for _, r := range revs {
		if r.Stopped {
			continue
		}
		listed[r.Name] = true
		tags.set(r.Name, r.ServiceTags)
		cat.SetRevision(catalogRevision(r.RevisionInfo))
		var allocs []nomadjob.Allocation
		if !atRest(r) {
			var err error
			if allocs, err = src.Allocations(ctx, r.Name); err != nil {
				log.Warn("list allocations", "revision", r.Name, "err", err)
				continue
			}
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
		for _, a := range cat.Allocations(r.Name) {
			if !live[a.ID] {
				cat.DeleteAllocation(a.ID)
			}
		}
	}
	for _, r := range cat.Revisions() {
		if !listed[r.Name] {
			cat.DeleteRevision(r.Name)
			tags.delete(r.Name)
		}
	}
}

// atRest reports whether the listing says a revision has nothing to route
// to: count 0, and no instance running, starting or queued in its job
// summary. Its allocations are not read: most revisions of a big cluster
// sit at zero, and one read each made serve's start cost a request per
// revision (issue 45).
func atRest(r nomadjob.RevisionStatus) bool {
	return r.Count == 0 && r.Running+r.Starting+r.Queued == 0
}

// applyNomadEvent folds one Nomad event into the catalog (and the
// revisions' tags, for their stand-ins).
func applyNomadEvent(cat *catalog.Catalog, tags *revisionTags, ev nomadjob.Event) {
	switch ev.Kind {
	case nomadjob.EventRevisionRegistered, nomadjob.EventRevisionUpdated:
		if ev.Revision.Stopped {
			cat.DeleteRevision(ev.Revision.Name)
			tags.delete(ev.Revision.Name)
			return
		}
		// Tags first: the stand-in keeper reacts to the catalog's change.
		tags.set(ev.Revision.Name, ev.Revision.ServiceTags)
		cat.SetRevision(catalogRevision(ev.Revision))
	case nomadjob.EventRevisionDeregistered:
		cat.DeleteRevision(ev.Revision.Name)
		tags.delete(ev.Revision.Name)
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
				HTTPSRedirect: rec.Service.HTTPS.Redirect, Internal: rec.Service.Internal(), Rollout: rec.Rollout})
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
