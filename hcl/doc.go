// Package hcl is the service language of nomad-serverless: it parses `.hcl`
// service files (HCL2 with Nomad jobspec idioms) into validated spec.Service
// values, and reports every problem as a diagnostic with file:line:col, a
// summary and a detail saying how to fix it.
//
// A file holds variable blocks, locals blocks and one or more service
// blocks. Everything a service block leaves out keeps the default of
// spec.NewService.
//
//	variable "image" {
//	  type        = string
//	  default     = "nginx:1.27"
//	  description = "for readers of the file"
//	}
//
//	locals {
//	  host = "hello.example.com"
//	}
//
//	service "hello" {
//	  namespace   = "default"
//	  region      = "global"
//	  datacenters = ["dc1"]
//	  node_pool   = "default"
//	  constraint {                 # repeatable, passed to Nomad as written
//	    attribute = "${attr.kernel.name}"
//	    value     = "linux"
//	  }
//
//	  image = var.image            # shorthand for a docker task, which
//	  port  = 8080                 # takes beside it what a docker task
//	  env   = { GREETING = "hi" }  # sets first: port, protocol, env (map or
//	  resources { cpu = 100 }      # block), resources and args (the
//	  args  = ["--verbose"]        # container's arguments); or the long form:
//	  task {
//	    driver = "docker"
//	    config {                   # the driver's own config, any shape
//	      image = var.image
//	    }
//	    env = { GREETING = "hi" }  # or env { GREETING = "hi" }
//	    resources {
//	      cpu    = 100             # MHz
//	      memory = 128             # MiB
//	    }
//	    port         = 8080        # where the app listens (PORT)
//	    protocol     = "http1"     # what the app speaks there: "http1"
//	                               # (HTTP/1.1, the default) or "h2c" (HTTP/2
//	                               # without TLS: a plain gRPC server). The
//	                               # sidecar speaks it to the app whatever the
//	                               # client spoke, and probes over it
//	    user         = "nobody"
//	    kill_timeout = "30s"
//	    artifact { ... }           # repeatable: source destination mode options
//	    template { ... }           # repeatable: data|source destination change_mode env
//	    volume_mount {             # repeatable; with image, at the service level
//	      volume      = "data"     # a volume block's name
//	      destination = "/srv/data"
//	      read_only   = true
//	    }
//	  }
//
//	  # The task {} without a label (or image) is the one task that serves
//	  # traffic: only it takes port and protocol, and it has no lifecycle.
//	  # Named tasks run beside it, with what a Nomad task takes (driver,
//	  # config, env, resources, artifact, template, user, kill_timeout,
//	  # volume_mount) and a lifecycle hook:
//	  task "migrate" {
//	    driver = "docker"
//	    config { image = "ghcr.io/acme/migrate:7" }
//	    lifecycle {
//	      hook    = "prestart"     # before the app: an init step, run to the
//	                               # end (its failure fails the instance, and
//	                               # deploy shows its stderr); "poststart":
//	                               # once the app runs; "poststop": after the
//	                               # instance stopped
//	      sidecar = false          # true: keep it running beside the app
//	    }                          # (prestart or poststart); no lifecycle: a
//	  }                            # main task, started with the app
//
//	  volume "data" {              # repeatable: the group's volume requests
//	    type      = "host"         # a client's host_volume, or "csi"
//	    source    = "api-data"
//	    read_only = true
//	    # access_mode, attachment_mode, per_alloc: CSI only. A CSI volume
//	    # only one instance can claim (single-node-*, or
//	    # multi-node-single-writer written to) needs per_alloc = true or
//	    # scaling { max = 1 }
//	  }
//	  ephemeral_disk {             # the instance's scratch disk
//	    size    = 300              # MB
//	    sticky  = false            # keep it when Nomad replaces the instance
//	    migrate = false            # on its node, or move it to another
//	  }
//
//	  readiness {                  # exactly one of http, tcp, grpc, exec
//	    http {
//	      path    = "/healthz"
//	      headers = { "X-Probe" = "1" }
//	    }
//	    # tcp {}   grpc { service = "name" }   exec { command = ["/bin/check"] }
//	    port              = 8080   # default: the app's port; may also be
//	                               # written inside http, tcp or grpc
//	    initial_delay     = "0s"
//	    period            = "0s"   # 0: every 25ms until ready, then every 1s
//	    timeout           = "1s"
//	    success_threshold = 1
//	    failure_threshold = 3
//	  }
//	  liveness { ... }             # same syntax; period defaults to 10s
//
//	  concurrency            = 10  # requests per instance at once, 0 = no limit
//	  timeout                = "300s"
//	  response_start_timeout = "0s"
//	  idle_timeout           = "0s"
//
//	  scaling {
//	    min                        = 0
//	    max                        = 10    # 0 = unbounded
//	    initial                    = 1
//	    metric                     = "concurrency" # or "rps", "cpu", "memory"
//	    target                     = 100   # default 100, or 200 for rps, 80 (%) for cpu/memory
//	    utilization                = 70    # not for cpu/memory
//	    window                     = "60s"
//	    panic_window_percentage    = 10
//	    panic_threshold_percentage = 200
//	    scale_to_zero_grace        = "30s"
//	    scale_down_delay           = "0s"
//	    burst_capacity             = 211   # -1: activator always in the path
//	    activation_scale           = 1
//	    max_scale_up_rate          = 1000
//	    max_scale_down_rate        = 2
//	  }
//
//	  traffic {                    # repeatable; none means 100% to latest
//	    revision = "hello-00001"   # or latest = true
//	    percent  = 90
//	    tag      = "stable"        # also routes stable-hello.<ns>.<domain>
//	  }
//
//	  rollout {                    # how the latest share moves to a new
//	                               # revision; none, or no duration and no
//	                               # steps: all at once. A route setting:
//	                               # changing it makes no new revision
//	    duration = "5m"            # when every step passes: Knative's 1%
//	                               # first, then equal steps of one interval
//	                               # each (at most 99 steps; a longer
//	                               # duration holds each several intervals)
//	    steps    = [1, 5, 25, 50]  # or explicit: the new revision's percent
//	                               # of the latest targets' share, growing,
//	                               # 1 to 100 (a 100 is judged too); each is
//	                               # held one interval, or with duration
//	                               # duration/len(steps) in whole intervals
//	    analysis {                 # a step is judged every interval
//	      interval       = "15s"
//	      min_requests   = 20      # of the new revision; fewer: the step
//	                               # waits and counts on (after 10 such
//	                               # intervals it passes, unjudged)
//	      max_error_rate = "1%"    # its 5xx, and the gateway's 502/503/504
//	                               # for it, per request judged
//	      max_latency    = "1.5x"  # its p99 at most 1.5 times the previous
//	                               # revision's, or "300ms", or both:
//	                               # ["1.5x", "300ms"] (over either fails);
//	                               # default none
//	    }
//	  }                            # A failed step sends the whole share
//	                               # back to the previous revision. Pinned
//	                               # targets and tags stay as written; a
//	                               # rollout needs a latest target with a
//	                               # percent. The control plane's leader
//	                               # drives it (package canary); deploy
//	                               # prints every step and exits 1 on a
//	                               # rollback (README: Safe rollouts)
//
//	  network {
//	    mode         = "host"      # or "bridge"
//	    host_network = "private"   # clients' host_network for every port; default: theirs
//	  }
//	  connect {
//	    upstream {
//	      destination     = "db"
//	      local_bind_port = 5432
//	    }
//	  }
//	  tags    = ["traefik.enable=true"]
//	  meta    = { team = "web" }   # or meta { team = "web" }
//	  domains = [local.host]
//	  https {
//	    redirect = true            # answer plain HTTP with 308 to https://
//	  }
//	  visibility = "public"        # or "internal": the gateway's internal listener only
//	}
//
// The tasks start hook by hook: the prestart tasks (init steps run to
// their end, sidecars keep running), then the app, the queue-proxy and the
// named tasks without a hook together, then the poststart tasks; on stop
// Nomad stops the app first (it is the group's leader), then the other
// main tasks and the queue-proxy, then the sidecars, and runs the poststop
// tasks last. Beside a docker or podman app whose port is published in
// host networking the queue-proxy is a poststart sidecar instead (see
// nomadjob's sidecarLifecycle). Named tasks, volumes and the disk are part
// of the template: changing one makes a new revision.
//
// metric = "cpu" or "memory" scales on the serving task's use of its own
// resources block, as Knative's HPA class does: target is a percentage of
// the task's reserved cpu (MHz) or memory (MiB), per instance on average,
// read every autoscaler tick from Nomad's allocation stats (cpu: the MHz
// the task used; memory: its RSS, or its cgroup's usage where the client
// measures no RSS). The count is ceil(sum of the instances' percentages /
// target) with the same windows, panic mode, rates, bounds and delay as
// the request metrics; utilization and scale_to_zero_grace do not apply,
// nor does burst_capacity other than -1 (the activator is in the path only
// at zero, as with Knative's HPA class). Such a service
// never scales to zero: min defaults to 1 and validate refuses min = 0 (at
// zero there is nothing to measure and no request wakes it). An instance
// whose use cannot be read holds the count: missing stats never scale
// down. raw_exec, and docker without cpu_hard_limit, may use more cpu than
// reserved, so cpu can read above 100%; target stays at most 100.
//
// The gateway serves every name of a service (<service>.<namespace>.<domain>,
// tag names, domains) over HTTPS too, with a certificate from serve's
// files, from Consul, or from ACME (see `nomad-serverless serve -h`).
// https { redirect = true } sends plain HTTP requests for a name to HTTPS
// (308, method and body kept) once the gateway holds a valid certificate
// for that name; before that, and for ACME's HTTP-01 challenges, plain
// HTTP is served as without it. It changes the route, not the revision.
//
// visibility = "internal" is Knative's cluster-local: every name of the
// service (its own, its tags', its domains) gets on the gateway's public
// HTTP and HTTPS ports exactly the answer a name nobody routes gets (404,
// no redirect), and its revisions are not reachable there by
// X-Serverless-Revision either. It is served on the gateway's internal
// listener (serve -internal-listen; the install job's internal port, on
// each node's own address), with the same split, tags, queue and wake
// from zero, and through the mesh, where its revisions fail over to that
// listener (Consul service nomad-serverless-internal). The internal
// listener serves public services too, so services of the cluster call
// everything at one address. ACME orders no certificate for an internal
// name. "public" (the default) is served on every listener. Like https,
// it changes the route, not the revision.
//
// Durations are strings with a unit ("30s", "1m30s", "250ms"); a bare number
// is refused because its unit would be a guess. null means "not set".
// Expressions may use var.*, local.*, and the functions Nomad jobspecs offer
// (upper, lower, format, join, split, concat, merge, lookup, length,
// coalesce, min, max, jsonencode, jsondecode, replace, trimspace, try, can,
// ...). There is no env(): values come from outside only through variables,
// set (lowest precedence first) by their default, NOMAD_SERVERLESS_VAR_<name>,
// -var-file files and -var flags.
//
// Parsing is bounded whatever a file holds, so that checking files nobody
// reviewed (in CI, in a review bot) is safe: files up to 256 KiB, nesting up
// to 64 levels, values up to 10,000 elements and 1 MiB of strings, format
// widths up to 1024, and a budget of evaluation steps that nested loops
// multiply against. Going past one is an error diagnostic naming the bound
// (see limits.go).
//
// References Nomad resolves at run time, such as "${attr.kernel.name}",
// "${node.unique.id}", "${meta.rack}", "${NOMAD_PORT_app}" or "${PORT}", are
// kept as written, as in Nomad's own HCL2 jobspecs.
package hcl
