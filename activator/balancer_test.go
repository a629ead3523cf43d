package activator

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
)

func testPool(n int, limit int32, policy Policy) *pool {
	p := &pool{limit: limit, policy: policy, rr: &atomic.Uint32{}}
	for i := range n {
		p.backends = append(p.backends, &backend{hostPort: fmt.Sprintf("127.0.0.1:%d", 1000+i)})
	}
	return p
}

func TestPolicyResolve(t *testing.T) {
	for _, tc := range []struct {
		limit int
		want  Policy
	}{{0, PolicyPowerOfTwo}, {1, PolicyLeastLoaded}, {3, PolicyLeastLoaded}, {4, PolicyLeastLoaded}, {100, PolicyLeastLoaded}} {
		if got := PolicyAuto.resolve(tc.limit); got != tc.want {
			t.Errorf("auto at concurrency %d = %s, want %s", tc.limit, got, tc.want)
		}
	}
	if got := PolicyLeastLoaded.resolve(1); got != PolicyLeastLoaded {
		t.Errorf("an explicit policy must not be replaced, got %s", got)
	}
	if _, err := ParsePolicy("random"); err == nil {
		t.Error("ParsePolicy accepted an unknown policy")
	}
}

// Every policy with a limit must never hand out more slots than the limit
// allows, under concurrent acquire/release.
func TestPoliciesNeverExceedLimit(t *testing.T) {
	for _, policy := range []Policy{PolicyFirstAvailable, PolicyRoundRobin, PolicyPowerOfTwo, PolicyLeastLoaded} {
		t.Run(string(policy), func(t *testing.T) {
			const limit = 2
			p := testPool(3, limit, policy)
			var over atomic.Int32
			var got atomic.Int64
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range 2000 {
						b := p.acquire()
						if b == nil {
							continue
						}
						got.Add(1)
						if b.inflight.Load() > limit {
							over.Add(1)
						}
						b.inflight.Add(-1)
					}
				}()
			}
			wg.Wait()
			if over.Load() > 0 {
				t.Fatalf("%d acquisitions saw more than %d in flight", over.Load(), limit)
			}
			if got.Load() == 0 {
				t.Fatal("no acquisition succeeded")
			}
			for _, b := range p.backends {
				if n := b.inflight.Load(); n != 0 {
					t.Fatalf("%s left with %d in flight", b.hostPort, n)
				}
			}
		})
	}
}

func TestFullPoolReturnsNil(t *testing.T) {
	for _, policy := range []Policy{PolicyFirstAvailable, PolicyRoundRobin, PolicyPowerOfTwo, PolicyLeastLoaded} {
		p := testPool(2, 1, policy)
		a, b := p.acquire(), p.acquire()
		if a == nil || b == nil || a == b {
			t.Fatalf("%s: two slots on two instances: got %v %v", policy, a, b)
		}
		if c := p.acquire(); c != nil {
			t.Fatalf("%s: third acquire on a full pool returned %s", policy, c.hostPort)
		}
		if p.free() {
			t.Fatalf("%s: free() on a full pool", policy)
		}
	}
	if (&pool{rr: &atomic.Uint32{}}).acquire() != nil {
		t.Fatal("empty pool returned a backend")
	}
}

func TestFirstAvailableFillsInOrder(t *testing.T) {
	p := testPool(3, 2, PolicyFirstAvailable)
	var got []string
	for range 6 {
		got = append(got, p.acquire().hostPort)
	}
	want := []string{"127.0.0.1:1000", "127.0.0.1:1000", "127.0.0.1:1001", "127.0.0.1:1001", "127.0.0.1:1002", "127.0.0.1:1002"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

func TestRoundRobinRotates(t *testing.T) {
	p := testPool(3, 10, PolicyRoundRobin)
	seen := map[string]int{}
	for range 9 {
		b := p.acquire()
		seen[b.hostPort]++
		b.inflight.Add(-1)
	}
	for _, b := range p.backends {
		if seen[b.hostPort] != 3 {
			t.Fatalf("round robin spread %v, want 3 each", seen)
		}
	}
}

func TestLeastLoadedAndP2CPreferIdle(t *testing.T) {
	for _, policy := range []Policy{PolicyLeastLoaded, PolicyPowerOfTwo} {
		p := testPool(2, 0, policy)
		p.backends[0].inflight.Store(50)
		for range 20 {
			if b := p.acquire(); b != p.backends[1] {
				t.Fatalf("%s picked the loaded instance", policy)
			}
		}
	}
}

// An ejected instance is never picked, by any policy, until restored; with
// every instance ejected there is no capacity (requests wait).
func TestEjectedInstanceIsSkippedUntilRestored(t *testing.T) {
	for _, policy := range []Policy{PolicyFirstAvailable, PolicyRoundRobin, PolicyPowerOfTwo, PolicyLeastLoaded} {
		for _, limit := range []int32{0, 10} {
			p := testPool(3, limit, policy)
			// The ejected one is also the least loaded: the trap the
			// issue measured (a dead instance answers fastest).
			p.backends[1].inflight.Store(1)
			p.backends[2].inflight.Store(1)
			if !p.backends[0].eject() || p.backends[0].eject() {
				t.Fatal("eject: exactly one call takes an instance out")
			}
			for range 50 {
				b := p.acquire()
				if b == nil || b == p.backends[0] {
					t.Fatalf("%s limit %d: picked %v, the ejected instance or none", policy, limit, b)
				}
				b.inflight.Add(-1)
			}
			p.backends[1].eject()
			p.backends[2].eject()
			if b := p.acquire(); b != nil || p.free() {
				t.Fatalf("%s limit %d: every instance ejected, yet %v picked (free=%v)", policy, limit, b, p.free())
			}
			if !p.backends[0].restore() || p.backends[0].restore() {
				t.Fatal("restore: exactly one call puts an instance back")
			}
			if b := p.acquire(); b != p.backends[0] {
				t.Fatalf("%s limit %d: the restored instance is not picked: %v", policy, limit, b)
			}
		}
	}
}

func BenchmarkAcquireRelease(b *testing.B) {
	for _, tc := range []struct {
		policy Policy
		limit  int32
	}{{PolicyFirstAvailable, 1}, {PolicyRoundRobin, 10}, {PolicyPowerOfTwo, 0}, {PolicyLeastLoaded, 10}} {
		b.Run(fmt.Sprintf("%s/cc=%d", tc.policy, tc.limit), func(b *testing.B) {
			p := testPool(10, tc.limit*1000, tc.policy)
			if tc.limit == 0 {
				p.limit = 0
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if bk := p.acquire(); bk != nil {
						bk.inflight.Add(-1)
					}
				}
			})
		})
	}
}
