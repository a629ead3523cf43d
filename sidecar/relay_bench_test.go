package sidecar

import (
	"context"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/grpcapp"
)

// BenchmarkRelayUnary is one gRPC unary call (EmptyCall) from a grpc-go
// client through the sidecar's HTTP/2 relay to a grpc-go app, all in this
// process, with 32 calls in flight on one connection: the profile of the
// relay's per-call work (make bench-grpc measures it against HAProxy).
func BenchmarkRelayUnary(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	app := grpcapp.NewServer(grpcapp.Config{Name: "bench"})
	go app.Serve(ln)
	b.Cleanup(app.Stop)
	cfg := benchConfig(ln.Addr().(*net.TCPAddr).Port, 0)
	cfg.AppProtocol = spec.ProtocolH2C
	s, err := New(cfg, Options{})
	if err != nil {
		b.Fatal(err)
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	al, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Serve(ctx, sl, al) }()
	b.Cleanup(func() { cancel(); <-done })
	cc, err := grpc.NewClient("passthrough:///"+sl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { cc.Close() })
	c := testpb.NewTestServiceClient(cc)
	cctx, ccancel := context.WithTimeout(context.Background(), time.Minute)
	defer ccancel()
	if _, err := c.EmptyCall(cctx, &testpb.Empty{}); err != nil {
		b.Fatal(err)
	}
	b.SetParallelism(32)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.EmptyCall(cctx, &testpb.Empty{}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
