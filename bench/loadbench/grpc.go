package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"

	"github.com/nomad-serverless/nomad-serverless/activator"
)

// The gRPC benchmark (issue 32): unary calls from grpc-go clients to a
// grpc-go server behind the sidecar (which speaks h2c to it), through the
// gateway, against HAProxy in the gateway's place (h2c on both of its
// sides) in front of the same sidecar, in one run, in alternating rounds
// whose order rotates, at three shapes: one stream on one connection, 32
// concurrent streams on one connection, 32 connections of one stream each.
// grpc-go is what a Go gRPC client is; it stays in bench/ (above the
// house's roof), out of the shipped binary.
//
//	go run ./bench/loadbench -mode grpc -bin bin/nomad-serverless

// envGRPCAppChild makes the benchmark's executable the gRPC app: a grpc-go
// server on the port it names.
const envGRPCAppChild = "LOADBENCH_GRPC_APP_CHILD"

// grpcMethod is the one unary method of the app: it answers the message
// it was sent.
const grpcMethod = "/bench.Echo/Echo"

// grpcMessage is the request of every call: the size of a small protobuf
// message (an ID and a few fields).
var grpcMessage = []byte("0123456789abcdef0123456789abcdef")

// rawCodec passes messages as the bytes they are, under gRPC's default
// codec name: on the wire a call is what a protobuf call of the same size
// is (content-type application/grpc, 5-byte length prefix), without
// generated code.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return *v.(*[]byte), nil }
func (rawCodec) Unmarshal(data []byte, v any) error {
	*v.(*[]byte) = append((*v.(*[]byte))[:0], data...)
	return nil
}
func (rawCodec) Name() string { return "proto" }

var _ encoding.Codec = rawCodec{}

// newGRPCApp is the gRPC app's server: bench.Echo/Echo answers the
// message it was sent.
func newGRPCApp() *grpc.Server {
	srv := grpc.NewServer(grpc.ForceServerCodec(rawCodec{}))
	srv.RegisterService(&grpc.ServiceDesc{
		ServiceName: "bench.Echo",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Echo", Handler: func(_ any, _ context.Context, dec func(any) error, _ grpc.UnaryServerInterceptor) (any, error) {
			var in []byte
			if err := dec(&in); err != nil {
				return nil, err
			}
			return &in, nil
		}}},
	}, struct{}{})
	return srv
}

// runGRPCAppChild serves the app on the port in config until SIGTERM.
func runGRPCAppChild(config string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:"+config)
	if err != nil {
		return err
	}
	srv := newGRPCApp()
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() { <-ctx.Done(); srv.Stop() }()
	return srv.Serve(ln)
}

// grpcShape is how the load is spread: Conns connections with Streams
// calls in flight on each.
type grpcShape struct {
	Name           string
	Conns, Streams int
}

func (s grpcShape) String() string {
	return fmt.Sprintf("%d conn x %d stream", s.Conns, s.Streams)
}

// grpcTarget is where calls go: Addr, with Authority as :authority (the
// gateway routes by it).
type grpcTarget struct {
	Name, Addr, Authority string
}

// runGRPC drives target with shape for d: every stream calls the next as
// soon as the previous answered (closed loop). The connections are made
// and warmed (one call on each stream) before the measured time.
func runGRPC(ctx context.Context, t grpcTarget, shape grpcShape, d time.Duration) (*Result, error) {
	conns := make([]*grpc.ClientConn, shape.Conns)
	defer func() {
		for _, c := range conns {
			if c != nil {
				c.Close()
			}
		}
	}()
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodec(rawCodec{})),
	}
	if t.Authority != "" {
		opts = append(opts, grpc.WithAuthority(t.Authority))
	}
	for i := range conns {
		c, err := grpc.NewClient("passthrough:///"+t.Addr, opts...)
		if err != nil {
			return nil, err
		}
		conns[i] = c
	}
	call := func(c *grpc.ClientConn, out *[]byte) error {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		return c.Invoke(cctx, grpcMethod, &grpcMessage, out)
	}
	// Warm up: every connection up, every stream once.
	var wg sync.WaitGroup
	errs := make(chan error, shape.Conns*shape.Streams)
	for _, c := range conns {
		for range shape.Streams {
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out []byte
				if err := call(c, &out); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return nil, fmt.Errorf("%s: warm-up call: %w", t.Name, err)
	}

	start := time.Now()
	end := start.Add(d)
	results := make([]*Result, 0, shape.Conns*shape.Streams)
	for _, c := range conns {
		for range shape.Streams {
			r := &Result{}
			results = append(results, r)
			wg.Add(1)
			go func() {
				defer wg.Done()
				var out []byte
				for ctx.Err() == nil {
					t0 := time.Now()
					if !t0.Before(end) {
						return
					}
					err := call(c, &out)
					done := time.Now()
					if !done.Before(end) {
						return // finished after the end: not counted
					}
					if err != nil || len(out) != len(grpcMessage) {
						r.Errors++
						continue
					}
					r.Requests++
					r.ByClass[2]++
					r.Latency.Record(done.Sub(t0))
				}
			}()
		}
	}
	wg.Wait()
	total := &Result{Target: t.Name, Conns: shape.Conns, Elapsed: min(time.Since(start), d)}
	for _, r := range results {
		total.Requests += r.Requests
		total.Errors += r.Errors
		total.ByClass[2] += r.ByClass[2]
		total.Latency.Merge(&r.Latency)
	}
	return total, ctx.Err()
}

