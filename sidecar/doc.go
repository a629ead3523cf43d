// Package sidecar is the queue-proxy: the process every instance of every
// revision runs beside the user's task (`nomad-serverless sidecar`, Nomad
// task "queue-proxy"). Every request to the instance passes through it.
//
// # What it does
//
//   - Serves the "http" port (HTTP/1.1 and h2c) and proxies to the app on
//     127.0.0.1:<app port> in the protocol the app declared
//     (SERVERLESS_APP_PROTOCOL), whatever the client spoke: HTTP/1.1
//     requests to an HTTP/1.1 app through a synchronous pooled forwarder
//     (forward.go), HTTP/2 clients of such an app, websockets and other
//     upgrades through httputil.ReverseProxy over HTTP/1.1, and every
//     request to an h2c app (a gRPC server) over h2c. Plain HTTP/1.1
//     requests (no body, no upgrade) to an HTTP/1.1 app are served by
//     event loops of its own on Linux (evloop_linux.go: an epoll loop per
//     P, each request a state machine, no goroutine per request),
//     elsewhere and for an h2c app by a keep-alive loop
//     (package datapath/keepalive); either costs a fraction of net/http's
//     per-request work, and a connection goes to net/http at its first
//     request of any other kind (frontdoor.go). HTTP/2 clients of an h2c
//     app (the gateway, gRPC clients; h2c with prior knowledge) are
//     relayed frame by frame by datapath/h2relay (relayhandler.go: the
//     breaker, timeouts, stats and answers below, per stream), onto
//     pooled h2c connections to the app, unless tracing is on. Bodies stream both
//     ways; responses are flushed as bytes arrive; X-Forwarded-For gets the
//     client appended, other X-Forwarded-* and traceparent pass unchanged;
//     hop-by-hop headers are dropped.
//   - Faults (forward.go, handler.go): a request whose connection to the
//     app broke before any answer is sent again once on a new connection
//     when it is replayable (or nothing of it was written); one the app
//     did not serve and another instance may (nothing of it reached the
//     app, or it is replayable and the app died with it) gets a 502 with
//     spec.NotServedHeader, which the gateway retries elsewhere whatever
//     the method; the header is the sidecar's alone (removed from the
//     app's answers). The first connection the app refuses marks the
//     sidecar not ready at once, and readiness is probed every 25 ms
//     until the app is back (health.go).
//   - Exactly one response per request: a response that starts before the
//     request body was read to its end (after waiting a few ms for it)
//     says Connection: close, a body that breaks before the app answered
//     gets one 400 with Connection: close, and heads a front proxy could
//     frame differently (Content-Length with Transfer-Encoding, duplicate
//     Content-Length, obs-fold, chunked HTTP/1.0) are refused with 400
//     before anything reaches the app (keepalive.ScreenConn on every
//     connection net/http reads).
//   - Concurrency breaker (breaker.go): with concurrency N > 0 at most N
//     requests are in the app at once, up to the queue depth more wait in
//     arrival order, and beyond that requests get 503 at once with a body
//     saying why. With concurrency 0 there is no breaker on the path.
//   - Timeouts (exchange.go), Knative's: until the response starts,
//     timeout (from arrival, queueing included), response_start_timeout
//     and idle_timeout (both from leaving the queue) each answer 504; once
//     it has started only idle_timeout (the gap between body writes)
//     applies and cuts the connection, so a response that keeps flowing
//     may outlive timeout. Either way the slot and in-flight count are
//     released.
//   - Readiness (health.go, probe.go, grpchealth.go): runs the revision's
//     readiness probe (http, tcp, grpc health, exec) itself; with period 0,
//     every 25 ms until the first success, then every second. Without a
//     declared probe, a TCP connect to the app port. A request with header
//     K-Network-Probe: queue is answered by the sidecar (200 "queue" when
//     the app is ready and the sidecar is not draining, 503 otherwise) and
//     never reaches the app: the Consul check sends it, so Consul health
//     wraps the user's readiness.
//   - Liveness: the liveness probe, if declared, runs on its period;
//     GET /liveness on the admin port reflects it (200 / 503 with the last
//     error) for the Consul check with check_restart.
//   - Stats and metrics on the admin port (admin.go, meter.go,
//     metrics.go): GET /stats returns spec.Stats as JSON (average
//     concurrency, requests and RPS since the previous read, with the
//     instance's identity); GET /metrics is Prometheus text with the
//     nomad_serverless_sidecar_ prefix and labels service and revision.
//     Every admin route is read-only; nothing on the network can drain the
//     sidecar or change its state.
//   - Drain (sidecar.go): on SIGTERM the probe fails at once and
//     keep-alives stop; requests still arriving are served for the drain
//     grace; then the listener closes and in-flight and queued requests
//     finish, all within the drain timeout (before Nomad's kill_timeout).
//     The "drained" log line records how long it waited and how many
//     requests finished during the drain.
//   - Access log: one JSON line per request (method, path, status,
//     duration_ms, bytes, proto) when SERVERLESS_ACCESS_LOG=true or
//     -access-log; off by default.
//
// # Configuration
//
// The compiled Nomad job sets these environment variables on the
// queue-proxy task (spec.SidecarConfig.Env writes them,
// spec.ParseSidecarEnv reads and validates them; a bad value stops the
// sidecar at start with every problem named, exit code 2):
//
//	PORT                              serving port (the "http" port), required
//	SERVERLESS_APP_HOST               where the app listens (default 127.0.0.1; the node's
//	                                  address for a container with a published port)
//	SERVERLESS_APP_PORT               the app's port on that host, required
//	SERVERLESS_APP_PROTOCOL           what the app speaks: h2c, or empty/http1 for
//	                                  HTTP/1.1 (http readiness probes follow it)
//	SERVERLESS_ADMIN_PORT             stats, metrics, liveness port, required
//	SERVERLESS_SERVICE                service name (stats, metric label), required
//	SERVERLESS_REVISION               revision name (stats, metric label), required
//	SERVERLESS_INSTANCE               instance identity in stats (the allocation ID)
//	SERVERLESS_CONCURRENCY            requests in the app at once; 0 (default) = no limit
//	SERVERLESS_QUEUE_DEPTH            requests that may wait for the limit;
//	                                  default 10 x concurrency
//	SERVERLESS_TIMEOUT                whole request, Go duration; default 300s
//	SERVERLESS_RESPONSE_START_TIMEOUT wait for the response headers; 0 (default) = off
//	SERVERLESS_IDLE_TIMEOUT           gap between response body writes; 0 (default) = off
//	SERVERLESS_READINESS              readiness probe as JSON (spec.Probe); empty = TCP
//	                                  connect to the app port, probed every 25 ms until
//	                                  ready, then every second
//	SERVERLESS_LIVENESS               liveness probe as JSON (spec.Probe); empty = none
//	SERVERLESS_DRAIN_GRACE            after SIGTERM, how long new requests are still
//	                                  served; default 3s
//	SERVERLESS_DRAIN_TIMEOUT          bound on the whole drain; default 29s (kill_timeout - 1s)
//	SERVERLESS_ACCESS_LOG             "true" to log every request; default off
//
// Command line flags of `nomad-serverless sidecar` add what the job does
// not carry: -access-log (same as SERVERLESS_ACCESS_LOG=true) and
// -log-level.
//
// Exec probes run in the sidecar's task, beside the user's task: the
// command must exist there.
//
// # Stats format
//
// JSON, not protobuf: one small object per instance every two seconds costs
// nothing worth a binary format, the autoscaler decodes it with the standard
// library, and an operator can read it with curl. Reading /stats starts a
// new averaging window; that changes what the next read averages over, not
// how the sidecar behaves. Average concurrency counts requests queued or in
// the app (Knative's definition); in_flight likewise, queued the waiting
// part of it.
package sidecar
