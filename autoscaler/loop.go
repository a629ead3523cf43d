package autoscaler

import (
	"context"
	"math"
	"sync"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// revState is the loop's private state for one revision.
type revState struct {
	name        string
	service     string
	scaling     spec.Scaling
	metric      spec.Metric // the effective metric (never "")
	concurrency int
	count       int // the job's count as the catalog says

	win          window
	panicBuckets int
	decider      Decider
	cursor       int // sampling rotates through the instances
	sh           *shared

	// This tick (ready is kept while the source does not change).
	mark     uint64
	ready    []consulroute.Instance
	queued   int
	inFlight int
}

// loop is one Run's state: created when Run starts, dropped when it returns.
// Only the Run goroutine touches it, except applies (a WaitGroup).
type loop struct {
	a    *Autoscaler
	revs map[string]*revState
	// lastFull is the last full tick's revisions in the source's order;
	// spare and partial are the buffers tick builds its list in.
	lastFull, spare, partial []*revState
	// srcChanged is closed when the source changes after the last full
	// read (nil: the source cannot tell; read it every tick).
	srcChanged <-chan struct{}
	gen        uint64
	col        collector
	sem        chan struct{} // bounds concurrent scale calls
	// woken are the traces of the wakes the running tickWoken decides
	// (by revision; tracing.go): the scale calls it makes are their spans.
	woken map[string]trace.SpanContext

	applies sync.WaitGroup
}

func newLoop(a *Autoscaler) *loop {
	return &loop{
		a:    a,
		revs: map[string]*revState{},
		col: collector{
			scraper:     a.scraper,
			resources:   a.cfg.Resources,
			resourceSem: make(chan struct{}, a.cfg.ResourceConcurrency),
			timeout:     a.cfg.ScrapeTimeout,
			workers:     a.cfg.ScrapeConcurrency,
		},
		sem: make(chan struct{}, 16),
	}
}

// changeNotifier is the optional interface of a source that says when it
// changed; *catalog.Catalog has it. Its Revisions and Ready hand out copies
// (megabytes a tick for 10,000 revisions), so while nothing changed the loop
// keeps what it read last time.
type changeNotifier interface {
	Changed() <-chan struct{}
}

// tickAll decides every revision the source lists and forgets the ones it
// no longer lists.
func (l *loop) tickAll(ctx context.Context) {
	src := l.a.cfg.Revisions
	if cn, ok := src.(changeNotifier); ok {
		if l.lastFull != nil && l.srcChanged != nil && !closed(l.srcChanged) {
			l.decide(ctx, l.lastFull, false)
			return
		}
		// Take the channel before reading, so a change during the read
		// is seen next tick.
		l.srcChanged = cn.Changed()
	}
	l.tick(ctx, src.Revisions(), true)
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// tickWoken decides the revisions woken since the last decision.
func (l *loop) tickWoken(ctx context.Context) {
	l.a.wakeMu.Lock()
	names := make([]string, 0, len(l.a.wakes))
	for name, tr := range l.a.wakes {
		names = append(names, name)
		if tr.IsValid() {
			if l.woken == nil {
				l.woken = map[string]trace.SpanContext{}
			}
			l.woken[name] = tr
		}
	}
	clear(l.a.wakes)
	l.a.wakeMu.Unlock()
	defer clear(l.woken) // only this decision's calls are the wakes'
	if len(names) == 0 {
		return
	}
	var revs []catalog.Revision
	if lk, ok := l.a.cfg.Revisions.(revisionLookup); ok {
		for _, n := range names {
			if r, ok := lk.Revision(n); ok {
				revs = append(revs, r)
			}
		}
	} else {
		want := make(map[string]bool, len(names))
		for _, n := range names {
			want[n] = true
		}
		for _, r := range l.a.cfg.Revisions.Revisions() {
			if want[r.Name] {
				revs = append(revs, r)
			}
		}
	}
	if len(revs) == 0 {
		l.a.log.Debug("wake for unknown revisions", "revisions", names)
		return
	}
	l.tick(ctx, revs, false)
}

// tick runs one round for revs: sync state, gather demand, scrape, record,
// decide, publish, apply. With full, revisions not in revs are forgotten.
func (l *loop) tick(ctx context.Context, revs []catalog.Revision, full bool) {
	a := l.a
	l.gen++
	gen := l.gen
	changed := false
	// The source lists revisions in the same order tick after tick, so a
	// full tick finds most states at the position they had in the last
	// full tick, without a map lookup. Two buffers swap roles.
	var prev, order []*revState
	if full {
		prev = l.lastFull
		order = l.spare[:0]
	} else {
		order = l.partial[:0]
	}
	for i := range revs {
		r := &revs[i]
		var st *revState
		if i < len(prev) && prev[i].name == r.Name {
			st = prev[i] // same position as last tick: no map lookup
		} else {
			st = l.revs[r.Name]
		}
		if st == nil {
			st = &revState{name: r.Name, sh: newShared(r.Service, r.Name)}
			l.revs[r.Name] = st
			changed = true
		}
		l.sync(st, r)
		st.mark = gen
		st.queued, st.inFlight = 0, 0
		order = append(order, st)
	}
	if full {
		l.spare, l.lastFull = prev, order
	} else {
		l.partial = order
	}
	if full && len(l.revs) != len(order) {
		for name, st := range l.revs {
			if st.mark != gen {
				delete(l.revs, name)
				changed = true
			}
		}
	}
	if changed {
		m := make(map[string]*shared, len(l.revs))
		for name, st := range l.revs {
			m[name] = st.sh
		}
		a.published.Store(&m)
	}
	l.decide(ctx, order, true)
}

// decide gathers demand, scrapes, records, decides, publishes and applies
// for order. With fresh, the ready instances are read from the source;
// otherwise (the source did not change) last tick's are used.
func (l *loop) decide(ctx context.Context, order []*revState, fresh bool) {
	a := l.a
	if !fresh {
		l.gen++
		for _, st := range order {
			st.mark = l.gen
			st.queued, st.inFlight = 0, 0
		}
	}
	now := a.cfg.Now()
	l.gatherDemand(now, l.gen)

	// Scrape a sample of each revision's ready instances: their sidecars,
	// or Nomad's stats of them for a revision scaled on cpu or memory.
	l.col.reset()
	for i, st := range order {
		if fresh {
			st.ready = a.cfg.Revisions.Ready(st.name)
		}
		n := len(st.ready)
		sampled := sampleSize(n)
		for k := range sampled {
			l.col.add(int32(i), st.metric, &st.ready[(st.cursor+k)%n])
		}
		if n > 0 {
			st.cursor = (st.cursor + sampled) % n
		}
	}
	l.col.run(ctx)
	if ctx.Err() != nil {
		return // leadership lost mid-tick: decide nothing on partial data
	}
	now = a.cfg.Now()

	// Aggregate, decide, publish, apply. Jobs are in revision order.
	j := 0
	for i, st := range order {
		var sum float64
		ok, failed := 0, 0
		for ; j < len(l.col.jobs) && int(l.col.jobs[j].rev) == i; j++ {
			if r := l.col.results[j]; r.ok {
				sum += r.value
				ok++
			} else {
				failed++
				a.log.Debug("scrape failed", "revision", st.name, "err", l.col.failed[j])
			}
		}
		gap := failed > 0
		switch {
		case st.metric.Resource():
			// Usage only: requests held at the activator are not cpu
			// or memory. With no ready instance nothing is known, and
			// old samples must not decide alone (gap: no scale-down).
			if ok > 0 {
				st.win.record(now, sum/float64(ok)*float64(len(st.ready)))
			}
			gap = gap || ok == 0
		case len(st.ready) == 0:
			// Nothing to scrape: the demand is what the activators hold.
			// (With the RPS metric a held request counts as one request
			// per second while it waits: enough to ask for capacity.)
			st.win.record(now, float64(st.queued))
		case ok > 0:
			// Extrapolate the sample (and the unknown instances) to every
			// ready instance, as Knative does.
			total := sum / float64(ok) * float64(len(st.ready))
			st.win.record(now, total+float64(st.queued))
		}
		stable, okStable := st.win.average(now, st.win.len())
		panicV, okPanic := st.win.average(now, st.panicBuckets)
		if !okPanic {
			panicV = stable
		}
		in := Inputs{
			Scaling:     st.scaling,
			Concurrency: st.concurrency,
			Ready:       len(st.ready),
			Count:       l.believedCount(st, now),
			Observed: Observation{
				Stable: stable,
				Panic:  panicV,
				Data:   okStable,
				Gap:    gap || (len(st.ready) > 0 && ok == 0),
			},
			Queued:          st.queued,
			InFlight:        st.inFlight,
			ActivatorInPath: l.activatorInPath(st),
		}
		dec := st.decider.Decide(in, now)
		l.publish(st, dec, now, uint64(failed))
		l.maybeApply(ctx, st, dec, now)
	}
}

// sync copies what the loop needs of a catalog revision and resizes the
// window when the stable window changed (empties it when the metric did).
func (l *loop) sync(st *revState, r *catalog.Revision) {
	st.service = r.Service
	st.concurrency = r.Concurrency
	st.count = r.Desired
	if st.scaling == r.Scaling && st.win.buckets != nil {
		return
	}
	st.scaling = r.Scaling
	s := effectiveScaling(r.Scaling)
	tick := l.a.cfg.Tick
	if st.win.buckets == nil || s.Metric != st.metric {
		// A new metric (scaling changes in place, from concurrency to
		// cpu, say): the old samples are in another unit. The emptied
		// window holds the count (no data) until it fills again.
		st.win = newWindow(s.Window, tick)
		st.metric = s.Metric
	} else {
		st.win.resize(bucketsFor(s.Window, tick)) // keeps the ring when its size holds
	}
	st.panicBuckets = min(bucketsFor(s.PanicWindow(), tick), st.win.len())
}

// gatherDemand adds up the fresh activator reports for this tick's
// revisions and forgets stale reports.
func (l *loop) gatherDemand(now time.Time, gen uint64) {
	a := l.a
	a.demandMu.Lock()
	defer a.demandMu.Unlock()
	for replica, r := range a.reports {
		if now.Sub(r.at) > a.cfg.DemandTTL {
			delete(a.reports, replica)
			continue
		}
		for name, d := range r.demand {
			if st := l.revs[name]; st != nil && st.mark == gen {
				st.queued += d.Queued
				st.inFlight += d.InFlight
			}
		}
	}
}

// activatorInPath tells the decider whether requests for the revision pass
// through the activator: always at zero instances or with unlimited burst
// capacity, and otherwise when the last published excess burst capacity was
// negative (the gateway routes through the activator then).
func (l *loop) activatorInPath(st *revState) bool {
	if len(st.ready) == 0 || st.scaling.BurstCapacity == spec.Unlimited {
		return true
	}
	bits := st.sh.ebc.Load()
	return bits != ebcUnknown && math.Float64frombits(bits) < 0
}

// believedCount is the catalog's count, unless this loop set another count
// recently and the catalog has not caught up yet.
func (l *loop) believedCount(st *revState, now time.Time) int {
	sh := st.sh
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if !sh.appliedAt.IsZero() && sh.applied != st.count && now.Sub(sh.appliedAt) < l.confirmWait() {
		return sh.applied
	}
	return st.count
}

// confirmWait is how long a count the loop set is trusted over a catalog
// that still shows the old one (the Nomad event takes a moment).
func (l *loop) confirmWait() time.Duration {
	return max(5*l.a.cfg.Tick, 10*time.Second)
}

func (l *loop) publish(st *revState, dec Decision, now time.Time, scrapeFailures uint64) {
	sh := st.sh
	sh.mu.Lock()
	sh.service = st.service
	sh.dec = dec
	sh.decided = now
	sh.scrapeFailures += scrapeFailures
	sh.mu.Unlock()
	sh.ebc.Store(math.Float64bits(dec.ExcessBurstCapacity))
}
