package autoscaler

import (
	"context"
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// The scale call of a wake in the trace of the request that caused it.
// The gateway puts the causing request's hold span in the wake's context
// (Wake's ctx; over the admin API, its traceparent header); the
// autoscaler keeps it with the woken revision, and the scale call its
// decision makes is a client span under it: "nomad scale", from the
// request to Nomad to its answer, one per attempt. The Waker's own raise
// (the leader did not take the wake) is one too. Config.Tracer nil
// (tracing off) or a wake no traced request caused: no span.
const (
	spanScale = "nomad scale"

	attrRevision = attribute.Key("serverless.revision")
	attrCount    = attribute.Key("serverless.scale.count")
	attrReason   = attribute.Key("serverless.scale.reason")
	attrAttempt  = attribute.Key("serverless.scale.attempt")
	attrBy       = attribute.Key("serverless.scale.by")
	attrRaised   = attribute.Key("serverless.scale.raised")
	attrWhose    = attribute.Key("serverless.wake.whose")
)

// wakeTrace is the sampled trace a wake's ctx carries, if any.
func wakeTrace(ctx context.Context) trace.SpanContext {
	if sc := trace.SpanContextFromContext(ctx); sc.IsSampled() {
		return sc
	}
	return trace.SpanContext{}
}

// wokenBy is the trace of the wake behind a scale call the loop starts
// for revision: the one tickWoken is deciding, or one not yet taken (a
// full tick came first and makes the call; tickWoken will find the
// count applied).
func (l *loop) wokenBy(revision string) trace.SpanContext {
	if l.a.cfg.Tracer == nil {
		return trace.SpanContext{}
	}
	if tr, ok := l.woken[revision]; ok {
		return tr
	}
	l.a.wakeMu.Lock()
	defer l.a.wakeMu.Unlock()
	return l.a.wakes[revision]
}

// startScaleSpan starts the span of one scale call under parent, or
// returns ctx and nil when there is no tracer or no traced wake.
func startScaleSpan(ctx context.Context, tr trace.Tracer, parent trace.SpanContext, by, revision string, count, attempt int, reason string) (context.Context, trace.Span) {
	if tr == nil || !parent.IsValid() {
		return ctx, nil
	}
	return tr.Start(trace.ContextWithRemoteSpanContext(ctx, parent), spanScale,
		trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attrRevision.String(revision), attrCount.Int(count), attrReason.String(reason),
			attrAttempt.Int(attempt), attrBy.String(by),
			// Most of the call is Nomad's: its write and its raft.
			attrWhose.String("nomad")))
}

// endScaleSpan ends a scale call's span (nil: none) with its outcome.
func endScaleSpan(sp trace.Span, err error) {
	if sp == nil {
		return
	}
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// injectWakeTrace puts a wake's trace into the admin API request that
// carries it to the leader (the W3C traceparent header: a leader that
// does not trace ignores it), and extractWakeTrace takes it out there.
func injectWakeTrace(ctx context.Context, h http.Header) {
	if wakeTrace(ctx).IsValid() {
		propagation.TraceContext{}.Inject(ctx, propagation.HeaderCarrier(h))
	}
}

func extractWakeTrace(ctx context.Context, h http.Header) context.Context {
	if len(h["Traceparent"]) == 0 {
		return ctx
	}
	return propagation.TraceContext{}.Extract(ctx, propagation.HeaderCarrier(h))
}
