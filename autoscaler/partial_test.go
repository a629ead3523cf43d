package autoscaler

import (
	"context"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A revision listed before its job is read (catalog.Revision.Partial: a
// replica just started, or the new leader after a failover) has no
// scaling the autoscaler may act on: whatever its placeholder says and
// whatever it sees, no scale call, and no excess burst capacity published
// (the gateway keeps the activator in its path). Once its job is read it
// is decided from a fresh state, as a new leader decides: no data keeps the
// count, min applies.
func TestLoopDoesNotDecideARevisionNotReadYet(t *testing.T) {
	quick := func(s *spec.Scaling) { s.Window = 6 * time.Second; s.ScaleToZeroGrace = 2 * time.Second }
	cases := []struct {
		name      string
		count     int                 // the instances the listing's summary shows
		ready     int                 // passing instances
		load      float64             // concurrency each reports
		demand    int                 // requests held at an activator
		whole     func(*spec.Scaling) // the scaling its job says, read later
		wholeCnt  int                 // its count as the job says
		wantAfter int                 // the first call once read
	}{
		{name: "running, idle: not scaled down on a placeholder's grace", count: 2, ready: 2, whole: quick, wholeCnt: 2, wantAfter: 1},
		{name: "running, loaded: not scaled up before its max is known", count: 1, ready: 1, load: 500,
			whole: func(s *spec.Scaling) { quick(s); s.Max = 3 }, wholeCnt: 1, wantAfter: 3},
		{name: "at rest: its min is not applied before it is known", count: 0,
			whole: func(s *spec.Scaling) { quick(s); s.Min = 2 }, wholeCnt: 0, wantAfter: 2},
		{name: "at zero with requests held: left to the Waker's raise", count: 0, demand: 3, whole: quick, wholeCnt: 0, wantAfter: 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			a, cat, scr, sc, clk := newTestAutoscaler(t, nil)
			name := "hello-00001"
			r := testRevision(name, tc.count, nil)
			r.Partial = true
			cat.SetRevision(r)
			cat.SetReady(name, instances(name, tc.ready))
			for i := range tc.ready {
				scr.set(instances(name, tc.ready)[i].ID, tc.load)
			}
			l := startLoop(t, a)
			report := func() {
				if tc.demand > 0 {
					if err := a.ReportDemand(ctx, "activator-1", []Demand{{Revision: name, Queued: tc.demand}}); err != nil {
						t.Fatal(err)
					}
				}
			}
			for range 15 { // 30 s: window, grace and scale-down delays several times over
				report()
				tickN(ctx, l, clk, 1, 2*time.Second)
			}
			if calls := sc.Calls(); len(calls) != 0 {
				t.Fatalf("scale calls %+v for a revision whose scaling is not read", calls)
			}
			if _, known := a.ExcessBurstCapacity(name); known {
				t.Error("an excess burst capacity published for a revision not decided")
			}
			// Its job is read.
			w := testRevision(name, tc.wholeCnt, tc.whole)
			cat.SetRevision(w)
			for i := 0; i < 15 && len(sc.Calls()) == 0; i++ {
				report()
				tickN(ctx, l, clk, 1, 2*time.Second)
			}
			calls := sc.Calls()
			if len(calls) == 0 || calls[0].Count != tc.wantAfter {
				t.Fatalf("calls once read %+v, want the first to %d", calls, tc.wantAfter)
			}
		})
	}
}
