package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"

	"github.com/nomad-serverless/nomad-serverless/test/grpcapp"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// Scenario 23: gRPC end to end. A plain grpc-go server (test/grpcapp: h2c
// only, the interop TestService and the health service) runs as raw_exec
// with protocol = "h2c" and gRPC readiness; a real grpc-go client calls it
// through the gateway. The first call at zero wakes the revision and is
// answered; every kind of call passes with its metadata, trailers and
// statuses; a deadline shorter than the app's work gives DeadlineExceeded
// and the app sees the call end, as it sees a client's cancellation; a
// burst of 100 calls on one connection at zero is answered in full, with
// one wake.
func TestE2E23GRPC(t *testing.T) {
	h := newHarness(t, "23 grpc")
	const svc = "e2e-grpc"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-23", "", "")
	// The app appends what it saw of named calls here: the allocation
	// runs on this machine (raw_exec), so the file is the test's to read.
	events := filepath.Join(h.dir, "grpcapp-events")
	s := Service{
		Name:        svc,
		Binary:      testbin.Program(t, grpcapp.Command),
		GRPC:        true,
		Env:         map[string]string{grpcapp.EnvEvents: events},
		Concurrency: 10,
		Scaling:     FastScaling(),
	}
	h.deploy(h.writeServices("grpc.hcl", s))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	// The first gRPC call to the revision at zero wakes it and is
	// answered, by the revision (its K_REVISION is the app's name).
	h.waitZero(rev, 90*time.Second)
	c := grpcapp.Dial(t, g.listen, host(svc, ""))
	start := time.Now()
	resp, err := c.UnaryCall(ctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("wake up")}})
	if err != nil || string(resp.GetPayload().GetBody()) != "wake up" || resp.GetServerId() != rev {
		t.Fatalf("first call at zero: %q from %q, %v", resp.GetPayload().GetBody(), resp.GetServerId(), err)
	}
	h.timing("gRPC call at zero: answered", time.Since(start))
	eventually(t, 15*time.Second, "Nomad records the wake of "+rev+" by the gRPC call", func() (bool, string) {
		ups := ScaleUpsFromZero(h.scalingEvents(rev), start)
		return len(ups) == 1, fmt.Sprintf("scale-ups from zero since the call: %v", ups)
	})

	// Every kind of call, metadata and trailers both ways, statuses.
	grpcapp.CheckCallKinds(t, ctx, c, rev)
	// Deadlines and cancellations reach the app.
	grpcapp.CheckDeadline(t, ctx, c, events, "e2e", 2*time.Second, time.Minute)
	grpcapp.CheckCancellations(t, ctx, c, events, "e2e", time.Minute)

	// 100 concurrent calls on one new connection to the revision at zero:
	// all answered, one wake, no app past the concurrency.
	h.waitZero(rev, 90*time.Second)
	burst := grpcapp.Dial(t, g.listen, host(svc, ""))
	burstStart := time.Now()
	errs, most := grpcapp.Burst(ctx, burst, 100, 100*time.Millisecond)
	h.timing("burst of 100 gRPC calls at zero: all answered", time.Since(burstStart))
	if len(errs) > 0 {
		t.Errorf("burst at zero: %d of 100 calls failed, e.g. %v", len(errs), errs[0])
	}
	if most < 1 || most > s.Concurrency {
		t.Errorf("burst at zero: an app had %d calls at once, want 1 to %d", most, s.Concurrency)
	}
	if n := burst.Dials(); n != 1 {
		t.Errorf("burst at zero: the client opened %d connections, want 1", n)
	}
	// Give the autoscaler's follow-up decisions a moment to be recorded.
	time.Sleep(2 * time.Second)
	if ups := ScaleUpsFromZero(h.scalingEvents(rev), burstStart); len(ups) != 1 {
		t.Errorf("the burst woke the revision %d times, want 1: %+v", len(ups), h.scalingEvents(rev))
	}
}
