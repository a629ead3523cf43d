package sidecar_test

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"google.golang.org/grpc/codes"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/nomad-serverless/nomad-serverless/datapath/h1"
	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/grpcapp"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The HTTP/2 relay (datapath/h2relay) serves h2c clients of an h2c app:
// these tests drive it with grpc-go on both sides, beside the ones in
// grpc_test.go (every call kind, cancellations, deadlines, a status in
// the middle of a stream), which run through it too.

// Streams cost the relay no goroutine each: 100 streams held on one
// connection leave the sidecar's goroutines where they were (net/http's
// HTTP/2 server and transport ran at least two per stream).
func TestRelayHoldsStreamsWithoutGoroutines(t *testing.T) {
	port, _ := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	if _, err := c.EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatal(err)
	}
	before := runtime.NumGoroutine()
	const held = 100
	release, err := grpcapp.HoldStreams(ctx, c, held)
	if err != nil {
		t.Fatal(err)
	}
	during := runtime.NumGoroutine()
	if st := r.stats(t); st.InFlight != held {
		t.Errorf("%d streams held; the sidecar's stats say %d in flight", held, st.InFlight)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}
	// The client's own goroutines are in the count too (grpc-go watches
	// each stream's context in one); net/http's two or more per stream
	// in the sidecar would add 2*held beside them.
	if grew := during - before; grew >= held+held/2 {
		t.Errorf("goroutines %d -> %d with %d streams held: the relay runs one per stream", before, during, held)
	}
	waitUntil(t, "the held streams end their requests", func() bool { return r.stats(t).InFlight == 0 })
}

// 100 calls at once on one connection, with and without a concurrency
// limit: all answered, at most the limit in the app at a time.
func TestRelayConcurrentCalls(t *testing.T) {
	t.Parallel()
	port, _ := startGRPCApp(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	for _, limit := range []int{0, 10} {
		cfg := grpcConfig(port)
		cfg.Concurrency, cfg.QueueDepth = limit, 100
		r := startSidecar(t, cfg, sidecar.Options{})
		r.waitReady(t)
		c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
		errs, most := grpcapp.Burst(ctx, c, 100, 20*time.Millisecond)
		if len(errs) > 0 {
			t.Fatalf("limit %d: %d of 100 calls failed, e.g. %v", limit, len(errs), errs[0])
		}
		if limit > 0 && most > limit {
			t.Errorf("limit %d: the app had %d calls at once", limit, most)
		}
		waitUntil(t, "every call ended at the sidecar", func() bool { return r.stats(t).InFlight == 0 })
	}
}

// A client that does not read a large streamed response holds the app
// back through the windows: the sidecar's memory stays bounded while the
// app has far more to send, and every byte arrives once the client reads.
func TestRelaySlowReaderIsBounded(t *testing.T) {
	port, _ := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	const n, size = 256, 256 << 10 // 64 MiB in all
	params := make([]*testpb.ResponseParameters, n)
	for i := range params {
		params[i] = &testpb.ResponseParameters{Size: size}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	stream, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: params})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	var peak uint64
	for range 20 {
		time.Sleep(100 * time.Millisecond)
		runtime.ReadMemStats(&ms)
		peak = max(peak, ms.HeapInuse)
	}
	// The relay holds at most its windows (4 MiB a connection), the
	// client its own; 64 MiB are waiting at the app.
	if grew := int64(peak) - int64(base); grew > 32<<20 {
		t.Errorf("heap grew by %d MiB while the client did not read a 64 MiB response", grew>>20)
	}
	got := 1
	for {
		_, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("after %d messages: %v", got, err)
		}
		got++
	}
	if got != n {
		t.Errorf("%d messages arrived, want %d", got, n)
	}
}

