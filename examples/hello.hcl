# hello.hcl: a docker web app rolled out as a 90/10 canary.
# Nine requests in ten go to the pinned revision hello-00001 (tag "stable"),
# one in ten to the latest revision (tag "canary", also reachable on its own
# at canary-hello.<namespace>.<domain>). The gateway also serves the extra
# domains listed below. Deploy it once with traffic { latest = true
# percent = 100 } to create hello-00001, then change the image and deploy this.

variable "image" {
  type        = string
  default     = "nginxdemos/hello:plain-text"
  description = "Container image of the app."
}

variable "canary_percent" {
  type    = number
  default = 10
}

service "hello" {
  task {
    driver = "docker"
    config {
      image = var.image
    }
    port = 80 # where the image listens; the sidecar proxies to it

    env {
      GREETING = "hello from ${var.image}"
    }

    resources {
      cpu    = 100 # MHz
      memory = 64  # MiB
    }
  }

  concurrency = 50 # requests one instance handles at once

  traffic {
    revision = "hello-00001"
    percent  = 100 - var.canary_percent
    tag      = "stable"
  }

  traffic {
    latest  = true
    percent = var.canary_percent
    tag     = "canary"
  }

  domains = ["hello.example.com", "www.hello.example.com"]
}
