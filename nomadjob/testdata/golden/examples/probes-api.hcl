job "api-00001" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "0"
    "serverless.generation"  = "1"
    "serverless.revision"    = "api-00001"
    "serverless.service"     = "api"
    "serverless.spec-hash"   = "sha256:9ab7f75e4644f2ef7af7279cc15090ac797d8455c1f99a91e1873ac326a82654"
    "serverless.timeout"     = "5m0s"
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
      name     = "api-00001"
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
        interval       = "10s"
        timeout        = "2s"
        initial_status = "passing"
        task           = "user"

        check_restart {
          limit = 3
          grace = "20s"
        }
      }

      meta {
        admin-port = "${NOMAD_HOST_PORT_admin}"
        revision   = "api-00001"
        service    = "api"
      }
    }

    scaling {
      min     = 1
      max     = 20
      enabled = false

      policy {
        serverless {
          activation_scale           = 1
          burst_capacity             = 211
          initial                    = 2
          max                        = 20
          max_scale_down_rate        = 2
          max_scale_up_rate          = 1000
          metric                     = "rps"
          min                        = 1
          panic_threshold_percentage = 200
          panic_window_percentage    = 20
          scale_down_delay           = "2m0s"
          scale_to_zero_grace        = "30s"
          target                     = 150
          utilization                = 70
          window                     = "30s"
        }
      }
    }

    task "user" {
      driver       = "docker"
      kill_timeout = "30s"
      leader       = true

      config {
        image = "ghcr.io/example/api:1.4.2"
        ports = ["app"]
      }

      env {
        K_CONFIGURATION = "api"
        K_REVISION      = "api-00001"
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
        SERVERLESS_CONCURRENCY            = "0"
        SERVERLESS_DRAIN_GRACE            = "3s"
        SERVERLESS_DRAIN_TIMEOUT          = "29s"
        SERVERLESS_IDLE_TIMEOUT           = "0s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_LIVENESS               = "{\"type\":\"http\",\"path\":\"/healthz\",\"initial_delay\":10000000000,\"period\":10000000000,\"timeout\":2000000000,\"success_threshold\":1,\"failure_threshold\":3}"
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "0"
        SERVERLESS_READINESS              = "{\"type\":\"http\",\"path\":\"/ready\",\"headers\":{\"X-Probe\":\"readiness\"},\"period\":0,\"timeout\":1000000000,\"success_threshold\":1,\"failure_threshold\":3}"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "api-00001"
        SERVERLESS_SERVICE                = "api"
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
