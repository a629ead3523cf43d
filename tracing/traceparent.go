package tracing

import (
	"encoding/binary"
	"math/rand/v2"
	"net/http"

	"go.opentelemetry.io/otel/trace"
)

// Traceparent is a root request's not-sampled decision, to carry on: the
// W3C traceparent (a new trace ID, a span ID, sampled=0) the hops after
// this one must get so that they do not sample the request on their own.
// It is a value, not yet a string: a forwarding path that writes its
// request head itself appends it there (Append) and the request path
// makes no string and no header map entry of it; a path that sends a
// header map sets it there (SetHeader). The zero value is none: the
// request carried its own trace context, or was sampled and has a span
// whose context the forward's client span injects.
type Traceparent struct {
	traceID trace.TraceID
	spanID  trace.SpanID
}

// IsSet reports whether there is a traceparent to carry on.
func (t Traceparent) IsSet() bool { return t.traceID.IsValid() }

// Append appends the header's value (TraceparentLen bytes) to dst.
func (t Traceparent) Append(dst []byte) []byte {
	return appendTraceparent(dst, t.traceID, t.spanID, false)
}

// String is the header's value.
func (t Traceparent) String() string { return traceparent(t.traceID, t.spanID, false) }

// SetHeader sets the traceparent in h, if there is one.
func (t Traceparent) SetHeader(h http.Header) {
	if t.IsSet() {
		h["Traceparent"] = []string{t.String()}
	}
}

// rootTraceID is a root request's random trace ID ending in lo, the 8
// bytes its sampling decision was made on (rootRule).
func rootTraceID(lo uint64) trace.TraceID {
	hi := rand.Uint64()
	for hi == 0 && lo == 0 { // all zero is invalid
		hi = rand.Uint64()
	}
	var t trace.TraceID
	binary.BigEndian.PutUint64(t[:8], hi)
	binary.BigEndian.PutUint64(t[8:], lo)
	return t
}
