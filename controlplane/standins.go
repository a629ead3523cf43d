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
	Replica() string
	RegisterStandIn(ctx context.Context, revision, service string, addr string, port int, tags ...string) error
	DeregisterStandIn(ctx context.Context, revision string) error
	StandInNodes(ctx context.Context) ([]consulroute.StandInNode, error)
	OwnStandIns(ctx context.Context, nodes []consulroute.StandInNode) ([]string, error)
	RemoveStandInNode(ctx context.Context, node string) error
	RemoveStandInsOf(ctx context.Context, replica string) ([]string, error)
	AgentStandIns(ctx context.Context) ([]consulroute.AgentStandIn, error)
	RemoveAgentStandIn(ctx context.Context, id string) error
	Replicas(ctx context.Context) (map[string]bool, error)
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

// orphanedStandInNodes picks the stand-in nodes whose replica is no
// longer registered at all (it stopped, or crashed and was removed): nobody
// is left to remove them. Another live replica's nodes are that replica's
// business, and self's are its own stand-ins. It is pure.
func orphanedStandInNodes(nodes []consulroute.StandInNode, replicas map[string]bool, self string) []string {
	var remove []string
	for _, n := range nodes {
		if n.Replica != self && !replicas[n.Replica] {
			remove = append(remove, n.Node)
		}
	}
	return remove
}

// orphanedAgentStandIns picks, from the stand-ins the local agent holds
// (only an earlier version registered them there), those no live replica
// of this version will remove: self's own, and those of replicas no longer
// registered. Another registered replica's are left to it (during an
// upgrade, an earlier version still running keeps its own). It is pure.
func orphanedAgentStandIns(local []consulroute.AgentStandIn, replicas map[string]bool, self string) []string {
	var remove []string
	for _, s := range local {
		if s.Replica == self || !replicas[s.Replica] {
			remove = append(remove, s.ID)
		}
	}
	return remove
}

// lostStandIns picks the revisions whose stand-in this replica registered
// (registered) and the catalog no longer holds (own, this replica's in the
// catalog): somebody deregistered them by hand, or another replica's sweep
// removed them while this replica's own activator registration was gone.
// The keeper forgets them, so its next pass registers the wanted ones
// again. It is pure.
func lostStandIns(own []string, registered map[string]bool) []string {
	held := make(map[string]bool, len(own))
	for _, rev := range own {
		held[rev] = true
	}
	var lost []string
	for rev := range registered {
		if !held[rev] {
			lost = append(lost, rev)
		}
	}
	sort.Strings(lost)
	return lost
}

// standInSweepEvery is how often the keeper looks for orphaned and lost
// stand-ins: a listing of the stand-in nodes, one health query, a listing
// of each of its own 16 nodes, and one of the local agent's services.
const standInSweepEvery = time.Minute

// keepStandIns registers this replica as a stand-in instance of every
// revision standInWanted names (Knative's SKS proxy mode), with the
// revision's own tags so catalog-driven proxies (Traefik, Fabio, Consul
// DNS) treat it as they treat an instance and send its first request here,
// and removes the stand-in once real instances pass or the revision is
// gone. Call it once Nomad's first listing is in the catalog (before that
// an empty catalog would say every stand-in is unwanted) and this
// replica's activator is registered. At once, and every standInSweepEvery,
// it removes the stand-in nodes of replicas that no longer exist, adopts
// its own stand-ins from an earlier run, registers again those the catalog
// lost, and removes what an earlier version left on the local agent; a
// value on sweepNow sweeps at once (serve sends one when it had to
// register its activator again: other replicas' sweeps may have removed
// its stand-ins meanwhile). On the way out it removes its stand-in nodes.
func keepStandIns(ctx context.Context, src standInSource, cat *catalog.Catalog, tags *revisionTags, addr string, port int, sweepNow <-chan struct{}, log *slog.Logger) {
	registered := map[string]bool{}
	self := src.Replica()
	defer func() {
		// Every node of this replica at once (16 calls), not one call per
		// stand-in.
		cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if _, err := src.RemoveStandInsOf(cleanup, self); err != nil {
			log.Warn("remove this replica's activator stand-ins on the way out", "err", err)
		}
	}()
	sweep := func() {
		nodes, err := src.StandInNodes(ctx)
		if err != nil {
			log.Warn("look for orphaned activator stand-ins", "err", err)
			return
		}
		replicas, err := src.Replicas(ctx)
		if err != nil {
			log.Warn("look for orphaned activator stand-ins", "err", err)
			return
		}
		own, err := src.OwnStandIns(ctx, nodes)
		if err != nil {
			log.Warn("look for orphaned activator stand-ins", "err", err)
			return
		}
		for _, rev := range lostStandIns(own, registered) {
			log.Warn("this replica's activator stand-in is gone from Consul's catalog; registering it again if still wanted", "revision", rev)
			delete(registered, rev)
		}
		for _, rev := range own { // from an earlier run under this name
			registered[rev] = true
		}
		for _, node := range orphanedStandInNodes(nodes, replicas, self) {
			if err := src.RemoveStandInNode(ctx, node); err != nil {
				log.Warn("remove the activator stand-ins of a replica that no longer exists", "node", node, "err", err)
				continue
			}
			log.Info("removed the activator stand-ins of a replica that no longer exists", "node", node)
		}
		local, err := src.AgentStandIns(ctx)
		if err != nil {
			log.Warn("look for activator stand-ins an earlier version left on the local agent", "err", err)
			return
		}
		for _, id := range orphanedAgentStandIns(local, replicas, self) {
			if err := src.RemoveAgentStandIn(ctx, id); err != nil {
				log.Warn("remove an activator stand-in an earlier version left on the local agent", "id", id, "err", err)
				continue
			}
			log.Info("removed an activator stand-in an earlier version left on the local agent", "id", id)
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
