package activator

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// newTestTracing is tracing into an in-memory exporter, sampled
// parent-based as in production.
func newTestTracing(t *testing.T) (*tracing.Provider, *tracetest.InMemoryExporter) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	p, err := tracing.New(context.Background(), tracing.Options{ServiceName: "test", Exporter: exp,
		Sampler: sdktrace.ParentBased(sdktrace.AlwaysSample())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	return p, exp
}

// flushed are the spans exported once everything ended is flushed.
func flushed(t *testing.T, p *tracing.Provider, exp *tracetest.InMemoryExporter) tracetest.SpanStubs {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.ForceFlush(ctx); err != nil {
		t.Fatal(err)
	}
	return exp.GetSpans()
}

func spanNamed(spans tracetest.SpanStubs, name string) (tracetest.SpanStub, bool) {
	for _, s := range spans {
		if s.Name == name {
			return s, true
		}
	}
	return tracetest.SpanStub{}, false
}

func attrOf(s tracetest.SpanStub, k attribute.Key) attribute.Value {
	for _, a := range s.Attributes {
		if a.Key == k {
			return a.Value
		}
	}
	return attribute.Value{}
}

const testParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

// A request with a traceparent: the gateway's server span is its child,
// with the route's attributes and the status; the forward is a client span
// under it, and the sidecar gets the client span as its parent.
func TestTracingGatewaySpans(t *testing.T) {
	p, exp := newTestTracing(t)
	var mu sync.Mutex
	var got []string
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = append(got, r.Header.Get("traceparent"))
		mu.Unlock()
		w.Write([]byte("ok"))
	})
	cat := oneRevision(0, 10*time.Second)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Tracing = p })

	for _, path := range []string{"/fast", "/body"} {
		exp.Reset()
		var code int
		if path == "/body" {
			// Bodies take the ReverseProxy path.
			resp, _ := tg.send(t, http.MethodPost, "canary-hello.default.localhost", path, strings.NewReader("x"), map[string]string{"traceparent": testParent})
			code = resp.StatusCode
		} else {
			code, _, _ = tg.get(t, "canary-hello.default.localhost", path, map[string]string{"traceparent": testParent})
		}
		if code != 200 {
			t.Fatalf("%s: status %d", path, code)
		}
		spans := flushed(t, p, exp)
		gw, ok := spanNamed(spans, spanGateway)
		fw, ok2 := spanNamed(spans, spanForward)
		if !ok || !ok2 {
			t.Fatalf("%s: spans %v, want %q and %q", path, spans.Snapshots(), spanGateway, spanForward)
		}
		if gw.SpanContext.TraceID().String() != "4bf92f3577b34da6a3ce929d0e0e4736" || gw.Parent.SpanID().String() != "00f067aa0ba902b7" || gw.SpanKind != trace.SpanKindServer {
			t.Errorf("%s: gateway span %v under %v (kind %v), want the client's child", path, gw.SpanContext, gw.Parent, gw.SpanKind)
		}
		if fw.Parent.SpanID() != gw.SpanContext.SpanID() || fw.SpanKind != trace.SpanKindClient {
			t.Errorf("%s: forward span's parent %v, want the gateway span %v", path, fw.Parent.SpanID(), gw.SpanContext.SpanID())
		}
		for k, want := range map[attribute.Key]string{attrService: "hello", attrRevision: "hello-00001", attrTag: "canary", attrNamespace: "default"} {
			if v := attrOf(gw, k).AsString(); v != want {
				t.Errorf("%s: %s = %q, want %q", path, k, v, want)
			}
		}
		if v := attrOf(gw, "http.response.status_code").AsInt64(); v != 200 {
			t.Errorf("%s: status attribute %d", path, v)
		}
		if v := attrOf(gw, attrRetries); v.Type() != attribute.INT64 || v.AsInt64() != 0 {
			t.Errorf("%s: retries attribute %v", path, v.Emit())
		}
		mu.Lock()
		last := got[len(got)-1]
		mu.Unlock()
		if want := "00-4bf92f3577b34da6a3ce929d0e0e4736-" + fw.SpanContext.SpanID().String() + "-01"; last != want {
			t.Errorf("%s: sidecar got traceparent %q, want %q", path, last, want)
		}
	}

	// sampled=0: nothing exported, and the flag goes on unchanged.
	exp.Reset()
	notSampled := "00-4bf92f3577b34da6a3ce929d0e0e4737-00f067aa0ba902b7-00"
	if code, _, _ := tg.get(t, "hello.default.localhost", "/", map[string]string{"traceparent": notSampled}); code != 200 {
		t.Fatalf("status %d", code)
	}
	if spans := flushed(t, p, exp); len(spans) != 0 {
		t.Errorf("a request with sampled=0 exported %d spans", len(spans))
	}
	mu.Lock()
	last := got[len(got)-1]
	mu.Unlock()
	if !strings.HasPrefix(last, "00-4bf92f3577b34da6a3ce929d0e0e4737-") || !strings.HasSuffix(last, "-00") {
		t.Errorf("sidecar got traceparent %q for a request not sampled", last)
	}
}

