package controlplane

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// leaderAddress caches the leading replica's admin address for RemoteSink.
type leaderAddress struct {
	addr atomic.Pointer[string]
}

func (l *leaderAddress) get() (string, bool) {
	p := l.addr.Load()
	if p == nil || *p == "" {
		return "", false
	}
	return *p, true
}

// follow looks the leader up every second: the holder of the lock is a
// replica name, and the gateways registered in Consul give its admin port
// (consulroute's LeaderGateway).
func (l *leaderAddress) follow(ctx context.Context, consul *consulroute.Client, log *slog.Logger) {
	for {
		addr := ""
		if g, ok, err := consul.LeaderGateway(ctx, consulroute.AutoscalerLockKey); ok {
			addr = "http://" + g.AdminHostPort()
		} else if err != nil && ctx.Err() == nil {
			log.Debug("look up the autoscaler leader", "err", err)
		}
		l.addr.Store(&addr)
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
}
