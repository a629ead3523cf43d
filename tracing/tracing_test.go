package tracing

import (
	"context"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
)

func newTest(t *testing.T, exp sdktrace.SpanExporter, capacity int) (*Provider, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	p, err := New(context.Background(), Options{ServiceName: "test", Exporter: exp, Registerer: reg, QueueCapacity: capacity})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	})
	return p, reg
}

func TestOffWithoutEndpoint(t *testing.T) {
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "")
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	p, err := New(context.Background(), Options{})
	if err != nil || p != nil {
		t.Fatalf("no endpoint: got %v, %v; want nil, nil", p, err)
	}
	env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:4318"
	if !Enabled(getenv) {
		t.Fatal("an endpoint is set: tracing must be on")
	}
	env["OTEL_TRACES_EXPORTER"] = "none"
	if Enabled(getenv) {
		t.Fatal("OTEL_TRACES_EXPORTER=none must switch tracing off")
	}
}

func TestSettingsPassOnOTELButServiceName(t *testing.T) {
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SERVICE_NAME": "cp", "OTEL_TRACES_SAMPLER_ARG": "0.01", "HOME": "/root"}
	got := Settings(func(k string) string { return env[k] })
	if len(got) != 2 || got["OTEL_EXPORTER_OTLP_ENDPOINT"] != "http://x:4318" || got["OTEL_TRACES_SAMPLER_ARG"] != "0.01" {
		t.Fatalf("settings: %v", got)
	}
	delete(env, "OTEL_EXPORTER_OTLP_ENDPOINT")
	if got := Settings(func(k string) string { return env[k] }); len(got) != 0 {
		t.Fatalf("tracing off passes on %v", got)
	}
}

// A request's traceparent makes the server span its child; sampled=0 is
// respected (parent-based), and the client span's context is what goes on.
func TestPropagationParentBased(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p, _ := newTest(t, exp, 0)
	const parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	for _, tc := range []struct {
		name, header, value string
		sampled             bool
		trace               string
	}{
		{"w3c sampled", "traceparent", parent, true, "0af7651916cd43dd8448eb211c80319c"},
		{"w3c not sampled", "traceparent", "00-0af7651916cd43dd8448eb211c80319d-b7ad6b7169203331-00", false, "0af7651916cd43dd8448eb211c80319d"},
		{"b3 single", "b3", "80f198ee56343ba864fe8b2a57d3eff7-e457b5a2e4d86bd1-1", true, "80f198ee56343ba864fe8b2a57d3eff7"},
		{"none", "", "", true, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exp.Reset()
			r := httptest.NewRequest("GET", "http://svc.default.localhost/x", nil)
			if tc.header != "" {
				r.Header.Set(tc.header, tc.value)
			}
			ctx, sp := p.StartServer(r, "server")
			out := http.Header{}
			_, cl := p.StartClient(ctx, out, "client")
			if got := sp.SpanContext().IsSampled(); got != tc.sampled {
				t.Fatalf("sampled %v, want %v", got, tc.sampled)
			}
			if tc.trace != "" && sp.SpanContext().TraceID().String() != tc.trace {
				t.Fatalf("trace %s, want %s", sp.SpanContext().TraceID(), tc.trace)
			}
			tp := out.Get("traceparent")
			if !strings.Contains(tp, cl.SpanContext().SpanID().String()) || !strings.Contains(tp, sp.SpanContext().TraceID().String()) {
				t.Fatalf("outgoing traceparent %q is not the client span %v", tp, cl.SpanContext())
			}
			cl.End()
			EndHTTP(sp, 200)
			if err := p.ForceFlush(context.Background()); err != nil {
				t.Fatal(err)
			}
			spans := exp.GetSpans()
			if !tc.sampled {
				if len(spans) != 0 {
					t.Fatalf("sampled=0 exported %d spans", len(spans))
				}
				return
			}
			if len(spans) != 2 || spans[0].Parent.SpanID() != spans[1].SpanContext.SpanID() {
				t.Fatalf("want client child of server, got %v", spans.Snapshots())
			}
		})
	}
}

// blockingExporter is a collector that never answers: each export waits
// until the test releases it.
type blockingExporter struct {
	calls   chan struct{}
	release chan struct{}
}

func (b *blockingExporter) ExportSpans(ctx context.Context, _ []sdktrace.ReadOnlySpan) error {
	select {
	case b.calls <- struct{}{}:
	default:
	}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return context.DeadlineExceeded
}
func (b *blockingExporter) Shutdown(context.Context) error { return nil }

