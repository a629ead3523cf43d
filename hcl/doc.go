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
//	}
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
