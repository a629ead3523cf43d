package rollout

import (
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A revision's scaling history (newest first) gives status its newest
// wake timeline and its newest reason to scale, which a timeline is not.
func TestScalingHistory(t *testing.T) {
	held := time.Unix(1_800_000_000, 0)
	tl := func(ms int) spec.WakeTimeline {
		return spec.NewWakeTimeline("hello", "hello-00001", "r1", "a", map[spec.WakeStep]time.Time{
			spec.WakeHeld: held.Add(time.Duration(ms) * time.Minute), spec.WakeFirstByte: held.Add(time.Duration(ms)*time.Minute + 500*time.Millisecond)})
	}
	newer, older := tl(2), tl(1)
	evs := []nomadjob.ScalingEvent{
		{Message: newer.Summary(), Meta: newer.ScalingMeta()},
		{Message: "no traffic for 30s", Meta: map[string]string{"rule": "idle"}},
		{Message: older.Summary(), Meta: older.ScalingMeta()},
		{Message: "wake: 1 request waiting at the activator"},
	}
	wake, last := scalingHistory("hello-00001", evs)
	if wake == nil || !wake.Held().Equal(newer.Held()) {
		t.Errorf("wake %+v, want the newer one", wake)
	}
	if last != "no traffic for 30s" {
		t.Errorf("last reason %q", last)
	}
	if wake, last := scalingHistory("x", nil); wake != nil || last != "" {
		t.Errorf("empty history: %v %q", wake, last)
	}
}
