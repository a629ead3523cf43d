package consulroute

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

const leaderKey = "nomad-serverless/leader/autoscaler"

func TestLockAcquireLeadReleaseDestroyAsRecorded(t *testing.T) {
	create := fx(t, "049-session-create.json")
	acquire := fx(t, "051-lock-acquire.json")
	read := fx(t, "053-lock-read.json")
	read.Request.Query.Set("wait", "1s") // the leader's watch of its key is a blocking read
	release := fx(t, "055-lock-release.json")
	destroy := fx(t, "056-session-destroy.json")
	c, replay, held := blockingReplay(t, "56", create, acquire, read, release, destroy)

	l := c.NewLock(leaderKey, "replica-1", 15*time.Second)
	l.renewEvery = time.Hour // renewal has its own test
	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	leading := make(chan struct{})
	leadDone := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- l.Run(ctx, func(lctx context.Context) {
			close(leading)
			<-lctx.Done()
			close(leadDone)
		})
	}()
	select {
	case <-leading:
	case <-time.After(10 * time.Second):
		t.Fatal("never led")
	}
	waitHeld(t, held) // the leader watches its key, blocked on index 56
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	select {
	case <-leadDone:
	default:
		t.Fatal("Run returned before lead did")
	}
	got := replay.Received()
	want := []fixtures.Exchange{create, acquire, read, release, destroy}
	if len(got) != len(want) {
		t.Fatalf("sent %d requests, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		assertSent(t, got[i], want[i])
	}
}

func TestLockContendedWaitsOnTheKeysIndex(t *testing.T) {
	create := fx(t, "050-session-create-second.json")
	acquire := fx(t, "052-lock-acquire-contended.json")
	read := fx(t, "053-lock-read.json") // held by the first replica's session
	read.Request.Query.Set("wait", "1s")
	destroy := withPath(fx(t, "056-session-destroy.json"), "/v1/session/destroy/322b8a5b-6d3a-dd59-4a57-8b1329330991")
	c, replay, held := blockingReplay(t, "56", create, acquire, read, destroy)

	l := c.NewLock(leaderKey, "replica-2", 15*time.Second)
	l.renewEvery = time.Hour
	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	done := make(chan error, 1)
	var led atomic.Bool
	go func() { done <- l.Run(ctx, func(context.Context) { led.Store(true) }) }()
	waitHeld(t, held) // blocked on the key's index 56, not polling
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if led.Load() {
		t.Error("led without the lock")
	}
	got := replay.Received()
	want := []fixtures.Exchange{create, acquire, read, destroy}
	if len(got) != len(want) {
		t.Fatalf("sent %d requests, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		assertSent(t, got[i], want[i])
	}
}

func TestLockRenewsSession(t *testing.T) {
	renew := fx(t, "054-session-renew.json")
	ex := []fixtures.Exchange{fx(t, "049-session-create.json"), fx(t, "051-lock-acquire.json"), fx(t, "053-lock-read.json")}
	// Enough renewal answers for however many land before the cancel.
	for range 100 {
		ex = append(ex, renew)
	}
	ex = append(ex, fx(t, "055-lock-release.json"), fx(t, "056-session-destroy.json"))
	c, replay, held := blockingReplay(t, "56", ex...)
	l := c.NewLock(leaderKey, "replica-1", 15*time.Second)
	l.renewEvery = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(ctxTimeout(t, 20*time.Second))
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx, func(lctx context.Context) { <-lctx.Done() }) }()
	waitHeld(t, held)
	deadline := time.Now().Add(10 * time.Second)
	renews := func() int {
		n := 0
		for _, r := range replay.Received() {
			if r.Path == renew.Request.Path {
				n++
			}
		}
		return n
	}
	for renews() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := renews(); n < 3 {
		t.Fatalf("%d renewals, want at least 3", n)
	}
	// Released and destroyed after the renewals stopped.
	var got []fixtures.Received
	for _, r := range replay.Received() {
		if r.Path != renew.Request.Path {
			got = append(got, r)
		}
	}
	if len(got) < 2 || got[len(got)-2].Query.Get("release") == "" || got[len(got)-1].Path != "/v1/session/destroy/fbc54f0e-c7bd-d816-c339-e0164eacacf4" {
		t.Errorf("the last requests were not release then destroy: %+v", got[max(0, len(got)-2):])
	}
	for _, r := range replay.Received() {
		if r.Path == renew.Request.Path {
			assertSent(t, r, renew)
		}
	}
}

