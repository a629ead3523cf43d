// Package e2e runs nomad-serverless end to end against real Nomad and Consul
// agents: the binary under test deploys services whose instances are real
// Nomad allocations (raw_exec: the binary's own test app behind its own
// sidecar), `serve` routes and scales them, and every scenario asserts what
// Nomad and Consul report (job counts, scaling events, allocations, health
// checks, config entries, the compiled discovery chain, KV), not only HTTP
// status codes.
//
// Where the agents come from (see Decide):
//   - NOMAD_ADDR and CONSUL_HTTP_ADDR set: those running agents;
//   - else `nomad` and `consul` on PATH: the suite starts a Consul dev agent
//     and a Nomad dev agent with dev/devagents, as `nomad-serverless
//     dev` does (loopback only, free ports, data in a temporary directory,
//     raw_exec enabled, Nomad registering in that Consul), and stops both at
//     the end;
//   - else it prints one line saying what it skipped and why. Plain
//     `go test ./e2e/` then passes (only the unit tests of this package's
//     helpers run); with `-args -require` (what `make e2e` passes) it fails,
//     so a skip is never mistaken for a pass.
//
// Run: make e2e   (or: go test -count=1 -v -timeout 30m ./e2e/ -args -require)
//
// Nothing outlives the run: TestMain runs the tests in a child of a guard
// process (devagents.Guarded) that, when a scenario panics, -timeout
// expires or the binary is interrupted or killed, stops the agents
// (SIGINT, then SIGKILL) and kills every process the suite started, Nomad's
// executors and tasks included. Scenario 99 proves it on purpose:
// -args -fail-on-purpose=fail|panic|hang|kill.
//
// Nomad's view lags: a client reports allocation status to the servers in
// batches, so a scenario waits (eventually, bounded) for what Nomad
// reports instead of reading it once, and never indexes a list it has not
// waited to hold what it needs.
//
// The scenarios drive the binary the way a user does (deploy, traffic,
// delete, serve, dev -deploy, install) and read its output where users read
// it (deploy's ready and URL lines, serve's admin API), then check what
// Nomad and Consul themselves say through their API clients.
//
// The files without _test hold pure helpers (the skip decision, deploy's
// output read back, the timing table, the cold-start split, the load
// client, the service files) with unit tests that need no agents.
package e2e
