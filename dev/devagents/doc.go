// Package devagents starts and stops a local Consul dev agent and a Nomad dev
// agent for `nomad-serverless dev` and the e2e suite: one implementation of
// their configuration (loopback only, raw_exec enabled, Nomad registering in
// that Consul, ACLs optional), their ports (the ones given, the rest picked
// free), the waits for a Consul leader, a Nomad leader and a ready client
// node with a healthy raw_exec driver, and an orderly stop (SIGINT, then
// SIGKILL of the process group after a bound).
//
// Guarded (guard.go) covers the stops that never happen: a test binary (or
// any program) run under it has a guard process that, however the program
// ends, stops the agents it registered and kills every process left below
// it, Nomad's executors and tasks included.
//
// Its readiness checks speak plain HTTP to the agents' addresses rather than
// going through nomad/api and consul/api: their DefaultConfig reads NOMAD_*
// and CONSUL_* from the process environment, and a user's token, region or
// CA file meant for another cluster must not reach dev agents.
package devagents
