package grpcapp

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
)

// serve runs the app in process and returns its address and events file.
func serve(t *testing.T, name string) (addr, events string) {
	t.Helper()
	events = filepath.Join(t.TempDir(), "events")
	f, err := os.OpenFile(events, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(Config{Name: name, Events: f})
	go srv.Serve(ln)
	t.Cleanup(srv.Stop)
	return ln.Addr().String(), events
}

// The app and the checks, with nothing between them: what the component
// and e2e tests rely on them for holds before a proxy is in the way.
func TestChecksPassAgainstTheAppItself(t *testing.T) {
	addr, events := serve(t, "direct")
	c := Dial(t, addr, "")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if r, err := healthpb.NewHealthClient(c.Conn).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", r, err)
	}
	CheckCallKinds(t, ctx, c, "direct")
	CheckCancellations(t, ctx, c, events, "direct", time.Minute)
	CheckDeadline(t, ctx, c, events, "direct", 100*time.Millisecond, time.Minute)
	errs, most := Burst(ctx, c, 20, 200*time.Millisecond)
	if len(errs) > 0 || most < 2 {
		t.Errorf("burst: %v; at most %d in progress, want several (nothing limits them)", errs, most)
	}
	release, err := HoldStreams(ctx, c, 3)
	if err != nil {
		t.Fatal(err)
	}
	var hdr metadata.MD
	if _, err := c.EmptyCall(ctx, &testpb.Empty{}, grpc.Header(&hdr)); err != nil || hdr.Get(HeaderInflight)[0] != "4" {
		t.Errorf("a call beside 3 held streams: %v, %s %v, want 4", err, HeaderInflight, hdr.Get(HeaderInflight))
	}
	if err := release(); err != nil {
		t.Error(err)
	}
	if _, ok := Find(mustEvents(t, events), EventDone, "direct-cancel-unary"); ok {
		t.Error("a canceled call is recorded done")
	}
	if n := c.Dials(); n != 1 {
		t.Errorf("%d connections, want 1", n)
	}
}

// recorder is a testing.TB that records errors instead of failing.
type recorder struct {
	testing.TB
	mu   sync.Mutex
	errs []string
}

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// The checks can fail: an app answering under another name fails every
// answer's check of it.
func TestCheckCallKindsCanFail(t *testing.T) {
	addr, _ := serve(t, "someone-else")
	rec := &recorder{TB: t}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	CheckCallKinds(rec, ctx, Dial(t, addr, ""), "direct")
	if len(rec.errs) < 5 {
		t.Fatalf("%d complaints about an app of another name, want one for each kind of answer: %q", len(rec.errs), rec.errs)
	}
}

// grpc-go's server does not speak HTTP/1.1: the HTTP/1.1 call only works
// through a proxy that speaks h2c to it (the sidecar).
func TestHTTP1CallNeedsAProxy(t *testing.T) {
	addr, _ := serve(t, "direct")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if st, err := HTTP1EmptyCall(ctx, &http.Client{}, "http://"+addr, "x"); err == nil {
		t.Fatalf("an HTTP/1.1 call straight to grpc-go answered grpc-status %q", st)
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

func TestRunNeedsAPort(t *testing.T) {
	err := Run(context.Background(), func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), EnvPort) {
		t.Fatalf("Run without a port: %v", err)
	}
}
