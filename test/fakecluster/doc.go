// Package fakecluster is a test tool: a fake Nomad agent and a fake Consul
// agent on 127.0.0.1, wired together like `nomad agent -dev` beside
// `consul agent -dev`, so the real CLI and `serve` can run together in tests
// where real Nomad and Consul cannot be installed.
//
// It implements exactly the endpoints this repository calls (through
// nomadjob, consulroute and the HashiCorp API clients), with the paths,
// query parameters, status codes, headers (X-Nomad-Index, X-Consul-Index),
// JSON shapes and error texts of the recorded Nomad 1.6 / Consul 1.16
// exchanges in test/fixtures/testdata; fixtures_test.go holds it to them.
// Anything else answers 404 "not implemented by the fake".
//
// Nomad (one server and one client node in one):
//   - jobs: register (EnforceIndex/JobModifyIndex conflicts, PreserveCounts,
//     versions, an unchanged spec writes nothing), read, list (prefix,
//     namespace=*, and the filter subset: Meta["k"] == "v", "k" in Meta,
//     top-level fields, and/or/not), deregister and purge;
//   - scaling: the scaling block's bounds (400 as fixture 013), scaling
//     events with message and meta (20 kept per group, every call in
//     ScaleRequests), scale status;
//   - allocations: list (all=false: the job's current incarnation), read
//     with AllocatedResources ports, client and desired status, task states
//     and task events with Nomad's DisplayMessage;
//   - the event stream (/v1/event/stream): ndjson, topics Job and
//     Allocation with keys, namespace, index, heartbeats, and a buffer of
//     the last 100 events, as Nomad keeps;
//   - a scheduler and client: when a count changes it places or stops
//     allocations (highest index first), replaces failed ones after the
//     reschedule delay, and runs them for real: raw_exec only (command and
//     args, NOMAD_* variables, ${...} interpolation, the host environment
//     minus Nomad's denylist, dynamic ports from the OS on 127.0.0.1),
//     prestart sidecar tasks before main tasks, the restart policy (then
//     "Not Restarting", the sibling killed, the allocation failed), and on
//     stop: Consul deregistration, the group's shutdown_delay, the kill
//     signal (SIGINT unless kill_signal says otherwise) to main tasks, then
//     to sidecars, SIGKILL after kill_timeout. Task output goes to
//     <alloc>/alloc/logs/<task>.stdout.0 and, optionally, Options.TaskOutput.
//
// Consul (one agent, one node):
//   - KV with cas, acquire and release, recurse, deletes with cas;
//   - sessions: create, renew, destroy, TTL expiry (after twice the TTL, as
//     Consul does), behaviors release and delete, lock delay (applied when
//     a session holding a key ends, not on release; at most 60 s); bound
//     to checks (NodeChecks, default serfHealth, and ServiceChecks): refused
//     on a critical or unregistered check, and invalidated in the write
//     that turns one critical or removes it (as real Consul 1.16 does:
//     consulroute's TestLive/LockBoundToCheck runs the same cases there);
//   - config entries service-defaults, proxy-defaults, service-router,
//     service-splitter and service-resolver: set (cas too), get, list,
//     delete, validated as Consul does for what routing needs (splitter
//     weights add to 100; one protocol across a chain, failover targets
//     included; an L7 protocol for routers and splitters; deletions too);
//   - the compiled discovery chain in fixture 037's shape;
//   - agent service registration and deregistration with checks; HTTP and
//     TCP checks really run at their interval (first run staggered), HTTP
//     ones with the check's method and headers; a check critical longer
//     than DeregisterCriticalServiceAfter removes its service;
//   - /v1/health/service/<name> with passing and tag filters;
//   - blocking queries (index and wait) on KV, health and config entries;
//   - /v1/agent/self and /v1/status/leader (both agents).
//
// What it simplifies, so a test must not read more into a pass:
//   - one node, no real scheduling: every allocation fits; constraints,
//     datacenters, node pools, resources (CPU, memory) and affinities are
//     ignored; no deployments, canaries or update strategies (revision
//     jobs turn deployments off anyway); no evaluations endpoint;
//   - only the raw_exec driver and host networking: docker, exec, bridge
//     mode, Connect sidecars, artifacts and templates fail the allocation
//     with a message saying so; lifecycle hooks other than prestart
//     sidecars are refused the same way;
//   - the restart policy's "delay" mode behaves as "fail"; check_restart
//     is registered but never restarts a task; script and gRPC checks are
//     registered as TTL checks nobody updates;
//   - Nomad registers services by calling the fake Consul directly, not
//     over HTTP, so a Consul fault does not stop registrations;
//   - ACLs, tokens and namespaces are not enforced: any namespace exists,
//     every token may do everything unless a Fault says otherwise;
//   - a single raft index per agent, without leader elections, snapshots
//     or garbage collection of terminal allocations;
//   - Consul updates a check's index only when its status changes (its
//     output changes silently), and serfHealth is always passing.
//
// Time is real; Options shortens what tests wait for (check interval,
// shutdown delay, reschedule delay, heartbeats). Nothing shortens session
// TTLs: a lock's leader steps down after one TTL without renewal because
// Consul frees its key only after two, and a fake that expired sooner would
// test a cluster that cannot exist. Faults: Down/Up close and reopen an
// agent's listener (connection refused meanwhile, open streams and blocking
// queries break), SetFault answers matching requests with a status such as
// 403. Every process the cluster starts is stopped on Close and every loop
// ends with it.
package fakecluster