// Errors in the middle of a stream, cancellation of a held call, and a
// client stream's end: each passes the relay and ends the call's request.
func TestRelayStreamEnds(t *testing.T) {
	t.Parallel()
	port, _ := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")

	// A server stream that fails after two messages.
	s, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{
		ResponseParameters: []*testpb.ResponseParameters{{Size: 10}, {Size: 10}},
		ResponseStatus:     &testpb.EchoStatus{Code: int32(codes.ResourceExhausted), Message: "after two"},
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		if _, err := s.Recv(); err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
	}
	if _, err := s.Recv(); status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "after two") {
		t.Fatalf("end of the stream: %v, want ResourceExhausted", err)
	}

	// A client stream with many messages.
	cs, err := c.StreamingInputCall(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if err := cs.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: make([]byte, 1000)}}); err != nil {
			t.Fatal(err)
		}
	}
	if resp, err := cs.CloseAndRecv(); err != nil || resp.GetAggregatedPayloadSize() != 100_000 {
		t.Fatalf("client stream: %v, %v", resp, err)
	}

	// A call cancelled while the app holds it.
	cctx, ccancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, grpcapp.MDSleep, "1h"))
	done := make(chan error, 1)
	go func() { _, err := c.UnaryCall(cctx, &testpb.SimpleRequest{}); done <- err }()
	waitUntil(t, "the held call is in flight", func() bool { return r.stats(t).InFlight == 1 })
	ccancel()
	if err := <-done; status.Code(err) != codes.Canceled {
		t.Fatalf("cancelled call: %v", err)
	}
	waitUntil(t, "every call ended at the sidecar", func() bool { return r.stats(t).InFlight == 0 })
}

