// Package canary is the rollout state machine of issue 42: it moves the
// traffic of a service's latest targets from the previous revision to a
// new one step by step, judges every step on what the gateway measured of
// both revisions, and sends the whole share back when a step fails.
//
// It is pure, like etcd's raft and the autoscaler's decider: no I/O, no
// goroutines, no clock. The caller (the control plane's leader) feeds it
// the time and per-revision measurements (Machine.Tick), tells it when a
// person took the route over (Machine.Interrupt) or when it loaded the
// state after a failover (Machine.Resume), and carries out what it
// returns: the split the route must hold, a revision to wake, and events
// for people and metrics.
//
// Its whole state is a plain JSON value (State), stored by the caller in
// Consul KV. The caller persists the state returned by Machine.State after
// every call that returned events, before it carries out the output (the
// route is a function of the state, so a leader that dies in between
// leaves a successor that applies the same split again, never an older
// one). A successor loads it (Load) and calls Resume: judgments already
// made are kept, the interval in flight starts again from the resume, so a
// failover skips nothing and repeats at most one interval.
//
// The parts, one file each: plan.go (the steps from a rollout block),
// histogram.go (a mergeable latency summary), measure.go (what is
// measured of a revision), judge.go (judging one window), machine.go (the
// state machine) and events.go (what it reports).
package canary
