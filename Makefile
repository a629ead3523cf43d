# nomad-serverless. Every target builds what it needs from nothing (Go
# modules come from the module proxy).
GO      ?= go
BIN     := bin/nomad-serverless
PKGS     = $(shell $(GO) list ./... | grep -v /e2e)

.PHONY: build test rules e2e e2e-scale soak e2e-rehearsal bench bench-scale bench-sidecar bench-gateway bench-grpc bench-tls lint demo fuzz fuzz-http clean

# CGO_ENABLED=0: a static binary, as the Dockerfile builds and ships. It
# also maps no libc or dynamic loader, which is 1.2 MiB of every sidecar's
# RSS (17.4 against 18.6 MiB peak in make bench-sidecar).
build:
	CGO_ENABLED=0 $(GO) build -o $(BIN) ./cmd/nomad-serverless

# Unit and component tests (real processes and HTTP on 127.0.0.1); e2e is separate.
# The proxies' socket reads and writes are raw system calls except under the
# race detector (datapath/rawio), so their packages also run without it.
test:
	$(GO) vet ./...
	$(GO) test -race -count=1 $(PKGS)
	$(GO) test -count=1 ./datapath/rawio/ ./datapath/keepalive/ ./activator/ ./sidecar/
	@$(MAKE) --no-print-directory rules

# The Prometheus rules (promtool's check and their unit tests in
# deploy/prometheus-rules.test.yml) and the Grafana dashboard's queries
# (each parsed as PromQL: written as a recording rule for promtool, since a
# JSON string is a YAML string, with the dashboard's variables given
# values). promtool comes with Prometheus: as root on Debian, make test
# installs the package when promtool is missing; otherwise one line says
# it skipped.
DASHBOARD := deploy/grafana-dashboard.json
rules:
	@if ! command -v promtool >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "make test: promtool is not on PATH; installing Debian's prometheus package for it"; \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null 2>&1 || \
			echo "make test: installing prometheus with apt-get failed"; \
	fi; \
	if ! command -v promtool >/dev/null 2>&1; then \
		echo "make test: SKIPPED promtool checks of deploy/prometheus-rules.yml and $(DASHBOARD): promtool is not on PATH (it comes with Prometheus: apt-get install prometheus)"; \
	else \
		promtool check rules deploy/prometheus-rules.yml && \
		promtool test rules deploy/prometheus-rules.test.yml && \
		tmp=$$(mktemp -d) && \
		{ echo 'groups: [{name: grafana-dashboard-queries, rules: ['; \
		  grep -o '"expr": *"\([^"\\]\|\\.\)*"' $(DASHBOARD) | \
		  sed 's/^"expr": *//; s/\$$__rate_interval/1m/g; s/\$$__range/1h/g; s/\$$service/web/g' | \
		  awk '{ printf "{record: \"grafana:query%d\", expr: %s},\n", NR, $$0 }'; \
		  echo ']}]'; } > $$tmp/dashboard-queries.yml && \
		promtool check rules $$tmp/dashboard-queries.yml; rc=$$?; rm -rf $$tmp; exit $$rc; \
	fi

# End-to-end against real Nomad and Consul agents; fails (does not pass) when
# they are missing, so a skip is never mistaken for a pass.
e2e: build
	$(GO) test -count=1 -v -timeout 30m ./e2e/ -args -require

# Scenario 21 alone: 3 serve replicas over REVISIONS revisions at zero on
# real agents (deploy throughput, the replicas' and agents' RSS, CPU and
# connections at idle, rebuild and tick times, list, status, wakes, leader
# failover, delete of all). Issue 45's run: make e2e-scale REVISIONS=10000.
REVISIONS ?= 1000
e2e-scale: build
	$(GO) test -count=1 -v -timeout 150m ./e2e/ -run TestE2E21 -args -require -revisions $(REVISIONS) -replicas 3

# Scenario 32 alone: the soak of issue 45 on real agents (a cluster of its
# own: a Nomad server, one node with its Consul agent, 4 serve replicas):
# 50 services with traffic (20 of them waking from zero again and again), a
# deploy a minute (good and bad in turn), a split change every 3 minutes, a
# replica kill -9 every 10 minutes (one for good), a Nomad client and a
# Consul agent restart. It prints a table (requests, failures by cause,
# slopes per replica) and writes it with a plot to SOAK_OUT. Not in CI:
# SOAK_DURATION=8m tries every fault once.
SOAK_DURATION ?= 60m
SOAK_OUT      ?= /tmp/nomad-serverless-soak
soak: build
	$(GO) test -count=1 -v -timeout 0 ./e2e/ -run TestE2E32 -args -require -soak-duration $(SOAK_DURATION) -soak-out $(SOAK_OUT)

