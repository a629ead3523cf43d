job "report-00012" {
  namespace   = "tools"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "0"
    "serverless.generation"  = "12"
    "serverless.revision"    = "report-00012"
    "serverless.service"     = "report"
    "serverless.spec-hash"   = "sha256:566f626d9d44bf9bb0e3dd63d8c463dec2fdd2874ae1b06664a291af2bc0d81b"
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
      name     = "report-00012"
      tags     = ["serverless", "service=report"]
      port     = "http"
      provider = "consul"

      check {
        name     = "ready"
        type     = "http"
        path     = "/"
        port     = "http"
        interval = "2s"
        timeout  = "1s"

        header {
          K-Network-Probe = ["queue"]
        }
      }

      meta {
        admin-port = "${NOMAD_HOST_PORT_admin}"
        revision   = "report-00012"
        service    = "report"
      }
    }

    scaling {
      min     = 0
      max     = 1000
      enabled = false

      policy {
        serverless {
          activation_scale           = 1
          burst_capacity             = 211
          initial                    = 1
          max                        = 0
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
      driver       = "raw_exec"
      user         = "nobody"
      kill_timeout = "10s"
      leader       = true

      config {
        args    = ["serve", "--port", "${NOMAD_PORT_app}"]
        command = "/opt/report/bin/report"
      }

      env {
        K_CONFIGURATION = "report"
        K_REVISION      = "report-00012"
        K_SERVICE       = "report"
        PORT            = "${NOMAD_PORT_app}"
      }

      resources {
        cpu    = 250
        memory = 256
      }

      artifact {
        source      = "https://example.com/report.tar.gz"
        destination = "local/report"

        options {
          checksum = "sha256:abc123"
        }
      }

      template {
        destination = "secrets/db.env"
        data        = "DB_URL={{ key \"report/db\" }}\n"
        change_mode = "restart"
        env         = true
      }
    }

    task "queue-proxy" {
      driver       = "exec"
      kill_timeout = "10s"

      config {
        args    = ["sidecar"]
        command = "local/nomad-serverless"
      }

      env {
        GOMAXPROCS                        = "1"
        PORT                              = "${NOMAD_PORT_http}"
        SERVERLESS_ADMIN_PORT             = "${NOMAD_PORT_admin}"
        SERVERLESS_APP_PORT               = "${NOMAD_PORT_app}"
        SERVERLESS_CONCURRENCY            = "0"
        SERVERLESS_DRAIN_GRACE            = "3s"
        SERVERLESS_DRAIN_TIMEOUT          = "9s"
        SERVERLESS_IDLE_TIMEOUT           = "0s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_QUEUE_DEPTH            = "0"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "report-00012"
        SERVERLESS_SERVICE                = "report"
        SERVERLESS_TIMEOUT                = "5m0s"
      }

      resources {
        cpu    = 100
        memory = 48
      }

      artifact {
        source      = "https://releases.example.com/nomad-serverless_linux_amd64.tar.gz"
        destination = "local/"
      }
    }
  }
}
