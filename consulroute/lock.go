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

// The leader lock's timing, as serve uses it (docs/design-notes.md, "the
// leader lock", explains the choice with the takeover times measured).
//
// What ends a dead leader's term quickly is not the session TTL but the
// health check the session is bound to (WithSessionCheck): Consul
// invalidates a session the moment one of its checks turns critical, and
// the replica's activator check (its admin /healthz, every 2 s) fails at
// its next run once the process is gone. The TTL is the backstop for a
// leader whose check keeps passing while it cannot reach Consul's servers:
// it steps down after LockTTL without a successful renewal, and Consul
// frees the key only after twice the TTL, so the two never overlap.
const (
	// LockTTL is Consul's shortest session TTL. Longer would only delay
	// the step-down of a leader cut off from Consul; it is above the 8 s
	// Consul pause the control plane must ride out without a new term.
	LockTTL = 10 * time.Second
	// LockDelay is how long Consul keeps a key from being acquired after
	// the session holding it was invalidated (not after a release): the
	// time a leader that was paused or cut off from its agent has to see
	// its key change and stop before another replica starts. Consul's
	// default, 15 s, would be most of a takeover's budget.
	LockDelay = time.Second
)

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

// leadEnded is why the lock cancels a session's or a leader's context. It
// is a cancellation (errors.Is(err, context.Canceled)): net/http returns a
// context's cause, not context.Canceled, for a request it cuts short, and
// Client.wrap told a Consul call cut short by a lost leadership apart from
// a cancellation only by that, so it said "cannot reach Consul ...: the
// lock key no longer names our session; is the Consul agent running
// there?" (the soak's logs, issue 45): now "...: the lock key no longer
// names our session".
type leadEnded struct{ error }

func (e leadEnded) Is(target error) bool { return target == context.Canceled }
func (e leadEnded) Unwrap() error        { return e.error }

// Lock is leader election with a Consul session and a KV lock (fixtures
// 049-056). At most one Lock per key holds it at a time, as far as Consul's
// session guarantees go: a leader whose session cannot be renewed for ttl
// steps down (its leader context is cancelled) before Consul frees the key
// for another (Consul waits twice the ttl, plus the lock delay); one whose
// session Consul invalidated sees its key change and steps down, and the
// lock delay gives it that long before another may take the key.
type Lock struct {
	c           *Client
	key         string
	holder      string
	sessionName string
	ttl         time.Duration
	lockDelay   time.Duration
	// checkService and checkID name the health check the session is bound
	// to (WithSessionCheck); empty for none.
	checkService, checkID string
	// renewEvery is ttl/2; a failed renewal is retried after a quarter of
	// it. Tests shorten it.
	renewEvery time.Duration
	err        error
}

// LockOption configures a Lock.
type LockOption func(*Lock)

// WithLockDelay sets the session's lock delay (default LockDelay). Consul's
// API client leaves a zero delay out of the request, which means Consul's
// default of 15 s, so the shortest delay sent is 1 ms; Consul caps it at
// 60 s.
func WithLockDelay(d time.Duration) LockOption {
	return func(l *Lock) { l.lockDelay = min(max(d, time.Millisecond), time.Minute) }
}

// WithSessionCheck binds the lock's session to a health check of the local
// agent, besides the node's serfHealth: Consul invalidates the session as
// soon as the check turns critical or is removed, which ends the term of a
// leader whose process died within one check interval. service is the
// check's service (its checks are followed with blocking queries, because
// Consul refuses a session on a check that is critical or not registered
// yet); checkID is the check's ID ("service:<service ID>" for a service's
// only check: see ActivatorCheckID).
func WithSessionCheck(service, checkID string) LockOption {
	return func(l *Lock) { l.checkService, l.checkID = service, checkID }
}

// ActivatorCheckID is the ID of the check RegisterActivator registers with
// this replica's activator service (id as given to it; empty for the
// default): the agent names a service's only check "service:<ID>".
func (c *Client) ActivatorCheckID(id string) string { return "service:" + c.activatorID(id) }

