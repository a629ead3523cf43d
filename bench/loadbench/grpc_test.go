package main

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestHAProxyH2CConfig(t *testing.T) {
	h := haproxyH2CPeer().Config("/tmp/d", "127.0.0.1:8001", "127.0.0.1:9001")
	for _, want := range []string{"bind 127.0.0.1:8001 proto h2\n", "server app 127.0.0.1:9001 proto h2 maxconn", "http-reuse always", "mode http"} {
		if !strings.Contains(h, want) {
			t.Errorf("haproxy h2c config lacks %q:\n%s", want, h)
		}
	}
}

// The gRPC load reaches the app directly and, when HAProxy is installed,
// through it in h2c, at two streams on one connection and two connections.
func TestGRPCLoad(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	app := newGRPCApp()
	go app.Serve(ln)
	defer app.Stop()
	targets := []grpcTarget{{Name: "direct", Addr: ln.Addr().String()}}
	k := haproxyH2CPeer()
	if bin, skip := locatePeer(k, exec.LookPath); skip != "" {
		t.Log(skip)
	} else {
		p, err := startPeer(k, bin, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer p.stop()
		targets = append(targets, grpcTarget{Name: "haproxy h2c", Addr: p.Addr, Authority: "grpc.default.localhost"})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tg := range targets {
		for _, shape := range []grpcShape{{Conns: 1, Streams: 2}, {Conns: 2, Streams: 1}} {
			r, err := runGRPC(ctx, tg, shape, 300*time.Millisecond)
			if err != nil {
				t.Fatalf("%s, %s: %v", tg.Name, shape, err)
			}
			if r.Requests == 0 || r.Errors != 0 || r.ByClass[2] != r.Requests || r.Latency.Quantile(.5) <= 0 {
				t.Errorf("%s, %s: %d calls, %d ok, %d errors", tg.Name, shape, r.Requests, r.ByClass[2], r.Errors)
			}
		}
	}
}
