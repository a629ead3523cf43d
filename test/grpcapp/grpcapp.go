// Package grpcapp is a gRPC app for tests: grpc-go's interop TestService
// (grpc.testing.TestService: unary, server-streaming, client-streaming and
// full-duplex calls) and the standard health service, served by a plain
// grpc.NewServer on h2c alone, as a user's gRPC server would be. It is test
// machinery: grpc-go links into this package and its command
// (cmd/grpcapp), never into the binary that ships.
//
// What a test can ask of it, per call, in request metadata:
//   - MDSleep: work this long before answering (a Go duration); the work
//     ends early when the call's context does;
//   - MDCall: a name for the call, under which the app writes what it saw
//     of it (started, its context ended) to the events file (EnvEvents);
//   - keys starting with MDEchoPrefix come back as response headers and,
//     again, as trailers.
//
// and in the request messages as interop defines them: a response_status
// is returned as the call's status, response_parameters size and pace a
// stream's responses, a unary call's payload is echoed.
//
// What every call answers besides: header HeaderInflight (how many calls
// the app had in progress when this one started, itself included: the most
// any answer reports is the most the app ever served at once), header
// HeaderServer (the app's name), and trailer TrailerMethod (the method).
//
// The events file is how a test learns that the app saw a cancellation:
// the app appends a line per event to a file named in its environment,
// which works the same for a process a component test started and for a
// Nomad allocation on the same machine, and needs no call that could be
// routed to another instance or arrive after the app has gone.
package grpcapp

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The app's environment.
const (
	EnvPort = "PORT"
	// EnvHost is the address to listen on; default 127.0.0.1.
	EnvHost = "GRPCAPP_HOST"
	// EnvEvents names the file the app appends its events to; empty
	// writes none.
	EnvEvents = "GRPCAPP_EVENTS"
	// EnvName is the app's name in HeaderServer; default K_REVISION.
	EnvName = "GRPCAPP_NAME"
)

// Request metadata the app acts on, and response metadata it adds.
const (
	MDSleep      = "x-grpcapp-sleep"
	MDCall       = "x-grpcapp-call"
	MDEchoPrefix = "x-echo-"

	HeaderInflight = "x-grpcapp-inflight"
	HeaderServer   = "x-grpcapp-server"
	TrailerMethod  = "x-grpcapp-method"
)

// Event kinds in the events file.
const (
	// EventStart: a named call reached the app's handler.
	EventStart = "start"
	// EventEnded: a named call's context ended before the app finished
	// it; the detail is the context's error, "canceled" (the client or a
	// proxy reset the stream) or "deadline" (the call's grpc-timeout
	// passed).
	EventEnded = "ended"
	// EventDone: the app finished a named call.
	EventDone = "done"
)

// Config is one app.
type Config struct {
	// Name goes in HeaderServer and SimpleResponse.server_id.
	Name string
	// Events receives one line per event of a named call; nil drops them.
	Events io.Writer
}

// app implements the test service.
type app struct {
	testpb.UnimplementedTestServiceServer
	cfg      Config
	inflight atomic.Int64
	eventsMu sync.Mutex // one line per Write, whole
}

// NewServer returns a gRPC server with the test and health services
// registered (the health service reports SERVING for the server as a
// whole and for grpc.testing.TestService).
func NewServer(cfg Config) *grpc.Server {
	srv := grpc.NewServer()
	testpb.RegisterTestServiceServer(srv, &app{cfg: cfg})
	hs := health.NewServer()
	hs.SetServingStatus("", healthpb.HealthCheckResponse_SERVING)
	hs.SetServingStatus(testpb.TestService_ServiceDesc.ServiceName, healthpb.HealthCheckResponse_SERVING)
	healthpb.RegisterHealthServer(srv, hs)
	return srv
}

// call is what a handler knows of its call.
type call struct {
	a      *app
	ctx    context.Context
	method string
	name   string // MDCall, "" when unnamed
	sleep  time.Duration
	header metadata.MD
}

