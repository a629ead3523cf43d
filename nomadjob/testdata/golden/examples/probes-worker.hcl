job "worker-00001" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "0"
    "serverless.generation"  = "1"
    "serverless.revision"    = "worker-00001"
    "serverless.service"     = "worker"
    "serverless.spec-hash"   = "sha256:0dfc30165d6e6cfff3cc56911f79fe769a78575384c1f352122407be70b6e813"
    "serverless.timeout"     = "5m0s"
  }

  update {
    max_parallel = 0
  }

  group "app" {
    count          = 1
    shutdown_delay = "5s"

    restart {
      interval = "1m0s"
      attempts = 3
      delay    = "1s"
      mode     = "fail"
    }

    reschedule {
      delay          = "5s"
      delay_function = "exponential"
      max_delay      = "1m0s"
      unlimited      = true
    }

    network {
      mode = "host"

      port "http" {}

      port "app" {
        to = 9000
      }

      port "admin" {}
    }

    service {
      name     = "worker-00001"
      tags     = ["serverless", "service=worker"]
      port     = "http"
      provider = "consul"

      check {
        name     = "ready"
        type     = "http"
        path     = "/"
        port     = "http"
        interval = "1s"
        timeout  = "1s"

        header {
          K-Network-Probe = ["queue"]
        }
      }

      check {
        name           = "liveness"
        type           = "http"
        path           = "/liveness"
        port           = "admin"
        interval       = "10s"
        timeout        = "5s"
        initial_status = "passing"
        task           = "user"

        check_restart {
          limit = 3
          grace = "10s"
        }
      }

      meta {
        admin-port = "${NOMAD_HOST_PORT_admin}"
        revision   = "worker-00001"
        service    = "worker"
      }
    }

    scaling {
      min     = 0
      max     = 3
      enabled = false

      policy {
        serverless {
          activation_scale           = 1
          burst_capacity             = 211
          initial                    = 1
          max                        = 3
          max_scale_down_rate        = 2
          max_scale_up_rate          = 1000
          metric                     = "concurrency"
          min                        = 0
          panic_threshold_percentage = 200
          panic_window_percentage    = 10
          scale_down_delay           = "0s"
          scale_to_zero_grace        = "30s"
          target                     = 100
          utilization                = 70
          window                     = "1m0s"
        }
      }
    }

    task "user" {
      driver       = "docker"
      kill_timeout = "30s"
      leader       = true

      config {
        args  = ["--listen", ":9000"]
        image = "ghcr.io/example/worker:0.9.0"
        ports = ["app"]
      }

      env {
        K_CONFIGURATION = "worker"
        K_REVISION      = "worker-00001"
        K_SERVICE       = "worker"
        PORT            = "9000"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }

    task "queue-proxy" {
      driver       = "raw_exec"
      kill_timeout = "30s"

      lifecycle {
        hook    = "poststart"
        sidecar = true
      }

      config {
        args    = ["sidecar"]
        command = "/usr/local/bin/nomad-serverless"
      }

      env {
        GOMAXPROCS                        = "1"
        PORT                              = "${NOMAD_PORT_http}"
        SERVERLESS_ADMIN_PORT             = "${NOMAD_PORT_admin}"
        SERVERLESS_APP_HOST               = "${NOMAD_IP_app}"
        SERVERLESS_APP_PORT               = "${NOMAD_HOST_PORT_app}"
        SERVERLESS_CONCURRENCY            = "0"
        SERVERLESS_DRAIN_GRACE            = "3s"
        SERVERLESS_DRAIN_TIMEOUT          = "29s"
        SERVERLESS_IDLE_TIMEOUT           = "0s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_LIVENESS               = "{\"type\":\"exec\",\"command\":[\"/bin/worker\",\"health\"],\"period\":10000000000,\"timeout\":5000000000,\"success_threshold\":1,\"failure_threshold\":3}"
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "0"
        SERVERLESS_READINESS              = "{\"type\":\"tcp\",\"period\":0,\"timeout\":1000000000,\"success_threshold\":1,\"failure_threshold\":3}"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "worker-00001"
        SERVERLESS_SERVICE                = "worker"
        SERVERLESS_TIMEOUT                = "5m0s"
      }

      resources {
        cpu    = 50
        memory = 64
      }

      logs {
        disabled = true
      }
    }
  }
}
