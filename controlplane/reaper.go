package controlplane

import (
	"context"
	"log/slog"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// replicaSource is what the leader's reaper of dead replicas needs
// (consulroute.Client).
type replicaSource interface {
	ReplicaRegistrations(ctx context.Context) ([]consulroute.ReplicaRegistration, error)
	SessionHolders(ctx context.Context) (map[string]bool, error)
	RemoveReplica(ctx context.Context, r consulroute.ReplicaRegistration) ([]string, error)
}

// How the leader watches for dead replicas: a look every reapEvery (two
// small reads: the activator service's instances, the session list, both
// as many as there are replicas), and a replica is dead once it has been
// seen so for reapGrace.
const (
	reapEvery = time.Second
	reapGrace = 3 * time.Second
)

// deadReplicas decides which replicas are dead for good enough to remove
// their registrations: the activator check critical and no Consul session
// (Consul ends a replica's session when that check turns critical or its
// node fails), seen so for at least grace since the first look that saw
// it (since, by replica; the returned map replaces it). A replica that
// starts registers its activator passing, so it is never taken for dead
// before its session exists; grace rides out a check that fails once.
// self, the leader, is alive by definition. It is pure.
func deadReplicas(regs []consulroute.ReplicaRegistration, holders map[string]bool, self string,
	since map[string]time.Time, now time.Time, grace time.Duration) ([]consulroute.ReplicaRegistration, map[string]time.Time) {
	next := map[string]time.Time{}
	var dead []consulroute.ReplicaRegistration
	for _, r := range regs {
		if r.Replica == self || !r.Critical || holders[r.Replica] {
			continue
		}
		first, ok := since[r.Replica]
		if !ok {
			first = now
		}
		next[r.Replica] = first
		if now.Sub(first) >= grace {
			dead = append(dead, r)
		}
	}
	return dead, next
}

// reapDeadReplicas runs while this replica leads: it removes, through the
// agent that holds them, the stand-ins and activator registration of every
// replica that died and stayed dead (kill -9, a node drained while its
// agent runs on, the control plane scaled down past a crash). Left alone
// they stay until their agent reaps them a minute after their checks fail,
// and `delete` waits for them meanwhile (issue 45). A replica that was
// only cut off registers everything again when it comes back
// (keepActivatorRegistered and its stand-in sweep).
func reapDeadReplicas(ctx context.Context, src replicaSource, self string, every, grace time.Duration, log *slog.Logger) {
	since := map[string]time.Time{}
	// warned: replicas whose removal failed, said once at warning level
	// (an agent that listens on loopback only, Consul's default
	// client_addr, stays unreachable from other nodes until it is reaped).
	warned := map[string]bool{}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		regs, err := src.ReplicaRegistrations(ctx)
		if err != nil {
			log.Warn("look for dead control-plane replicas", "err", err)
			continue
		}
		holders, err := src.SessionHolders(ctx)
		if err != nil {
			log.Warn("look for dead control-plane replicas", "err", err)
			continue
		}
		var dead []consulroute.ReplicaRegistration
		now := time.Now()
		dead, since = deadReplicas(regs, holders, self, since, now, grace)
		for _, r := range dead {
			removed, err := src.RemoveReplica(ctx, r)
			if err != nil {
				lvl := slog.LevelDebug
				if !warned[r.Replica] {
					lvl, warned[r.Replica] = slog.LevelWarn, true
				}
				log.Log(ctx, lvl, "remove the registrations of a dead control-plane replica (retrying every second; its agent reaps them a minute after their checks failed)",
					"replica", r.Replica, "node", r.Node, "removed", len(removed), "err", err)
				continue
			}
			delete(warned, r.Replica)
			log.Info("removed the registrations of a dead control-plane replica (activator check critical, no Consul session)",
				"replica", r.Replica, "node", r.Node, "dead_for", now.Sub(since[r.Replica]).Round(time.Millisecond), "removed", len(removed))
			delete(since, r.Replica)
		}
	}
}
