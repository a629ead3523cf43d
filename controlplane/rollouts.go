package controlplane

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/canary"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// The rollout driver runs on the leader, beside the autoscaler, and drives
// every service's rollout (issue 42) with canary's state machine: the
// machine decides, the driver does the I/O, as the autoscaler's loop does
// for its decider.
//
// What it guarantees:
//   - The state lives in Consul KV (consulroute.RolloutKey), written with
//     check-and-set after every call that returned events and before the
//     driver acts on them. A deposed leader's write fails and it lets the
//     rollout go; a new leader loads every stored rollout and Resumes it,
//     so a kill -9 skips no step and repeats at most one interval.
//   - The route is a function of the state: the record (and through
//     Publish the service-splitter) is brought to the machine's split,
//     with the step, the judgments and the end for people, whenever they
//     differ; a leader that died between storing and acting writes the
//     same split again, never an older one.
//   - A person wins: a record whose rollout is not the one driven (a
//     deploy of another revision), or that a person ended (traffic,
//     rollback), interrupts the machine; it never writes the route again.
//   - Every step, the end and a stop are Nomad scaling events of the new
//     revision (message only), so `nomad job scaling-events` shows them.

// rolloutConsul is what the driver needs of Consul (consulroute.Client).
type rolloutConsul interface {
	ReadRecord(ctx context.Context, namespace, service string) (consulroute.Record, uint64, error)
	Publish(ctx context.Context, rec consulroute.Record, casIndex uint64) error
	KVGet(ctx context.Context, key string) (consulroute.KVEntry, error)
	KVKeys(ctx context.Context, prefix, separator string) ([]string, error)
	CASKV(ctx context.Context, key string, value []byte, index uint64) (bool, error)
}

// rolloutNomad is what the driver needs of Nomad (nomadjob.Client).
type rolloutNomad interface {
	ScaleAtLeast(ctx context.Context, revision string, n int, reason string, meta map[string]string) (bool, error)
	RecordScalingEvent(ctx context.Context, revision, message string, meta map[string]string) error
}

// rolloutDriverConfig wires a driver.
type rolloutDriverConfig struct {
	Consul rolloutConsul
	Nomad  rolloutNomad
	// Catalog gives the records' rollouts and the revisions' readiness.
	Catalog *catalog.Catalog
	// Measure takes the gateways' measurements since its previous call
	// (autoscaler.TakeMeasurements).
	Measure func() (map[string]canary.Measurement, error)
	// Every is how often the machines tick (default 250 ms: a judgment is
	// due at an absolute time, and ticking often keeps it from being late
	// by more than that; a tick without events does no I/O).
	Every time.Duration
	// WakeTimeout bounds the wake before the first step (default 2 min).
	WakeTimeout time.Duration
	Now         func() time.Time
	Metrics     *rolloutMetrics
	Logger      *slog.Logger
}

// rolloutDriver drives the rollouts while this replica leads. Its state is
// touched only by Run's goroutine.
type rolloutDriver struct {
	cfg  rolloutDriverConfig
	log  *slog.Logger
	runs map[string]*rolloutRun // by namespace/service
	// done remembers rollouts that ended here (by ID), so a catalog that
	// has not yet seen the end does not start them again.
	done map[string]string
}

// rolloutRun is one rollout being driven.
type rolloutRun struct {
	namespace, service, id string
	m                      *canary.Machine
	idx                    uint64 // of the state key, for check-and-set
	history                []canary.Event
	lastWake               time.Time
	// applied is what the record holds of the machine's output (phase,
	// new percent): an output equal to it writes nothing.
	applied string
}

// storedRollout is the state key's value.
type storedRollout struct {
	ID      string         `json:"id"`
	State   canary.State   `json:"state"`
	History []canary.Event `json:"history"`
}

// maxStoredHistory bounds the stored history as the record's is bounded.
const maxStoredHistory = consulroute.MaxRolloutHistory

