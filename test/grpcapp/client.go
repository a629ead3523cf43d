package grpcapp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// Command is the app's main package, for testbin.Program.
const Command = "./test/grpcapp/cmd/grpcapp"

// Client is one grpc-go client connection: HTTP/2 with prior knowledge
// (h2c), as every gRPC client without TLS speaks, to one address.
type Client struct {
	testpb.TestServiceClient
	Conn  *grpc.ClientConn
	dials atomic.Int64
}

// Dial returns a client of addr whose calls carry authority as :authority
// (the Host the gateway routes on; "" is addr). It never resolves or
// balances: every call goes over one connection (Dials says how many it
// opened). Closed when the test ends.
func Dial(tb testing.TB, addr, authority string) *Client {
	tb.Helper()
	c := &Client{}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, a string) (net.Conn, error) {
			c.dials.Add(1)
			return (&net.Dialer{}).DialContext(ctx, "tcp", a)
		}),
	}
	if authority != "" {
		opts = append(opts, grpc.WithAuthority(authority))
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, opts...)
	if err != nil {
		tb.Fatalf("grpcapp: client of %s: %v", addr, err)
	}
	tb.Cleanup(func() { conn.Close() })
	c.Conn, c.TestServiceClient = conn, testpb.NewTestServiceClient(conn)
	return c
}

// Dials is how many TCP connections the client opened.
func (c *Client) Dials() int64 { return c.dials.Load() }

// Metadata the checks send, to see it come back.
var (
	echoText = "hello, metadata"
	echoBin  = string([]byte{0, 1, 2, 0xfe, 0xff})
)