// begin reads the call's metadata, counts it in progress and records its
// start; end must follow.
func (a *app) begin(ctx context.Context, method string) (*call, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	c := &call{a: a, ctx: ctx, method: method, header: metadata.MD{}}
	if v := md.Get(MDCall); len(v) > 0 {
		c.name = v[0]
	}
	if v := md.Get(MDSleep); len(v) > 0 {
		d, err := time.ParseDuration(v[0])
		if err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "%s: %v", MDSleep, err)
		}
		c.sleep = d
	}
	n := a.inflight.Add(1)
	for k, vs := range md {
		if strings.HasPrefix(k, MDEchoPrefix) {
			c.header[k] = vs
		}
	}
	c.header.Set(HeaderInflight, strconv.FormatInt(n, 10))
	c.header.Set(HeaderServer, a.cfg.Name)
	c.event(EventStart, "")
	return c, nil
}

// end stops counting the call and sets its trailers: the echoed keys and
// the method. It returns err, after recording how the call ended.
func (c *call) end(err error) error {
	c.a.inflight.Add(-1)
	tr := metadata.Pairs(TrailerMethod, c.method)
	for k, vs := range c.header {
		if strings.HasPrefix(k, MDEchoPrefix) {
			tr[k] = vs
		}
	}
	grpc.SetTrailer(c.ctx, tr)
	switch cerr := c.ctx.Err(); {
	case errors.Is(cerr, context.Canceled):
		c.event(EventEnded, "canceled")
	case errors.Is(cerr, context.DeadlineExceeded):
		c.event(EventEnded, "deadline")
	default:
		c.event(EventDone, "")
	}
	return err
}

// work takes d, or less when the call's context ends first: then it
// returns the context's status.
func (c *call) work(d time.Duration) error {
	if d <= 0 {
		return c.ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-c.ctx.Done():
		return status.FromContextError(c.ctx.Err()).Err()
	}
}

// event appends "kind call detail" to the events file, for a named call.
func (c *call) event(kind, detail string) {
	if c.name == "" || c.a.cfg.Events == nil {
		return
	}
	line := kind + " " + c.name
	if detail != "" {
		line += " " + detail
	}
	c.a.eventsMu.Lock()
	defer c.a.eventsMu.Unlock()
	// One Write per line: with O_APPEND, lines of several processes
	// sharing the file never interleave.
	_, _ = io.WriteString(c.a.cfg.Events, line+"\n")
}

// echoStatus is the status a request asked for, nil for OK.
func echoStatus(s *testpb.EchoStatus) error {
	if s == nil || codes.Code(s.GetCode()) == codes.OK {
		return nil
	}
	return status.Error(codes.Code(s.GetCode()), s.GetMessage())
}

// payload is n bytes of a pattern a client can check.
func payload(n int32) *testpb.Payload {
	b := make([]byte, max(n, 0))
	for i := range b {
		b[i] = byte('a' + i%26)
	}
	return &testpb.Payload{Body: b}
}

func (a *app) EmptyCall(ctx context.Context, _ *testpb.Empty) (*testpb.Empty, error) {
	c, err := a.begin(ctx, "EmptyCall")
	if err != nil {
		return nil, err
	}
	if err := grpc.SetHeader(ctx, c.header); err != nil {
		return nil, c.end(err)
	}
	if err := c.work(c.sleep); err != nil {
		return nil, c.end(err)
	}
	return &testpb.Empty{}, c.end(nil)
}

// UnaryCall echoes the request's payload (or answers response_size bytes
// when it asks for some) after the call's sleep, or the status the
// request asks for.
func (a *app) UnaryCall(ctx context.Context, req *testpb.SimpleRequest) (*testpb.SimpleResponse, error) {
	c, err := a.begin(ctx, "UnaryCall")
	if err != nil {
		return nil, err
	}
	if err := grpc.SetHeader(ctx, c.header); err != nil {
		return nil, c.end(err)
	}
	if err := c.work(c.sleep); err != nil {
		return nil, c.end(err)
	}
	if err := echoStatus(req.GetResponseStatus()); err != nil {
		return nil, c.end(err)
	}
	p := req.GetPayload()
	if req.GetResponseSize() > 0 || p == nil {
		p = payload(req.GetResponseSize())
	}
	return &testpb.SimpleResponse{Payload: p, ServerId: a.cfg.Name}, c.end(nil)
}

