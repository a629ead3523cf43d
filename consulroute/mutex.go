package consulroute

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Mutexes are named mutual-exclusion locks shared by every replica: lock
// name is the KV key prefix+name, acquired with a Consul session. Where
// Lock (the leader lock) elects one replica for as long as it lives, these
// are taken and released around one piece of work (an ACME order for one
// name), so one replica's Mutexes hold all of their keys through a single
// session: created at the first Lock, renewed every TTL/2, destroyed by
// Close. Consul frees the keys of a replica that died when its session is
// invalidated (twice the TTL after the last renewal; sooner when the node
// fails), after the lock delay.
//
// A Mutex guards work, not data: a replica whose session Consul ended
// while it worked is not stopped (nothing fences it), so the work under
// one must tolerate a rare second runner. An ACME order does: the second
// finds the first's result in storage, or orders once more.
type Mutexes struct {
	c         *Client
	prefix    string
	holder    string
	ttl       time.Duration
	lockDelay time.Duration
	// waiting, when set, is called each time Lock finds the key held by
	// another session and starts waiting for it (tests use it to know a
	// Lock is blocked without sleeping).
	waiting func(name string)

	mu      sync.Mutex
	session string             // "" until the first Lock, or after it was lost
	stop    context.CancelFunc // ends the session's renewal
	renewed sync.WaitGroup
	held    map[string]bool
	closed  bool
}

// MutexOption configures Mutexes.
type MutexOption func(*Mutexes)

// WithMutexTTL sets the session's TTL (default LockTTL; clamped to what
// Consul accepts, 10s to 24h).
func WithMutexTTL(d time.Duration) MutexOption {
	return func(m *Mutexes) { m.ttl = min(max(d, minSessionTTL), maxSessionTTL) }
}

// WithMutexWaitHook calls f(name) whenever Lock waits on a key another
// session holds.
func WithMutexWaitHook(f func(name string)) MutexOption {
	return func(m *Mutexes) { m.waiting = f }
}

// NewMutexes makes named locks under prefix (a KV folder, ending in "/");
// holder (this replica's name) is written as each held key's value, so
// `consul kv get` shows who holds it.
func (c *Client) NewMutexes(prefix, holder string, opts ...MutexOption) (*Mutexes, error) {
	if prefix == "" || !strings.HasSuffix(prefix, "/") || strings.HasPrefix(prefix, "/") {
		return nil, fmt.Errorf("mutexes: prefix %q: want a KV folder such as %slocks/", prefix, TLSStorePrefix)
	}
	if holder == "" {
		return nil, errors.New("mutexes: holder is empty")
	}
	m := &Mutexes{c: c, prefix: prefix, holder: holder, ttl: LockTTL, lockDelay: LockDelay, held: map[string]bool{}}
	for _, o := range opts {
		o(m)
	}
	return m, nil
}

// Key is the KV key of the lock name.
func (m *Mutexes) Key(name string) string { return m.prefix + name }

// Lock blocks until this replica holds the lock name or ctx ends. A name
// this replica already holds is an error: the locks are not reentrant, as
// the work under one is not.
func (m *Mutexes) Lock(ctx context.Context, name string) error {
	if err := checkMutexName(name); err != nil {
		return err
	}
	key := m.Key(name)
	var index uint64
	failures := 0
	// freeSeen: the last read found the key free. An acquire refused
	// after that is a lock delay; before it, the holder had just not
	// released yet.
	freeSeen := false
	for {
		ok, err := m.TryLock(ctx, name)
		switch {
		case err != nil && ctx.Err() != nil:
			return fmt.Errorf("lock %s: %w", key, ctx.Err())
		case err != nil:
			if errors.Is(err, errHeldHere) || errors.Is(err, errClosed) || failures >= 5 {
				return err
			}
			// Consul unreachable for a moment, or our session ended
			// between its creation and the acquire: try again.
			failures++
			if !sleep(ctx, m.c.backoff(failures)) {
				return fmt.Errorf("lock %s: %w", key, ctx.Err())
			}
			continue
		case ok:
			return nil
		}
		failures = 0
		// Held by another session, or free but in the lock delay of a
		// session Consul ended. Wait for the key to change, or for the
		// delay to pass.
		p, meta, err := m.c.api.KV().Get(key, m.c.blocking(ctx, index))
		if err != nil {
			if ctx.Err() != nil {
				return fmt.Errorf("lock %s: %w", key, ctx.Err())
			}
			if !sleep(ctx, m.c.backoff(0)) {
				return fmt.Errorf("lock %s: %w", key, ctx.Err())
			}
			index = 0
			continue
		}
		if p == nil || p.Session == "" {
			// Free: try at once. Free yet refused is a lock delay; Consul
			// says nothing when it ends, so try again at a short pace.
			index = 0
			if freeSeen && !sleep(ctx, min(max(m.lockDelay/4, time.Millisecond), 250*time.Millisecond)) {
				return fmt.Errorf("lock %s: %w", key, ctx.Err())
			}
			freeSeen = true
			continue
		}
		freeSeen = false
		if m.waiting != nil {
			m.waiting(name)
		}
		index = nextIndex(index, meta.LastIndex)
	}
}

var (
	errHeldHere = errors.New("already held by this replica")
	errClosed   = errors.New("mutexes closed")
)

