package tracing

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// samplerFromEnv builds the sampler OTEL_TRACES_SAMPLER and
// OTEL_TRACES_SAMPLER_ARG name, as the SDK would. The Provider keeps it
// (and gives it to the SDK) so that it can decide for a request before any
// span exists: a request that is not sampled then costs no span at all.
// parentBased says that a parent's sampled flag decides.
func samplerFromEnv(getenv func(string) string) (s sdktrace.Sampler, parentBased bool, err error) {
	name := strings.ToLower(strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER")))
	arg := strings.TrimSpace(getenv("OTEL_TRACES_SAMPLER_ARG"))
	ratio := func() (float64, error) {
		if arg == "" {
			return 1, nil
		}
		r, err := strconv.ParseFloat(arg, 64)
		if err != nil || r < 0 || r > 1 {
			return 0, fmt.Errorf("OTEL_TRACES_SAMPLER_ARG=%q: want a ratio between 0 and 1", arg)
		}
		return r, nil
	}
	switch name {
	case "", "parentbased_always_on":
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), true, nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), true, nil
	case "parentbased_traceidratio":
		r, err := ratio()
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), true, err
	case "always_on":
		return sdktrace.AlwaysSample(), false, nil
	case "always_off":
		return sdktrace.NeverSample(), false, nil
	case "traceidratio":
		r, err := ratio()
		return sdktrace.TraceIDRatioBased(r), false, err
	}
	return nil, false, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: nomad-serverless knows always_on, always_off, traceidratio and their parentbased_ forms", name)
}

// idGenerator makes random trace and span IDs, and uses the trace ID a
// root request was already sampled with (presetTraceID in the context),
// so the span gets the ID its sampling decision was made for.
type idGenerator struct{}

type presetTraceID struct{}

func (idGenerator) NewIDs(ctx context.Context) (trace.TraceID, trace.SpanID) {
	if tid, ok := ctx.Value(presetTraceID{}).(trace.TraceID); ok {
		return tid, newSpanID()
	}
	return newTraceID(), newSpanID()
}

func (idGenerator) NewSpanID(context.Context, trace.TraceID) trace.SpanID { return newSpanID() }

// newTraceID and newSpanID are random and never zero (invalid). They use
// math/rand/v2's per-thread generator: no lock on the request path.
func newTraceID() trace.TraceID {
	var t trace.TraceID
	for !t.IsValid() {
		a, b := rand.Uint64(), rand.Uint64()
		for i := range 8 {
			t[i], t[8+i] = byte(a>>(56-8*i)), byte(b>>(56-8*i))
		}
	}
	return t
}

func newSpanID() trace.SpanID {
	var s trace.SpanID
	for !s.IsValid() {
		a := rand.Uint64()
		for i := range 8 {
			s[i] = byte(a >> (56 - 8*i))
		}
	}
	return s
}

const hexDigits = "0123456789abcdef"

// traceparent formats a W3C traceparent in one allocation.
func traceparent(t trace.TraceID, s trace.SpanID, sampled bool) string {
	var b [55]byte
	copy(b[:], "00-")
	for i, c := range t {
		b[3+2*i], b[4+2*i] = hexDigits[c>>4], hexDigits[c&15]
	}
	b[35] = '-'
	for i, c := range s {
		b[36+2*i], b[37+2*i] = hexDigits[c>>4], hexDigits[c&15]
	}
	b[52], b[53], b[54] = '-', '0', '0'
	if sampled {
		b[54] = '1'
	}
	return string(b[:])
}

// notSampled reports whether a version-00 traceparent says its trace is
// not sampled; anything else (another version, a malformed header) is
// left to the full parser.
func notSampled(tp string) bool {
	if len(tp) != 55 || tp[0] != '0' || tp[1] != '0' || tp[2] != '-' || tp[35] != '-' || tp[52] != '-' {
		return false
	}
	d := strings.IndexByte(hexDigits, tp[54]|0x20)
	if d < 0 || strings.IndexByte(hexDigits, tp[53]|0x20) < 0 {
		return false
	}
	return d&1 == 0
}