func TestLeaderNamesTheHolder(t *testing.T) {
	free := synthetic("lock key never taken", "GET", "/v1/kv/nomad-serverless/leader/other", nil, 404, "56", nil)
	c, _ := replayClient(t, fx(t, "053-lock-read.json"), free)
	ctx := ctxTimeout(t, 5*time.Second)
	holder, ok, err := c.Leader(ctx, leaderKey)
	if err != nil || !ok || holder != "replica-1" {
		t.Errorf("Leader = %q, %v, %v; want replica-1, true", holder, ok, err)
	}
	holder, ok, err = c.Leader(ctx, "nomad-serverless/leader/other")
	if err != nil || ok || holder != "" {
		t.Errorf("Leader of a free key = %q, %v, %v; want none", holder, ok, err)
	}
}

func TestLockArgumentsValidated(t *testing.T) {
	c := testClient(t, "127.0.0.1:1")
	ctx := ctxTimeout(t, time.Second)
	for _, l := range []*Lock{c.NewLock("", "h", time.Minute), c.NewLock("/x", "h", time.Minute), c.NewLock(leaderKey, "", time.Minute)} {
		if err := l.Run(ctx, func(context.Context) {}); err == nil {
			t.Errorf("Run accepted key %q holder %q", l.key, l.holder)
		}
	}
	if err := c.NewLock(leaderKey, "h", time.Minute).Run(ctx, nil); err == nil {
		t.Error("Run accepted a nil lead")
	}
	if l := c.NewLock(leaderKey, "h", time.Second); l.ttl != 10*time.Second {
		t.Errorf("ttl %s, want clamped to Consul's minimum 10s", l.ttl)
	}
}

// leaderTracker counts leaders running at once.
type leaderTracker struct {
	now, most atomic.Int32
	mu        sync.Mutex
	order     []string
}

func (lt *leaderTracker) lead(name string, started chan<- string) func(context.Context) {
	return func(ctx context.Context) {
		n := lt.now.Add(1)
		for {
			m := lt.most.Load()
			if n <= m || lt.most.CompareAndSwap(m, n) {
				break
			}
		}
		lt.mu.Lock()
		lt.order = append(lt.order, name)
		lt.mu.Unlock()
		started <- name
		<-ctx.Done()
		lt.now.Add(-1)
	}
}

func TestTwoLocksOneLeadsOtherTakesOverAfterCancel(t *testing.T) {
	f, addr := newFakeConsul(t)
	ca := testClient(t, addr, WithReplica("a"))
	cb := testClient(t, addr, WithReplica("b"))
	la := ca.NewLock(leaderKey, "a@127.0.0.1:9001", 15*time.Second)
	lb := cb.NewLock(leaderKey, "b@127.0.0.1:9002", 15*time.Second)
	for _, l := range []*Lock{la, lb} {
		l.renewEvery = 25 * time.Millisecond // exercise renewal while contending
	}

	var lt leaderTracker
	started := make(chan string, 4)
	ctxA, cancelA := context.WithCancel(ctxTimeout(t, 30*time.Second))
	ctxB, cancelB := context.WithCancel(ctxTimeout(t, 30*time.Second))
	defer cancelB()
	doneA, doneB := make(chan error, 1), make(chan error, 1)
	go func() { doneA <- la.Run(ctxA, lt.lead("a", started)) }()
	go func() { doneB <- lb.Run(ctxB, lt.lead("b", started)) }()

	var first string
	select {
	case first = <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("nobody led")
	}
	// The other stays a follower while the first holds the lock.
	select {
	case s := <-started:
		t.Fatalf("%s led while %s held the lock", s, first)
	case <-time.After(300 * time.Millisecond):
	}
	holder, ok, err := ca.Leader(ctxA, leaderKey)
	if err != nil || !ok || holder[:1] != first {
		t.Fatalf("Leader = %q, %v, %v; want %s", holder, ok, err, first)
	}

	// Stop the leader: the follower takes over within a bounded time.
	stop, stopDone, otherDone, other := cancelA, doneA, doneB, "b"
	if first == "b" {
		stop, stopDone, otherDone, other = cancelB, doneB, doneA, "a"
	}
	stop()
	if err := <-stopDone; err != nil {
		t.Fatalf("leader's Run: %v", err)
	}
	select {
	case s := <-started:
		if s != other {
			t.Fatalf("%s led after cancel, want %s", s, other)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not take over within 10s after %s stopped", other, first)
	}
	if lt.most.Load() != 1 {
		t.Errorf("%d leaders at once", lt.most.Load())
	}
	holder, ok, _ = ca.Leader(context.Background(), leaderKey)
	if !ok || holder[:1] != other {
		t.Errorf("Leader = %q after takeover, want %s", holder, other)
	}
	f.mu.Lock()
	sessions := len(f.sessions)
	f.mu.Unlock()
	if sessions != 1 {
		t.Errorf("%d sessions live, want only the new leader's (the stopped one destroys its own)", sessions)
	}
	cancelA()
	cancelB()
	select {
	case <-otherDone:
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its ctx ended")
	}
	if h := f.holder(leaderKey); h != "" {
		t.Errorf("lock still held by %s after both stopped", h)
	}
}

func TestLockLostWhenSessionInvalidatedThenReacquired(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	l := c.NewLock(leaderKey, "r1", 15*time.Second)
	l.renewEvery = 20 * time.Millisecond
	l.lockDelay = 50 * time.Millisecond

	var leads atomic.Int32
	lost := make(chan struct{}, 4)
	started := make(chan struct{}, 4)
	ctx, cancel := context.WithCancel(ctxTimeout(t, 30*time.Second))
	done := make(chan error, 1)
	go func() {
		done <- l.Run(ctx, func(lctx context.Context) {
			leads.Add(1)
			started <- struct{}{}
			<-lctx.Done()
			if ctx.Err() == nil {
				lost <- struct{}{}
			}
		})
	}()
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal(what)
		}
	}
	wait(started, "never led")
	// The session expires (as when renewals stop reaching Consul).
	f.invalidate(f.holder(leaderKey))
	wait(lost, "leader context not cancelled after its session was invalidated")
	wait(started, "did not lead again with a new session after the lock delay")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if leads.Load() != 2 {
		t.Errorf("led %d times, want 2", leads.Load())
	}
}