// TryLock takes the lock name if it is free and reports whether it did.
func (m *Mutexes) TryLock(ctx context.Context, name string) (bool, error) {
	if err := checkMutexName(name); err != nil {
		return false, err
	}
	key := m.Key(name)
	m.mu.Lock()
	held := m.held[name]
	m.mu.Unlock()
	if held {
		return false, fmt.Errorf("lock %s: %w", key, errHeldHere)
	}
	sid, err := m.ensureSession(ctx)
	if err != nil {
		return false, fmt.Errorf("lock %s: %w", key, err)
	}
	ok, _, err := m.c.api.KV().Acquire(&api.KVPair{Key: key, Value: []byte(m.holder), Session: sid}, m.c.w(ctx))
	if err != nil {
		// An acquire with a session Consul no longer knows is refused
		// with 500 "invalid session": forget it, the next try makes one.
		if strings.Contains(strings.ToLower(err.Error()), "invalid session") {
			m.dropSession(sid)
		}
		return false, m.c.wrap("lock "+key, err)
	}
	if !ok {
		return false, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.session != sid {
		// The session was lost while the acquire was on its way: the
		// key is no longer ours, or soon will not be.
		return false, fmt.Errorf("lock %s: the session ended while acquiring", key)
	}
	m.held[name] = true
	return true, nil
}

// Unlock releases the lock name, and deletes its key when nobody took it
// meanwhile (keys of names locked once would otherwise pile up).
func (m *Mutexes) Unlock(ctx context.Context, name string) error {
	key := m.Key(name)
	m.mu.Lock()
	held, sid := m.held[name], m.session
	delete(m.held, name)
	m.mu.Unlock()
	if !held || sid == "" {
		// Lost with its session (logged then), which freed the key.
		return nil
	}
	kv := m.c.api.KV()
	if _, _, err := kv.Release(&api.KVPair{Key: key, Session: sid}, m.c.w(ctx)); err != nil {
		return m.c.wrap("unlock "+key, err)
	}
	if p, _, err := kv.Get(key, m.c.q(ctx)); err == nil && p != nil && p.Session == "" {
		// Only if still free: another replica may hold it already.
		_, _, _ = kv.DeleteCAS(&api.KVPair{Key: key, ModifyIndex: p.ModifyIndex}, m.c.w(ctx))
	}
	return nil
}

// Held lists the names this replica holds, sorted.
func (m *Mutexes) Held() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]string, 0, len(m.held))
	for n := range m.held {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// Close releases every lock held, destroys the session and stops renewing
// it. Lock after Close fails.
func (m *Mutexes) Close(ctx context.Context) error {
	m.mu.Lock()
	m.closed = true
	names := make([]string, 0, len(m.held))
	for n := range m.held {
		names = append(names, n)
	}
	m.mu.Unlock()
	var errs []error
	for _, n := range names {
		// Released before the session ends: Consul applies the lock
		// delay to keys a session still holds when it is destroyed.
		if err := m.Unlock(ctx, n); err != nil {
			errs = append(errs, err)
		}
	}
	m.mu.Lock()
	sid, stop := m.session, m.stop
	m.session, m.stop = "", nil
	m.mu.Unlock()
	if stop != nil {
		stop()
		m.renewed.Wait()
	}
	if sid != "" {
		if _, err := m.c.api.Session().Destroy(sid, m.c.w(ctx)); err != nil {
			errs = append(errs, m.c.wrap("destroy session "+sid, err))
		}
	}
	return errors.Join(errs...)
}

// ensureSession returns the session, creating it (and its renewal) when
// there is none.
func (m *Mutexes) ensureSession(ctx context.Context) (string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return "", errClosed
	}
	if m.session != "" {
		return m.session, nil
	}
	sid, _, err := m.c.api.Session().Create(&api.SessionEntry{
		Name:      spec.ReservedPrefix + "-" + path.Base(strings.TrimSuffix(m.prefix, "/")),
		TTL:       m.ttl.String(),
		Behavior:  api.SessionBehaviorRelease,
		LockDelay: m.lockDelay,
	}, m.c.w(ctx))
	if err != nil {
		return "", m.c.wrap("create a session for locks under "+m.prefix, err)
	}
	rctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	m.session, m.stop = sid, stop
	m.renewed.Go(func() { m.renew(rctx, sid) })
	return sid, nil
}

// dropSession forgets sid (if it is still the session) and the locks held
// through it: Consul has ended it, or will.
func (m *Mutexes) dropSession(sid string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.session != sid {
		return
	}
	if len(m.held) > 0 {
		names := make([]string, 0, len(m.held))
		for n := range m.held {
			names = append(names, n)
		}
		slices.Sort(names)
		m.c.log.Warn("named locks lost with their Consul session; the work under them goes on unguarded", "prefix", m.prefix, "names", names)
	}
	m.session = ""
	clear(m.held)
	if m.stop != nil {
		m.stop()
		m.stop = nil
	}
}

// renew keeps the session alive until ctx ends; when Consul no longer
// knows it, or no renewal succeeded for a TTL, it is dropped.
func (m *Mutexes) renew(ctx context.Context, sid string) {
	last := time.Now()
	wait := m.ttl / 2
	for sleep(ctx, wait) {
		sent := time.Now()
		entry, _, err := m.c.api.Session().Renew(sid, m.c.w(ctx))
		switch {
		case ctx.Err() != nil:
			return
		case err != nil && time.Since(last) >= m.ttl:
			m.dropSession(sid)
			return
		case err != nil:
			wait = max(m.ttl/8, time.Millisecond)
		case entry == nil:
			m.dropSession(sid)
			return
		default:
			last, wait = sent, m.ttl/2
		}
	}
}

func checkMutexName(name string) error {
	if name == "" || strings.HasPrefix(name, "/") || strings.HasSuffix(name, "/") {
		return fmt.Errorf("lock name %q: want a non-empty name without leading or trailing /", name)
	}
	return nil
}