// CheckCallKinds makes each kind of call (unary, server-streaming,
// client-streaming, full-duplex) and an error of each kind of answer (a
// status after headers, and a trailers-only one), and reports with
// tb.Errorf whatever did not come back as the app sent it: messages,
// headers, trailers, statuses. server is the app's name every answer must
// carry ("" skips that check).
func CheckCallKinds(tb testing.TB, ctx context.Context, c testpb.TestServiceClient, server string) {
	tb.Helper()
	ctx = metadata.AppendToOutgoingContext(ctx, MDEchoPrefix+"text", echoText, MDEchoPrefix+"bin-bin", echoBin)
	checkMD := func(what string, md metadata.MD, method string, trailer bool) {
		tb.Helper()
		if got := md.Get(MDEchoPrefix + "text"); len(got) != 1 || got[0] != echoText {
			tb.Errorf("%s: %stext = %q, want %q (all: %v)", what, MDEchoPrefix, got, echoText, md)
		}
		if got := md.Get(MDEchoPrefix + "bin-bin"); len(got) != 1 || got[0] != echoBin {
			tb.Errorf("%s: %sbin-bin = %q, want %q", what, MDEchoPrefix, got, echoBin)
		}
		if trailer {
			if got := md.Get(TrailerMethod); len(got) != 1 || got[0] != method {
				tb.Errorf("%s: trailer %s = %q, want %q", what, TrailerMethod, got, method)
			}
		} else if got := md.Get(HeaderServer); server != "" && (len(got) != 1 || got[0] != server) {
			tb.Errorf("%s: header %s = %q, want %q", what, HeaderServer, got, server)
		}
	}

	// Unary: the payload echoed, metadata back in headers and trailers.
	var hdr, tr metadata.MD
	body := bytes.Repeat([]byte("unary "), 1000)
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: body}}, grpc.Header(&hdr), grpc.Trailer(&tr))
	if err != nil {
		tb.Errorf("unary: %v", err)
	} else if !bytes.Equal(resp.GetPayload().GetBody(), body) || (server != "" && resp.GetServerId() != server) {
		tb.Errorf("unary: %d bytes back from %q, sent %d to %q", len(resp.GetPayload().GetBody()), resp.GetServerId(), len(body), server)
	}
	checkMD("unary header", hdr, "", false)
	checkMD("unary trailer", tr, "UnaryCall", true)

	// A status after headers: code, message (not ASCII, so
	// percent-encoded on the wire) and trailers all arrive.
	const msg = "told to fail: ünïcode, 100% sure"
	hdr, tr = nil, nil
	_, err = c.UnaryCall(ctx, &testpb.SimpleRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.FailedPrecondition), Message: msg}}, grpc.Header(&hdr), grpc.Trailer(&tr))
	if s := status.Convert(err); s.Code() != codes.FailedPrecondition || s.Message() != msg {
		tb.Errorf("error status: got %v %q, want FailedPrecondition %q", s.Code(), s.Message(), msg)
	}
	checkMD("error header", hdr, "", false)
	checkMD("error trailer", tr, "UnaryCall", true)

	// A trailers-only answer (refused before any header was sent).
	_, err = c.UnaryCall(metadata.AppendToOutgoingContext(ctx, MDSleep, "not a duration"), &testpb.SimpleRequest{})
	if s := status.Convert(err); s.Code() != codes.InvalidArgument || !strings.Contains(s.Message(), MDSleep) {
		tb.Errorf("trailers-only error: got %v %q, want InvalidArgument naming %s", s.Code(), s.Message(), MDSleep)
	}

	// Server streaming: every message, in order, then the trailers.
	sizes := []int32{1, 1000, 70000, 3}
	var params []*testpb.ResponseParameters
	for _, n := range sizes {
		params = append(params, &testpb.ResponseParameters{Size: n})
	}
	out, err := c.StreamingOutputCall(ctx, &testpb.StreamingOutputCallRequest{ResponseParameters: params})
	if err != nil {
		tb.Errorf("server streaming: %v", err)
	} else {
		var got []int32
		for {
			m, err := out.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				tb.Errorf("server streaming: after %v: %v", got, err)
				break
			}
			if !bytes.Equal(m.GetPayload().GetBody(), payload(int32(len(m.GetPayload().GetBody()))).GetBody()) {
				tb.Errorf("server streaming: message %d is not the app's pattern", len(got))
			}
			got = append(got, int32(len(m.GetPayload().GetBody())))
		}
		if fmt.Sprint(got) != fmt.Sprint(sizes) {
			tb.Errorf("server streaming: sizes %v, want %v", got, sizes)
		}
		h, _ := out.Header()
		checkMD("server streaming header", h, "", false)
		checkMD("server streaming trailer", out.Trailer(), "StreamingOutputCall", true)
	}

	// Client streaming: the app counted every byte sent.
	in, err := c.StreamingInputCall(ctx)
	if err != nil {
		tb.Errorf("client streaming: %v", err)
	} else {
		var sent int32
		for _, n := range []int{27182, 8, 1828, 45904} {
			if err := in.Send(&testpb.StreamingInputCallRequest{Payload: &testpb.Payload{Body: make([]byte, n)}}); err != nil {
				tb.Errorf("client streaming: send: %v", err)
				break
			}
			sent += int32(n)
		}
		r, err := in.CloseAndRecv()
		if err != nil || r.GetAggregatedPayloadSize() != sent {
			tb.Errorf("client streaming: the app counted %d bytes (%v), sent %d", r.GetAggregatedPayloadSize(), err, sent)
		}
		h, _ := in.Header()
		checkMD("client streaming header", h, "", false)
		checkMD("client streaming trailer", in.Trailer(), "StreamingInputCall", true)
	}

	// Full duplex, ping-pong: each answer comes while the call is open, so
	// neither side's messages wait for the other to finish.
	bidi, err := c.FullDuplexCall(ctx)
	if err != nil {
		tb.Errorf("full duplex: %v", err)
		return
	}
	for i := int32(1); i <= 5; i++ {
		if err := bidi.Send(&testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: i * 100}}}); err != nil {
			tb.Errorf("full duplex: send %d: %v", i, err)
			return
		}
		m, err := bidi.Recv()
		if err != nil || len(m.GetPayload().GetBody()) != int(i*100) {
			tb.Errorf("full duplex: answer %d: %d bytes, %v", i, len(m.GetPayload().GetBody()), err)
			return
		}
	}
	// And an error in the middle of the stream ends it with its status.
	if err := bidi.Send(&testpb.StreamingOutputCallRequest{ResponseStatus: &testpb.EchoStatus{Code: int32(codes.Aborted), Message: "mid-stream"}}); err != nil {
		tb.Errorf("full duplex: send the error: %v", err)
		return
	}
	if _, err := bidi.Recv(); status.Code(err) != codes.Aborted || status.Convert(err).Message() != "mid-stream" {
		tb.Errorf("full duplex: status %v, want Aborted \"mid-stream\"", err)
	}
	h, _ := bidi.Header()
	checkMD("full duplex header", h, "", false)
	checkMD("full duplex trailer", bidi.Trailer(), "FullDuplexCall", true)
}

