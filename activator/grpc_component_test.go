package activator

// Component tests of gRPC through the whole serving path: a real grpc-go
// client, the gateway in this process, and per instance a real sidecar
// process in front of a real grpc-go server (test/grpcapp, h2c only, gRPC
// readiness), placed by dev/localcluster and scaled by the real autoscaler.

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/dev/localcluster"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/grpcapp"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// grpcBound bounds each test's calls: generous, so only a hang fails.
const grpcBound = 3 * time.Minute

// addGRPCService adds a one-revision service whose instances run the gRPC
// app with protocol h2c and gRPC readiness, and returns the app's events
// file (shared by its instances). The request timeout is an hour, so a
// call held up anywhere fails the test's own bound instead of ending as a
// timeout.
func (s *stack) addGRPCService(t *testing.T, svc string, rev catalog.Revision) string {
	t.Helper()
	events := filepath.Join(t.TempDir(), "events")
	probe := spec.DefaultProbe(spec.ProbeGRPC)
	if rev.Timeout == 0 {
		rev.Timeout = time.Hour
	}
	s.addService(t, svc, []catalog.Revision{rev}, localcluster.App{
		Command:   []string{testbin.Program(t, grpcapp.Command)},
		Protocol:  spec.ProtocolH2C,
		Readiness: &probe,
		Env:       map[string]string{grpcapp.EnvEvents: events},
	})
	return events
}

// grpcClient is one h2c connection to the gateway with the service's host
// as :authority.
func (s *stack) grpcClient(t *testing.T, svc string) *grpcapp.Client {
	return grpcapp.Dial(t, s.srv.Listener.Addr().String(), svc+".default.localhost")
}

// The first gRPC call to a revision at zero wakes it and is answered; then
// every kind of call, metadata, trailers and statuses, client
// cancellations and deadlines pass gateway and sidecar both ways, and an
// HTTP/1.1 client reaches the h2c-only app through them.
func TestGRPCComponentWakeAndCalls(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 3 * time.Second})
	const rev = "greeter-00001"
	events := s.addGRPCService(t, "greeter", catalog.Revision{Name: rev})
	c := s.grpcClient(t, "greeter")
	ctx, cancel := context.WithTimeout(context.Background(), grpcBound)
	defer cancel()

	if n := s.lc.Running(rev); n != 0 {
		t.Fatalf("%d instances before the first call, want 0", n)
	}
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wake up")}})
	if err != nil || string(resp.GetPayload().GetBody()) != "wake up" || resp.GetServerId() != rev {
		t.Fatalf("first call at zero: %v from %q, %v", resp.GetPayload(), resp.GetServerId(), err)
	}
	if w := s.lc.Wakes(rev); w != 1 {
		t.Errorf("%d wakes from zero, want 1: %+v", w, s.lc.ScaleEvents(rev))
	}

	grpcapp.CheckCallKinds(t, ctx, c, rev)
	grpcapp.CheckCancellations(t, ctx, c, events, "gateway", time.Minute)
	grpcapp.CheckDeadline(t, ctx, c, events, "gateway", 2*time.Second, time.Minute)
	if st, err := grpcapp.HTTP1EmptyCall(ctx, s.cli, s.srv.URL, "greeter.default.localhost"); err != nil || st != "0" {
		t.Errorf("HTTP/1.1 call through the gateway to the h2c app: grpc-status %q, %v", st, err)
	}
	if n := c.Dials(); n != 1 {
		t.Errorf("the client opened %d connections, want 1", n)
	}
}

// A burst of 100 concurrent calls on one connection to a revision at zero
// is answered in full, with one wake, and no instance's app sees more
// calls at once than the revision's concurrency.
func TestGRPCComponentBurstAtZero(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 3 * time.Second})
	const rev = "burst-00001"
	s.addGRPCService(t, "burst", catalog.Revision{Name: rev, Concurrency: 10})
	c := s.grpcClient(t, "burst")
	ctx, cancel := context.WithTimeout(context.Background(), grpcBound)
	defer cancel()
	errs, most := grpcapp.Burst(ctx, c, 100, 50*time.Millisecond)
	if len(errs) > 0 {
		t.Fatalf("%d of 100 calls failed, e.g. %v", len(errs), errs[0])
	}
	if w := s.lc.Wakes(rev); w != 1 {
		t.Errorf("%d wakes from zero, want 1: %+v", w, s.lc.ScaleEvents(rev))
	}
	if most < 1 || most > 10 {
		t.Errorf("an instance's app had %d calls at once, want 1 to 10 (concurrency 10)", most)
	}
	if n := c.Dials(); n != 1 {
		t.Errorf("the client opened %d connections, want 1", n)
	}
	t.Logf("100 calls answered; at most %d at once in one app; %d instances", most, s.lc.Running(rev))
}

