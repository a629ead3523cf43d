package sidecar_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/grpcapp"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// A real gRPC server (grpc-go, h2c only: test/grpcapp) behind the sidecar,
// with a real grpc-go client in front. The gateway's component tests run
// the same through the gateway and sidecar processes; here the sidecar is
// in this process, under the race detector.

// startGRPCApp runs test/grpcapp on a free port and returns the port and
// its events file.
func startGRPCApp(t *testing.T) (port int, events string) {
	t.Helper()
	port = testbin.FreePort(t)
	events = filepath.Join(t.TempDir(), "events")
	p := testbin.Start(t, testbin.Program(t, grpcapp.Command), nil, map[string]string{
		grpcapp.EnvPort: strconv.Itoa(port), grpcapp.EnvEvents: events, grpcapp.EnvName: "hello-00001",
	})
	p.WaitPort(t, port, time.Minute)
	return port, events
}

// grpcConfig is a sidecar of an h2c app with gRPC readiness. Its request
// timeout is longer than any test's own bound, so a call held up in the
// sidecar fails the test instead of being ended by the timeout.
func grpcConfig(appPort int) spec.SidecarConfig {
	cfg := config(appPort)
	cfg.Timeout = time.Hour
	cfg.AppProtocol = spec.ProtocolH2C
	p := spec.DefaultProbe(spec.ProbeGRPC)
	cfg.Readiness = &p
	return cfg
}

// Every kind of call, metadata and trailers both ways, error statuses,
// cancellations and deadlines pass the sidecar; an HTTP/1.1 client reaches
// the h2c-only server too.
func TestGRPCThroughSidecar(t *testing.T) {
	t.Parallel()
	port, events := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	grpcapp.CheckCallKinds(t, ctx, c, "hello-00001")
	grpcapp.CheckCancellations(t, ctx, c, events, "sidecar", time.Minute)
	grpcapp.CheckDeadline(t, ctx, c, events, "sidecar", time.Second, time.Minute)
	if st, err := grpcapp.HTTP1EmptyCall(ctx, http.DefaultClient, r.url, "x"); err != nil || st != "0" {
		t.Errorf("HTTP/1.1 call to the h2c app: grpc-status %q, %v", st, err)
	}
	if n := c.Dials(); n != 1 {
		t.Errorf("the client opened %d connections, want 1", n)
	}
	waitUntil(t, "every call ended at the sidecar", func() bool { return r.stats(t).InFlight == 0 })
}

// Streams are requests: N held streams on one connection are N in flight
// in the stats the autoscaler reads, and a concurrency limit of 1 lets the
// app see one call at a time however many streams one connection carries.
func TestGRPCStreamsAreRequests(t *testing.T) {
	t.Parallel()
	port, _ := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	const held = 7
	release, err := grpcapp.HoldStreams(ctx, c, held)
	if err != nil {
		t.Fatal(err)
	}
	if st := r.stats(t); st.InFlight != held {
		t.Errorf("%d streams held on one connection; the sidecar's stats say %d in flight", held, st.InFlight)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the held streams end their requests", func() bool { return r.stats(t).InFlight == 0 })
	if n := c.Dials(); n != 1 {
		t.Errorf("the client opened %d connections, want 1", n)
	}

	one := grpcConfig(port)
	one.Concurrency, one.QueueDepth = 1, 100
	r1 := startSidecar(t, one, sidecar.Options{})
	r1.waitReady(t)
	c1 := grpcapp.Dial(t, strings.TrimPrefix(r1.url, "http://"), "")
	errs, most := grpcapp.Burst(ctx, c1, 30, 10*time.Millisecond)
	if len(errs) > 0 {
		t.Fatalf("%d of 30 calls failed, e.g. %v", len(errs), errs[0])
	}
	if most != 1 {
		t.Errorf("with concurrency 1 the app had %d calls at once, want 1", most)
	}
}

// An app that ends a call while its client is still sending (a status in
// the middle of a bidirectional stream) has its status and trailers passed
// on at once, not when the client next sends or the request timeout ends
// the request: the HTTP/2 transport to the app waited for the client's
// body before it let the response end (golang/go#80085).
func TestGRPCStatusWhileClientStillSends(t *testing.T) {
	t.Parallel()
	port, _ := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	stream, err := c.FullDuplexCall(metadata.AppendToOutgoingContext(ctx, grpcapp.MDEchoPrefix+"k", "v"))
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Send(&testpb.StreamingOutputCallRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.Aborted), Message: "mid-stream"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.Aborted {
		t.Fatalf("status %v, want Aborted while the client's side is open (a minute is the bound)", err)
	}
	if got := stream.Trailer().Get(grpcapp.MDEchoPrefix + "k"); len(got) != 1 || got[0] != "v" {
		t.Errorf("trailers %v", stream.Trailer())
	}
	waitUntil(t, "the call ends its request", func() bool { return r.stats(t).InFlight == 0 })
}

// A gRPC app ends a call at its grpc-timeout with RST_STREAM CANCEL; the
// sidecar answers the call's deadline, not a 502 (which a client whose own
// timer had not fired yet saw as Unavailable). Here the client has no
// deadline of its own, only the header, so the app's reset always comes
// first.
func TestGRPCAppResetAtTheDeadlineIsDeadlineExceeded(t *testing.T) {
	t.Parallel()
	port, _ := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.url+"/grpc.testing.TestService/UnaryCall", bytes.NewReader(make([]byte, 5)))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	req.Header.Set("Grpc-Timeout", "200m")
	req.Header.Set(grpcapp.MDSleep, "1h")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	status := resp.Header.Get("Grpc-Status")
	if status == "" {
		status = resp.Trailer.Get("Grpc-Status")
	}
	if resp.StatusCode != http.StatusOK || status != "4" || resp.Header.Get("Content-Type") != "application/grpc" {
		t.Fatalf("HTTP %d, grpc-status %q, Content-Type %q, body %q: want 200 with grpc-status 4 (DEADLINE_EXCEEDED)", resp.StatusCode, status, resp.Header.Get("Content-Type"), body)
	}
}