// WaitEvent waits up to timeout for the events file to hold an event of a
// kind for a call, and returns it; it fails the test otherwise.
func WaitEvent(tb testing.TB, path, kind, call string, timeout time.Duration) Event {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for {
		events, err := ReadEvents(path)
		if err != nil {
			tb.Fatal(err)
		}
		if e, ok := Find(events, kind, call); ok {
			return e
		}
		if time.Now().After(deadline) {
			tb.Fatalf("grpcapp: no %q event of call %s within %s; events: %v", kind, call, timeout, events)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// CheckCancellations makes two calls that would work for an hour, waits
// until the app has each, cancels each at the client, and fails the test
// unless the app saw each cancellation (its context canceled): a unary
// call, and a full-duplex call waiting for the client's next message.
// prefix names the calls in the events file.
func CheckCancellations(tb testing.TB, ctx context.Context, c testpb.TestServiceClient, events, prefix string, timeout time.Duration) {
	tb.Helper()
	unary := prefix + "-cancel-unary"
	cctx, cancel := context.WithCancel(metadata.AppendToOutgoingContext(ctx, MDCall, unary, MDSleep, "1h"))
	errc := make(chan error, 1)
	go func() {
		_, err := c.UnaryCall(cctx, &testpb.SimpleRequest{})
		errc <- err
	}()
	WaitEvent(tb, events, EventStart, unary, timeout)
	cancel()
	if err := <-errc; status.Code(err) != codes.Canceled {
		tb.Errorf("canceled unary call: %v, want Canceled", err)
	}
	if e := WaitEvent(tb, events, EventEnded, unary, timeout); e.Detail != "canceled" {
		tb.Errorf("the app saw the unary call end with %q, want canceled", e.Detail)
	}

	bidi := prefix + "-cancel-bidi"
	cctx, cancel = context.WithCancel(metadata.AppendToOutgoingContext(ctx, MDCall, bidi))
	defer cancel()
	stream, err := c.FullDuplexCall(cctx)
	if err != nil {
		tb.Fatalf("full duplex: %v", err)
	}
	if err := stream.Send(&testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: 1}}}); err != nil {
		tb.Fatalf("full duplex: send: %v", err)
	}
	if _, err := stream.Recv(); err != nil {
		tb.Fatalf("full duplex: first answer: %v", err)
	}
	cancel()
	if _, err := stream.Recv(); status.Code(err) != codes.Canceled {
		tb.Errorf("canceled full-duplex call: %v, want Canceled", err)
	}
	if e := WaitEvent(tb, events, EventEnded, bidi, timeout); e.Detail != "canceled" {
		tb.Errorf("the app saw the full-duplex call end with %q, want canceled", e.Detail)
	}
}

// CheckDeadline makes a unary call that would work for an hour with a
// deadline, and fails the test unless the client gets DeadlineExceeded
// and the app saw the call's context end. A deadline may pass before the
// call reaches a busy app at all, which proves nothing: the deadline then
// doubles, from first up to a minute, until the app had the call first.
func CheckDeadline(tb testing.TB, ctx context.Context, c testpb.TestServiceClient, events, prefix string, first, timeout time.Duration) {
	tb.Helper()
	for d, i := first, 0; ; d, i = 2*d, i+1 {
		name := fmt.Sprintf("%s-deadline-%d", prefix, i)
		dctx, cancel := context.WithTimeout(metadata.AppendToOutgoingContext(ctx, MDCall, name, MDSleep, "1h"), d)
		_, err := c.UnaryCall(dctx, &testpb.SimpleRequest{})
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			tb.Fatalf("call with a deadline of %s: %v, want DeadlineExceeded", d, err)
		}
		evs, rerr := ReadEvents(events)
		if rerr != nil {
			tb.Fatal(rerr)
		}
		if _, ok := Find(evs, EventStart, name); !ok && d < time.Minute {
			tb.Logf("the app had not received the call when its deadline of %s passed; again with %s", d, 2*d)
			continue
		}
		// The app had the call (or is about to): its context ends, by
		// its own reading of grpc-timeout or by the reset the proxies
		// pass on, whichever comes first.
		WaitEvent(tb, events, EventStart, name, timeout)
		e := WaitEvent(tb, events, EventEnded, name, timeout)
		tb.Logf("deadline %s: DeadlineExceeded at the client; the app saw its context end (%s)", d, e.Detail)
		return
	}
}

