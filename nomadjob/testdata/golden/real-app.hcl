job "ledger-00001" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "serverless.concurrency" = "0"
    "serverless.generation"  = "1"
    "serverless.revision"    = "ledger-00001"
    "serverless.service"     = "ledger"
    "serverless.spec-hash"   = "sha256:4f2f5697f56f95865668a92db1e211d75d3dfe753b304715b0aa0fabc5a6709c"
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

    volume "db" {
      type            = "csi"
      source          = "ledger-db"
      access_mode     = "single-node-writer"
      attachment_mode = "file-system"
      per_alloc       = true
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
      sticky  = true
      migrate = true
      size    = 1024
    }

    network {
      mode = "host"

      port "http" {}

      port "app" {}

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
      max     = 4
      enabled = false

      policy {
        serverless {
          activation_scale           = 1
          burst_capacity             = 211
          initial                    = 1
          max                        = 4
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
      driver       = "exec"
      kill_timeout = "30s"
      leader       = true

      config {
        command = "/opt/ledger/bin/ledger"
      }

      env {
        K_CONFIGURATION = "ledger"
        K_REVISION      = "ledger-00001"
        K_SERVICE       = "ledger"
        PORT            = "${NOMAD_PORT_app}"
      }

      resources {
        cpu    = 100
        memory = 128
      }

      volume_mount {
        volume      = "config"
        destination = "/etc/ledger"
        read_only   = true
      }

      volume_mount {
        volume      = "db"
        destination = "/var/lib/ledger"
        read_only   = false
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
      driver       = "exec"
      kill_timeout = "5s"

      lifecycle {
        hook = "prestart"
      }

      config {
        args    = ["migrate", "up"]
        command = "/opt/ledger/bin/ledger"
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

      volume_mount {
        volume      = "db"
        destination = "/var/lib/ledger"
        read_only   = false
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
        VAULT_ADDR      = "https://vault.service.consul:8200"
      }

      resources {
        cpu    = 50
        memory = 64
      }

      template {
        destination = "local/agent.hcl"
        data        = "auto_auth {}\n"
      }
    }

    task "ship-logs" {
      driver       = "docker"
      kill_timeout = "10s"

      lifecycle {
        hook    = "poststart"
        sidecar = true
      }

      config {
        image = "fluent/fluent-bit:3"
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

    task "cleanup" {
      driver       = "exec"
      kill_timeout = "5s"

      lifecycle {
        hook = "poststop"
      }

      config {
        args    = ["-rf", "/alloc/data/tmp"]
        command = "/bin/rm"
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