// NewLock makes a lock on key; holder (for example the replica id and admin
// address) is written as the key's value on acquire so Leader can tell who
// leads. ttl is clamped to what Consul accepts (10s..24h). Problems with the
// arguments are reported by Run.
func (c *Client) NewLock(key, holder string, ttl time.Duration, opts ...LockOption) *Lock {
	l := &Lock{
		c:           c,
		key:         key,
		holder:      holder,
		sessionName: spec.ReservedPrefix + "-" + path.Base(key),
		ttl:         min(max(ttl, minSessionTTL), maxSessionTTL),
		lockDelay:   LockDelay,
	}
	for _, o := range opts {
		o(l)
	}
	l.renewEvery = l.ttl / 2
	switch {
	case key == "" || strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/"):
		l.err = fmt.Errorf("lock key %q: want a KV key such as %sautoscaler", key, LeaderKeyPrefix)
	case holder == "":
		l.err = fmt.Errorf("lock %s: holder is empty", key)
	case (l.checkService == "") != (l.checkID == ""):
		l.err = fmt.Errorf("lock %s: a session check needs both its service and its ID (got %q, %q)", key, l.checkService, l.checkID)
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
	if l.checkID != "" {
		if err := l.awaitCheck(ctx); err != nil || ctx.Err() != nil {
			return err
		}
	}
	kv := l.c.api.KV()
	entry := &api.SessionEntry{
		Name:      l.sessionName,
		TTL:       l.ttl.String(),
		Behavior:  api.SessionBehaviorRelease,
		LockDelay: l.lockDelay,
	}
	if l.checkID != "" {
		// NodeChecks stays Consul's default (serfHealth): the node's
		// failure ends the session too.
		entry.ServiceChecks = []api.ServiceCheck{{ID: l.checkID}}
	}
	sid, _, err := l.c.api.Session().Create(entry, l.c.w(ctx))
	if err != nil {
		// A check that turned critical since awaitCheck saw it is refused
		// here ("Check ... is in critical state"); Run's backoff and the
		// next awaitCheck deal with it.
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
		// Release before destroying: Consul applies the lock delay only
		// to keys a session still holds when it ends, so a replica that
		// stops hands the lock on at once.
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
	// freeSeen is when a read first showed the key free (zero while it is
	// held); refused counts the acquires Consul refused since.
	var freeSeen time.Time
	refused := 0
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
		if !freeSeen.IsZero() {
			// Free but refused: the key is in the lock delay of the
			// session that held it (Consul's guard after a holder's
			// session was invalidated). Consul says nothing when it
			// ends, so there is nothing to block on: try again when it
			// should be over if that session's delay was ours (it began
			// before our read saw the key free), then at a short pace
			// in case its delay was another (a replica configured
			// otherwise). Then read the key afresh: another replica may
			// have been quicker.
			d := l.delayPace()
			if refused == 0 {
				d = min(max(time.Until(freeSeen.Add(l.lockDelay)), time.Millisecond), 4*d)
			}
			refused++
			if !sleep(sctx, d) {
				break
			}
			index = 0
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
				if freeSeen.IsZero() {
					freeSeen = time.Now()
				}
				break
			}
			freeSeen, refused = time.Time{}, 0
		}
	}
	if cause := context.Cause(sctx); errors.Is(cause, errSessionLost) {
		return cause
	}
	return nil
}

// delayPace is how often an acquire is retried while the key is in a lock
// delay that outlasted ours: a quarter of ours, at most 250 ms.
func (l *Lock) delayPace() time.Duration {
	return min(max(l.lockDelay/4, time.Millisecond), 250*time.Millisecond)
}

// awaitCheck blocks until the check the session is to be bound to is
// registered and not critical, as Consul requires to create the session:
// at start-up the activator's check is critical until its first run, and
// after a failure until it passes again. It follows the check's service
// with blocking queries on the catalog (which is what Consul validates a
// session against, not the agent's own view).
func (l *Lock) awaitCheck(ctx context.Context) error {
	var index uint64
	for ctx.Err() == nil {
		checks, meta, err := l.c.api.Health().Checks(l.checkService, l.c.blocking(ctx, index))
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return l.c.wrap("wait for check "+l.checkID+" to pass (the leader lock's session is bound to it)", err)
		}
		for _, chk := range checks {
			if chk != nil && chk.CheckID == l.checkID && chk.Status != api.HealthCritical {
				return nil
			}
		}
		index = nextIndex(index, meta.LastIndex)
	}
	return nil
}

// renew keeps the session alive; it cancels sctx with errSessionLost when
// Consul says the session is gone or no renewal succeeded for ttl.
func (l *Lock) renew(sctx context.Context, sid string, cancel context.CancelCauseFunc) {
	last := time.Now()
	wait := l.renewEvery
	for sleep(sctx, wait) {
		sent := time.Now()
		entry, _, err := l.c.api.Session().Renew(sid, l.c.w(sctx))
		switch {
		case sctx.Err() != nil:
			return
		case err != nil:
			if time.Since(last) >= l.ttl {
				cancel(leadEnded{fmt.Errorf("%w: %w", errSessionLost, l.c.wrap("renew session", err))})
				return
			}
			l.c.log.WarnContext(sctx, "leader lock: session renewal failed; retrying", "key", l.key, "err", l.c.wrap("renew session", err))
			wait = max(l.renewEvery/4, time.Millisecond)
		case entry == nil:
			cancel(leadEnded{fmt.Errorf("%w: Consul no longer knows session %s", errSessionLost, sid)})
			return
		default:
			// Counted from when the renewal was sent: Consul restarted
			// the TTL no earlier than that.
			last = sent
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
	cancel(leadEnded{errLeadReturned})
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
			cancel(leadEnded{errLockLost})
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
