package controlplane

import (
	"context"
	"log/slog"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// activatorRegistry is what keepActivatorRegistered needs (consulroute.Client).
type activatorRegistry interface {
	ActivatorRegistered(ctx context.Context, id string) (bool, error)
	RegisterActivator(ctx context.Context, reg consulroute.ActivatorRegistration) error
}

// activatorCheckEvery is how often serve asks its local Consul agent
// whether it still holds the activator registration: one call to the
// local agent, which answers from its own state without a server round
// trip, so its cost does not grow with revisions or replicas.
const activatorCheckEvery = 5 * time.Second

// keepActivatorRegistered registers self again whenever the local agent
// no longer holds it. The agent drops it when it reaps the service after
// its check stayed critical for DeregisterAfter (serve stalled, or its
// admin address was unreachable for that long) and when it restarts
// without its state (a -dev agent); nothing else registers it again, and
// without it this replica is out of every activator list: the mesh's
// failover, `deploy`'s URL, the stand-ins' alias checks and the leader
// lock's session check. After each registration made again it calls
// registeredAgain (the stand-in keeper's sweep: the agent lost those
// too). It returns once ctx ends and no registration of its own is under
// way, so the caller may deregister then.
func keepActivatorRegistered(ctx context.Context, reg activatorRegistry, self consulroute.ActivatorRegistration, every time.Duration, registeredAgain func(), log *slog.Logger) {
	t := time.NewTicker(every)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ok, err := reg.ActivatorRegistered(ctx, self.ID)
		if err != nil {
			// Consul unreachable: the next tick asks again. Said once
			// per outage, not every tick.
			if !failing && ctx.Err() == nil {
				log.Warn("check the activator registration on the local Consul agent", "err", err)
			}
			failing = true
			continue
		}
		failing = false
		if ok {
			continue
		}
		// Not cut off by ctx: the caller deregisters once this returns,
		// and a registration abandoned on the way could still land at
		// the agent after that.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err = reg.RegisterActivator(rctx, self)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				log.Warn("the local Consul agent lost this replica's activator registration; registering it again failed", "err", err)
			}
			continue
		}
		log.Warn("the local Consul agent had lost this replica's activator registration (reaped after its check stayed critical, or the agent restarted without its state); registered it again")
		registeredAgain()
	}
}
