job "nomad-serverless" {
  namespace   = "default"
  type        = "service"
  datacenters = ["*"]
  meta = {
    "nomad-serverless.domain"  = "example.com"
    "nomad-serverless.version" = "dev"
  }

  constraint {
    attribute = "${attr.kernel.name}"
    value     = "linux"
    operator  = "="
  }

  group "control-plane" {
    count = 2

    spread {
      attribute = "${node.unique.id}"
    }

    restart {
      interval = "1m0s"
      attempts = 5
      delay    = "1s"
      mode     = "delay"
    }

    update {
      max_parallel     = 1
      health_check     = "checks"
      min_healthy_time = "10s"
      healthy_deadline = "3m0s"
      auto_revert      = true
    }

    network {
      port "gateway" {
        static = 8080
      }

      port "admin" {
        static = 8081
      }

      port "https" {
        static = 443
      }

      port "internal" {
        static = 8082
      }
    }

    task "serve" {
      driver         = "docker"
      kill_timeout   = "35s"
      shutdown_delay = "5s"
      kill_signal    = "SIGTERM"

      config {
        args         = ["serve", "-listen", ":${NOMAD_PORT_gateway}", "-admin-listen", "${NOMAD_IP_admin}:${NOMAD_PORT_admin}", "-domain", "example.com", "-replica", "${NOMAD_ALLOC_ID}", "-https-port", "${NOMAD_PORT_https}", "-internal-listen", "${NOMAD_IP_internal}:${NOMAD_PORT_internal}", "-sockets", "${NOMAD_ALLOC_DIR}/gateway-sockets.sock"]
        image        = "ghcr.io/nomad-serverless/nomad-serverless:latest"
        network_mode = "host"
      }

      env {
        CONSUL_HTTP_ADDR = "127.0.0.1:8500"
        NOMAD_ADDR       = "unix://${NOMAD_SECRETS_DIR}/api.sock"
      }

      service {
        name     = "nomad-serverless-gateway"
        tags     = ["nomad-serverless", "gateway"]
        port     = "gateway"
        provider = "consul"

        check {
          name     = "serve healthz"
          type     = "http"
          path     = "/healthz"
          port     = "admin"
          interval = "5s"
          timeout  = "2s"
        }

        meta {
          domain = "example.com"
        }
      }

      resources {
        cpu    = 500
        memory = 256
      }

      template {
        destination = "secrets/tokens.env"
        data        = "{{ with nomadVar \"nomad/jobs/nomad-serverless\" -}}\nCONSUL_HTTP_TOKEN={{ .consul_token }}\n{{- end }}\n"
        change_mode = "restart"
        env         = true
      }

      identity {
        env = true
      }
    }

    task "sockets" {
      driver = "docker"
      user   = "root"

      lifecycle {
        hook    = "prestart"
        sidecar = true
      }

      config {
        args         = ["keep-sockets", "-socket", "${NOMAD_ALLOC_DIR}/gateway-sockets.sock", "-listen", ":${NOMAD_PORT_gateway}", "-https-listen", ":${NOMAD_PORT_https}", "-internal-listen", "${NOMAD_IP_internal}:${NOMAD_PORT_internal}", "-owner", "65532"]
        cap_add      = ["net_bind_service"]
        image        = "ghcr.io/nomad-serverless/nomad-serverless:latest"
        network_mode = "host"
      }

      resources {
        cpu    = 20
        memory = 32
      }
    }
  }
}
