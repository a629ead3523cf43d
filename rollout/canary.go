package rollout

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nomad-serverless/nomad-serverless/canary"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A deploy of a service with an active rollout block does not move the
// latest share at once: it publishes the new revision at 0 % with a
// pending rollout in the record (rolloutFor), and the control plane's
// leader moves the share step by step (controlplane/rollouts.go). deploy
// then follows the record (followRollout): it prints every step and
// judgment, and ends with the rollout: nil when it completed, an error
// with the reason when it rolled back or a person stopped it.

// rolloutFor is the record's rollout after a deploy that makes latest the
// latest revision: a new pending rollout when the service has an active
// rollout block and another revision holds the latest share; the one in
// progress when it already rolls latest out; else the last one (kept for
// status), stopped when it was in progress, since this deploy moves the
// latest share at once.
func (d *Deployer) rolloutFor(svc *spec.Service, rec consulroute.Record, latest string) *consulroute.RolloutRoute {
	cur := rec.Rollout
	if cur.InProgress() && cur.New == latest {
		return cur
	}
	previous := rec.Latest
	if cur.InProgress() {
		previous = cur.Previous
	}
	if !svc.Rollout.Active() || previous == "" || previous == latest || svc.LatestPercent() == 0 {
		if cur.InProgress() {
			stopped := *cur
			stopped.Phase, stopped.EndedAt = consulroute.RolloutStopped, d.now().UTC()
			stopped.Reason = fmt.Sprintf("a deploy by a person moved the latest share to %s at once", latest)
			return &stopped
		}
		return cur
	}
	if cur != nil && cur.New == latest && cur.Phase == consulroute.RolloutRolledBack {
		fmt.Fprintf(d.out, "%s: revision %s of this spec was rolled back at %s: %s; rolling it out again\n",
			svc.Name, latest, cur.EndedAt.Format(time.RFC3339), cur.Reason)
	}
	now := d.now().UTC()
	return &consulroute.RolloutRoute{ID: latest + "@" + now.Format(time.RFC3339Nano), New: latest, Previous: previous,
		Phase: consulroute.RolloutPending, StartedAt: now}
}

// leaderLate is how long a pending rollout waits for the leader before
// deploy says so.
const leaderLate = 30 * time.Second

// followRollout prints the rollout's history as the leader writes it into
// the record, until it ends. It returns nil when it completed.
func (d *Deployer) followRollout(ctx context.Context, svc *spec.Service, ro *consulroute.RolloutRoute) error {
	name := svc.Name
	plan, err := canary.PlanFor(svc.Rollout, 2*time.Minute)
	if err != nil {
		return err
	}
	fmt.Fprintf(d.out, "%s: rolling out %s over %s: steps %v of the latest share, judged every %s (the control plane's leader drives it; -detach returns at once)\n",
		name, ro.New, plan.Duration(), plan.Steps, plan.Interval)
	start := d.now()
	printed, saidLate := 0, false
	for {
		rec, _, err := d.consul.ReadRecord(ctx, svc.Namespace, name)
		if err != nil {
			return fmt.Errorf("follow the rollout of %s: %w", ro.New, err)
		}
		cur := rec.Rollout
		if cur == nil || cur.ID != ro.ID {
			return fmt.Errorf("rollout of %s: another deploy or traffic change replaced it", ro.New)
		}
		for _, h := range cur.History[min(printed, len(cur.History)):] {
			fmt.Fprintf(d.out, "%s: rollout: %s\n", name, h.Message)
		}
		printed = len(cur.History)
		switch cur.Phase {
		case consulroute.RolloutCompleted:
			fmt.Fprintf(d.out, "%s: rollout of %s completed in %s\n", name, ro.New, d.now().Sub(start).Round(time.Second))
			return nil
		case consulroute.RolloutRolledBack:
			return fmt.Errorf("rollout of %s rolled back to %s: %s\nRevision %s stays deployed at 0 %% and is marked failed", ro.New, cur.Previous, cur.Reason, ro.New)
		case consulroute.RolloutStopped:
			return fmt.Errorf("rollout of %s stopped: %s", ro.New, cur.Reason)
		case consulroute.RolloutPending:
			if !saidLate && d.now().Sub(start) > leaderLate {
				saidLate = true
				fmt.Fprintf(d.out, "%s: no control plane leader has taken the rollout up after %s: is `nomad-serverless serve` running? (waiting)\n", name, leaderLate)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("follow the rollout of %s: %w (the leader goes on with it; see `nomad-serverless status %s`)", ro.New, ctx.Err(), name)
		case <-time.After(d.poll):
		}
	}
}

// Rollback sends the whole latest share of a service back at once: to
// revision to, or without it to the revision its latest rollout started
// from (the last one that completed a rollout, or was the latest before
// it). A rollout in progress ends: the person wins. The revision rolled
// back from stays deployed at 0 %. It returns the record written.
func Rollback(ctx context.Context, nomad RevisionStore, consul RecordStore, namespace, service, to string, now time.Time) (consulroute.Record, error) {
	for attempt := 0; ; attempt++ {
		rec, idx, err := readDeployedRecord(ctx, consul, namespace, service)
		if err != nil {
			return rec, err
		}
		ro := rec.Rollout
		target := to
		if target == "" {
			if ro == nil {
				return rec, fmt.Errorf("%s has had no rollout to roll back: name the revision with -to", service)
			}
			target = ro.Previous
		}
		if target == rec.Latest && !ro.InProgress() {
			return rec, fmt.Errorf("%s already sends its latest share to %s", service, target)
		}
		revs, err := nomad.Revisions(ctx, namespace, service)
		if err != nil {
			return rec, err
		}
		ok := false
		for _, r := range revs {
			ok = ok || (r.Name == target && !r.Stopped)
		}
		if !ok {
			return rec, fmt.Errorf("revision %s of %s is not running in Nomad (see `nomad-serverless revisions %s`)", target, service, service)
		}
		from := rec.Latest
		if ro.InProgress() {
			from = ro.New
		}
		if ro != nil {
			c := *ro
			if c.InProgress() || c.New == from {
				c.Phase, c.EndedAt = consulroute.RolloutRolledBack, now.UTC()
				c.Reason = fmt.Sprintf("rolled back by a person to %s", target)
				c.AddHistory(consulroute.RolloutEvent{At: now.UTC(), Kind: "rolled_back", Message: c.Reason})
			}
			rec.Rollout = &c
		}
		rec.Latest = target
		rec.Revisions = MergeRevisions(rec.Revisions, target, rec.Service.Traffic)
		rec.UpdatedAt = now.UTC()
		err = consul.Publish(ctx, rec, idx)
		if err == nil {
			return rec, nil
		}
		if !errors.Is(err, consulroute.ErrConflict) || attempt == 4 {
			return rec, err
		}
	}
}
