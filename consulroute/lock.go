package consulroute

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// LeaderKeyPrefix is where leader locks live in KV.
const LeaderKeyPrefix = "nomad-serverless/leader/"

// Session TTL bounds Consul accepts.
const (
	minSessionTTL = 10 * time.Second
	maxSessionTTL = 24 * time.Hour
)

var (
	errSessionLost  = errors.New("consul session lost (renewal failed or it expired)")
	errLockLost     = errors.New("the lock key no longer names our session")
	errLeadReturned = errors.New("lead returned while still leader")
)

// Lock is leader election with a Consul session and a KV lock (fixtures
// 049-056). At most one Lock per key holds it at a time, as far as Consul's
// session guarantees go: a leader whose session cannot be renewed for ttl
// steps down (its leader context is cancelled) before Consul frees the key
// for another (Consul waits at least ttl, plus the lock delay).
type Lock struct {
	c           *Client
	key         string
	holder      string
	sessionName string
	ttl         time.Duration
	lockDelay   time.Duration
	// renewEvery is ttl/2; a failed renewal is retried after a quarter of
	// it. Tests shorten it.
	renewEvery time.Duration
	err        error
}

// NewLock makes a lock on key; holder (for example the replica id and admin
// address) is written as the key's value on acquire so Leader can tell who
// leads. ttl is clamped to what Consul accepts (10s..24h). Problems with the
// arguments are reported by Run.
func (c *Client) NewLock(key, holder string, ttl time.Duration) *Lock {
	l := &Lock{
		c:           c,
		key:         key,
		holder:      holder,
		sessionName: spec.ReservedPrefix + "-" + path.Base(key),
		ttl:         min(max(ttl, minSessionTTL), maxSessionTTL),
		lockDelay:   time.Second,
	}
	l.renewEvery = l.ttl / 2
	switch {
	case key == "" || strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/"):
		l.err = fmt.Errorf("lock key %q: want a KV key such as %sautoscaler", key, LeaderKeyPrefix)
	case holder == "":
		l.err = fmt.Errorf("lock %s: holder is empty", key)
	}
	return l
}

// Run blocks until ctx ends. It acquires the lock (waiting on the key's
// index while another holds it), keeps the session alive by renewing it at
// ttl/2, and calls lead with a context that is cancelled when leadership is
// lost (renewal fails, the key no longer names our session) or ctx ends.
// lead must return once its context is done; the lock is released only
// after lead has returned, so two leads never overlap through this Lock.
// After a loss Run goes back to acquiring with a new session. When ctx ends
// it releases the lock, destroys the session and returns nil. Consul errors
// are retried with backoff, never returned.
func (l *Lock) Run(ctx context.Context, lead func(leaderCtx context.Context)) error {
	if l.err != nil {
		return l.err
	}
	if lead == nil {
		return fmt.Errorf("lock %s: lead is nil", l.key)
	}
	failures := 0
	for ctx.Err() == nil {
		err := l.runSession(ctx, lead)
		if ctx.Err() != nil {
			break
		}
		if err == nil {
			failures = 0
			continue
		}
		d := l.c.backoff(failures)
		failures++
		l.c.log.WarnContext(ctx, "leader lock: retrying", "key", l.key, "retry_in", d, "err", err)
		sleep(ctx, d)
	}
	return nil
}

// runSession lives as long as one Consul session: acquire, lead, and on the
// way out release and destroy.
func (l *Lock) runSession(ctx context.Context, lead func(context.Context)) error {
	kv := l.c.api.KV()
	sid, _, err := l.c.api.Session().Create(&api.SessionEntry{
		Name:      l.sessionName,
		TTL:       l.ttl.String(),
		Behavior:  api.SessionBehaviorRelease,
		LockDelay: l.lockDelay,
	}, l.c.w(ctx))
	if err != nil {
		return l.c.wrap("create a session for lock "+l.key, err)
	}
	sctx, cancel := context.WithCancelCause(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { l.renew(sctx, sid, cancel) })

	held := false
	defer func() {
		cancel(nil)
		wg.Wait()
		// ctx may be over: clean up with a context of our own, bounded.
		cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer stop()
		if held {
			if _, _, rerr := kv.Release(&api.KVPair{Key: l.key, Session: sid}, l.c.w(cctx)); rerr != nil {
				l.c.log.WarnContext(ctx, "leader lock: release failed (the session's end frees it)", "key", l.key, "err", l.c.wrap("release "+l.key, rerr))
			}
		}
		if _, derr := l.c.api.Session().Destroy(sid, l.c.w(cctx)); derr != nil {
			l.c.log.WarnContext(ctx, "leader lock: destroying the session failed (its TTL ends it)", "session", sid, "err", l.c.wrap("destroy session", derr))
		}
	}()

	var index uint64
	free := false // the last read of the key showed nobody holding it
	for sctx.Err() == nil {
		ok, _, err := kv.Acquire(&api.KVPair{Key: l.key, Value: []byte(l.holder), Session: sid}, l.c.w(sctx))
		if err != nil {
			if sctx.Err() != nil {
				break
			}
			return l.c.wrap("acquire "+l.key, err)
		}
		if ok {
			held = true
			return l.leadWhileHeld(sctx, sid, lead)
		}
		if free {
			// Free but refused: the key is in its lock delay (Consul's
			// guard after a holder's session was invalidated). Wait it
			// out, then read the key afresh.
			if !sleep(sctx, l.lockDelay) {
				break
			}
			index, free = 0, false
		}
		// Held by another: block on the key until it looks free.
		for sctx.Err() == nil {
			p, meta, err := kv.Get(l.key, l.c.blocking(sctx, index))
			if err != nil {
				if sctx.Err() != nil {
					break
				}
				return l.c.wrap("wait for lock "+l.key, err)
			}
			index = nextIndex(index, meta.LastIndex)
			if p == nil || p.Session == "" {
				free = true
				break
			}
		}
	}
	if cause := context.Cause(sctx); errors.Is(cause, errSessionLost) {
		return cause
	}
	return nil
}

