package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/certs"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// The gateway under test runs in its own process, as `serve` would, so its
// CPU is measured apart from the load generator's: the benchmark starts its
// own executable again with envGatewayChild set, and the child serves a
// gateway over a fixed catalog (gatewayChildConfig) instead of running a
// mode.
const envGatewayChild = "LOADBENCH_GATEWAY_CHILD"

// envCPUProfile, in the gateway's environment (-proxy-env), names a file
// for its CPU profile.
const envCPUProfile = "LOADBENCH_CPUPROFILE"

// gatewayChildConfig is the child's whole configuration, JSON in
// envGatewayChild.
type gatewayChildConfig struct {
	Listen string            `json:"listen"`
	Policy activator.Policy  `json:"policy"`
	Routes []gatewayBenchSvc `json:"routes"`
	// TLSListen, when set, is an HTTPS port beside Listen, with the
	// certificates in CertFiles (tls.go).
	TLSListen string           `json:"tls_listen,omitempty"`
	CertFiles []certs.FilePair `json:"cert_files,omitempty"`
}

// gatewayBenchSvc is one service with one revision and its instances
// (sidecar addresses), listed ready as Consul would.
type gatewayBenchSvc struct {
	Service     string   `json:"service"`
	Concurrency int      `json:"concurrency"`
	Instances   []string `json:"instances"`
}

func (s gatewayBenchSvc) revision() string { return spec.RevisionName(s.Service, 1) }

func (s gatewayBenchSvc) host() string { return s.Service + ".default." + activator.DefaultDomain }

// steadyAutoscaler stands for an autoscaler that has decided every revision
// has plenty of spare capacity (the steady state the throughput runs
// measure): the activator stays out of the path, demand goes nowhere.
type steadyAutoscaler struct{}

func (steadyAutoscaler) ReportDemand(context.Context, string, []autoscaler.Demand) error { return nil }
func (steadyAutoscaler) Wake(context.Context, string, autoscaler.Demand) error           { return nil }
func (steadyAutoscaler) ExcessBurstCapacity(string) (float64, bool)                      { return 1000, true }

func runGatewayChild(js string) error {
	var cfg gatewayChildConfig
	if err := json.Unmarshal([]byte(js), &cfg); err != nil {
		return fmt.Errorf("%s: %w", envGatewayChild, err)
	}
	cat := catalog.New()
	for _, r := range cfg.Routes {
		rev := r.revision()
		cat.SetRevision(catalog.Revision{Name: rev, Service: r.Service, Namespace: spec.DefaultNamespace,
			Generation: 1, Concurrency: r.Concurrency, Timeout: 30 * time.Second, Scaling: spec.DefaultScaling(), Desired: len(r.Instances)})
		var ready []consulroute.Instance
		for i, addr := range r.Instances {
			host, portS, err := net.SplitHostPort(addr)
			if err != nil {
				return err
			}
			port, _ := strconv.Atoi(portS)
			ready = append(ready, consulroute.Instance{ID: rev + "-" + strconv.Itoa(i), Revision: rev, Address: host, Port: port})
		}
		cat.SetReady(rev, ready)
		cat.SetService(catalog.Service{Name: r.Service, Namespace: spec.DefaultNamespace, Route: consulroute.Route{
			Service: r.Service, Namespace: spec.DefaultNamespace, Splits: []consulroute.Split{{Revision: rev, Percent: 100}}}})
	}
	// -proxy-env OTEL_EXPORTER_OTLP_ENDPOINT=...,OTEL_TRACES_SAMPLER=...
	// traces the gateway as serve would.
	tp, err := tracing.New(context.Background(), tracing.Options{ServiceName: "loadbench-gateway"})
	if err != nil {
		return err
	}
	if tp != nil {
		defer tp.Shutdown(context.Background())
	}
	g, err := activator.New(activator.Config{Catalog: cat, Autoscaler: steadyAutoscaler{}, Policy: cfg.Policy, Replica: "bench", Tracing: tp})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	// -proxy-env LOADBENCH_CPUPROFILE=/tmp/gw.prof profiles the gateway.
	if path := os.Getenv(envCPUProfile); path != "" {
		f, err := os.Create(path)
		if err != nil {
			return err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	go func() { _ = g.Run(ctx) }()
	srv := g.Server(cfg.Listen)
	// As serve does (controlplane/listen.go): through the gateway's
	// listener, which screens the heads net/http reads (and so every
	// HTTP/2 connection's reads pass through keepalive.ScreenConn).
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return err
	}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(g.Listener(ln)) }()
	if cfg.TLSListen != "" {
		m, err := certs.New(certs.Config{Files: cfg.CertFiles})
		if err != nil {
			return err
		}
		ln, err := net.Listen("tcp", cfg.TLSListen)
		if err != nil {
			return err
		}
		tsrv := g.TLSServer(cfg.TLSListen)
		go func() { errc <- tsrv.Serve(g.TLSListener(ln, m.TLSConfig())) }()
		defer tsrv.Close()
	}
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// startGatewayChild runs the gateway process on a free port.
func startGatewayChild(name string, policy activator.Policy, routes []gatewayBenchSvc, extraEnv map[string]string) (*proc, string, error) {
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	js, err := json.Marshal(gatewayChildConfig{Listen: addr, Policy: policy, Routes: routes})
	if err != nil {
		return nil, "", err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, "", fmt.Errorf("find own executable to start the gateway: %w", err)
	}
	env := map[string]string{envGatewayChild: string(js)}
	for k, v := range extraEnv {
		env[k] = v
	}
	p, err := startProc(name, self, nil, env)
	if err != nil {
		return nil, "", err
	}
	if err := p.waitPort(port, 10*time.Second); err != nil {
		p.stop(time.Second)
		return nil, "", err
	}
	return p, addr, nil
}