// The revision's timeout answers 504 before the response starts, a full
// queue 503, and an app that is not there 502 with the not-served header
// (the gateway retries elsewhere).
func TestRelaySidecarAnswers(t *testing.T) {
	t.Parallel()
	port, _ := startGRPCApp(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	cfg := grpcConfig(port)
	cfg.Timeout = 300 * time.Millisecond
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	_, err := c.UnaryCall(metadata.AppendToOutgoingContext(ctx, grpcapp.MDSleep, "10s"), &testpb.SimpleRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "504") {
		t.Errorf("call beyond the revision's timeout: %v, want Unavailable from a 504", err)
	}

	one := grpcConfig(port)
	one.Concurrency, one.QueueDepth = 1, 0
	r1 := startSidecar(t, one, sidecar.Options{})
	r1.waitReady(t)
	c1 := grpcapp.Dial(t, strings.TrimPrefix(r1.url, "http://"), "")
	release, err := grpcapp.HoldStreams(ctx, c1, 1)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c1.EmptyCall(ctx, &testpb.Empty{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "503") {
		t.Errorf("call with the limit reached and no queue: %v, want Unavailable from a 503", err)
	}
	if err := release(); err != nil {
		t.Fatal(err)
	}

	gone := grpcConfig(testbin.FreePort(t))
	gone.Readiness = nil
	r2 := startSidecar(t, gone, sidecar.Options{})
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, r2.url+"/grpc.testing.TestService/EmptyCall", strings.NewReader("\x00\x00\x00\x00\x00"))
	req.Header.Set("Content-Type", "application/grpc")
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || resp.Header.Get(spec.NotServedHeader) != spec.NotServedValue {
		t.Errorf("app not there: %d, %s %q; want 502 with the header", resp.StatusCode, spec.NotServedHeader, resp.Header.Get(spec.NotServedHeader))
	}
}

// The app gets X-Forwarded-For and Forwarded through the relay as through
// net/http: the client appended to what came (Forwarded derived from
// X-Forwarded-* when the request had none), repeated fields joined.
func TestRelayForwardedHeaders(t *testing.T) {
	t.Parallel()
	a := startH2CApp(t)
	r := startSidecar(t, h2cConfig(a.port), sidecar.Options{})
	r.waitReady(t)
	tr := &http2.Transport{AllowHTTP: true, DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	}}
	defer tr.CloseIdleConnections()
	const host = "hello.default.localhost"
	for i, c := range []struct {
		in      http.Header
		xff     string
		wantFwd string
	}{
		{http.Header{}, "127.0.0.1", h1.Forwarded(http.Header{}, "127.0.0.1", host, "http")},
		{http.Header{"X-Forwarded-For": {"10.0.0.1"}, "X-Forwarded-Proto": {"https"}}, "10.0.0.1, 127.0.0.1",
			h1.Forwarded(http.Header{"X-Forwarded-For": {"10.0.0.1"}, "X-Forwarded-Proto": {"https"}}, "127.0.0.1", host, "http")},
		{http.Header{"X-Forwarded-For": {"10.0.0.1", "10.0.0.2"}, "Forwarded": {"for=10.0.0.1", "for=10.0.0.2"}}, "10.0.0.1, 10.0.0.2, 127.0.0.1",
			"for=10.0.0.1, for=10.0.0.2, " + h1.Forwarded(http.Header{}, "127.0.0.1", host, "http")},
	} {
		req, _ := http.NewRequest(http.MethodGet, r.url+"/fwd/"+strconv.Itoa(i), nil)
		req.Host = host
		for k, vv := range c.in {
			req.Header[k] = vv
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		a.mu.Lock()
		var got *h2cSeen
		for _, s := range a.seen {
			if s.path == "/fwd/"+strconv.Itoa(i) {
				got = s
			}
		}
		a.mu.Unlock()
		if got == nil {
			t.Fatalf("case %d: the app did not get the request", i)
		}
		if len(got.xff) != 1 || got.xff[0] != c.xff || len(got.fwd) != 1 || got.fwd[0] != c.wantFwd {
			t.Errorf("case %d: X-Forwarded-For %q, Forwarded %q; want %q and %q", i, got.xff, got.fwd, c.xff, c.wantFwd)
		}
	}
}

// A drain sends GOAWAY on the relay's connections: a stream in flight
// finishes (its client released after the GOAWAY), nothing is abandoned,
// and Serve returns once it has.
func TestRelayDrainFinishesStreams(t *testing.T) {
	t.Parallel()
	port, _ := startGRPCApp(t)
	r := startSidecar(t, grpcConfig(port), sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	release, err := grpcapp.HoldStreams(ctx, c, 3)
	if err != nil {
		t.Fatal(err)
	}
	stopped := make(chan struct{})
	go func() { r.stop(); close(stopped) }()
	// Past the drain grace (200 ms): the listener is closed and the
	// connection has its GOAWAY.
	time.Sleep(time.Second)
	select {
	case <-stopped:
		t.Fatal("the sidecar stopped with streams in flight")
	default:
	}
	if err := release(); err != nil {
		t.Fatalf("held streams after the GOAWAY: %v", err)
	}
	select {
	case <-stopped:
	case <-ctx.Done():
		t.Fatal("the sidecar did not stop once its streams ended")
	}
	rep, ok := r.sc.LastDrain()
	if !ok || rep.Abandoned != 0 || rep.InFlightAtStart != 3 {
		t.Errorf("drain report %+v (%v): want 3 in flight at the start, none abandoned", rep, ok)
	}
}

// The app dies and comes back on its port: calls in flight end (the
// connection was lost), a call while it is down is answered 502 with the
// not-served header (nothing reached an app), and once it is back the
// pool dials it again and calls pass.
func TestRelayAppRestarts(t *testing.T) {
	t.Parallel()
	port := testbin.FreePort(t)
	start := func() *testbin.Proc {
		p := testbin.Start(t, testbin.Program(t, grpcapp.Command), nil, map[string]string{
			grpcapp.EnvPort: strconv.Itoa(port), grpcapp.EnvName: "hello-00001",
		})
		p.WaitPort(t, port, time.Minute)
		return p
	}
	app := start()
	cfg := grpcConfig(port)
	cfg.Readiness = nil
	r := startSidecar(t, cfg, sidecar.Options{})
	r.waitReady(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := grpcapp.Dial(t, strings.TrimPrefix(r.url, "http://"), "")
	if _, err := c.EmptyCall(ctx, &testpb.Empty{}); err != nil {
		t.Fatal(err)
	}
	held := make(chan error, 1)
	go func() {
		_, err := c.UnaryCall(metadata.AppendToOutgoingContext(ctx, grpcapp.MDSleep, "1h"), &testpb.SimpleRequest{})
		held <- err
	}()
	waitUntil(t, "the held call is in flight", func() bool { return r.stats(t).InFlight == 1 })
	app.Stop(t)
	if err := <-held; status.Code(err) == codes.OK {
		t.Fatal("a call in flight when the app died succeeded")
	}
	_, err := c.EmptyCall(ctx, &testpb.Empty{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "502") {
		t.Errorf("call while the app is down: %v, want Unavailable from a 502", err)
	}
	start()
	testbin.Eventually(t, time.Minute, 50*time.Millisecond, "calls pass again", func() (bool, string) {
		_, err := c.EmptyCall(ctx, &testpb.Empty{})
		return err == nil, fmt.Sprint(err)
	})
	waitUntil(t, "every call ended at the sidecar", func() bool { return r.stats(t).InFlight == 0 })
}
