job "greeter-00001" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "100"
    "serverless.generation"  = "1"
    "serverless.revision"    = "greeter-00001"
    "serverless.service"     = "greeter"
    "serverless.spec-hash"   = "sha256:36a5492c3ccee09205f4689e2ded891d469b94cd7cd05216118aa3af646c4fce"
    "serverless.timeout"     = "30s"
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
        to = 50051
      }

      port "admin" {}
    }

    service {
      name     = "greeter-00001"
      tags     = ["serverless", "service=greeter"]
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
        revision   = "greeter-00001"
        service    = "greeter"
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
        image = "ghcr.io/example/greeter:2.0.1"
        ports = ["app"]
      }

      env {
        K_CONFIGURATION = "greeter"
        K_REVISION      = "greeter-00001"
        K_SERVICE       = "greeter"
        PORT            = "50051"
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
        SERVERLESS_APP_PROTOCOL           = "h2c"
        SERVERLESS_CONCURRENCY            = "100"
        SERVERLESS_DRAIN_GRACE            = "3s"
        SERVERLESS_DRAIN_TIMEOUT          = "29s"
        SERVERLESS_IDLE_TIMEOUT           = "0s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "1000"
        SERVERLESS_READINESS              = "{\"type\":\"grpc\",\"period\":0,\"timeout\":1000000000,\"success_threshold\":1,\"failure_threshold\":3}"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "greeter-00001"
        SERVERLESS_SERVICE                = "greeter"
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