# The e2e scenarios against test/fakecluster (a stand-in for Nomad and
# Consul that runs the allocations as real processes), for machines without
# the agents: it checks the suite and the wiring, and says loudly that it is
# not an end-to-end pass.
e2e-rehearsal: build
	$(GO) test -count=1 -v -timeout 20m ./e2e/ -args -rehearse

bench: bench-sidecar bench-gateway bench-tls bench-scale
	$(GO) test -run '^$$' -bench . -skip '^BenchmarkScale' -benchmem ./spec/ ./hcl/ ./autoscaler/ ./sidecar/ ./activator/

# The simulation benchmarks of issue 45: the route table, the revision
# states, the autoscaler tick and the catalog feed's bookkeeping at 1k, 10k
# and 100k revisions, then how each grows (bench/growth fails on a
# quadratic one). SCALEBENCH passes go test flags (-benchtime 3x for a
# quick look).
SCALEBENCH ?= -benchtime 5x
bench-scale:
	{ $(GO) test -run '^$$' -bench '^BenchmarkScale' -benchmem $(SCALEBENCH) ./activator/ ./autoscaler/ ./controlplane/ 2>&1 || echo "FAIL: go test"; } | $(GO) run ./bench/growth

# BENCHFLAGS passes loadbench flags: make bench-sidecar
# BENCHFLAGS='-duration 1s -rounds 2' for a quick look, BENCHFLAGS='-peers ""'
# to leave HAProxy and nginx out.
BENCHFLAGS ?=
bench-sidecar: build
	$(GO) run ./bench/loadbench -mode sidecar -bin $(BIN) $(BENCHFLAGS)

bench-gateway: build
	$(GO) run ./bench/loadbench -mode gateway -bin $(BIN) $(BENCHFLAGS)

# gRPC unary through gateway + sidecar against HAProxy (h2c on both sides)
# + the same sidecar, at 1 and 32 streams on one connection and at 32
# connections (grpc-go client and server; bench/ does not ship).
bench-grpc: build
	$(GO) run ./bench/loadbench -mode grpc -bin $(BIN) $(BENCHFLAGS)
	$(GO) run ./bench/loadbench -mode grpc-sidecar -bin $(BIN) $(BENCHFLAGS)

# The HTTPS port against HAProxy terminating TLS with the same certificate
# in front of the same sidecar (bench/loadbench/tls.go).
bench-tls: build
	$(GO) run ./bench/loadbench -mode tls -bin $(BIN) $(BENCHFLAGS)

# The HCL parser's fuzz target (make fuzz FUZZTIME=10m for longer).
# -fuzzminimizetime 1000x: Go minimizes every new interesting input, by
# default for up to 60 s in the worker, which reports no executions until
# it is done (the run shows 0/sec) and is restarted when the time runs out;
# a bound by count keeps the exec rate steady. Failing inputs are saved to
# hcl/testdata/fuzz/FuzzParse either way.
FUZZTIME ?= 60s
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParse -fuzztime $(FUZZTIME) -fuzzminimizetime 1000x ./hcl/

# The data path's parsers: the fast-path request parser against net/http's
# on the same bytes, the smuggling screens, and the gateway's HTTP/2
# listener against x/net/http2's Framer (one target at a time, as go test
# fuzzes one per package). An HTTP/2 input that makes the server send a
# GOAWAY for an error keeps its streams' handlers for net/http's 1 s
# shutdown timer, so that target minimizes 100 runs, not 1000.
fuzz-http:
	$(GO) test -run '^$$' -fuzz '^FuzzParseRequest$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 1000x ./datapath/keepalive/
	$(GO) test -run '^$$' -fuzz '^FuzzScreenStream$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 1000x ./datapath/keepalive/
	$(GO) test -run '^$$' -fuzz '^FuzzScreenHead$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 1000x ./datapath/h1/
	$(GO) test -run '^$$' -fuzz '^FuzzGatewayH2$$' -fuzztime $(FUZZTIME) -fuzzminimizetime 100x ./activator/

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
