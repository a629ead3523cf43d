package autoscaler

import (
	"context"
	"log/slog"
	"time"
)

// Locker is leader election as the autoscaler needs it; consulroute's *Lock
// satisfies it. Run blocks until ctx ends, calling lead each time this
// replica becomes leader with a context that ends when leadership is lost;
// it must not call lead again before the previous lead returned.
type Locker interface {
	Run(ctx context.Context, lead func(leaderCtx context.Context)) error
}

// RunWhenLeader runs run (the Autoscaler's Run) while this replica holds
// lock, until ctx ends. When leadership is lost run's context is cancelled;
// run must return promptly, and the lock is handed on only after it has,
// so two replicas never scale at once. Should lock.Run fail before ctx ends,
// it is started again after a pause. It returns nil once ctx ends.
func RunWhenLeader(ctx context.Context, lock Locker, run func(ctx context.Context) error, logger *slog.Logger) error {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	lead := func(lctx context.Context) {
		logger.Info("leadership acquired: autoscaler running")
		if err := run(lctx); err != nil {
			logger.Error("autoscaler stopped with an error", "err", err)
		}
		logger.Info("autoscaler stopped leading")
	}
	backoff := 500 * time.Millisecond
	for {
		err := lock.Run(ctx, lead)
		if ctx.Err() != nil {
			return nil
		}
		logger.Warn("leader election failed; retrying", "in", backoff, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		backoff = min(backoff*2, 10*time.Second)
	}
}