// grpcShapes are the three.
var grpcShapes = []grpcShape{
	{Name: "1 stream", Conns: 1, Streams: 1},
	{Name: "32 streams, 1 conn", Conns: 1, Streams: 32},
	{Name: "32 conns", Conns: 32, Streams: 1},
}

// runGRPCBench measures (a) the gRPC app directly, (b) through the
// sidecar, (c) through the gateway and the same sidecar and (d) through
// HAProxy (h2c in and out) and the same sidecar, at each shape.
func runGRPCBench(ctx context.Context, o Options) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	appPort, scPort, scAdmin := ports[0], ports[1], ports[2]
	self, err := os.Executable()
	if err != nil {
		return err
	}
	app, err := startProc("grpc-app", self, nil, map[string]string{envGRPCAppChild: strconv.Itoa(appPort)})
	if err != nil {
		return err
	}
	defer app.stop(5 * time.Second)
	if err := app.waitPort(appPort, 10*time.Second); err != nil {
		return err
	}
	sc, err := startSidecar(o.Bin, "sidecar", scPort, appPort, scAdmin, 0, map[string]string{"SERVERLESS_APP_PROTOCOL": "h2c"})
	if err != nil {
		return err
	}
	defer sc.stop(5 * time.Second)
	svc := gatewayBenchSvc{Service: "grpc", Concurrency: 0, Instances: []string{addrOf(scPort)}}
	gw, gwAddr, err := startGatewayChild("gateway", activator.PolicyAuto, []gatewayBenchSvc{svc}, o.ProxyEnv)
	if err != nil {
		return err
	}
	defer gw.stop(5 * time.Second)
	var peers []*peer
	for _, k := range o.Peers {
		if k.Name == "haproxy" {
			if peers, err = startPeers(o.Out, []peerKind{haproxyH2CPeer()}, addrOf(scPort)); err != nil {
				return err
			}
		}
	}
	defer stopPeers(peers)

	targets := []grpcTarget{
		{Name: "(a) direct", Addr: addrOf(appPort)},
		{Name: "(b) sidecar", Addr: addrOf(scPort)},
		{Name: "(c) gateway+sidecar", Addr: gwAddr, Authority: svc.host()},
	}
	cpuOf := map[string][]*proc{targets[1].Name: {sc}, targets[2].Name: {gw, sc}}
	peerOf := map[string]*peer{}
	for _, p := range peers {
		t := grpcTarget{Name: "(d) haproxy+sidecar", Addr: p.Addr, Authority: svc.host()}
		targets = append(targets, t)
		cpuOf[t.Name] = []*proc{sc}
		peerOf[t.Name] = p
	}

	run := func(t grpcTarget, shape grpcShape, d time.Duration, s *Series, round int) error {
		span := startCPUSpan(cpuOf[t.Name], peerOf[t.Name], app)
		idle := s.measureIdle()
		r, err := runGRPC(ctx, t, shape, d)
		idle()
		if err != nil {
			return err
		}
		span.end(s)
		s.Add(r)
		PrintRun(o.Out, round, r)
		return nil
	}

	series := make([][]*Series, len(grpcShapes)) // by shape, by target
	for si, shape := range grpcShapes {
		for _, t := range targets {
			series[si] = append(series[si], &Series{Name: t.Name})
			if _, err := runGRPC(ctx, t, shape, o.Warmup); err != nil {
				return fmt.Errorf("warm-up: %w", err)
			}
		}
	}
	for si, shape := range grpcShapes {
		d := o.Duration
		if shape.Conns*shape.Streams == 1 {
			d = o.SingleDuration
		}
		fmt.Fprintf(o.Out, "\ngRPC unary, %s (%s), %s a run, rounds alternate the targets and rotate their order\n", shape.Name, shape, d)
		for round := 1; round <= o.Rounds; round++ {
			for k := range targets {
				i := (k + round - 1) % len(targets)
				if err := run(targets[i], shape, d, series[si][i], round); err != nil {
					return err
				}
			}
		}
	}

	for si, shape := range grpcShapes {
		ss := series[si]
		rows := peerRows(ss[:2], ss[2:3], ss[3:])
		if err := PrintPeerComparison(o.Out, fmt.Sprintf("== gRPC unary, %s (medians of the rounds; vs = our calls/s / the peer's; CPU/req = the proxies' CPU; app CPU/req = the app's behind each)", shape), rows); err != nil {
			return err
		}
	}
	if len(peers) > 0 {
		fmt.Fprintf(o.Out, "\n== summary: (c) gateway+sidecar vs (d) haproxy+sidecar (target in brackets)\n")
		for si, shape := range grpcShapes {
			ours, hp := medianStats(series[si][2]), medianStats(series[si][3])
			rps, p99 := div(ours.RPS, hp.RPS), divDur(ours.P99, hp.P99)
			fmt.Fprintf(o.Out, "%-20s calls/s %.3f  [>= %.2f] %s   p99 %.2fx  [<= %.2fx] %s\n", shape.Name+":",
				rps, targetVsHAProxyRPS, verdict(rps >= targetVsHAProxyRPS), p99, targetVsHAProxyP99, verdict(p99 <= targetVsHAProxyP99))
		}
	}
	if rss, err := peakRSS(gw.pid()); err == nil {
		fmt.Fprintf(o.Out, "gateway peak RSS (VmHWM): %s\n", fmtMiB(rss))
	}
	return nil
}
