package controlplane

import (
	"context"
	"log/slog"
	"sort"
	"time"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// standInSource is what the stand-in keeper needs (consulroute.Client).
type standInSource interface {
	RegisterStandIn(ctx context.Context, revision, service string, addr string, port int, tags ...string) error
	DeregisterStandIn(ctx context.Context, revision string) error
	StandInID(revision string) string
	LocalStandIns(ctx context.Context) ([]consulroute.StandIn, error)
	Replicas(ctx context.Context) (map[string]bool, error)
	RemoveStandIn(ctx context.Context, id string) error
}

// standInWanted says which revisions need this replica's stand-in (revision
// -> service): those with no ready instance, and those Nomad has been told
// to run at zero. The second is what keeps a catalog-driven proxy's route
// alive across a scale to zero (make before break): the job's count drops
// to 0 before Nomad stops the last allocation and deregisters its service,
// so the stand-in, registered passing, is in the catalog before the last
// real instance leaves it. It is pure: the keeper feeds it the catalog.
func standInWanted(revs []catalog.Revision, ready func(revision string) int) map[string]string {
	want := map[string]string{}
	for _, r := range revs {
		if r.Desired == 0 || ready(r.Name) == 0 {
			want[r.Name] = r.Service
		}
	}
	return want
}

// orphanedStandIns picks, from the stand-ins the local agent holds, those
// to remove (IDs) and this replica's own to adopt (revisions): a stand-in
// whose replica is no longer registered at all (it stopped, or crashed
// and Consul reaped it) has nobody left to remove it, and one of this
// replica's own names from an earlier run (same replica name, restarted)
// is taken back so the keeper removes it when it is not wanted. Another
// live replica's stand-ins are that replica's business. It is pure.
func orphanedStandIns(local []consulroute.StandIn, replicas map[string]bool, ownID func(revision string) string) (remove []string, adopt []string) {
	for _, s := range local {
		switch {
		case s.ID == ownID(s.Revision):
			adopt = append(adopt, s.Revision)
		case !replicas[s.Replica]:
			remove = append(remove, s.ID)
		}
	}
	return remove, adopt
}

// lostStandIns picks the revisions whose stand-in this replica registered
// (registered) and the local agent no longer holds (local): the agent
// restarted without its state, or another replica's sweep removed them
// while this replica's own activator registration was gone (reaped). The
// keeper forgets them, so its next pass registers the wanted ones again.
// It is pure.
func lostStandIns(local []consulroute.StandIn, registered map[string]bool, ownID func(revision string) string) []string {
	held := make(map[string]bool, len(local))
	for _, s := range local {
		held[s.ID] = true
	}
	var lost []string
	for rev := range registered {
		if !held[ownID(rev)] {
			lost = append(lost, rev)
		}
	}
	sort.Strings(lost)
	return lost
}

// standInSweepEvery is how often the keeper looks for orphaned stand-ins on
// its agent (one agent listing and one health query).
const standInSweepEvery = time.Minute

// keepStandIns registers this replica as a stand-in instance of every
// revision standInWanted names (Knative's SKS proxy mode), with the
// revision's own tags so catalog-driven proxies (Traefik, Fabio, Consul
// DNS) treat it as they treat an instance and send its first request here,
// and removes the stand-in once real instances pass or the revision is
// gone. Call it once Nomad's first listing is in the catalog (before that
// an empty catalog would say every stand-in is unwanted) and this
// replica's activator is registered. At once, and every standInSweepEvery,
// it removes stand-ins on its agent left by replicas that no longer
// exist, adopts its own from an earlier run and registers again those the
// agent lost; a value on sweepNow sweeps at once (serve sends one when it
// had to register its activator again: whatever lost that lost the
// stand-ins too). On the way out it removes every stand-in it registered.
func keepStandIns(ctx context.Context, src standInSource, cat *catalog.Catalog, tags *revisionTags, addr string, port int, sweepNow <-chan struct{}, log *slog.Logger) {
	registered := map[string]bool{}
	defer func() {
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		for rev := range registered {
			_ = src.DeregisterStandIn(cleanup, rev)
		}
	}()
	sweep := func() {
		local, err := src.LocalStandIns(ctx)
		if err != nil {
			log.Warn("look for orphaned activator stand-ins", "err", err)
			return
		}
		replicas, err := src.Replicas(ctx)
		if err != nil {
			log.Warn("look for orphaned activator stand-ins", "err", err)
			return
		}
		remove, adopt := orphanedStandIns(local, replicas, src.StandInID)
		for _, rev := range lostStandIns(local, registered, src.StandInID) {
			log.Warn("the local Consul agent lost this replica's activator stand-in; registering it again if still wanted", "revision", rev)
			delete(registered, rev)
		}
		for _, rev := range adopt {
			registered[rev] = true
		}
		for _, id := range remove {
			if err := src.RemoveStandIn(ctx, id); err != nil {
				log.Warn("remove an orphaned activator stand-in", "id", id, "err", err)
				continue
			}
			log.Info("removed an activator stand-in left by a replica that no longer exists", "id", id)
		}
	}
	sweep()
	nextSweep := time.Now().Add(standInSweepEvery)
	ready := func(rev string) int { return len(cat.Ready(rev)) }
	for {
		changed := cat.Changed()
		if time.Now().After(nextSweep) {
			sweep()
			nextSweep = time.Now().Add(standInSweepEvery)
		}
		passStart := time.Now()
		want := standInWanted(cat.Revisions(), ready)
		revs := make([]string, 0, len(want))
		for rev := range want {
			if !registered[rev] {
				revs = append(revs, rev)
			}
		}
		sort.Strings(revs)
		for _, rev := range revs {
			if err := src.RegisterStandIn(ctx, rev, want[rev], addr, port, tags.get(rev)...); err != nil {
				log.Warn("register activator stand-in", "revision", rev, "err", err)
				continue
			}
			registered[rev] = true
		}
		for rev := range registered {
			if _, ok := want[rev]; ok {
				continue
			}
			if err := src.DeregisterStandIn(ctx, rev); err != nil {
				log.Warn("deregister activator stand-in", "revision", rev, "err", err)
				continue
			}
			delete(registered, rev)
		}
		// A pass reads the whole catalog: during a burst of changes (a
		// bulk deploy) the next one waits nine times what this one took,
		// at most a second, so the keeper takes a tenth of a core at
		// most (issue 45).
		if !sleepCtx(ctx, standInGap(time.Since(passStart))) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-changed:
		case <-sweepNow:
			nextSweep = time.Time{}
		case <-time.After(10 * time.Second): // retry failed registrations; sweep
		}
	}
}

