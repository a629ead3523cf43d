# nomad-serverless. Every target builds what it needs from nothing (Go
# modules come from the module proxy).
GO      ?= go
BIN     := bin/nomad-serverless
PKGS     = $(shell $(GO) list ./... | grep -v /e2e)

.PHONY: build test e2e e2e-scale e2e-rehearsal bench bench-sidecar bench-gateway lint demo fuzz clean

# CGO_ENABLED=0: a static binary, as the Dockerfile builds and ships. It
# also maps no libc or dynamic loader, which is 1.2 MiB of every sidecar's
# RSS (17.4 against 18.6 MiB peak in make bench-sidecar).
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/nomad-serverless

# Unit and component tests (real processes and HTTP on 127.0.0.1); e2e is separate.
# The proxies' socket reads and writes are raw system calls except under the
# race detector (internal/rawio), so their packages also run without it.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 $(PKGS)
	$(GO) test -count=1 ./internal/rawio/ ./internal/keepalive/ ./activator/ ./sidecar/

# End-to-end against real Nomad and Consul agents; fails (does not pass) when
# they are missing, so a skip is never mistaken for a pass.
e2e: build
	$(GO) test -count=1 -v -timeout 30m ./e2e/ -args -require

# Scenario 21 alone: one serve over 1,000 revisions at zero on real agents
# (deploy throughput, serve's idle RSS, CPU and Consul connections, a cold
# start among them).
e2e-scale: build
	$(GO) test -count=1 -v -timeout 30m ./e2e/ -run TestE2E21 -args -require -revisions 1000

# The e2e scenarios against internal/fakecluster (a stand-in for Nomad and
# Consul that runs the allocations as real processes), for machines without
# the agents: it checks the suite and the wiring, and says loudly that it is
# not an end-to-end pass.
e2e-rehearsal: build
	$(GO) test -count=1 -v -timeout 20m ./e2e/ -args -rehearse

bench: bench-sidecar bench-gateway
	$(GO) test -run '^$$' -bench . -benchmem ./spec/ ./hcl/ ./autoscaler/ ./sidecar/ ./activator/

bench-sidecar: build
	$(GO) run ./internal/loadbench -mode sidecar -bin $(BIN)

bench-gateway: build
	$(GO) run ./internal/loadbench -mode gateway -bin $(BIN)

fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime 60s ./hcl/

lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); exit 1)
	$(GO) vet ./...

# Deploys examples/raw-exec.hcl onto Nomad and Consul dev agents and wakes it
# from zero; without nomad and consul on PATH, says where to get them and runs
# the local demonstration (dev -demo) instead.
demo: build
	$(BIN) dev -deploy examples/raw-exec.hcl -or-demo

clean:
	rm -rf bin
