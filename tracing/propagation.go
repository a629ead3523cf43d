package tracing

import (
	"context"

	"go.opentelemetry.io/contrib/propagators/b3"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// propagator reads W3C trace context (traceparent, tracestate) and, when a
// request has none, B3 (single or multiple headers, for Zipkin users); it
// writes only W3C trace context. Writing B3 too would double every
// request's trace headers for the few apps that need it.
type propagator struct {
	w3c propagation.TraceContext
	b3  propagation.TextMapPropagator
}

func newPropagator() propagator { return propagator{b3: b3.New()} }

func (p propagator) Inject(ctx context.Context, c propagation.TextMapCarrier) {
	p.w3c.Inject(ctx, c)
}

func (p propagator) Extract(ctx context.Context, c propagation.TextMapCarrier) context.Context {
	if out := p.w3c.Extract(ctx, c); trace.SpanContextFromContext(out).IsValid() {
		return out
	}
	return p.b3.Extract(ctx, c)
}

func (p propagator) Fields() []string {
	return append(p.w3c.Fields(), p.b3.Fields()...)
}
