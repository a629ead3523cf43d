job "testapp-00001" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "10"
    "serverless.generation"  = "1"
    "serverless.revision"    = "testapp-00001"
    "serverless.service"     = "testapp"
    "serverless.spec-hash"   = "sha256:a0379c02f989f2d62220dea51e592b45f2b5452f917132082ed30d161a3f8e65"
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

      port "app" {}

      port "admin" {}
    }

    service {
      name     = "testapp-00001"
      tags     = ["serverless", "service=testapp"]
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

      meta {
        admin-port = "${NOMAD_HOST_PORT_admin}"
        revision   = "testapp-00001"
        service    = "testapp"
      }
    }

    scaling {
      min     = 0
      max     = 5
      enabled = false

      policy {
        serverless {
          activation_scale           = 1
          burst_capacity             = 211
          initial                    = 1
          max                        = 5
          max_scale_down_rate        = 2
          max_scale_up_rate          = 1000
          metric                     = "concurrency"
          min                        = 0
          panic_threshold_percentage = 200
          panic_window_percentage    = 10
          scale_down_delay           = "0s"
          scale_to_zero_grace        = "5s"
          target                     = 5
          utilization                = 70
          window                     = "6s"
        }
      }
    }

    task "user" {
      driver       = "raw_exec"
      kill_timeout = "5s"
      leader       = true

      config {
        args    = ["run-task", "--", "nomad-serverless", "testapp"]
        command = "/usr/local/bin/nomad-serverless"
      }

      env {
        K_CONFIGURATION = "testapp"
        K_REVISION      = "testapp-00001"
        K_SERVICE       = "testapp"
        PORT            = "${NOMAD_PORT_app}"
      }

      resources {
        cpu    = 100
        memory = 128
      }

      logs {
        disabled = true
      }
    }

    task "queue-proxy" {
      driver       = "raw_exec"
      kill_timeout = "5s"

      config {
        args    = ["sidecar"]
        command = "/usr/local/bin/nomad-serverless"
      }

      env {
        GOMAXPROCS                        = "1"
        PORT                              = "${NOMAD_PORT_http}"
        SERVERLESS_ADMIN_PORT             = "${NOMAD_PORT_admin}"
        SERVERLESS_APP_PORT               = "${NOMAD_PORT_app}"
        SERVERLESS_CONCURRENCY            = "10"
        SERVERLESS_DRAIN_GRACE            = "2s"
        SERVERLESS_DRAIN_TIMEOUT          = "4s"
        SERVERLESS_IDLE_TIMEOUT           = "0s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "100"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "testapp-00001"
        SERVERLESS_SERVICE                = "testapp"
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