// The concurrency limit counts streams, not connections: with a limit of
// 1, many calls on one connection reach each app one at a time.
func TestGRPCComponentConcurrencyCountsStreams(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond})
	sc := testScaling()
	sc.Min = 1
	s.addGRPCService(t, "single", catalog.Revision{Name: "single-00001", Concurrency: 1, Scaling: sc})
	c := s.grpcClient(t, "single")
	ctx, cancel := context.WithTimeout(context.Background(), grpcBound)
	defer cancel()
	errs, most := grpcapp.Burst(ctx, c, 40, 20*time.Millisecond)
	if len(errs) > 0 {
		t.Fatalf("%d of 40 calls failed, e.g. %v", len(errs), errs[0])
	}
	if most != 1 {
		t.Errorf("an app had %d calls at once, want 1 (concurrency 1 counts streams)", most)
	}
	if n := c.Dials(); n != 1 {
		t.Errorf("the client opened %d connections, want 1", n)
	}
}

// The autoscaler scales on gRPC load as on HTTP/1 load: N streams held on
// one connection are N concurrent requests to the decider (not one
// connection), and over the target that scales the revision up.
func TestGRPCComponentAutoscalesOnStreams(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond})
	const rev = "held-00001"
	sc := testScaling()
	sc.Min, sc.Max, sc.Target = 1, 4, 2
	s.addGRPCService(t, "held", catalog.Revision{Name: rev, Scaling: sc})
	waitFor(t, "an instance routable", func() bool { return len(s.g.routable(rev)) > 0 })
	c := s.grpcClient(t, "held")
	ctx, cancel := context.WithTimeout(context.Background(), grpcBound)
	defer cancel()

	const n = 8
	release, err := grpcapp.HoldStreams(ctx, c, n)
	if err != nil {
		t.Fatal(err)
	}
	testbin.Eventually(t, time.Minute, 100*time.Millisecond, fmt.Sprintf("the decider sees %d held streams as about %d concurrent requests", n, n), func() (bool, string) {
		st, ok := s.as.State(rev)
		return ok && st.Stable > n-1.5 && st.Stable < n+1.5, fmt.Sprintf("%+v", st)
	})
	testbin.Eventually(t, time.Minute, 100*time.Millisecond, "the revision scales up", func() (bool, string) {
		return s.lc.Running(rev) >= 2, fmt.Sprintf("%d running; scale events %+v", s.lc.Running(rev), s.lc.ScaleEvents(rev))
	})
	if err := release(); err != nil {
		t.Fatal(err)
	}
	if d := c.Dials(); d != 1 {
		t.Errorf("the client opened %d connections, want 1", d)
	}
}

// Many concurrent unary calls on one client connection, the shape of
// make bench-grpc's "32 streams, 1 conn", pass the gateway's relay and
// the sidecar's without one failing (the relay's pooled upstream
// connections carry them).
func TestGRPCComponentManyStreamsOneConnection(t *testing.T) {
	s := startStack(t, stackOptions{checkInterval: 200 * time.Millisecond})
	sc := testScaling()
	sc.Min = 1
	s.addGRPCService(t, "many", catalog.Revision{Name: "many-00001", Scaling: sc})
	c := s.grpcClient(t, "many")
	ctx, cancel := context.WithTimeout(context.Background(), grpcBound)
	defer cancel()
	const streams, calls = 32, 150
	errs := make(chan error, streams*calls)
	var wg sync.WaitGroup
	for range streams {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range calls {
				if _, err := c.EmptyCall(ctx, &testpb.Empty{}); err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	n := 0
	var first error
	for err := range errs {
		if first == nil {
			first = err
		}
		n++
	}
	if n > 0 {
		t.Fatalf("%d of %d calls failed, e.g. %v", n, streams*calls, first)
	}
	if d := c.Dials(); d != 1 {
		t.Errorf("the client opened %d connections, want 1 (its connection was lost)", d)
	}
}
