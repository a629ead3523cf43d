package autoscaler

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/catalog"
)

// newTestTracer is a tracer into an in-memory exporter, parent-based as
// in production, and the function that returns what it exported.
func newTestTracer(t *testing.T) (trace.Tracer, func() tracetest.SpanStubs) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.NeverSample())))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp.Tracer("test"), func() tracetest.SpanStubs {
		if err := tp.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		return exp.GetSpans()
	}
}

// heldRequest is the span context of a traced request's hold at the
// gateway, as the gateway puts it into a wake's context.
func heldRequest(t *testing.T, sampled bool) trace.SpanContext {
	t.Helper()
	tid, _ := trace.TraceIDFromHex("4bf92f3577b34da6a3ce929d0e0e4736")
	sid, _ := trace.SpanIDFromHex("00f067aa0ba902b7")
	flags := trace.TraceFlags(0)
	if sampled {
		flags = trace.FlagsSampled
	}
	return trace.NewSpanContext(trace.SpanContextConfig{TraceID: tid, SpanID: sid, TraceFlags: flags})
}

func scaleSpans(spans tracetest.SpanStubs) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == spanScale {
			out = append(out, s)
		}
	}
	return out
}

func attrValue(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

// checkScaleSpan fails unless spans hold exactly one scale call, the
// child of cause, with what the call did.
func checkScaleSpan(t *testing.T, spans tracetest.SpanStubs, cause trace.SpanContext, by string, count int) tracetest.SpanStub {
	t.Helper()
	sc := scaleSpans(spans)
	if len(sc) != 1 {
		t.Fatalf("%d %q spans, want 1 (all: %v)", len(sc), spanScale, spans.Snapshots())
	}
	s := sc[0]
	if s.SpanContext.TraceID() != cause.TraceID() || s.Parent.SpanID() != cause.SpanID() || s.SpanKind != trace.SpanKindClient {
		t.Errorf("scale span %v under %v (kind %v), want a client span under the held request %v", s.SpanContext, s.Parent, s.SpanKind, cause)
	}
	if v := attrValue(s, attrRevision).AsString(); v != "hello-00001" {
		t.Errorf("revision %q", v)
	}
	if v := attrValue(s, attrCount).AsInt64(); v != int64(count) {
		t.Errorf("count %d, want %d", v, count)
	}
	if v := attrValue(s, attrBy).AsString(); v != by {
		t.Errorf("by %q, want %q", v, by)
	}
	if v := attrValue(s, attrReason).AsString(); v == "" {
		t.Error("no reason")
	}
	return s
}

// The scale call a traced wake leads to is a span in the trace of the
// request that caused it, whether the wake reached the leader in process
// or over the admin API; an untraced wake, or a sampled=0 one, makes
// none.
func TestTracingWakeScaleCallIsASpan(t *testing.T) {
	for _, remote := range []bool{false, true} {
		t.Run(map[bool]string{false: "in process", true: "admin API"}[remote], func(t *testing.T) {
			tracer, spans := newTestTracer(t)
			a, cat, _, sc, clk := newTestAutoscaler(t, func(c *Config) { c.Tracer = tracer })
			cat.SetRevision(testRevision("hello-00001", 0, nil))
			cat.SetRevision(testRevision("other-00001", 0, nil))
			var sink DemandSink = a
			if remote {
				keys := testKeys(t)
				srv := adminServer(t, a, keys)
				rs, err := NewRemoteSink(RemoteSinkConfig{Leader: func() (string, bool) { return srv.URL, true }, Client: signedClient(t, keys)})
				if err != nil {
					t.Fatal(err)
				}
				sink = rs
			}
			ctx := context.Background()
			l := startLoop(t, a)
			tickN(ctx, l, clk, 1, 0)

			cause := heldRequest(t, true)
			if err := sink.Wake(trace.ContextWithSpanContext(ctx, cause), "a1", Demand{Revision: "hello-00001", Queued: 1}); err != nil {
				t.Fatal(err)
			}
			if err := sink.Wake(trace.ContextWithSpanContext(ctx, heldRequest(t, false)), "a1", Demand{Revision: "other-00001", Queued: 1}); err != nil {
				t.Fatal(err)
			}
			l.tickWoken(ctx)
			l.applies.Wait()
			if n := len(sc.Calls()); n != 2 {
				t.Fatalf("%d scale calls, want 2", n)
			}
			checkScaleSpan(t, spans(), cause, "autoscaler", 1)
		})
	}
}

// A full tick that decides a woken revision before tickWoken does still
// puts its call in the wake's trace.
func TestTracingWakeScaleCallByAFullTick(t *testing.T) {
	tracer, spans := newTestTracer(t)
	a, cat, _, sc, clk := newTestAutoscaler(t, func(c *Config) { c.Tracer = tracer })
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	ctx := context.Background()
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 0)
	cause := heldRequest(t, true)
	if err := a.Wake(trace.ContextWithSpanContext(ctx, cause), "a1", Demand{Revision: "hello-00001", Queued: 1}); err != nil {
		t.Fatal(err)
	}
	tickN(ctx, l, clk, 1, 0)
	l.tickWoken(ctx) // finds the count applied: no second call
	l.applies.Wait()
	if n := len(sc.Calls()); n != 1 {
		t.Fatalf("%d scale calls, want 1", n)
	}
	checkScaleSpan(t, spans(), cause, "autoscaler", 1)
}

// A failed call's span says so; the retry is a span of its own.
func TestTracingScaleRetriesAreSpans(t *testing.T) {
	tracer, spans := newTestTracer(t)
	a, cat, _, sc, clk := newTestAutoscaler(t, func(c *Config) { c.Tracer = tracer })
	sc.fail = func(n int, _ scaleCall) error {
		if n == 1 {
			return transientErr{"nomad: 500"}
		}
		return nil
	}
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	ctx := context.Background()
	l := startLoop(t, a)
	tickN(ctx, l, clk, 1, 0)
	cause := heldRequest(t, true)
	_ = a.Wake(trace.ContextWithSpanContext(ctx, cause), "a1", Demand{Revision: "hello-00001", Queued: 1})
	l.tickWoken(ctx)
	l.applies.Wait()
	got := scaleSpans(spans())
	if len(got) != 2 || got[0].Status.Code.String() != "Error" || !strings.Contains(got[0].Status.Description, "500") ||
		attrValue(got[1], attrAttempt).AsInt64() != 2 || got[1].Status.Code.String() == "Error" {
		t.Fatalf("spans %+v, want a failed attempt and a second one", got)
	}
}

// The Waker's own raise (the leader did not take the wake) is a span in
// the causing request's trace too.
func TestTracingWakerRaiseIsASpan(t *testing.T) {
	tracer, spans := newTestTracer(t)
	cat := catalog.New()
	cat.SetRevision(testRevision("hello-00001", 0, nil))
	raiser := &memRaiser{cat: cat}
	w, err := NewWaker(WakerConfig{Revisions: cat, Raiser: raiser, Next: &memNext{err: errLeaderGone}, Tracer: tracer, HandOff: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cause := heldRequest(t, true)
	if err := w.Wake(trace.ContextWithSpanContext(context.Background(), cause), "r2", Demand{Revision: "hello-00001", Queued: 1}); err != nil {
		t.Fatal(err)
	}
	s := checkScaleSpan(t, spans(), cause, "waker", 1)
	if !attrValue(s, attrRaised).AsBool() {
		t.Error("the raise span does not say it raised")
	}
}
