package activator

import (
	"context"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// The gateway's spans. Config.Tracing nil (no OTLP endpoint) leaves
// g.tracing nil, and the data path's only cost is testing that pointer:
// every span below starts behind such a test.
//
//   - "gateway" (server): one per routed request, with the route, the
//     service, the revision, the tag, the retries and the status;
//   - "activator hold" (internal): the wait of a request that found no
//     free slot; a request that waited on a wake from zero it did not
//     cause links to the hold of the request that did;
//   - "gateway -> sidecar" (client): the forward to the instance, all
//     attempts included; its context is the traceparent the sidecar gets;
//   - "wake <revision>" and one "wake: <step>" span per step of the wake's
//     timeline, children of the causing request's hold, emitted when the
//     timeline is complete (after the request, with the steps' own times).
//     Each step span runs from the step before it to the step, and says
//     whose time that was (ours, nomad, app, consul).
const (
	spanGateway = "gateway"
	spanHold    = "activator hold"
	spanForward = "gateway -> sidecar"
	spanWake    = "wake "
	spanStep    = "wake: "
)

// Attribute keys of the gateway's spans.
const (
	attrService   = attribute.Key("serverless.service")
	attrNamespace = attribute.Key("serverless.namespace")
	attrRevision  = attribute.Key("serverless.revision")
	attrTag       = attribute.Key("serverless.tag")
	attrRetries   = attribute.Key("serverless.retries")
	attrInstance  = attribute.Key("serverless.instance")
	attrStep      = attribute.Key("serverless.wake.step")
	attrWhose     = attribute.Key("serverless.wake.whose")
	attrWhat      = attribute.Key("serverless.wake.what")
	attrAlloc     = attribute.Key("serverless.wake.allocation")
	attrMissing   = attribute.Key("serverless.wake.missing")
	attrCause     = attribute.Key("serverless.wake.caused")
)

// startRequestSpan opens a routed request's server span and returns the
// request with it in its context; a request that is not sampled gets
// none (nil), and every other span of the gateway is skipped for it. A
// root request that is not sampled gets tp instead, the decision the
// instance must get: the fast path writes it into the request head
// (writeRequestHead), the others into the header map.
func (g *Gateway) startRequestSpan(r *http.Request, rev *revision, rt *route) (_ *http.Request, _ trace.Span, tp tracing.Traceparent) {
	r, sp, tp := g.tracing.StartRequest(r, spanGateway)
	if sp == nil {
		return r, nil, tp
	}
	sp.SetAttributes(attrService.String(rev.service), attrRevision.String(rev.name))
	if rt != nil {
		sp.SetAttributes(attrNamespace.String(rt.namespace))
		if rt.tag != "" {
			sp.SetAttributes(attrTag.String(rt.tag))
		}
	}
	return r, sp, tp
}

// endRequestSpan ends a request's server span with its outcome.
func endRequestSpan(sp trace.Span, f *forward, status int) {
	if f != nil {
		sp.SetAttributes(attrRetries.Int(f.tries))
	}
	tracing.EndHTTP(sp, status)
}

// forwardSpans are a sampled request's server span and its forward's
// client span.
type forwardSpans struct{ server, forward trace.Span }

// endSpansAtUpgrade ends a protocol switch's spans at the 101: a
// websocket is one span for its upgrade, not one as long as the tunnel.
// The ends deferred in serve then do nothing (a span ends once).
func (f *forward) endSpansAtUpgrade() {
	endForward(f.spans.forward, f)
	endRequestSpan(f.spans.server, f, f.status)
}

// startHold opens the span of a request's wait for a slot.
func (g *Gateway) startHold(ctx context.Context) (context.Context, trace.Span) {
	return g.tracing.Tracer().Start(ctx, spanHold)
}

func endHold(sp trace.Span, err error) {
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// startForward opens the client span of the forward to the sidecar and
// puts its context in the request's header, for the sidecar. The header
// is the request's own: both forwarding paths send it on.
func (g *Gateway) startForward(r *http.Request, f *forward) trace.Span {
	_, sp := g.tracing.StartClient(r.Context(), r.Header, spanForward, attrInstance.String(f.b.hostPort))
	return sp
}

func endForward(sp trace.Span, f *forward) {
	if f.b != nil {
		sp.SetAttributes(attrInstance.String(f.b.hostPort))
	}
	sp.SetAttributes(attrRetries.Int(f.tries))
	tracing.EndHTTP(sp, f.status)
}

// joinWake ties a held request's span to the wake it waits on: the first
// sampled request is the wake's cause (the timeline's spans go in its
// trace), every other one links to it.
func (w *wake) join(ctx context.Context) {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		return
	}
	t := w.t
	t.mu.Lock()
	var link trace.SpanContext
	cause := false
	switch {
	case w.finished:
	case !w.cause.IsValid() || (!w.cause.IsSampled() && sc.IsSampled()):
		w.cause, cause = sc, true
	default:
		link = w.cause
	}
	t.mu.Unlock()
	sp := trace.SpanFromContext(ctx)
	if link.IsValid() {
		sp.AddLink(trace.Link{SpanContext: link, Attributes: []attribute.KeyValue{attrCause.Bool(false)}})
	} else if cause {
		sp.SetAttributes(attrCause.Bool(true))
	}
}

// wakeCause returns ctx with the hold span of the traced request that
// caused the revision's open wake, if one did: the wake's scale call is
// a span under it. The request joined the wake (join) before it asked
// for the wake.
func (r *revision) wakeCause(ctx context.Context) context.Context {
	w := r.openWake.Load()
	if w == nil {
		return ctx
	}
	w.t.mu.Lock()
	cause := w.cause
	w.t.mu.Unlock()
	if !cause.IsSampled() {
		return ctx
	}
	return trace.ContextWithSpanContext(ctx, cause)
}

// traceWake writes a finished wake's timeline into the trace of the
// request that caused it: a span from the hold to the last step, and one
// child per step from the step before it, with whose time it was.
func (g *Gateway) traceWake(cause trace.SpanContext, tl spec.WakeTimeline) {
	if len(tl.Steps) == 0 {
		return
	}
	tr := g.tracing.Tracer()
	first, last := tl.Steps[0].At, tl.Steps[len(tl.Steps)-1].At
	attrs := []attribute.KeyValue{attrService.String(tl.Service), attrRevision.String(tl.Revision), attrAlloc.String(tl.Alloc)}
	if len(tl.Missing) > 0 {
		missing := make([]string, len(tl.Missing))
		for i, s := range tl.Missing {
			missing[i] = string(s)
		}
		attrs = append(attrs, attrMissing.StringSlice(missing))
	}
	ctx := trace.ContextWithRemoteSpanContext(context.Background(), cause)
	ctx, ws := tr.Start(ctx, spanWake+tl.Revision, trace.WithTimestamp(first), trace.WithAttributes(attrs...))
	prev := first
	for _, st := range tl.Steps {
		start := prev
		if st.At.Before(start) {
			start = st.At // clocks of other machines; never a negative span
		}
		_, s := tr.Start(ctx, spanStep+string(st.Step), trace.WithTimestamp(start), trace.WithAttributes(
			attrStep.String(string(st.Step)), attrWhose.String(string(st.Step.Whose())), attrWhat.String(st.Step.Describe())))
		s.End(trace.WithTimestamp(st.At))
		if st.At.After(prev) {
			prev = st.At
		}
	}
	ws.End(trace.WithTimestamp(maxTime(last, prev)))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