// StreamingOutputCall sends one response per response_parameters entry,
// each after its interval.
func (a *app) StreamingOutputCall(req *testpb.StreamingOutputCallRequest, stream grpc.ServerStreamingServer[testpb.StreamingOutputCallResponse]) error {
	c, err := a.begin(stream.Context(), "StreamingOutputCall")
	if err != nil {
		return err
	}
	if err := stream.SendHeader(c.header); err != nil {
		return c.end(err)
	}
	if err := c.work(c.sleep); err != nil {
		return c.end(err)
	}
	for _, p := range req.GetResponseParameters() {
		if err := c.work(time.Duration(p.GetIntervalUs()) * time.Microsecond); err != nil {
			return c.end(err)
		}
		if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: payload(p.GetSize())}); err != nil {
			return c.end(err)
		}
	}
	return c.end(echoStatus(req.GetResponseStatus()))
}

// StreamingInputCall answers the sum of the payload sizes the client sent.
func (a *app) StreamingInputCall(stream grpc.ClientStreamingServer[testpb.StreamingInputCallRequest, testpb.StreamingInputCallResponse]) error {
	c, err := a.begin(stream.Context(), "StreamingInputCall")
	if err != nil {
		return err
	}
	if err := stream.SendHeader(c.header); err != nil {
		return c.end(err)
	}
	var sum int32
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return c.end(err)
		}
		sum += int32(len(req.GetPayload().GetBody()))
	}
	if err := c.work(c.sleep); err != nil {
		return c.end(err)
	}
	return c.end(stream.SendAndClose(&testpb.StreamingInputCallResponse{AggregatedPayloadSize: sum}))
}

// FullDuplexCall answers each request as it arrives, as
// StreamingOutputCall answers one, until the client half-closes.
func (a *app) FullDuplexCall(stream grpc.BidiStreamingServer[testpb.StreamingOutputCallRequest, testpb.StreamingOutputCallResponse]) error {
	c, err := a.begin(stream.Context(), "FullDuplexCall")
	if err != nil {
		return err
	}
	if err := stream.SendHeader(c.header); err != nil {
		return c.end(err)
	}
	if err := c.work(c.sleep); err != nil {
		return c.end(err)
	}
	for {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return c.end(nil)
		}
		if err != nil {
			return c.end(err)
		}
		if err := echoStatus(req.GetResponseStatus()); err != nil {
			return c.end(err)
		}
		for _, p := range req.GetResponseParameters() {
			if err := c.work(time.Duration(p.GetIntervalUs()) * time.Microsecond); err != nil {
				return c.end(err)
			}
			if err := stream.Send(&testpb.StreamingOutputCallResponse{Payload: payload(p.GetSize())}); err != nil {
				return c.end(err)
			}
		}
	}
}

// Event is one line of the events file.
type Event struct {
	Kind, Call, Detail string
}

// ReadEvents reads the events file; a file not written yet has none.
func ReadEvents(path string) ([]Event, error) {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("grpcapp: read events: %w", err)
	}
	defer f.Close()
	var out []Event
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue // a line being written
		}
		e := Event{Kind: fields[0], Call: fields[1]}
		if len(fields) > 2 {
			e.Detail = fields[2]
		}
		out = append(out, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("grpcapp: read events %s: %w", path, err)
	}
	return out, nil
}

// Find is the first event of a kind for a call, if any.
func Find(events []Event, kind, call string) (Event, bool) {
	for _, e := range events {
		if e.Kind == kind && e.Call == call {
			return e, true
		}
	}
	return Event{}, false
}
