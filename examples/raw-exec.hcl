# raw-exec.hcl: runs this repository's own test app (`nomad-serverless
# testapp`) with the raw_exec driver, so no container runtime is needed.
# The e2e tests and `nomad-serverless dev` deploy it. Scaling is tuned to
# react within seconds: a short stable window, a short scale-to-zero grace
# and a low target, so a handful of concurrent requests adds instances.
#
#   nomad-serverless deploy -var binary=$PWD/bin/nomad-serverless examples/raw-exec.hcl

variable "binary" {
  type        = string
  default     = "nomad-serverless"
  description = "Path (or name on PATH) of the nomad-serverless binary on the Nomad clients."
}

service "testapp" {
  task {
    driver = "raw_exec"
    config {
      command = var.binary
      args    = ["testapp"]
    }
    kill_timeout = "5s" # the sidecar drains within this
  }

  concurrency = 10

  scaling {
    min                 = 0
    max                 = 5
    initial             = 1
    target              = 5 # concurrent requests per instance
    window              = "6s"
    scale_to_zero_grace = "5s"
  }
}
