# grpc.hcl: a gRPC server. A plain gRPC server speaks only HTTP/2 without
# TLS (h2c), so the service says so: the sidecar then speaks h2c to it
# whatever the client spoke, and the gateway carries gRPC calls (unary and
# streaming, deadlines, metadata, trailers, cancellation) to it. Reach it
# with any gRPC client at greeter.default.<domain>:<gateway port>, e.g.
#   grpcurl -plaintext -authority greeter.default.localhost 127.0.0.1:8080 list

service "greeter" {
  image    = "ghcr.io/example/greeter:2.0.1"
  port     = 50051
  protocol = "h2c" # default "http1"

  # The standard grpc.health.v1 service answers readiness.
  readiness {
    grpc {}
  }

  concurrency = 100 # streams in the app at once, per instance
  timeout     = "30s"
}
