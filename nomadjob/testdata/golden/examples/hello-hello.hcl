job "hello-00001" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "50"
    "serverless.generation"  = "1"
    "serverless.revision"    = "hello-00001"
    "serverless.service"     = "hello"
    "serverless.spec-hash"   = "sha256:4d7f6c96d39e6966618231fd427ee770132c6cc03df7eb672b06ce636d684b5e"
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
        to = 80
      }

      port "admin" {}
    }

    service {
      name     = "hello-00001"
      tags     = ["serverless", "service=hello"]
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
        revision   = "hello-00001"
        service    = "hello"
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
      driver       = "docker"
      kill_timeout = "30s"
      leader       = true

      config {
        image = "nginxdemos/hello:plain-text"
        ports = ["app"]
      }

      env {
        GREETING        = "hello from nginxdemos/hello:plain-text"
        K_CONFIGURATION = "hello"
        K_REVISION      = "hello-00001"
        K_SERVICE       = "hello"
        PORT            = "80"
      }

      resources {
        cpu    = 100
        memory = 64
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
        SERVERLESS_CONCURRENCY            = "50"
        SERVERLESS_DRAIN_GRACE            = "3s"
        SERVERLESS_DRAIN_TIMEOUT          = "29s"
        SERVERLESS_IDLE_TIMEOUT           = "0s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "500"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "hello-00001"
        SERVERLESS_SERVICE                = "hello"
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
