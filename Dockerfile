# syntax=docker/dockerfile:1
# The one nomad-serverless binary: CLI, control plane (serve) and queue-proxy
# sidecar. Build:  docker build -t nomad-serverless:dev --build-arg VERSION=dev .
# Run:    docker run --rm --network host nomad-serverless:dev serve -domain example.com

FROM golang:1.26 AS build
WORKDIR /src
# Modules first, so a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
# Static binary (no cgo) so it runs on distroless/static, and on any Linux
# node when the exec or raw_exec driver fetches it as an artifact.
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION}" \
      -o /out/nomad-serverless ./cmd/nomad-serverless

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/nomad-serverless /usr/local/bin/nomad-serverless
USER nonroot:nonroot
# Gateway and admin API of `serve`; the sidecar's ports are chosen by Nomad.
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/nomad-serverless"]
CMD ["serve"]