// A root request (no trace context) the sampler drops gets no span, and
// its decision reaches the sidecar as a traceparent with sampled=0 and a
// new trace on both forwarding paths: written into the request head by
// the fast path, through the header map by ReverseProxy.
func TestTracingRootNotSampledCarriesDecision(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	p, err := tracing.New(context.Background(), tracing.Options{ServiceName: "test", Exporter: exp,
		Sampler: sdktrace.ParentBased(sdktrace.NeverSample())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Shutdown(context.Background()) })
	got := make(chan []string, 4)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Values("traceparent")
		w.Write([]byte("ok"))
	})
	cat := oneRevision(0, 10*time.Second)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Tracing = p })
	seen := map[string]bool{}
	for _, path := range []string{"/fast", "/body"} {
		var code int
		if path == "/body" {
			resp, _ := tg.send(t, http.MethodPost, "hello.default.localhost", path, strings.NewReader("x"), nil)
			code = resp.StatusCode
		} else {
			code, _, _ = tg.get(t, "hello.default.localhost", path, nil)
		}
		if code != 200 {
			t.Fatalf("%s: status %d", path, code)
		}
		tps := <-got
		if len(tps) != 1 {
			t.Fatalf("%s: the sidecar got traceparent %q, want one", path, tps)
		}
		sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.HeaderCarrier{"Traceparent": tps}))
		if !sc.IsValid() || sc.IsSampled() || seen[sc.TraceID().String()] {
			t.Errorf("%s: the sidecar got traceparent %q: want a new trace, not sampled", path, tps[0])
		}
		seen[sc.TraceID().String()] = true
	}
	if spans := flushed(t, p, exp); len(spans) != 0 {
		t.Errorf("requests not sampled exported %d spans", len(spans))
	}
}