func TestLockStepsDownWhenKeyTakenAway(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	l := c.NewLock(leaderKey, "r1", 15*time.Second)
	l.renewEvery = time.Hour
	ctx, cancel := context.WithCancel(ctxTimeout(t, 30*time.Second))
	defer cancel()
	started := make(chan struct{}, 4)
	lost := make(chan struct{}, 4)
	done := make(chan error, 1)
	go func() {
		done <- l.Run(ctx, func(lctx context.Context) {
			started <- struct{}{}
			<-lctx.Done()
			lost <- struct{}{}
		})
	}()
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("never led")
	}
	// An operator deletes the lock key.
	f.mu.Lock()
	delete(f.kv, leaderKey)
	f.kvIndex = f.bump()
	f.mu.Unlock()
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("leader kept leading after its lock key vanished")
	}
	// It goes back to acquiring: the key is free, so it leads again.
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("did not lead again")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestLockStepsDownWhenRenewalsFailForTTL(t *testing.T) {
	f, addr := newFakeConsul(t)
	c := testClient(t, addr)
	l := c.NewLock(leaderKey, "r1", 15*time.Second)
	l.ttl = 200 * time.Millisecond // Consul's floor is 10s; shortened to keep the test quick
	l.renewEvery = 20 * time.Millisecond
	ctx, cancel := context.WithCancel(ctxTimeout(t, 30*time.Second))
	started := make(chan struct{}, 4)
	lost := make(chan struct{}, 4)
	done := make(chan error, 1)
	go func() {
		done <- l.Run(ctx, func(lctx context.Context) {
			started <- struct{}{}
			<-lctx.Done()
			if ctx.Err() == nil {
				lost <- struct{}{}
			}
		})
	}()
	wait := func(ch <-chan struct{}, what string) {
		t.Helper()
		select {
		case <-ch:
		case <-time.After(10 * time.Second):
			t.Fatal(what)
		}
	}
	wait(started, "never led")
	f.mu.Lock()
	f.failRenew = true
	f.mu.Unlock()
	wait(lost, "kept leading although no renewal succeeded for the TTL")
	f.mu.Lock()
	f.failRenew = false
	f.mu.Unlock()
	wait(started, "did not lead again once renewals worked")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// A Consul call cut short because the leadership ended is a cancellation,
// not Consul out of reach (issue 45's soak logged "cannot reach Consul
// ...: the lock key no longer names our session; is the Consul agent
// running there?" at every lost leadership).
func TestLeadEndedIsACancellationNotAnUnreachableConsul(t *testing.T) {
	c := testClient(t, "127.0.0.1:1")
	for _, cause := range []error{leadEnded{errLockLost}, leadEnded{fmt.Errorf("%w: Consul no longer knows session x", errSessionLost)}} {
		ctx, cancel := context.WithCancelCause(context.Background())
		cancel(cause)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPut, "http://127.0.0.1:1/v1/agent/service/register", nil)
		_, err := http.DefaultClient.Do(req)
		if err == nil {
			t.Fatal("a request on a cancelled context went through")
		}
		werr := c.wrap("register the activator stand-in for r", err)
		if !errors.Is(werr, context.Canceled) {
			t.Errorf("%v: not a cancellation", werr)
		}
		var ce *Error
		if errors.As(werr, &ce) || strings.Contains(werr.Error(), "cannot reach Consul") {
			t.Errorf("a lost leadership reported as Consul out of reach: %v", werr)
		}
		if !errors.Is(werr, errSessionLost) && !errors.Is(werr, errLockLost) {
			t.Errorf("%v: the cause is lost", werr)
		}
	}
}
