package tracing

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// Provider is a process's tracing, on. A nil *Provider is tracing off:
// callers test for nil before any other call, which is what keeps the
// data path free of tracing's cost when no endpoint is set.
//
// Its spans are sampled parent-based (the SDK's default, or
// OTEL_TRACES_SAMPLER): a request that arrives with a trace context keeps
// its sampled flag, sampled or not.
type Provider struct {
	tp     *sdktrace.TracerProvider
	tracer trace.Tracer
	prop   propagator
	q      *queue
	// sampler is the SDK's, kept to decide for a root request before any
	// span exists; parentBased: a caller's sampled=0 is final.
	sampler     sdktrace.Sampler
	parentBased bool
	root        rootRule
}

// Options configure New. Everything about where spans go and how many are
// sampled comes from the OTEL_* environment, as for any OpenTelemetry
// program.
type Options struct {
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME
	// (or service.name in OTEL_RESOURCE_ATTRIBUTES) says otherwise.
	ServiceName string
	// Attributes are added to the resource (the environment's win).
	Attributes []attribute.KeyValue
	// Registerer gets the span queue's counters (nil: none registered).
	Registerer prometheus.Registerer
	Logger     *slog.Logger

	// Exporter and Sampler replace the OTLP exporter and the environment's
	// sampler (tests: tracetest's in-memory exporter). With Exporter set,
	// New does not look for an endpoint.
	Exporter sdktrace.SpanExporter
	Sampler  sdktrace.Sampler
	// QueueCapacity bounds the spans waiting for export (default 2048).
	QueueCapacity int
}

// New returns the process's tracing, or nil (and no error) when the
// environment names no OTLP endpoint. It reads the process's environment,
// as the SDK and the exporter it builds do.
func New(ctx context.Context, o Options) (*Provider, error) {
	getenv := os.Getenv
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	exp := o.Exporter
	if exp == nil {
		if !Enabled(getenv) {
			return nil, nil
		}
		var err error
		if exp, err = otlpExporter(getenv); err != nil {
			return nil, err
		}
	}
	attrs := append([]attribute.KeyValue{attribute.String("service.name", o.ServiceName)}, o.Attributes...)
	res, err := resource.New(ctx, resource.WithAttributes(attrs...), resource.WithTelemetrySDK(), resource.WithFromEnv())
	if err != nil {
		return nil, fmt.Errorf("reading the tracing resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES): %w", err)
	}
	q, err := newQueue(exp, queueConfig{Capacity: o.QueueCapacity}, o.Registerer, o.Logger)
	if err != nil {
		return nil, err
	}
	sampler, parentBased, root := o.Sampler, false, rootRule{}
	if sampler == nil {
		if sampler, parentBased, root, err = samplerFromEnv(getenv); err != nil {
			return nil, err
		}
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithResource(res), sdktrace.WithSpanProcessor(q),
		sdktrace.WithSampler(sampler), sdktrace.WithIDGenerator(idGenerator{}))
	return &Provider{tp: tp, tracer: tp.Tracer("github.com/nomad-serverless/nomad-serverless"), prop: newPropagator(), q: q,
		sampler: sampler, parentBased: parentBased, root: root}, nil
}