// standInGap is how long the stand-in keeper waits after a pass that took
// d before it looks at the catalog again.
func standInGap(d time.Duration) time.Duration {
	return min(9*d, time.Second)
}

// standInFirst is the autoscaler's Scaler in serve: before it takes a
// revision to zero it registers this replica's stand-in for it, so a
// catalog-driven proxy (Fabio, Traefik) never sees the revision without a
// passing instance. The keeper alone would register the stand-in only once
// Nomad's event of the new count reached it, a race with Nomad's client
// deregistering the last instance that the client can win (on one dev
// agent it deregisters 2 to 32 ms after the scale call). Registering is
// idempotent; the keeper wants the stand-in too (the count is 0) and takes
// it over, and if the scale call fails its minute sweep adopts the stand-in
// and removes it while the revision still has instances.
type standInFirst struct {
	scaler autoscaler.Scaler
	src    standInSource
	cat    *catalog.Catalog
	tags   *revisionTags
	addr   string
	port   int
	log    *slog.Logger
}

func (s standInFirst) Scale(ctx context.Context, revision string, count int, reason string, meta map[string]string) error {
	if count == 0 {
		if r, ok := s.cat.Revision(revision); ok {
			if err := s.src.RegisterStandIn(ctx, revision, r.Service, s.addr, s.port, s.tags.get(revision)...); err != nil {
				// Scale anyway: a proxy's route may blink, the revision
				// still goes to zero as decided.
				s.log.Warn("register the activator stand-in before scaling to zero", "revision", revision, "err", err)
			}
		}
	}
	return s.scaler.Scale(ctx, revision, count, reason, meta)
}
