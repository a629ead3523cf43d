package activator

import (
	"testing"
	"time"
)

// The wait before the next probe of a new allocation: none after a probe
// the sidecar held to its end, a short one after a refused connection (no
// sidecar yet), the interval after a sidecar's quick "not ready".
func TestNextProbe(t *testing.T) {
	const interval = 25 * time.Millisecond
	for _, c := range []struct {
		res        string
		took, hold time.Duration
		want       time.Duration
	}{
		{"not_ready", 2 * time.Second, 2 * time.Second, 0},
		{"error", 2*time.Second + time.Millisecond, 2 * time.Second, 0},
		{"error", 100 * time.Microsecond, 2 * time.Second, refusedRetry},
		{"not_ready", time.Millisecond, 2 * time.Second, interval},
		{"not_ready", time.Millisecond, 0, interval},
		{"error", time.Millisecond, 0, refusedRetry},
	} {
		if got := nextProbe(c.res, c.took, c.hold, interval); got != c.want {
			t.Errorf("nextProbe(%s, took %s, hold %s) = %s, want %s", c.res, c.took, c.hold, got, c.want)
		}
	}
	if got := nextProbe("error", time.Millisecond, time.Second, 2*time.Millisecond); got != 2*time.Millisecond {
		t.Errorf("a probe interval shorter than the refused retry: %s", got)
	}
}