// otlpExporter builds the OTLP/HTTP exporter (otlp.go), which reads its
// endpoint, headers, TLS, timeout and compression from the environment.
// OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL may say http/protobuf (the
// specification's default); grpc is refused with what to do instead: the
// OTLP/gRPC exporter links grpc-go, which would grow every sidecar's
// binary by megabytes (test/house keeps it out), and every collector
// that speaks OTLP/gRPC on 4317 speaks OTLP/HTTP on 4318.
func otlpExporter(getenv func(string) string) (sdktrace.SpanExporter, error) {
	proto := getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if proto == "" {
		proto = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	switch strings.TrimSpace(proto) {
	case "", "http/protobuf":
	case "grpc":
		return nil, errors.New("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: nomad-serverless exports traces over OTLP/HTTP only; set it to http/protobuf and point OTEL_EXPORTER_OTLP_ENDPOINT at the collector's OTLP/HTTP port (usually 4318)")
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: nomad-serverless exports traces over http/protobuf", proto)
	}
	return newOTLPHTTP(getenv)
}

// Collectors are the span queue's counters, for a process whose
// registry is made after its tracing (the sidecar's).
func (p *Provider) Collectors() []prometheus.Collector {
	return []prometheus.Collector{p.q.dropped, p.q.exported}
}

// Tracer starts spans.
func (p *Provider) Tracer() trace.Tracer { return p.tracer }

// Extract returns ctx with the trace context of a request's header (W3C,
// else B3), if any.
func (p *Provider) Extract(ctx context.Context, h http.Header) context.Context {
	return p.prop.Extract(ctx, propagation.HeaderCarrier(h))
}

// Inject writes ctx's span into a request's header as W3C traceparent
// and tracestate, replacing what was there.
func (p *Provider) Inject(ctx context.Context, h http.Header) {
	delete(h, "Traceparent")
	delete(h, "Tracestate")
	p.prop.Inject(ctx, propagation.HeaderCarrier(h))
}

// StartServer starts the server span of an incoming request, the child
// of the trace context it carries.
func (p *Provider) StartServer(r *http.Request, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx := p.Extract(r.Context(), r.Header)
	attrs = append(attrs,
		attribute.String("http.request.method", r.Method),
		attribute.String("url.path", r.URL.Path),
		attribute.String("server.address", r.Host),
		attribute.String("network.protocol.version", protoVersion(r)),
	)
	return p.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
}

// StartRequest opens the server span of a request on the data path. A
// request that is not sampled gets no span (nil), and its request is
// returned as it came. One without any trace context (a root) that is
// not sampled gets, instead of a span, the decision to carry on (tp): a
// traceparent with sampled=0 that the caller must send to the next hop,
// so the hops after it (the sidecar, the app) do not sample it on their
// own. Only the sampled pay for spans and attributes.
//
// The decisions that drop a request are made before any span exists, so
// that they cost at most a few random numbers: a caller's sampled=0 under
// a parent-based sampler (nothing), and a root request the sampler drops
// (rootRule; no allocation: tp is a value the caller writes where it
// writes the request). The request's context is not looked at for a
// parent: a server's request context holds no span.
func (p *Provider) StartRequest(r *http.Request, name string) (_ *http.Request, _ trace.Span, tp Traceparent) {
	h := r.Header
	ctx := r.Context()
	if in := h["Traceparent"]; len(in) > 0 {
		if p.parentBased && len(in) == 1 && notSampled(in[0]) {
			return r, nil, Traceparent{}
		}
		ctx = p.Extract(ctx, h)
	} else if len(h["B3"]) > 0 || len(h["X-B3-Traceid"]) > 0 {
		ctx = p.Extract(ctx, h)
	} else {
		var tid trace.TraceID
		if p.root.known {
			lo := rand.Uint64()
			tid = rootTraceID(lo)
			if !p.root.keeps(lo) {
				return r, nil, Traceparent{traceID: tid, spanID: newSpanID()}
			}
		} else {
			tid = newTraceID()
			res := p.sampler.ShouldSample(sdktrace.SamplingParameters{ParentContext: ctx, TraceID: tid, Name: name, Kind: trace.SpanKindServer})
			if res.Decision == sdktrace.Drop {
				return r, nil, Traceparent{traceID: tid, spanID: newSpanID()}
			}
		}
		// The span gets the trace ID it was sampled with.
		ctx = context.WithValue(ctx, presetTraceID{}, tid)
	}
	ctx, sp := p.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindServer))
	if !sp.IsRecording() {
		return r, nil, Traceparent{}
	}
	sp.SetAttributes(
		attribute.String("http.request.method", r.Method),
		attribute.String("url.path", r.URL.Path),
		attribute.String("server.address", r.Host),
		attribute.String("network.protocol.version", protoVersion(r)),
	)
	return r.WithContext(ctx), sp, Traceparent{}
}

// StartClient starts the client span of a request sent on, a child of
// ctx's span, and writes its context into the outgoing header.
func (p *Provider) StartClient(ctx context.Context, h http.Header, name string, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	ctx, sp := p.tracer.Start(ctx, name, trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	p.Inject(ctx, h)
	return ctx, sp
}

// EndHTTP ends a server or client span with the response's status: 5xx
// and no response at all (0) are errors, as OpenTelemetry's HTTP
// conventions say.
func EndHTTP(sp trace.Span, status int) {
	if status > 0 {
		sp.SetAttributes(attribute.Int("http.response.status_code", status))
	}
	if status == 0 || status >= 500 {
		sp.SetStatus(codes.Error, http.StatusText(status))
	}
	sp.End()
}

func protoVersion(r *http.Request) string {
	if r.ProtoMajor == 2 {
		return "2"
	}
	if r.ProtoMinor == 0 {
		return "1.0"
	}
	return "1.1"
}

// ForceFlush exports every span ended so far.
func (p *Provider) ForceFlush(ctx context.Context) error { return p.tp.ForceFlush(ctx) }

// Shutdown exports what is queued, bounded by ctx, and stops.
func (p *Provider) Shutdown(ctx context.Context) error {
	if err := p.tp.Shutdown(ctx); err != nil {
		return fmt.Errorf("stopping tracing: %w", err)
	}
	return nil
}

// Exemplar is the exemplar label of ctx's span for a latency histogram
// (the trace id), or nil when the span is not sampled: only a sampled
// trace can be found in the backend.
func Exemplar(sc trace.SpanContext) prometheus.Labels {
	if !sc.IsSampled() {
		return nil
	}
	return prometheus.Labels{"trace_id": sc.TraceID().String()}
}

// Observe records v in o with sc's trace as its exemplar when o keeps
// exemplars (client_golang's histograms do) and sc is sampled.
func Observe(o prometheus.Observer, v float64, sc trace.SpanContext) {
	if l := Exemplar(sc); l != nil {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, l)
			return
		}
	}
	o.Observe(v)
}