// Burst makes n unary calls at once, each working for sleep, and returns
// the error of each that failed and the most calls in progress any answer
// reported (HeaderInflight).
func Burst(ctx context.Context, c testpb.TestServiceClient, n int, sleep time.Duration) (errs []error, maxInflight int) {
	var mu sync.Mutex
	var wg sync.WaitGroup
	ctx = metadata.AppendToOutgoingContext(ctx, MDSleep, sleep.String())
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var hdr metadata.MD
			body := fmt.Appendf(nil, "call %d", i)
			resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: body}}, grpc.Header(&hdr))
			if err == nil && !bytes.Equal(resp.GetPayload().GetBody(), body) {
				err = fmt.Errorf("call %d: answered %q", i, resp.GetPayload().GetBody())
			}
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			var k int
			if v := hdr.Get(HeaderInflight); len(v) == 1 {
				fmt.Sscan(v[0], &k)
			}
			maxInflight = max(maxInflight, k)
		}()
	}
	wg.Wait()
	return errs, maxInflight
}

// HoldStreams opens n full-duplex calls and waits until each has its
// first answer, so each is in progress at the app; the returned function
// ends them (half-close) and reports the first error.
func HoldStreams(ctx context.Context, c testpb.TestServiceClient, n int) (release func() error, err error) {
	var streams []grpc.BidiStreamingClient[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]
	release = func() error {
		var first error
		for _, s := range streams {
			if err := s.CloseSend(); err != nil && first == nil {
				first = err
			}
			if _, err := s.Recv(); !errors.Is(err, io.EOF) && first == nil {
				first = fmt.Errorf("held stream ended with %v, want EOF", err)
			}
		}
		return first
	}
	for i := range n {
		s, err := c.FullDuplexCall(ctx)
		if err == nil {
			err = s.Send(&testpb.StreamingOutputCallRequest{ResponseParameters: []*testpb.ResponseParameters{{Size: 1}}})
		}
		if err == nil {
			_, err = s.Recv()
		}
		if err != nil {
			return release, fmt.Errorf("held stream %d: %w", i, err)
		}
		streams = append(streams, s)
	}
	return release, nil
}

// HTTP1EmptyCall calls EmptyCall with HTTP/1.1 (a gRPC request's framing
// by hand: POST, application/grpc, one empty message), as a client that
// does not speak HTTP/2 would reach an h2c-only app through the proxies,
// and returns the grpc-status trailer it got.
func HTTP1EmptyCall(ctx context.Context, client *http.Client, baseURL, host string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+"/grpc.testing.TestService/EmptyCall", bytes.NewReader(make([]byte, 5)))
	if err != nil {
		return "", err
	}
	req.Host = host
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	resp, err := client.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", fmt.Errorf("read body: %w", err)
	}
	if resp.ProtoMajor != 1 || resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "application/grpc" || !bytes.Equal(body, make([]byte, 5)) {
		return "", fmt.Errorf("%s %s, Content-Type %q, body % x: want HTTP/1.1 200 application/grpc and one empty message", resp.Proto, resp.Status, resp.Header.Get("Content-Type"), body)
	}
	st := resp.Trailer.Get("Grpc-Status")
	if st == "" {
		st = resp.Header.Get("Grpc-Status") // a trailers-only answer
	}
	return st, nil
}
