job "shop-00002" {
  region      = "eu"
  namespace   = "default"
  type        = "service"
  datacenters = ["eu-west-1a", "eu-west-1b"]
  node_pool   = "web"
  meta = {
    "serverless.concurrency" = "0"
    "serverless.generation"  = "2"
    "serverless.revision"    = "shop-00002"
    "serverless.service"     = "shop"
    "serverless.spec-hash"   = "sha256:4a22df5c003bab645838b888f96b28ee69fbd23dbca13a47031c3225b85350fa"
    "serverless.timeout"     = "5m0s"
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
  }

  constraint {
    attribute = "${meta.tier}"
    value     = "frontend"
    operator  = "="
  }

  update {
    max_parallel = 0
  }

  group "app" {
    count          = 1
    shutdown_delay = "10s"

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
      name     = "shop-00002"
      tags     = ["serverless", "service=shop", "traefik.enable=true", "traefik.http.routers.shop.rule=Host(`shop.example.com`)"]
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
        owner      = "shop-team"
        revision   = "shop-00002"
        service    = "shop"
        team       = "web"
      }
    }

    scaling {
      min     = 0
      max     = 50
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
        image        = "example/shop:1"
        network_mode = "bridge"
        ports        = ["app"]
      }

      env {
        K_CONFIGURATION = "shop"
        K_REVISION      = "shop-00002"
        K_SERVICE       = "shop"
        PORT            = "${NOMAD_PORT_app}"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }

    task "queue-proxy" {
      driver       = "raw_exec"
      kill_timeout = "30s"

      config {
        args    = ["sidecar"]
        command = "/usr/local/bin/nomad-serverless"
      }

      env {
        GOMAXPROCS                        = "1"
        PORT                              = "${NOMAD_PORT_http}"
        SERVERLESS_ADMIN_PORT             = "${NOMAD_PORT_admin}"
        SERVERLESS_APP_PORT               = "${NOMAD_PORT_app}"
        SERVERLESS_CONCURRENCY            = "0"
        SERVERLESS_DRAIN_GRACE            = "3s"
        SERVERLESS_DRAIN_TIMEOUT          = "29s"
        SERVERLESS_IDLE_TIMEOUT           = "0s"
        SERVERLESS_INSTANCE               = "${NOMAD_ALLOC_ID}"
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "0"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "shop-00002"
        SERVERLESS_SERVICE                = "shop"
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
