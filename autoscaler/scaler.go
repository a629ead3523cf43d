package autoscaler

import "context"

// Scaler sets a revision's instance count: nomadjob's Nomad client in
// production (Jobs().Scale on group "app"), a local process cluster in tests.
// reason is the human sentence shown in `nomad job scaling-events`; meta
// carries the numbers behind it (stable, panic, ...).
type Scaler interface {
	Scale(ctx context.Context, revision string, count int, reason string, meta map[string]string) error
}

// Raiser raises a revision's count to at least n and never lowers it:
// nomadjob's ScaleAtLeast (guarded by the job's modify index), used by
// every replica's Waker. raised tells whether this call changed the count.
type Raiser interface {
	ScaleAtLeast(ctx context.Context, revision string, n int, reason string, meta map[string]string) (raised bool, err error)
}
