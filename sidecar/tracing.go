package sidecar

import (
	"net/http"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// The sidecar's spans. Options.Tracing nil (no OTLP endpoint in the
// task's environment) leaves Handler.tracing nil, and the request path's
// only cost is testing that pointer.
//
//   - "sidecar" (server): one per request, a child of the gateway's
//     forward (or of whatever trace context the request carries), with
//     the revision, the instance and the status;
//   - "sidecar queue" (internal): the wait behind the revision's
//     concurrency limit (serverless.queue.waited false: a slot was free),
//     on revisions that have one;
//   - "sidecar -> app" (client): the call to the app; its context is the
//     traceparent the app gets, so the app's own spans join the trace.
//
// Probes (spec.ProbeHeader) get no span: they are the sidecar's own.
const (
	spanSidecar = "sidecar"
	spanQueue   = "sidecar queue"
	spanApp     = "sidecar -> app"

	attrRevision = attribute.Key("serverless.revision")
	attrInstance = attribute.Key("serverless.instance")
	attrWaited   = attribute.Key("serverless.queue.waited")
)

// startSpan opens a request's server span, kept in x for done, and
// returns the request with it in its context. A request that is not
// sampled gets none (x.span stays nil), and no other span either. A root
// request (one that did not come through the gateway: mesh and catalog
// proxies' traffic) that is not sampled carries the decision on to the
// app in its header.
func (h *Handler) startSpan(x *exchange, r *http.Request) *http.Request {
	r, sp, tp := h.tracing.StartRequest(r, spanSidecar)
	tp.SetHeader(r.Header)
	if sp != nil {
		sp.SetAttributes(attrRevision.String(h.cfg.Revision), attrInstance.String(h.cfg.Instance))
		x.span = sp
	}
	return r
}

func (h *Handler) startQueueSpan(r *http.Request) trace.Span {
	_, sp := h.tracing.Tracer().Start(r.Context(), spanQueue)
	return sp
}

// endQueueSpan ends the queue span; waited says whether the request had
// to wait for a slot.
func endQueueSpan(sp trace.Span, waited bool, err error) {
	sp.SetAttributes(attrWaited.Bool(waited))
	if err != nil {
		sp.RecordError(err)
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End()
}

// startAppSpan opens the client span of the call to the app and writes
// its context into the request's header, which every path to the app
// sends on.
func (h *Handler) startAppSpan(r *http.Request) trace.Span {
	_, sp := h.tracing.StartClient(r.Context(), r.Header, spanApp)
	return sp
}

func endAppSpan(sp trace.Span, x *exchange) { tracing.EndHTTP(sp, x.status) }

// endSpansAtUpgrade ends a protocol switch's spans at the 101: a
// websocket is one span for its upgrade, not one as long as the tunnel.
// The later ends do nothing (a span ends once).
func (x *exchange) endSpansAtUpgrade() {
	if x.appSpan != nil {
		tracing.EndHTTP(x.appSpan, x.status)
	}
	tracing.EndHTTP(x.span, x.status)
}
