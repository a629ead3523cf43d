# probes.hcl: readiness and liveness probes, scaling bounds and an rps metric.
# "api" is probed for readiness every 25ms until it first answers (period 0,
# so a new instance takes traffic as soon as it can) and for liveness every
# 10s; it scales on requests per second between 1 and 20 instances.
# "worker" in the same file shows tcp readiness and an exec liveness probe.

service "api" {
  task {
    driver = "docker"
    config {
      image = "ghcr.io/example/api:1.4.2"
    }
    port = 8080
  }

  readiness {
    http {
      path    = "/ready"
      headers = { "X-Probe" = "readiness" }
    }
    period            = "0s" # aggressive until the first success, then every second
    timeout           = "1s"
    failure_threshold = 3
  }

  liveness {
    http {
      path = "/healthz"
    }
    initial_delay     = "10s"
    period            = "10s"
    timeout           = "2s"
    failure_threshold = 3
  }

  scaling {
    min     = 1
    max     = 20
    initial = 2
    metric  = "rps"
    target  = 150 # requests per second per instance

    window                  = "30s"
    panic_window_percentage = 20
    scale_down_delay        = "2m"
  }
}

service "worker" {
  task {
    driver = "docker"
    config {
      image = "ghcr.io/example/worker:0.9.0"
      args  = ["--listen", ":9000"]
    }
    port = 9000
  }

  readiness {
    tcp {}
  }

  liveness {
    exec {
      command = ["/bin/worker", "health"]
    }
    timeout = "5s"
  }

  scaling {
    min = 0
    max = 3
  }
}
