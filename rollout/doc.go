// Package rollout rolls service files out to Nomad and Consul, client side
// (like `nomad job run`; no control plane needed): a Deployer plans every
// service first and writes nothing if any plan is refused, then registers
// each new revision (or updates its scaling in place), publishes the route,
// waits until the revision is ready, stops one that never is, and collects
// old revisions. Beside it: traffic changes (SetTraffic), revision
// retention (Collect), delete (Delete), and what `status` and `revisions`
// read of a service (Inspector, ExplainNotReady), and following its
// instances' logs (Logs).
//
// It talks to Nomad and Consul through small interfaces that nomadjob.Client
// and consulroute.Client satisfy, so its tests run against fakes. It
// writes its progress to the writers it is given; the command owns the
// terminal and the exit codes. Only the command (and dev) import it.
package rollout
