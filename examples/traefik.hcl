# traefik.hcl: exposing a service through Traefik's Consul catalog provider.
# The tags below land on every revision's Consul service, so Traefik routes
# Host(whoami.example.com) to the service's ready instances. Every revision
# declares the same router and Traefik service name, which Traefik merges into
# one route across revisions. While a revision is scaled to zero the activator
# stands in for it in the catalog, so the first request wakes it.

locals {
  host = "whoami.example.com"
}

service "whoami" {
  task {
    driver = "docker"
    config {
      image = "traefik/whoami:v1.10"
      args  = ["--port", "8080"]
    }
    port = 8080
  }

  tags = [
    "traefik.enable=true",
    "traefik.http.routers.whoami.rule=Host(`${local.host}`)",
    "traefik.http.routers.whoami.entrypoints=web",
    "traefik.http.routers.whoami.service=whoami",
    "traefik.http.services.whoami.loadbalancer.passhostheader=true",
  ]

  meta = {
    team = "platform"
  }

  # While a revision sleeps at zero, Traefik sends the first request to the
  # activator's stand-in instance with this Host header: the gateway must
  # know it to wake the right revision.
  domains = [local.host]
}
