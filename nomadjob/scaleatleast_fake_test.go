package nomadjob_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// Several replicas wake one revision at zero at once, some rounds while the
// leader scales it higher: exactly one wake changes the count, none fails,
// and a count the leader raised is never set back. Each replica has a
// client of its own, as each serve process does.
func TestScaleAtLeastConcurrentReplicas(t *testing.T) {
	c, leader := fakeClient(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	svc := sleepService()
	svc.Scaling.Min, svc.Scaling.Max = 0, 5
	if _, err := leader.Register(ctx, sleeper(t, &svc, 1), 0); err != nil {
		t.Fatal(err)
	}
	const rev, replicas = "stop-00001", 5
	wakers := make([]*nomadjob.Client, replicas)
	for i := range wakers {
		nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
		if err != nil {
			t.Fatal(err)
		}
		wakers[i] = nc
	}
	for round := range 8 {
		withLeader := round%2 == 1
		if err := leader.Scale(ctx, rev, 0, "test: back to zero", nil); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		start := make(chan struct{})
		raised := make([]bool, replicas)
		errs := make([]error, replicas)
		for i, nc := range wakers {
			wg.Go(func() {
				<-start
				raised[i], errs[i] = nc.ScaleAtLeast(ctx, rev, 1, "wake: test", map[string]string{"replica": string(rune('a' + i))})
			})
		}
		var leaderErr error
		if withLeader {
			wg.Go(func() {
				<-start
				leaderErr = leader.Scale(ctx, rev, 3, "panic: test burst", nil)
			})
		}
		close(start)
		wg.Wait()
		n := 0
		for i := range wakers {
			if errs[i] != nil {
				t.Errorf("round %d: replica %d: %v", round, i, errs[i])
			}
			if raised[i] {
				n++
			}
		}
		if leaderErr != nil {
			t.Fatalf("round %d: leader: %v", round, leaderErr)
		}
		count, _ := c.Nomad.Count("default", rev, "app")
		switch {
		case withLeader && count != 3:
			t.Errorf("round %d: count %d after the leader scaled to 3 alongside the wakes: a wake set it back", round, count)
		case !withLeader && count != 1:
			t.Errorf("round %d: count %d after the wakes, want 1", round, count)
		}
		if n > 1 || (!withLeader && n != 1) {
			t.Errorf("round %d (leader scaling too: %v): %d wakes changed the count, want exactly one (or none after the leader)", round, withLeader, n)
		}
	}
}