// A wake's timeline goes into the trace of the request that caused it:
// a wake span under its hold and one span per step with whose time it
// was; a second request held on the same wake links to the first.
func TestTracingWakeTimelineSpans(t *testing.T) {
	p, exp := newTestTracing(t)
	rig := newTrackerRig()
	g := &Gateway{tracing: p}
	rig.t.traced = g.traceWake
	tr, rev := rig.t, rig.rev
	tracer := p.Tracer()

	tr.open(rev)
	w := rev.openWake.Load()
	ctx1, hold1 := tracer.Start(context.Background(), spanHold)
	w.join(ctx1)
	ctx2, hold2 := tracer.Start(context.Background(), spanHold)
	w.join(ctx2)
	hold1.End()
	hold2.End()

	rig.clk.set(rig.at(2))
	tr.scaledFromZero(rev, rig.at(1.5))
	tr.evaluation(rev.name, "eval-1", rig.at(1.6))
	tr.allocation(AllocationTimes{Revision: rev.name, ID: "alloc-1", EvalID: "eval-1", Placed: rig.at(10),
		Received: rig.at(30), AppStarted: rig.at(400), SidecarStarted: rig.at(610)})
	tr.probeReady(rev.name, "alloc-1", rig.at(701), spec.InstanceTimes{Started: rig.at(620), AppAccepted: rig.at(640), AppReady: rig.at(700)})
	rig.clk.set(rig.at(702))
	w.sending()
	rig.clk.set(rig.at(703))
	w.answered("alloc-1")
	rig.clk.set(rig.at(900))
	tr.consulPassing(rev.name, []string{"alloc-1"})
	if len(rig.finished()) != 1 {
		t.Fatal("the wake did not finish")
	}

	spans := flushed(t, p, exp)
	ws, ok := spanNamed(spans, spanWake+rev.name)
	if !ok {
		t.Fatalf("no wake span in %v", spans.Snapshots())
	}
	if ws.Parent.SpanID() != hold1.SpanContext().SpanID() || ws.SpanContext.TraceID() != hold1.SpanContext().TraceID() {
		t.Errorf("wake span's parent %v, want the first hold %v", ws.Parent, hold1.SpanContext())
	}
	if !ws.StartTime.Equal(rig.at(0)) || !ws.EndTime.Equal(rig.at(900)) {
		t.Errorf("wake span %s..%s, want held..consul passing", ws.StartTime, ws.EndTime)
	}
	want := map[spec.WakeStep]struct {
		from, to float64
		whose    spec.Whose
	}{
		spec.WakeScaleWritten:  {0, 1.5, spec.WhoseOurs},
		spec.WakePlaced:        {2, 10, spec.WhoseNomad}, // after allocation_seen, at 2 on the fake clock
		spec.WakeAppReady:      {640, 700, spec.WhoseApp},
		spec.WakeFirstByte:     {702, 703, spec.WhoseApp},
		spec.WakeConsulPassing: {703, 900, spec.WhoseConsul},
	}
	steps := 0
	for _, s := range spans {
		if !strings.HasPrefix(s.Name, spanStep) {
			continue
		}
		steps++
		if s.Parent.SpanID() != ws.SpanContext.SpanID() {
			t.Errorf("step %s is not a child of the wake span", s.Name)
		}
		step := spec.WakeStep(attrOf(s, attrStep).AsString())
		if w, ok := want[step]; ok {
			if !s.StartTime.Equal(rig.at(w.from)) || !s.EndTime.Equal(rig.at(w.to)) || attrOf(s, attrWhose).AsString() != string(w.whose) {
				t.Errorf("step %s: %s..%s whose %s; want +%vms..+%vms whose %s", step, s.StartTime.Sub(rig.base), s.EndTime.Sub(rig.base), attrOf(s, attrWhose).AsString(), w.from, w.to, w.whose)
			}
		}
	}
	if steps != 15 {
		t.Errorf("%d step spans, want 15 (every step of a whole wake)", steps)
	}
	var linked bool
	for _, s := range spans {
		if s.SpanContext.SpanID() == hold2.SpanContext().SpanID() {
			for _, l := range s.Links {
				linked = linked || l.SpanContext.SpanID() == hold1.SpanContext().SpanID()
			}
		}
	}
	if !linked {
		t.Error("the second held request does not link to the wake's cause")
	}
}

// A traced request held at zero asks for the wake with its hold span in
// the wake's context: the scale call the autoscaler makes for it is a
// span under the hold (autoscaler/tracing.go).
func TestTracingWakeCarriesTheCause(t *testing.T) {
	p, exp := newTestTracing(t)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) })
	cat := oneRevision(0, 10*time.Second)
	as := &fakeAutoscaler{}
	as.onWake = func(autoscaler.Demand) {
		cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	}
	tg := startGateway(t, cat, as, func(c *Config) { c.Tracing = p })
	if code, _, _ := tg.get(t, "hello.default.localhost", "/", map[string]string{"traceparent": testParent}); code != 200 {
		t.Fatalf("status %d", code)
	}
	hold, ok := spanNamed(flushed(t, p, exp), spanHold)
	if !ok {
		t.Fatal("no hold span")
	}
	as.mu.Lock()
	defer as.mu.Unlock()
	if len(as.wakeTraces) == 0 || as.wakeTraces[0].SpanID() != hold.SpanContext.SpanID() || !as.wakeTraces[0].IsSampled() {
		t.Fatalf("wakes came with %v, want the hold span %v", as.wakeTraces, hold.SpanContext)
	}
}