// A dead collector neither blocks the span's end nor grows the queue:
// spans beyond its capacity are dropped and counted.
func TestDeadCollectorDropsAndCounts(t *testing.T) {
	exp := &blockingExporter{calls: make(chan struct{}, 1), release: make(chan struct{})}
	q, err := newQueue(exp, queueConfig{Capacity: 4, Batch: 1, Timeout: time.Hour}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(q))
	t.Cleanup(func() {
		close(exp.release)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := tp.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	tr := tp.Tracer("test")
	// One span goes to the stuck exporter (a batch of one)...
	_, s := tr.Start(context.Background(), "first")
	s.End()
	select {
	case <-exp.calls:
	case <-time.After(30 * time.Second):
		t.Fatal("the exporter was never called")
	}
	// ...so the queue fills: 4 wait, the rest are dropped, none blocks.
	const n = 100
	done := make(chan struct{})
	go func() {
		for range n {
			_, s := tr.Start(context.Background(), "later")
			s.End()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("ending spans blocked on a dead collector")
	}
	if got := testutil.ToFloat64(q.dropped.WithLabelValues(dropQueueFull)); got != n-4 {
		t.Fatalf("dropped %v spans, want %d", got, n-4)
	}
}

func TestExemplarOnlySampled(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: "h"})
	Observe(h, 1, trace.SpanContext{})
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1}, SpanID: trace.SpanID{1}, TraceFlags: trace.FlagsSampled})
	Observe(h, 2, sc)
	reg := prometheus.NewRegistry()
	reg.MustRegister(h)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var ex []string
	for _, b := range mfs[0].GetMetric()[0].GetHistogram().GetBucket() {
		if e := b.GetExemplar(); e != nil {
			ex = append(ex, e.GetLabel()[0].GetValue())
		}
	}
	if len(ex) != 1 || ex[0] != sc.TraceID().String() {
		t.Fatalf("exemplars %v, want one of trace %s", ex, sc.TraceID())
	}
}

// StartRequest: a request not sampled gets no span and keeps its
// traceparent; one without trace context gets the decision (sampled=0)
// for the hops after it, as a value its header is left without.
func TestStartRequestNotSampled(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p, err := New(context.Background(), Options{ServiceName: "test", Exporter: exp, Sampler: sdktrace.ParentBased(sdktrace.NeverSample())})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	r := httptest.NewRequest("GET", "http://x/", nil)
	out, sp, carry := p.StartRequest(r, "server")
	if sp != nil || out != r || len(r.Header) != 0 {
		t.Fatalf("a request not sampled got a span, a new request or a header %v", r.Header)
	}
	if tp := carry.String(); !carry.IsSet() || !notSampled(tp) || string(carry.Append(nil)) != tp {
		t.Fatalf("traceparent to carry on %q, want the not-sampled decision", tp)
	}
	carry.SetHeader(r.Header)
	if r.Header.Get("traceparent") != carry.String() {
		t.Fatalf("SetHeader: %v", r.Header)
	}
	const in = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
	r = httptest.NewRequest("GET", "http://x/", nil)
	r.Header.Set("traceparent", in)
	if _, sp, carry := p.StartRequest(r, "server"); sp != nil || carry.IsSet() || r.Header.Get("traceparent") != in {
		t.Fatalf("sampled=0 from the client: span %v, traceparent %q, carried %q", sp, r.Header.Get("traceparent"), carry)
	}
	// Sampled by its parent: a span, with the request's attributes.
	r = httptest.NewRequest("GET", "http://x/p", nil)
	r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	r2, sp, carry := p.StartRequest(r, "server")
	if sp == nil || carry.IsSet() || !trace.SpanContextFromContext(r2.Context()).IsSampled() {
		t.Fatal("a sampled parent's request got no span")
	}
	sp.End()
	if err := p.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if s := exp.GetSpans(); len(s) != 1 || len(s[0].Attributes) != 4 {
		t.Fatalf("exported %v", s.Snapshots())
	}
}

func TestSamplerFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name, arg   string
		parentBased bool
		desc        string
		bad         bool
	}{
		{"", "", true, "ParentBased{root:AlwaysOnSampler", false},
		{"parentbased_traceidratio", "0.01", true, "ParentBased{root:TraceIDRatioBased{0.01}", false},
		{"traceidratio", "0.5", false, "TraceIDRatioBased{0.5}", false},
		{"always_off", "", false, "AlwaysOffSampler", false},
		{"traceidratio", "2", false, "", true},
		{"jaeger_remote", "", false, "", true},
	} {
		env := map[string]string{"OTEL_TRACES_SAMPLER": tc.name, "OTEL_TRACES_SAMPLER_ARG": tc.arg}
		s, pb, _, err := samplerFromEnv(func(k string) string { return env[k] })
		if tc.bad {
			if err == nil {
				t.Errorf("%s %s: no error", tc.name, tc.arg)
			}
			continue
		}
		if err != nil || pb != tc.parentBased || !strings.HasPrefix(s.Description(), tc.desc) {
			t.Errorf("%s %s: %v parent-based %v, %v", tc.name, tc.arg, s.Description(), pb, err)
		}
	}
}

func TestTraceparentFormatAndFlag(t *testing.T) {
	tid, sid := newTraceID(), newSpanID()
	for _, sampled := range []bool{true, false} {
		tp := traceparent(tid, sid, sampled)
		sc := trace.SpanContextFromContext(newPropagator().Extract(context.Background(), propagation.HeaderCarrier(http.Header{"Traceparent": {tp}})))
		if sc.TraceID() != tid || sc.SpanID() != sid || sc.IsSampled() != sampled || notSampled(tp) == sampled {
			t.Errorf("%q reads back as %v (notSampled %v)", tp, sc, notSampled(tp))
		}
	}
	if notSampled("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00") || notSampled("garbage") {
		t.Error("notSampled trusted a header it cannot read")
	}
}

