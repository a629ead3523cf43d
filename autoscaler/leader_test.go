package autoscaler

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// consulroute's lock is what serve passes to RunWhenLeader.
var _ Locker = (*consulroute.Lock)(nil)

// The catalog is the production RevisionSource.
var _ RevisionSource = (*catalog.Catalog)(nil)

// memLock is an in-memory Locker with consulroute.Lock's contract: one
// holder at a time, lead's context ends when the lock is lost (revoke) or
// Run's ctx ends, the lock is freed only after lead returned, and Run goes
// back to acquiring after a loss.
type memLock struct {
	mu     sync.Mutex
	held   bool
	freed  chan struct{} // closed when the lock is freed
	revoke context.CancelFunc
	leads  atomic.Int64 // how many times a lead was started
}

func newMemLock() *memLock { return &memLock{freed: make(chan struct{})} }

func (m *memLock) Run(ctx context.Context, lead func(context.Context)) error {
	for {
		m.mu.Lock()
		for m.held {
			freed := m.freed
			m.mu.Unlock()
			select {
			case <-freed:
			case <-ctx.Done():
				return nil
			}
			m.mu.Lock()
		}
		if ctx.Err() != nil {
			m.mu.Unlock()
			return nil
		}
		lctx, cancel := context.WithCancel(ctx)
		m.held, m.revoke = true, cancel
		m.mu.Unlock()

		m.leads.Add(1)
		lead(lctx)
		cancel()

		m.mu.Lock()
		m.held, m.revoke = false, nil
		close(m.freed)
		m.freed = make(chan struct{})
		m.mu.Unlock()
		if ctx.Err() != nil {
			return nil
		}
	}
}

// lose makes the current holder lose the lock (its session expired).
func (m *memLock) lose() {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.revoke != nil {
		m.revoke()
	}
}

// replica is one `serve` process: an autoscaler run under the shared lock.
type replica struct {
	a      *Autoscaler
	cancel context.CancelFunc
	done   chan struct{}
}

func TestLeaderElectionTwoReplicas(t *testing.T) {
	cat := catalog.New()
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	lock := newMemLock()
	var active, maxActive atomic.Int64

	start := func() *replica {
		a, err := New(Config{Revisions: cat, Scaler: &recordingScaler{cat: cat}, Scraper: newFakeScraper(), Tick: 5 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		r := &replica{a: a, cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(r.done)
			RunWhenLeader(ctx, lock, func(lctx context.Context) error {
				n := active.Add(1)
				for {
					m := maxActive.Load()
					if n <= m || maxActive.CompareAndSwap(m, n) {
						break
					}
				}
				defer active.Add(-1)
				return a.Run(lctx)
			}, nil)
		}()
		t.Cleanup(func() {
			cancel()
			<-r.done
		})
		return r
	}
	r1, r2 := start(), start()
	leader := func() *replica {
		var l *replica
		waitFor(t, 20*time.Second, "one leader", func() bool {
			switch {
			case r1.a.Leading() && !r2.a.Leading():
				l = r1
			case r2.a.Leading() && !r1.a.Leading():
				l = r2
			}
			return l != nil
		})
		return l
	}

	first := leader()
	waitFor(t, 20*time.Second, "the leader's first decision", func() bool { _, ok := first.a.State("hello-00001"); return ok })
	// Let both run a while: only one may scale.
	time.Sleep(50 * time.Millisecond)

	// The leader loses its session: it stops, the other (or itself, on a
	// new session) takes over, never both.
	lock.lose()
	waitFor(t, 20*time.Second, "a new term", func() bool { return lock.leads.Load() >= 2 })
	second := leader()

	// The leader dies: the other takes over.
	second.cancel()
	<-second.done
	if second.a.Leading() {
		t.Fatal("a dead replica still leads")
	}
	other := r1
	if second == r1 {
		other = r2
	}
	waitFor(t, 20*time.Second, "the surviving replica to lead", other.a.Leading)
	waitFor(t, 20*time.Second, "the new leader's first decision", func() bool { _, ok := other.a.State("hello-00001"); return ok })
	if _, ok := second.a.State("hello-00001"); ok {
		t.Error("the dead replica still serves state")
	}
	if m := maxActive.Load(); m != 1 {
		t.Fatalf("%d autoscalers ran at once, want 1", m)
	}
}

// flakyLock fails its first calls like a Consul that is not up yet.
type flakyLock struct {
	fails atomic.Int64
	inner *memLock
}

func (f *flakyLock) Run(ctx context.Context, lead func(context.Context)) error {
	if f.fails.Add(-1) >= 0 {
		return errors.New("consul: connection refused")
	}
	return f.inner.Run(ctx, lead)
}

func TestRunWhenLeaderRetriesAFailingLock(t *testing.T) {
	lock := &flakyLock{inner: newMemLock()}
	lock.fails.Store(1)
	ctx, cancel := context.WithCancel(context.Background())
	led := make(chan struct{}, 1)
	done := make(chan error, 1)
	go func() {
		done <- RunWhenLeader(ctx, lock, func(lctx context.Context) error {
			select {
			case led <- struct{}{}:
			default:
			}
			<-lctx.Done()
			return nil
		}, nil)
	}()
	select {
	case <-led:
	case <-time.After(testbin.Bound(30 * time.Second)):
		t.Fatal("never led after the lock recovered")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("RunWhenLeader: %v", err)
		}
	case <-time.After(testbin.Bound(20 * time.Second)):
		t.Fatal("RunWhenLeader did not return after ctx ended")
	}
}