func newRolloutDriver(cfg rolloutDriverConfig) (*rolloutDriver, error) {
	if cfg.Consul == nil || cfg.Nomad == nil || cfg.Catalog == nil || cfg.Measure == nil {
		return nil, errors.New("rollout driver: Consul, Nomad, Catalog and Measure are required")
	}
	if cfg.Every <= 0 {
		cfg.Every = 250 * time.Millisecond
	}
	if cfg.WakeTimeout <= 0 {
		cfg.WakeTimeout = 2 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &rolloutDriver{cfg: cfg, log: log.With("component", "rollouts"), runs: map[string]*rolloutRun{}, done: map[string]string{}}, nil
}

// Run drives rollouts until ctx ends (leadership lost); it returns nil
// then. It resumes the stored rollouts first.
func (d *rolloutDriver) Run(ctx context.Context) error {
	d.runs, d.done = map[string]*rolloutRun{}, map[string]string{}
	d.resumeStored(ctx)
	t := time.NewTicker(d.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		d.tick(ctx)
	}
}

func runKey(namespace, service string) string { return namespace + "/" + service }

// resumeStored loads every stored rollout that has not ended and resumes
// it (a leader taking over).
func (d *rolloutDriver) resumeStored(ctx context.Context) {
	keys, err := d.cfg.Consul.KVKeys(ctx, consulroute.RolloutKVPrefix, "")
	if err != nil {
		d.log.Warn("list stored rollouts (retried on the next tick for each record in progress)", "err", err)
		return
	}
	for _, key := range keys {
		rest := strings.TrimPrefix(key, consulroute.RolloutKVPrefix)
		ns, svc, ok := strings.Cut(rest, "/")
		if !ok || svc == "" {
			continue
		}
		d.load(ctx, ns, svc, "")
	}
}

// load loads a service's stored rollout. With id set, only that rollout
// (a record's): ok false when none is stored under it. A stored rollout
// that ended is applied once more (a leader may have died between storing
// the end and writing the record) and remembered as done.
func (d *rolloutDriver) load(ctx context.Context, ns, svc, id string) (ok bool) {
	e, err := d.cfg.Consul.KVGet(ctx, consulroute.RolloutKey(ns, svc))
	if errors.Is(err, consulroute.ErrNotFound) {
		return false
	}
	if err != nil {
		d.log.Warn("read a stored rollout", "service", svc, "namespace", ns, "err", err)
		return true // not known: do not start it afresh over a state we could not read
	}
	var st storedRollout
	if err := json.Unmarshal(e.Value, &st); err != nil {
		d.log.Warn("skip an unreadable stored rollout", "key", e.Key, "err", err)
		return false
	}
	if id != "" && st.ID != id {
		return false
	}
	m, err := canary.Load(st.State)
	if err != nil {
		d.log.Warn("skip a stored rollout that cannot run", "key", e.Key, "err", err)
		return false
	}
	r := &rolloutRun{namespace: ns, service: svc, id: st.ID, m: m, idx: e.ModifyIndex, history: st.History}
	key := runKey(ns, svc)
	if m.Phase().Ended() {
		d.done[key] = st.ID
		// A leader that died between storing the end and writing it left
		// the record in progress: write the end. A record that heard of
		// the end is left alone: a person may have changed it since.
		if rec, _, err := d.cfg.Consul.ReadRecord(ctx, ns, svc); err == nil && rec.Rollout.InProgress() && rec.Rollout.ID == st.ID {
			d.apply(ctx, r, canary.Output{Route: m.Split()}, false)
		}
		return true
	}
	d.runs[key] = r
	d.act(ctx, r, m.Resume(d.cfg.Now()))
	return true
}

// tick takes the measurements, starts and interrupts rollouts as the
// records say, and ticks every machine.
func (d *rolloutDriver) tick(ctx context.Context) {
	meas, err := d.cfg.Measure()
	if err != nil {
		d.log.Debug("take measurements", "err", err)
	}
	now := d.cfg.Now()
	seen := map[string]bool{}
	for _, s := range d.cfg.Catalog.Services() {
		key := runKey(s.Namespace, s.Name)
		seen[key] = true
		r := d.runs[key]
		ro := s.Rollout
		switch {
		case r != nil && (ro == nil || ro.ID != r.id || !ro.InProgress()):
			d.checkTakenOver(ctx, r)
		case r == nil && ro.InProgress() && d.done[key] != ro.ID:
			d.start(ctx, s.Namespace, s.Name, ro.ID)
		}
	}
	for key, r := range d.runs {
		if !seen[key] {
			d.checkTakenOver(ctx, r)
		}
	}
	for _, r := range d.runs {
		st := r.m.State()
		in := canary.Input{New: meas[st.New], Previous: meas[st.Previous], NewReady: len(d.cfg.Catalog.Ready(st.New)) > 0}
		out, err := r.m.Tick(now, in)
		if err != nil {
			d.log.Warn("tick a rollout", "service", r.service, "err", err)
			continue
		}
		d.act(ctx, r, out)
	}
}

// start takes up a rollout a record asks for: a stored state under its ID
// is loaded (a leader died after storing it), else a new machine starts
// from the record's service.
func (d *rolloutDriver) start(ctx context.Context, ns, svc, id string) {
	if d.load(ctx, ns, svc, id) {
		return
	}
	rec, _, err := d.cfg.Consul.ReadRecord(ctx, ns, svc)
	if err != nil {
		d.log.Warn("read the record of a rollout to start", "service", svc, "err", err)
		return
	}
	ro := rec.Rollout
	if !ro.InProgress() || ro.ID != id {
		return // the catalog was behind; the next tick sees the record
	}
	key := runKey(ns, svc)
	// A rollout that cannot start (a plan validate let through) leaves
	// the latest share where it was, on the previous revision.
	fail := func(err error) {
		d.log.Warn("cannot start a rollout", "service", svc, "err", err)
		d.done[key] = id
		d.publish(ctx, ns, svc, id, func(rec *consulroute.Record) {
			rec.Rollout.Phase, rec.Rollout.EndedAt = consulroute.RolloutRolledBack, d.cfg.Now().UTC()
			rec.Rollout.Reason = "the rollout could not start: " + err.Error()
			rec.Latest = rec.Rollout.Previous
		})
	}
	plan, err := canary.PlanFor(rec.Service.Rollout, d.cfg.WakeTimeout)
	if err != nil {
		fail(err)
		return
	}
	m, err := canary.New(canary.Config{Service: svc, New: ro.New, Previous: ro.Previous, LatestPercent: rec.Service.LatestPercent(), Plan: plan}, d.cfg.Now())
	if err != nil {
		fail(err)
		return
	}
	r := &rolloutRun{namespace: ns, service: svc, id: id, m: m}
	d.runs[key] = r
	d.log.Info("rollout started", "service", svc, "new", ro.New, "previous", ro.Previous, "steps", plan.Steps, "interval", plan.Interval)
	d.cfg.Metrics.started(svc)
	// Stored before the first tick, so a leader that dies now leaves a
	// successor that resumes it rather than starting it again.
	if !d.store(ctx, r) {
		delete(d.runs, key)
	}
}

// checkTakenOver reads the record afresh (the catalog may be behind this
// driver's own writes) and interrupts the run when a person took the
// route over.
func (d *rolloutDriver) checkTakenOver(ctx context.Context, r *rolloutRun) {
	rec, _, err := d.cfg.Consul.ReadRecord(ctx, r.namespace, r.service)
	var by string
	switch {
	case errors.Is(err, consulroute.ErrNotFound):
		by = "the service was deleted"
	case err != nil:
		d.log.Warn("read the record of a rollout", "service", r.service, "err", err)
		return
	default:
		by = takenOverBy(rec, r.id)
	}
	if by == "" {
		return
	}
	d.act(ctx, r, r.m.Interrupt(d.cfg.Now(), by))
}

// takenOverBy says who took the route over from rollout id, "" when
// nobody did.
func takenOverBy(rec consulroute.Record, id string) string {
	ro := rec.Rollout
	switch {
	case ro == nil:
		return "a person's deploy or traffic change removed the rollout"
	case ro.ID != id:
		return fmt.Sprintf("a deploy by a person started another rollout, of %s", ro.New)
	case !ro.InProgress():
		if ro.Reason != "" {
			return ro.Reason
		}
		return "a person ended it (" + ro.Phase + ")"
	}
	return ""
}

// act stores the state when out has events, then carries out out.
func (d *rolloutDriver) act(ctx context.Context, r *rolloutRun, out canary.Output) {
	if len(out.Events) > 0 {
		r.history = append(r.history, out.Events...)
		if n := len(r.history) - maxStoredHistory; n > 0 {
			r.history = r.history[n:]
		}
		if !d.store(ctx, r) {
			delete(d.runs, runKey(r.namespace, r.service))
			return
		}
	}
	d.apply(ctx, r, out, true)
	if r.m.Phase().Ended() {
		key := runKey(r.namespace, r.service)
		delete(d.runs, key)
		d.done[key] = r.id
	}
}

// store writes the run's state with check-and-set; false when another
// writer (a deposed or a new leader) won, and this one must let it go.
func (d *rolloutDriver) store(ctx context.Context, r *rolloutRun) bool {
	b, err := json.Marshal(storedRollout{ID: r.id, State: r.m.State(), History: r.history})
	if err != nil {
		d.log.Error("encode a rollout's state", "service", r.service, "err", err)
		return false
	}
	key := consulroute.RolloutKey(r.namespace, r.service)
	for attempt := 0; attempt < 3; attempt++ {
		ok, err := d.cfg.Consul.CASKV(ctx, key, b, r.idx)
		if err != nil {
			d.log.Warn("store a rollout's state (retrying)", "service", r.service, "err", err)
			if !sleepCtx(ctx, 200*time.Millisecond) {
				return false
			}
			continue
		}
		if !ok {
			if r.idx == 0 {
				// A state of an earlier rollout of the service: this one
				// replaces it.
				if e, err := d.cfg.Consul.KVGet(ctx, key); err == nil {
					var old storedRollout
					if json.Unmarshal(e.Value, &old) == nil && old.ID != r.id {
						r.idx = e.ModifyIndex
						continue
					}
				}
			}
			d.log.Warn("another leader wrote this rollout's state: letting it go", "service", r.service, "key", key)
			return false
		}
		e, err := d.cfg.Consul.KVGet(ctx, key)
		if err != nil {
			d.log.Warn("read back a rollout's state", "service", r.service, "err", err)
			return false
		}
		r.idx = e.ModifyIndex
		return true
	}
	return false
}

// apply brings the record (and so the route and the splitter) to the
// machine's output, wakes the new revision, and tells Nomad's scaling
// events and the metrics of the events.
func (d *rolloutDriver) apply(ctx context.Context, r *rolloutRun, out canary.Output, tell bool) {
	st := r.m.State()
	now := d.cfg.Now()
	if out.Wake != "" && now.Sub(r.lastWake) >= 5*time.Second {
		r.lastWake = now
		n := 1
		if rev, ok := d.cfg.Catalog.Revision(out.Wake); ok {
			n = max(1, rev.Scaling.ActivationScale)
		}
		if _, err := d.cfg.Nomad.ScaleAtLeast(ctx, out.Wake, n, fmt.Sprintf("rollout of %s: woken before step 1", r.service), map[string]string{"rollout": r.id}); err != nil {
			d.log.Warn("wake a revision before its rollout's first step", "revision", out.Wake, "err", err)
		}
	}
	if tell {
		for _, ev := range out.Events {
			d.tell(ctx, r, st, ev)
		}
	}
	want := fmt.Sprintf("%s/%d", st.Phase, newPercent(out.Route))
	if len(out.Events) == 0 && want == r.applied {
		return
	}
	if st.Phase == canary.PhaseStopped {
		// The person's route stands; the record only hears why.
		if d.publish(ctx, r.namespace, r.service, r.id, func(rec *consulroute.Record) {
			rec.Rollout.AddHistory(recordEvents(st, out.Events)...)
		}) {
			r.applied = want
		}
		return
	}
	ok := d.publish(ctx, r.namespace, r.service, r.id, func(rec *consulroute.Record) {
		ro := rec.Rollout
		ro.Phase = string(st.Phase)
		ro.NewPercent = newPercent(out.Route)
		ro.Steps = len(st.Plan.Steps)
		if !st.StepStartedAt.IsZero() {
			ro.Step, ro.StepPct = st.Step+1, st.Plan.Steps[st.Step]
		}
		ro.Reason = st.Reason
		if !st.EndedAt.IsZero() {
			ro.EndedAt = st.EndedAt.UTC()
		}
		ro.AddHistory(recordEvents(st, out.Events)...)
		if st.Phase == canary.PhaseRolledBack {
			// The latest share goes back to the previous revision, and the
			// new one stays published at 0 %, marked failed by the phase.
			rec.Latest = st.Previous
		}
	})
	if ok {
		r.applied = want
	}
}

// publish changes the record of rollout id with change and publishes it
// (config entries first, then the record, check-and-set). It gives up when
// the record no longer holds rollout id in progress: the next tick
// interrupts the machine. It reports whether the record was written.
func (d *rolloutDriver) publish(ctx context.Context, ns, svc, id string, change func(*consulroute.Record)) bool {
	for attempt := 0; attempt < 5; attempt++ {
		rec, idx, err := d.cfg.Consul.ReadRecord(ctx, ns, svc)
		if err != nil {
			d.log.Warn("read a record to write a rollout step", "service", svc, "err", err)
			return false
		}
		if rec.Rollout == nil || rec.Rollout.ID != id {
			return false
		}
		change(&rec)
		rec.UpdatedAt = d.cfg.Now().UTC()
		err = d.cfg.Consul.Publish(ctx, rec, idx)
		if err == nil {
			return true
		}
		if !errors.Is(err, consulroute.ErrConflict) {
			d.log.Warn("publish a rollout step (retried on the next tick)", "service", svc, "err", err)
			return false
		}
	}
	return false
}

// tell makes an event a Nomad scaling event of the new revision (steps,
// ends, stops: what `nomad job scaling-events` lists), a log line and
// metrics.
func (d *rolloutDriver) tell(ctx context.Context, r *rolloutRun, st canary.State, ev canary.Event) {
	msg := eventText(st, ev)
	d.log.Info("rollout: "+msg, "service", r.service, "new", st.New, "previous", st.Previous, "kind", ev.Kind)
	d.cfg.Metrics.observe(r.service, st, ev)
	switch ev.Kind {
	case canary.EventStepStarted, canary.EventCompleted, canary.EventRolledBack, canary.EventStopped, canary.EventResumed:
		if err := d.cfg.Nomad.RecordScalingEvent(ctx, st.New, "rollout: "+msg, map[string]string{"rollout": r.id, "rollout_event": string(ev.Kind)}); err != nil {
			d.log.Warn("record a rollout step as a Nomad scaling event", "revision", st.New, "err", err)
		}
	}
}

// eventText is an event as people read it: a judgment with both
// revisions' figures, else the machine's message.
func eventText(st canary.State, ev canary.Event) string {
	if ev.Judgment != nil {
		return ev.Judgment.Line(st.New, st.Previous)
	}
	return ev.Message
}

func recordEvents(st canary.State, evs []canary.Event) []consulroute.RolloutEvent {
	out := make([]consulroute.RolloutEvent, 0, len(evs))
	for _, ev := range evs {
		out = append(out, consulroute.RolloutEvent{At: ev.At.UTC(), Kind: string(ev.Kind), Message: eventText(st, ev)})
	}
	return out
}

// newPercent is the new revision's share of the service in the route's
// whole percents: the machine's weight rounded down, but never 0 for a
// share above 0 (a first step of 1 % of a 10 % latest share is 1 % of the
// service, not nothing; see docs/design-notes.md).
func newPercent(s *canary.Split) int {
	if s == nil {
		return 0
	}
	p := int(s.NewWeight) / 100
	if s.NewWeight > 0 && p == 0 {
		p = 1
	}
	return p
}

// waitLeading returns once auto runs (it sums the measurements only then)
// or ctx ends.
func waitLeading(ctx context.Context, auto interface{ Leading() bool }) {
	for !auto.Leading() {
		if !sleepCtx(ctx, 10*time.Millisecond) {
			return
		}
	}
}