// Under the environment's parentbased_traceidratio sampler, a root request
// the ratio drops costs the decision to carry on; one it keeps is a span
// whose trace is the one it was sampled with.
func TestRootDecidedBeforeAnySpan(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	for _, ratio := range []string{"0", "1"} {
		t.Setenv("OTEL_TRACES_SAMPLER_ARG", ratio)
		exp := tracetest.NewInMemoryExporter()
		p, err := New(context.Background(), Options{ServiceName: "test", Exporter: exp})
		if err != nil {
			t.Fatal(err)
		}
		r := httptest.NewRequest("GET", "http://x/", nil)
		r2, sp, carry := p.StartRequest(r, "server")
		tp := carry.String()
		if ratio == "0" {
			if sp != nil || !notSampled(tp) || len(r.Header) != 0 {
				t.Errorf("ratio 0: span %v, traceparent %q", sp, tp)
			}
		} else {
			if sp == nil || !sp.SpanContext().IsSampled() || r2 == r || carry.IsSet() {
				t.Fatalf("ratio 1: no sampled span")
			}
			sp.End()
		}
		if err := p.ForceFlush(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := len(exp.GetSpans()); (ratio == "1") != (n == 1) {
			t.Errorf("ratio %s: %d spans exported", ratio, n)
		}
		p.Shutdown(context.Background())
	}
}

func attrKV(k, v string) attribute.KeyValue      { return attribute.String(k, v) }
func attrInt(k string, v int) attribute.KeyValue { return attribute.Int(k, v) }

func counterValue(c prometheus.Counter) float64 { return testutil.ToFloat64(c) }

// The root rule StartRequest applies itself decides as the SDK's
// TraceIDRatioBased sampler does, for the same trace ID, at every ratio
// (the span of a kept root is started with that ID and decided again by
// the SDK), and keeps about the ratio.
func TestRootRuleAgreesWithSDK(t *testing.T) {
	for _, ratio := range []float64{0, 0.01, 0.25, 0.5, 0.999, 1} {
		rule, sdk := ratioRule(ratio), sdktrace.TraceIDRatioBased(ratio)
		kept := 0
		const n = 20000
		for range n {
			lo := rand.Uint64()
			tid := rootTraceID(lo)
			want := sdk.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: tid}).Decision == sdktrace.RecordAndSample
			if got := rule.keeps(lo); got != want {
				t.Fatalf("ratio %v, trace %s: rule keeps %v, the SDK %v", ratio, tid, got, want)
			}
			if want {
				kept++
			}
		}
		if got := float64(kept) / n; math.Abs(got-ratio) > 0.02 {
			t.Errorf("ratio %v: kept %v", ratio, got)
		}
	}
	// The edges, where a bound off by one shows.
	rule, sdk := ratioRule(0.5), sdktrace.TraceIDRatioBased(0.5)
	for _, lo := range []uint64{0, 1, 1<<63 - 1, 1 << 63, 1<<63 + 1, math.MaxUint64} {
		want := sdk.ShouldSample(sdktrace.SamplingParameters{ParentContext: context.Background(), TraceID: rootTraceID(lo)}).Decision == sdktrace.RecordAndSample
		if rule.keeps(lo) != want {
			t.Errorf("ratio 0.5, low half %x: rule %v, SDK %v", lo, rule.keeps(lo), want)
		}
	}
}

// A root request that is not sampled allocates nothing: the decision is a
// value the forwarding path writes into the request it sends.
func TestRootNotSampledAllocatesNothing(t *testing.T) {
	t.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	t.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	p, err := New(context.Background(), Options{ServiceName: "test", Exporter: tracetest.NewInMemoryExporter()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	r := httptest.NewRequest("GET", "http://x/", nil)
	buf := make([]byte, 0, 64)
	if n := testing.AllocsPerRun(100, func() {
		_, _, carry := p.StartRequest(r, "server")
		buf = carry.Append(buf[:0])
	}); n != 0 {
		t.Errorf("%v allocations per not-sampled root", n)
	}
	if len(buf) != TraceparentLen || !notSampled(string(buf)) {
		t.Errorf("appended %q", buf)
	}
}

// BenchmarkStartRequestRootNotSampled is what a root request the sampler
// drops costs: the decision and the traceparent to carry on, formatted
// into a reused buffer as the gateway's request head is.
func BenchmarkStartRequestRootNotSampled(b *testing.B) {
	b.Setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
	b.Setenv("OTEL_TRACES_SAMPLER_ARG", "0")
	p, err := New(context.Background(), Options{ServiceName: "bench", Exporter: tracetest.NewNoopExporter()})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Shutdown(context.Background())
	r := httptest.NewRequest("GET", "http://x/", nil)
	r.Header.Set("User-Agent", "bench")
	buf := make([]byte, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		_, sp, tp := p.StartRequest(r, "gateway")
		if sp != nil {
			b.Fatal("sampled at ratio 0")
		}
		buf = tp.Append(buf[:0])
	}
}
