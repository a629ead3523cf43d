package autoscaler

import (
	"context"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A leader dies and another takes over with fresh state: it does not scale
// the busy revision down while its windows fill (two of the six instances
// the first leader asked for are still starting), and gives the idle one a
// whole scale-to-zero grace from the takeover, although the first leader
// had counted most of it already.
func TestNewLeaderKeepsBusyAndIdleRevisions(t *testing.T) {
	ctx := context.Background()
	first, cat, scr, sc, clk := newTestAutoscaler(t, nil)
	second, err := New(first.cfg) // the other replica: same cluster, own state
	if err != nil {
		t.Fatal(err)
	}
	const grace = 30 * time.Second
	cat.SetRevision(testRevision("busy-00001", 4, nil))
	cat.SetReady("busy-00001", instances("busy-00001", 4))
	cat.SetRevision(testRevision("idle-00001", 1, func(s *spec.Scaling) { s.ScaleToZeroGrace = grace }))
	cat.SetReady("idle-00001", instances("idle-00001", 1))
	scr.set("idle-00001-i0", 0)
	for _, in := range instances("busy-00001", 4) {
		scr.set(in.ID, 100) // 400 in all: 6 instances' worth at 70 each
	}

	l1 := startLoop(t, first)
	tickN(ctx, l1, clk, 12, 2*time.Second) // 24 s: the idle one is 24 s into its grace
	if calls := sc.Calls(); len(calls) != 1 || calls[0].Revision != "busy-00001" || calls[0].Count != 6 {
		t.Fatalf("the first leader scaled %+v, want the busy revision to 6 only", calls)
	}
	// The first leader dies (its loop simply stops) as the load drops to a
	// sixth: what a fresh decider sees first would ask for one instance.
	for _, in := range instances("busy-00001", 4) {
		scr.set(in.ID, 10)
	}
	took := clk.Now()
	l2 := startLoop(t, second)
	for clk.Now().Sub(took) < 60*time.Second {
		tickN(ctx, l2, clk, 1, 2*time.Second)
		for _, c := range sc.Calls() {
			if c.Revision == "busy-00001" && c.Count < 6 {
				t.Fatalf("the new leader scaled the busy revision down to %d %s after taking over: %q", c.Count, clk.Now().Sub(took), c.Reason)
			}
			if c.Revision == "idle-00001" && c.Count == 0 && clk.Now().Sub(took) < grace {
				t.Fatalf("the new leader scaled the idle revision to zero %s after taking over, within a grace of %s: %q", clk.Now().Sub(took), grace, c.Reason)
			}
		}
	}
	// It has decided the idle one to zero by now (a grace and a tick or two
	// after the takeover), and the busy one comes down once the hold is
	// over.
	toZero := false
	for _, c := range sc.Calls() {
		toZero = toZero || (c.Revision == "idle-00001" && c.Count == 0)
	}
	if !toZero {
		t.Errorf("the idle revision is still up a minute after the takeover: %+v", sc.Calls())
	}
	tickN(ctx, l2, clk, 3, 2*time.Second)
	if st, _ := second.State("busy-00001"); st.Desired >= 6 {
		t.Errorf("the busy revision is still held at %d after the stable window (%s: %s)", st.Desired, st.Rule, st.Reason)
	}
}
