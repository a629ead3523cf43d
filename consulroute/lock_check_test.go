package consulroute

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The leader lock bound to the replica's activator check, on the fake
// cluster: a dead leader's session ends with its check, the lock delay
// holds the key that long and no longer, a stopping leader hands on at
// once, and a waiting replica blocks on the key. The same cases run
// against a real agent in TestLive (liveLockBoundToCheck): the real agent
// is the truth, the fake must agree.
func TestLockBoundToTheActivatorCheck(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 50 * time.Millisecond})
	lockBoundToCheck(t, c.Consul.Addr(), 50*time.Millisecond, 300*time.Millisecond)
}

// cutProxy stands between one replica and Consul, as its process's link
// to the agent: Cut ends every request in flight and refuses the rest,
// which is what the agent sees of a replica killed with SIGKILL (no
// release, no renewal). It counts the requests per path.
type cutProxy struct {
	srv *httptest.Server

	mu     sync.Mutex
	cut    bool
	cancel []context.CancelFunc
	count  map[string]int
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0) // cut requests are the point
	p := &cutProxy{count: map[string]int{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			cancel()
			panic(http.ErrAbortHandler) // the connection drops, no answer
		}
		p.count[r.Method+" "+r.URL.Path]++
		p.cancel = append(p.cancel, cancel)
		p.mu.Unlock()
		defer cancel()
		rp.ServeHTTP(w, r.WithContext(ctx))
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *cutProxy) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

func (p *cutProxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.cancel {
		c()
	}
}

func (p *cutProxy) requests(methodPath string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.count[methodPath]
}

// lockReplica is one replica as far as the lock goes: its admin /healthz
// (what its activator check polls), its registration, and its Lock.
type lockReplica struct {
	name    string
	c       *Client
	proxy   *cutProxy
	healthy atomic.Bool
	admin   *httptest.Server
	lock    *Lock

	leading atomic.Bool
	ledAt   atomic.Pointer[time.Time]
	cancel  context.CancelFunc
	done    chan struct{}
}

func startLockReplica(t *testing.T, consulAddr, name, key string, interval, lockDelay time.Duration) *lockReplica {
	t.Helper()
	target := consulAddr
	if !strings.Contains(target, "://") {
		target = "http://" + target
	}
	r := &lockReplica{name: name, proxy: newCutProxy(t, target), done: make(chan struct{})}
	r.healthy.Store(true)
	r.admin = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if !r.healthy.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	}))
	t.Cleanup(r.admin.Close)
	r.c = testClient(t, r.proxy.addr(), WithReplica(name), WithWaitTime(time.Minute), WithBackoff(20*time.Millisecond, 200*time.Millisecond))
	adminPort := r.admin.Listener.Addr().(*net.TCPAddr).Port
	ctx := ctxTimeout(t, 10*time.Second)
	if err := r.c.RegisterActivator(ctx, ActivatorRegistration{Address: "127.0.0.1", Port: adminPort, AdminPort: adminPort,
		CheckInterval: interval, CheckTimeout: time.Second, DeregisterAfter: time.Minute}); err != nil {
		t.Fatal(err)
	}
	// What is left of a replica when a test ends, from a client of its own
	// (the replica's link may be cut).
	t.Cleanup(func() {
		cl := testClient(t, consulAddr, WithReplica(name))
		_ = cl.DeregisterActivator(context.Background(), "")
	})
	r.lock = r.c.NewLock(key, name, LockTTL, WithLockDelay(lockDelay), WithSessionCheck(spec.ActivatorServiceName, r.c.ActivatorCheckID("")))
	return r
}

func (r *lockReplica) run(t *testing.T, leaders *atomic.Int32) {
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() {
		defer close(r.done)
		_ = r.lock.Run(ctx, func(lctx context.Context) {
			if n := leaders.Add(1); n > 1 {
				t.Errorf("%s leads while %d others do", r.name, n-1)
			}
			now := time.Now()
			r.ledAt.Store(&now)
			r.leading.Store(true)
			<-lctx.Done()
			r.leading.Store(false)
			leaders.Add(-1)
		})
	}()
	t.Cleanup(func() { r.stop(t) })
}

// stop ends the replica gracefully (SIGTERM): Run releases and returns.
func (r *lockReplica) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	select {
	case <-r.done:
	case <-time.After(20 * time.Second):
		t.Errorf("%s: Run did not return after its context ended", r.name)
	}
}

