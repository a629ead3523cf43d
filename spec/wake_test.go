package spec

import (
	"encoding/json"
	"slices"
	"testing"
	"time"
)

func wakeAt(ms ...float64) []time.Time {
	base := time.Unix(1_800_000_000, 0)
	out := make([]time.Time, len(ms))
	for i, m := range ms {
		out[i] = base.Add(time.Duration(m * float64(time.Millisecond)))
	}
	return out
}

// A timeline orders its steps by time (ties in the usual order), measures
// each from the held request and from the step before, names the missing
// ones, and reads back from a scaling event's meta and from JSON as it was.
func TestWakeTimelineOrderAndRoundTrips(t *testing.T) {
	at := wakeAt(0, 1, 1, 9, 400, 300, 310, 311, 500, 502, 503)
	tl := NewWakeTimeline("hello", "hello-00001", "r1", "alloc-1", map[WakeStep]time.Time{
		WakeHeld: at[0], WakeScaleWritten: at[1], WakeEvaluation: at[2], WakePlaced: at[3],
		WakeSidecarTask: at[4], WakeAppTask: at[5], WakeAppAccepted: at[6], WakeAppReady: at[7],
		WakeProbeReady: at[8], WakeSent: at[9], WakeFirstByte: at[10],
	})
	var order []WakeStep
	for _, s := range tl.Steps {
		order = append(order, s.Step)
	}
	want := []WakeStep{WakeHeld, WakeScaleWritten, WakeEvaluation, WakePlaced, WakeAppTask, WakeAppAccepted, WakeAppReady, WakeSidecarTask, WakeProbeReady, WakeSent, WakeFirstByte}
	if !slices.Equal(order, want) {
		t.Fatalf("order %v, want %v", order, want)
	}
	if s := tl.Steps[4]; s.Since != 300*time.Millisecond || s.Delta != 291*time.Millisecond {
		t.Errorf("app task: since %s delta %s, want 300ms and 291ms", s.Since, s.Delta)
	}
	if !slices.Equal(tl.Missing, []WakeStep{WakeSeen, WakeReceived, WakeSidecarUp, WakeConsulPassing}) {
		t.Errorf("missing %v", tl.Missing)
	}
	if fb, _ := tl.FirstByte(); fb != 503*time.Millisecond {
		t.Errorf("first byte %s", fb)
	}
	if ours, _ := tl.OurShare(); ours != 192*time.Millisecond {
		t.Errorf("our share %s, want 192ms (app ready at 311, first byte at 503)", ours)
	}
	// The app accepted before its sidecar's task started: fine, that
	// task's start is not the app's cause. Nothing is out of order.
	if bad := tl.OutOfOrder(0); len(bad) != 0 {
		t.Errorf("out of order: %v", bad)
	}

	meta := tl.ScalingMeta()
	back, ok := WakeTimelineFromMeta("hello-00001", meta)
	if !ok || back.Service != "hello" || back.Replica != "r1" || back.Alloc != "alloc-1" || len(back.Steps) != len(tl.Steps) {
		t.Fatalf("read back from meta %v: %+v %v", meta, back, ok)
	}
	for i := range back.Steps {
		if back.Steps[i].Step != tl.Steps[i].Step || !back.Steps[i].At.Equal(tl.Steps[i].At) || back.Steps[i].Delta != tl.Steps[i].Delta {
			t.Errorf("step %d read back as %+v, want %+v", i, back.Steps[i], tl.Steps[i])
		}
	}
	if _, ok := WakeTimelineFromMeta("x", map[string]string{"rule": "wake"}); ok {
		t.Error("another scaling event read as a timeline")
	}

	b, err := json.Marshal(tl)
	if err != nil {
		t.Fatal(err)
	}
	var fromJSON WakeTimeline
	if err := json.Unmarshal(b, &fromJSON); err != nil {
		t.Fatal(err)
	}
	if s := fromJSON.Steps[4]; s.Step != WakeAppTask || s.Since != 300*time.Millisecond || s.Delta != 291*time.Millisecond {
		t.Errorf("from JSON %s: %+v", b, s)
	}
}

// A step before its cause is named; clock slack forgives a little.
func TestWakeTimelineOutOfOrder(t *testing.T) {
	at := wakeAt(0, 10, 5)
	tl := NewWakeTimeline("s", "s-00001", "", "", map[WakeStep]time.Time{WakeHeld: at[0], WakeAppAccepted: at[1], WakeAppReady: at[2]})
	if bad := tl.OutOfOrder(0); len(bad) != 1 {
		t.Errorf("out of order %v, want app_ready before app_accepted", bad)
	}
	if bad := tl.OutOfOrder(10 * time.Millisecond); len(bad) != 0 {
		t.Errorf("out of order within slack: %v", bad)
	}
}

func TestInstanceTimesHeader(t *testing.T) {
	at := wakeAt(1, 2, 3)
	it := InstanceTimes{Started: at[0], AppAccepted: at[1], AppReady: at[2]}
	if got := ParseInstanceTimes(it.Header()); !got.Started.Equal(at[0]) || !got.AppAccepted.Equal(at[1]) || !got.AppReady.Equal(at[2]) {
		t.Errorf("round trip of %q: %+v", it.Header(), got)
	}
	if h := (InstanceTimes{Started: at[0]}).Header(); h != "started=1800000000001000000" {
		t.Errorf("header with the start only: %q", h)
	}
	if got := ParseInstanceTimes("started=x, app-ready=-1, nonsense, app-accepted=5"); !got.Started.IsZero() || !got.AppReady.IsZero() || got.AppAccepted.UnixNano() != 5 {
		t.Errorf("garbled header read as %+v", got)
	}
}
