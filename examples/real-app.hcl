# A real app from a Nomad shop: its database migration runs once before it
# starts serving (an init step), a Vault agent runs beside it, a log shipper
# starts once it runs, its configuration comes from a host volume, and it
# gets a larger scratch disk. `nomad-serverless render examples/real-app.hcl`
# shows the Nomad job.
service "ledger" {
  task {
    driver = "docker"
    config { image = "ghcr.io/acme/ledger:3.4" }
    port = 8080
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

  task "migrate" {
    driver = "docker"
    config {
      image = "ghcr.io/acme/ledger:3.4"
      args  = ["migrate", "up"]
    }
    lifecycle { hook = "prestart" }
  }

  task "vault-agent" {
    driver = "docker"
    config {
      image = "hashicorp/vault:1.15"
      args  = ["agent", "-config=/local/agent.hcl"]
    }
    template {
      data        = "vault { address = \"https://vault.service.consul:8200\" }\nauto_auth { method \"jwt\" { config = { role = \"ledger\" } } }\n"
      destination = "local/agent.hcl"
    }
    lifecycle {
      hook    = "prestart"
      sidecar = true
    }
    resources {
      cpu    = 50
      memory = 64
    }
  }

  task "ship-logs" {
    driver = "docker"
    config { image = "fluent/fluent-bit:3.1" }
    lifecycle {
      hook    = "poststart"
      sidecar = true
    }
    resources {
      cpu    = 50
      memory = 64
    }
  }

  volume "config" {
    type      = "host"
    source    = "ledger-config"
    read_only = true
  }

  ephemeral_disk {
    size = 1024
  }

  readiness {
    http { path = "/healthz" }
  }

  scaling {
    min = 0
    max = 10
  }
}