// renew keeps the session alive; it cancels sctx with errSessionLost when
// Consul says the session is gone or no renewal succeeded for ttl.
func (l *Lock) renew(sctx context.Context, sid string, cancel context.CancelCauseFunc) {
	last := time.Now()
	wait := l.renewEvery
	for sleep(sctx, wait) {
		entry, _, err := l.c.api.Session().Renew(sid, l.c.w(sctx))
		switch {
		case sctx.Err() != nil:
			return
		case err != nil:
			if time.Since(last) >= l.ttl {
				cancel(fmt.Errorf("%w: %w", errSessionLost, l.c.wrap("renew session", err)))
				return
			}
			l.c.log.WarnContext(sctx, "leader lock: session renewal failed; retrying", "key", l.key, "err", l.c.wrap("renew session", err))
			wait = max(l.renewEvery/4, time.Millisecond)
		case entry == nil:
			cancel(fmt.Errorf("%w: Consul no longer knows session %s", errSessionLost, sid))
			return
		default:
			last = time.Now()
			wait = l.renewEvery
		}
	}
}

// leadWhileHeld runs lead with a context cancelled when the key stops naming
// our session, the session is lost, or ctx ends, and waits for it.
func (l *Lock) leadWhileHeld(sctx context.Context, sid string, lead func(context.Context)) error {
	lctx, cancel := context.WithCancelCause(sctx)
	var wg sync.WaitGroup
	wg.Go(func() { l.watchHeld(lctx, sid, cancel) })
	lead(lctx)
	cancel(errLeadReturned)
	wg.Wait()
	cause := context.Cause(lctx)
	switch {
	case sctx.Err() != nil && !errors.Is(context.Cause(sctx), errSessionLost):
		return nil // ctx ended: a normal shutdown
	case errors.Is(cause, errLeadReturned):
		return fmt.Errorf("lock %s: %w; stepping down", l.key, errLeadReturned)
	default:
		l.c.log.WarnContext(sctx, "leader lock: leadership lost", "key", l.key, "cause", cause)
		return nil
	}
}

// watchHeld blocks on the lock key and cancels lctx when it no longer names
// our session. Errors are retried: losing Consul altogether shows up as a
// failed session renewal.
func (l *Lock) watchHeld(lctx context.Context, sid string, cancel context.CancelCauseFunc) {
	var index uint64
	failures := 0
	for lctx.Err() == nil {
		p, meta, err := l.c.api.KV().Get(l.key, l.c.blocking(lctx, index))
		if err != nil {
			if lctx.Err() != nil {
				return
			}
			sleep(lctx, l.c.backoff(failures))
			failures++
			continue
		}
		failures = 0
		if p == nil || p.Session != sid {
			cancel(errLockLost)
			return
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

// Leader tells who holds the lock on key: the holder written at acquire.
// ok is false when nobody holds it.
func (c *Client) Leader(ctx context.Context, key string) (holder string, ok bool, err error) {
	p, _, err := c.api.KV().Get(key, c.q(ctx))
	if err != nil {
		return "", false, c.wrap("read lock "+key, err)
	}
	if p == nil || p.Session == "" {
		return "", false, nil
	}
	return string(p.Value), true, nil
}

// AutoscalerLockKey is the KV key of the autoscaler's leader lock; its value
// is the leading replica's ID, which Gateways lists with its admin port.
const AutoscalerLockKey = "nomad-serverless/leader/autoscaler"
