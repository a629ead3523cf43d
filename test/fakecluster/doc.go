// Package fakecluster is a test tool: a fake Nomad agent and a fake Consul
// agent on 127.0.0.1, wired together like `nomad agent -dev` beside
// `consul agent -dev`, for `make test` on machines without the agents and
// for `make e2e-rehearsal`. Real agents run every e2e scenario (`make e2e`).
//
// It serves only what this repository's tests use (nomadjob, consulroute,
// the CLI and serve, the e2e suite), with the paths, parameters, status
// codes, index headers, JSON shapes and error texts of the recorded Nomad
// 1.6 and Consul 1.16 exchanges in test/fixtures/testdata; fixtures_test.go
// holds it to them. Anything else answers 404 "not implemented by the
// fake". When the real agents and the fake disagree, the agents are right.
//
// Nomad: jobs (optimistic concurrency, PreserveCounts, versions, an
// unchanged job writes nothing; list by prefix and go-bexpr filter, stop,
// purge), scaling within the scaling block's bounds with scaling events,
// allocations (list, read, stop, and their stats: CPU and RSS of each
// task's process group, measured as raw_exec does), the event stream
// (topics Job, Allocation and the Evaluation of a deregistration; Nomad's
// buffer of 100 events; heartbeats), and one client node that runs
// allocations for real:
// raw_exec only, host networking with ports from the OS, ${NOMAD_*}
// interpolation, prestart sidecars before main tasks, the restart and
// reschedule policies, and on stop the Consul deregistration, shutdown
// delay, kill signal and kill timeout, main tasks before sidecars. A client
// reports its allocations' changes in batches, as a real one does.
//
// Consul: KV (cas, acquire, release, recurse, keys), sessions (TTL, lock
// delay, bound to checks: refused on a critical one, ended when one turns
// critical or goes), config entries (service-defaults, routers, splitters,
// resolvers, validated as a routing graph) and the compiled discovery
// chain, agent service registration with HTTP checks that really run, TTL
// and alias checks, health and catalog reads, and blocking queries (index
// and wait) on all of them.
//
// What it simplifies, so a test must not read more into a pass: one node;
// no constraints, resources, deployments or evaluations; only raw_exec; no
// ACLs (any token, any namespace) unless a Fault says otherwise; one raft
// index per agent; serfHealth always passes; check_restart never restarts.
//
// Time is real; Options shortens what tests wait for, except session TTLs.
// Down and Up close and reopen an agent's listener; SetFault answers
// matching requests with an error status. Close stops every process and
// goroutine the cluster started.
package fakecluster
