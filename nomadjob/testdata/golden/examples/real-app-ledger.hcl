job "ledger-00001" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "0"
    "serverless.generation"  = "1"
    "serverless.revision"    = "ledger-00001"
    "serverless.service"     = "ledger"
    "serverless.spec-hash"   = "sha256:7c95d5f4ff2d26b6ab5a45d2de4e838b15028fe226e13bfe145a768e4789cb7d"
    "serverless.timeout"     = "5m0s"
  }

  update {
    max_parallel = 0
  }

  group "app" {
    count          = 1
    shutdown_delay = "5s"

    volume "config" {
      type      = "host"
      source    = "ledger-config"
      read_only = true
    }

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

    ephemeral_disk {
      sticky  = false
      migrate = false
      size    = 1024
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
      name     = "ledger-00001"
      tags     = ["serverless", "service=ledger"]
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
        revision   = "ledger-00001"
        service    = "ledger"
      }
    }

    scaling {
      min     = 0
      max     = 10
      enabled = false

      policy {
        serverless {
          activation_scale           = 1
          burst_capacity             = 211
          initial                    = 1
          max                        = 10
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
        image = "ghcr.io/acme/ledger:3.4"
        ports = ["app"]
      }

      env {
        K_CONFIGURATION = "ledger"
        K_REVISION      = "ledger-00001"
        K_SERVICE       = "ledger"
        PORT            = "8080"
      }

      resources {
        cpu    = 200
        memory = 256
      }

      volume_mount {
        volume      = "config"
        destination = "/etc/ledger"
        read_only   = true
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
        SERVERLESS_LOG_FILE               = "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr"
        SERVERLESS_QUEUE_DEPTH            = "0"
        SERVERLESS_READINESS              = "{\"type\":\"http\",\"path\":\"/healthz\",\"period\":0,\"timeout\":1000000000,\"success_threshold\":1,\"failure_threshold\":3}"
        SERVERLESS_RESPONSE_START_TIMEOUT = "0s"
        SERVERLESS_REVISION               = "ledger-00001"
        SERVERLESS_SERVICE                = "ledger"
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

    task "migrate" {
      driver       = "docker"
      kill_timeout = "5s"

      lifecycle {
        hook = "prestart"
      }

      config {
        args  = ["migrate", "up"]
        image = "ghcr.io/acme/ledger:3.4"
      }

      env {
        K_CONFIGURATION = "ledger"
        K_REVISION      = "ledger-00001"
        K_SERVICE       = "ledger"
      }

      resources {
        cpu    = 100
        memory = 128
      }
    }

    task "vault-agent" {
      driver       = "docker"
      kill_timeout = "5s"

      lifecycle {
        hook    = "prestart"
        sidecar = true
      }

      config {
        args  = ["agent", "-config=/local/agent.hcl"]
        image = "hashicorp/vault:1.15"
      }

      env {
        K_CONFIGURATION = "ledger"
        K_REVISION      = "ledger-00001"
        K_SERVICE       = "ledger"
      }

      resources {
        cpu    = 50
        memory = 64
      }

      template {
        destination = "local/agent.hcl"
        data        = "vault { address = \"https://vault.service.consul:8200\" }\nauto_auth { method \"jwt\" { config = { role = \"ledger\" } } }\n"
      }
    }

    task "ship-logs" {
      driver       = "docker"
      kill_timeout = "5s"

      lifecycle {
        hook    = "poststart"
        sidecar = true
      }

      config {
        image = "fluent/fluent-bit:3.1"
      }

      env {
        K_CONFIGURATION = "ledger"
        K_REVISION      = "ledger-00001"
        K_SERVICE       = "ledger"
      }

      resources {
        cpu    = 50
        memory = 64
      }
    }
  }
}