func waitUntil(t *testing.T, timeout time.Duration, what string, f func() bool) time.Duration {
	t.Helper()
	timeout = testbin.Bound(timeout)
	start := time.Now()
	for !f() {
		if time.Since(start) > timeout {
			t.Fatalf("not within %s: %s", timeout, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
	return time.Since(start)
}

// followKey follows the key with blocking queries from a client of its
// own; the func it returns tells the holder it last saw and when the key
// was last seen freed.
func followKey(t *testing.T, consulAddr, key string) func() (holder string, freed time.Time) {
	t.Helper()
	cl := testClient(t, consulAddr, WithWaitTime(5*time.Second))
	var mu sync.Mutex
	var holder string
	var freed time.Time
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		var index uint64
		for ctx.Err() == nil {
			p, meta, err := cl.api.KV().Get(key, cl.blocking(ctx, index))
			if err != nil {
				sleep(ctx, 20*time.Millisecond)
				continue
			}
			index = nextIndex(index, meta.LastIndex)
			mu.Lock()
			switch {
			case p == nil || p.Session == "":
				if holder != "" || freed.IsZero() {
					freed = time.Now()
				}
				holder = ""
			default:
				holder = string(p.Value)
			}
			mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return func() (string, time.Time) {
		mu.Lock()
		defer mu.Unlock()
		return holder, freed
	}
}

func lockBoundToCheck(t *testing.T, consulAddr string, interval, lockDelay time.Duration) {
	key := LeaderKeyPrefix + "check-" + strings.ReplaceAll(t.Name(), "/", "-")
	t.Cleanup(func() {
		_, _ = testClient(t, consulAddr).api.KV().Delete(key, nil)
	})
	suffix := fmt.Sprint(time.Now().UnixNano() % 1e6)
	var leaders atomic.Int32
	key0 := followKey(t, consulAddr, key)

	// a's check starts critical: Consul refuses a session bound to it, so
	// the lock waits (blocking on the check) until it passes.
	a := startLockReplica(t, consulAddr, "a"+suffix, key, interval, lockDelay)
	a.healthy.Store(false)
	a.run(t, &leaders)
	time.Sleep(3 * interval)
	if a.leading.Load() {
		t.Fatal("a leads although the check its session must be bound to never passed")
	}
	a.healthy.Store(true)
	waitUntil(t, 30*time.Second, "a leads once its check passes", a.leading.Load)

	// b's own session has a lock delay of a minute: it matters when b
	// hands the lock on below, and it is not the delay b waits out when a
	// dies (that is a's).
	b := startLockReplica(t, consulAddr, "b"+suffix, key, interval, time.Minute)
	b.run(t, &leaders)
	waitUntil(t, 30*time.Second, "b has a session and waits on the key", func() bool {
		return b.proxy.requests("GET /v1/kv/"+key) >= 1
	})
	// Waiting is one blocking read of the key at a time, not polling.
	before := b.proxy.requests("GET /v1/kv/" + key)
	time.Sleep(5 * interval)
	if n := b.proxy.requests("GET /v1/kv/"+key) - before; n > 1 || b.leading.Load() {
		t.Errorf("b read the key %d times while a held it (leading %v): want it blocked on the key's index", n, b.leading.Load())
	}

	// a dies (SIGKILL): nothing of it reaches Consul any more (no release,
	// no renewal) and its /healthz is gone. Its session ends with its
	// check, and b takes the key once the lock delay of a's session is
	// over.
	killed := time.Now()
	a.proxy.Cut()
	a.stop(t) // its release and destroy cannot reach Consul
	a.admin.CloseClientConnections()
	a.admin.Close()
	waitUntil(t, 30*time.Second, "b leads after a died", b.leading.Load)
	took := time.Since(killed)
	_, freed := key0()
	ledAt := *b.ledAt.Load()
	t.Logf("a killed -> key free after %s -> b leads after %s (check interval %s, lock delay %s)",
		freed.Sub(killed).Round(time.Millisecond), ledAt.Sub(killed).Round(time.Millisecond), interval, lockDelay)
	if ledAt.Sub(freed) < lockDelay/2 {
		t.Errorf("b took the key %s after it was freed, within the lock delay %s", ledAt.Sub(freed), lockDelay)
	}
	if took >= 2*LockTTL {
		t.Errorf("takeover took %s: it waited for the session's TTL, not for the check", took)
	}
	waitUntil(t, 30*time.Second, "the key names b", func() bool { h, _ := key0(); return h == b.name })

	// b stops (SIGTERM) and c, waiting, leads at once although b's session
	// has a lock delay of a minute: a release hands on without it.
	c := startLockReplica(t, consulAddr, "c"+suffix, key, interval, lockDelay)
	c.run(t, &leaders)
	waitUntil(t, 30*time.Second, "c waits on the key", func() bool { return c.proxy.requests("GET /v1/kv/"+key) >= 1 })
	stopped := time.Now()
	b.stop(t)
	waitUntil(t, 30*time.Second, "c leads after b stopped", c.leading.Load)
	t.Logf("b stopped -> c leads after %s", time.Since(stopped).Round(time.Millisecond))

	// c's check fails while c lives (a pause, a wedged admin server):
	// Consul ends its session, c sees its key change and steps down, and
	// once the check passes again c leads again with a new session, after
	// the lock delay of the old one.
	c.healthy.Store(false)
	waitUntil(t, 30*time.Second, "c steps down when its check fails", func() bool { return !c.leading.Load() })
	waitUntil(t, 30*time.Second, "the key is free once the check of its holder failed", func() bool { h, _ := key0(); return h == "" })
	c.healthy.Store(true)
	waitUntil(t, 30*time.Second, "c leads again once its check passes", c.leading.Load)
}
