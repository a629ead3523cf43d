job "api-00003" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "10"
    "serverless.generation"  = "3"
    "serverless.revision"    = "api-00003"
    "serverless.service"     = "api"
    "serverless.spec-hash"   = "sha256:945fe46f94a8c2c8f25cc469485e33d96943c24125aa73a722815838d9c025eb"
    "serverless.timeout"     = "30s"
  }

  update {
    max_parallel = 0
  }

  group "app" {
    count          = 2
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
        to = 8080
      }

      port "admin" {}
    }

    service {
      name     = "api-00003"
      tags     = ["serverless", "service=api"]
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
        interval       = "5s"
        timeout        = "2s"
        initial_status = "passing"
        task           = "user"

        check_restart {
          limit = 4
          grace = "13s"
        }
      }

      meta {
        admin-port = "${NOMAD_HOST_PORT_admin}"
        revision   = "api-00003"
        service    = "api"
      }
    }

    scaling {
      min     = 1
      max     = 5
      enabled = false

      policy {
        serverless {
          activation_scale           = 1
          burst_capacity             = -1
          initial                    = 2
          max                        = 5
          max_scale_down_rate        = 2
          max_scale_up_rate          = 1000
          metric                     = "rps"
          min                        = 1
          panic_threshold_percentage = 200
          panic_window_percentage    = 10
          scale_down_delay           = "30s"
          scale_to_zero_grace        = "30s"
          target                     = 50
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
        image = "example/api:7"
        ports = ["app"]
      }

      env {
        K_CONFIGURATION = "api"
        K_REVISION      = "api-00003"
        K_SERVICE       = "api"
        PORT            = "8080"
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
        SERVERLESS_CONCURRENCY            = "10"
        SERVERLESS_DRAIN_GRACE            = "3s"
        SERVERLESS_DRAIN_TIMEOUT          = "29s"
        SERVERLESS_IDLE_TIMEOUT           = "5s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_LIVENESS               = "{\"type\":\"http\",\"path\":\"/healthz\",\"initial_delay\":3000000000,\"period\":5000000000,\"timeout\":2000000000,\"success_threshold\":1,\"failure_threshold\":4}"
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "100"
        SERVERLESS_READINESS              = "{\"type\":\"http\",\"path\":\"/ready\",\"headers\":{\"X-Probe\":\"ready\"},\"period\":0,\"timeout\":1000000000,\"success_threshold\":1,\"failure_threshold\":3}"
        SERVERLESS_RESPONSE_START_TIMEOUT = "10s"
        SERVERLESS_REVISION               = "api-00003"
        SERVERLESS_SERVICE                = "api"
        SERVERLESS_TIMEOUT                = "30s"
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
