package grpcapp

import (
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The app itself, in process: what the component and e2e tests rely on it
// to do (echo, in-flight count, events, statuses) holds before it is a
// witness behind a proxy.
func TestAppDirect(t *testing.T) {
	events := filepath.Join(t.TempDir(), "events")
	f, err := os.OpenFile(events, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(Config{Name: "direct", Events: f})
	go srv.Serve(ln)
	defer srv.Stop()
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cli := testpb.NewTestServiceClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	if r, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}

	var hdr, tr metadata.MD
	octx := metadata.AppendToOutgoingContext(ctx, MDCall, "u1", "x-echo-a", "1")
	resp, err := cli.UnaryCall(octx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("hi")}}, grpc.Header(&hdr), grpc.Trailer(&tr))
	if err != nil || string(resp.GetPayload().GetBody()) != "hi" || resp.ServerId != "direct" {
		t.Fatalf("unary: %v %v", resp, err)
	}
	if hdr.Get("x-echo-a")[0] != "1" || hdr.Get(HeaderInflight)[0] != "1" || hdr.Get(HeaderServer)[0] != "direct" {
		t.Errorf("header %v", hdr)
	}
	if tr.Get("x-echo-a")[0] != "1" || tr.Get(TrailerMethod)[0] != "UnaryCall" {
		t.Errorf("trailer %v", tr)
	}

	// A status asked for, and a bad sleep (refused before any header:
	// a trailers-only response).
	_, err = cli.UnaryCall(ctx, &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.FailedPrecondition), Message: "no"}})
	if s := status.Convert(err); s.Code() != codes.FailedPrecondition || s.Message() != "no" {
		t.Errorf("echo status: %v", err)
	}
	_, err = cli.UnaryCall(metadata.AppendToOutgoingContext(ctx, MDSleep, "soon"), &testpb.SimpleRequest{})
	if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), MDSleep) {
		t.Errorf("bad sleep: %v", err)
	}

	// Two calls at once: the second to start reports 2 in progress.
	hold, release := context.WithCancel(ctx)
	go cli.UnaryCall(metadata.AppendToOutgoingContext(hold, MDSleep, "1h", MDCall, "held"), &testpb.SimpleRequest{})
	waitEvent(t, events, EventStart, "held")
	hdr = nil
	if _, err := cli.EmptyCall(ctx, &testpb.Empty{}, grpc.Header(&hdr)); err != nil || hdr.Get(HeaderInflight)[0] != "2" {
		t.Errorf("second call in flight: %v, header %v", err, hdr)
	}
	release()
	if e := waitEvent(t, events, EventEnded, "held"); e.Detail != "canceled" {
		t.Errorf("held call ended %q, want canceled", e.Detail)
	}
	dctx, dcancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, MDSleep, "1h", MDCall, "late"), 200*time.Millisecond)
	defer dcancel()
	if _, err := cli.UnaryCall(dctx, &testpb.SimpleRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Errorf("deadline: %v", err)
	}
	waitEvent(t, events, EventEnded, "late")
	if _, ok := Find(mustEvents(t, events), EventDone, "u1"); !ok {
		t.Errorf("no done event for u1: %v", mustEvents(t, events))
	}

	// The streams.
	out, err := cli.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: 3}, {Size: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	for {
		m, err := out.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		sizes = append(sizes, len(m.GetPayload().GetBody()))
	}
	if len(sizes) != 2 || sizes[0] != 3 || sizes[1] != 5 {
		t.Errorf("server stream sizes %v", sizes)
	}
	in, err := cli.StreamingInputCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []int{1, 10, 100} {
		if err := in.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: make([]byte, n)}}); err != nil {
			t.Fatal(err)
		}
	}
	if r, err := in.CloseAndRecv(); err != nil || r.AggregatedPayloadSize != 111 {
		t.Errorf("client stream: %v %v", r, err)
	}
	bidi, err := cli.FullDuplexCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for i := 1; i <= 3; i++ {
		if err := bidi.Send(&testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: int32(i)}}}); err != nil {
			t.Fatal(err)
		}
		if m, err := bidi.Recv(); err != nil || len(m.GetPayload().GetBody()) != i {
			t.Fatalf("bidi %d: %v %v", i, m, err)
		}
	}
	bidi.CloseSend()
	if _, err := bidi.Recv(); err != io.EOF {
		t.Errorf("bidi end: %v", err)
	}
}

func mustEvents(t *testing.T, path string) []Event {
	t.Helper()
	ev, err := ReadEvents(path)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

func waitEvent(t *testing.T, path, kind, call string) Event {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		if e, ok := Find(mustEvents(t, path), kind, call); ok {
			return e
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %s event for %s: %v", kind, call, mustEvents(t, path))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestRunNeedsAPort(t *testing.T) {
	err := Run(context.Background(), func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), EnvPort) {
		t.Fatalf("Run without a port: %v", err)
	}
}