// A websocket is one span for its upgrade: the gateway's spans end at the
// 101, while the tunnel is still open.
func TestTracingUpgradeEndsAtSwitch(t *testing.T) {
	p, exp := newTestTracing(t)
	release := make(chan struct{})
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		c, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Error(err)
			return
		}
		defer c.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
		brw.Flush()
		<-release
	})
	t.Cleanup(func() { close(release) })
	cat := oneRevision(0, 10*time.Second)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Tracing = p })

	conn, err := net.Dial("tcp", tg.srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: hello.default.localhost\r\nConnection: Upgrade\r\nUpgrade: websocket\r\ntraceparent: %s\r\n\r\n", testParent)
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v, %v", resp, err)
	}
	// The tunnel is open; the spans are already ended and exported.
	var spans tracetest.SpanStubs
	waitFor(t, "the upgrade's spans end at the 101", func() bool {
		spans = flushed(t, p, exp)
		_, ok1 := spanNamed(spans, spanGateway)
		_, ok2 := spanNamed(spans, spanForward)
		return ok1 && ok2
	})
	gw, _ := spanNamed(spans, spanGateway)
	if v := attrOf(gw, "http.response.status_code").AsInt64(); v != 101 {
		t.Errorf("gateway span status %d, want 101", v)
	}
}

// A collector that is gone (nothing listens on its port) costs requests
// nothing: they are answered, and the spans that could not go are
// dropped and counted.
func TestTracingDeadCollector(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://"+dead)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
	reg := prometheus.NewRegistry()
	p, err := tracing.New(context.Background(), tracing.Options{ServiceName: "test", Registerer: reg})
	if err != nil || p == nil {
		t.Fatalf("tracing with an endpoint: %v, %v", p, err)
	}
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = p.Shutdown(ctx)
	}()
	sc := newFakeSidecar(t, true, nil)
	cat := oneRevision(0, 10*time.Second)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Tracing = p })
	for range 20 {
		if code, _, _ := tg.get(t, "hello.default.localhost", "/", map[string]string{"traceparent": testParent}); code != 200 {
			t.Fatalf("status %d with the collector gone", code)
		}
	}
	waitFor(t, "the spans that could not be exported are counted", func() bool {
		return counter(t, reg, "nomad_serverless_trace_spans_dropped_total", nil) >= 40 // 20 gateway + 20 forward spans
	})
}

// A sampled request's latency is an exemplar of the gateway's histogram,
// with its trace id, in the OpenMetrics page a scraper asks for.
func TestTracingExemplarOnMetrics(t *testing.T) {
	p, _ := newTestTracing(t)
	sc := newFakeSidecar(t, true, nil)
	cat := oneRevision(0, 10*time.Second)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, func(c *Config) { c.Tracing = p })
	if code, _, _ := tg.get(t, "hello.default.localhost", "/", map[string]string{"traceparent": testParent}); code != 200 {
		t.Fatalf("status %d", code)
	}
	req := httptest.NewRequest("GET", MetricsPath, nil)
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	rec := httptest.NewRecorder()
	tg.g.AdminHandler().ServeHTTP(rec, req)
	want := `trace_id="4bf92f3577b34da6a3ce929d0e0e4736"`
	for _, line := range strings.Split(rec.Body.String(), "\n") {
		if strings.HasPrefix(line, "nomad_serverless_gateway_request_duration_seconds_bucket") && strings.Contains(line, want) {
			return
		}
	}
	t.Errorf("no exemplar %s on the request duration histogram:\n%s", want, rec.Body.String())
}
