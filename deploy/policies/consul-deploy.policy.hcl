# Users of nomad-serverless deploy, traffic, revisions, status, list and delete.

# service-defaults, service-splitter, service-router and service-resolver
# entries are named after the service and its revisions.
service_prefix "" {
  policy = "write"
}

# deploy reads instances' health while it waits for them.
node_prefix "" {
  policy = "read"
}

# The last applied copy of each service.
key_prefix "nomad-serverless/services/" {
  policy = "write"
}

# serve's tracing settings (OTEL_*), compiled into each new revision's sidecar.
key "nomad-serverless/tracing" {
  policy = "read"
}

# The control plane's own keys, the admin API's keyring among them: whoever
# reads it can scale every revision through the admin API. The gateway's TLS
# private keys are there too (nomad-serverless/control-plane/tls/).
key_prefix "nomad-serverless/control-plane/" {
  policy = "deny"
}
