package tracing

import (
	"context"
	"encoding/binary"
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
// parentBased says that a parent's sampled flag decides; root is the same
// sampler's rule for a request without a parent, which StartRequest
// applies itself (rootRule).
func samplerFromEnv(getenv func(string) string) (s sdktrace.Sampler, parentBased bool, root rootRule, err error) {
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
		return sdktrace.ParentBased(sdktrace.AlwaysSample()), true, ratioRule(1), nil
	case "parentbased_always_off":
		return sdktrace.ParentBased(sdktrace.NeverSample()), true, ratioRule(0), nil
	case "parentbased_traceidratio":
		r, err := ratio()
		return sdktrace.ParentBased(sdktrace.TraceIDRatioBased(r)), true, ratioRule(r), err
	case "always_on":
		return sdktrace.AlwaysSample(), false, ratioRule(1), nil
	case "always_off":
		return sdktrace.NeverSample(), false, ratioRule(0), nil
	case "traceidratio":
		r, err := ratio()
		return sdktrace.TraceIDRatioBased(r), false, ratioRule(r), err
	}
	return nil, false, rootRule{}, fmt.Errorf("OTEL_TRACES_SAMPLER=%q: nomad-serverless knows always_on, always_off, traceidratio and their parentbased_ forms", name)
}

// rootRule is the environment's sampler applied to a root request (one
// without trace context) without calling the SDK: the SDK's
// TraceIDRatioBased keeps a trace when the last 8 bytes of its ID, big
// endian and shifted right once, are below fraction * 2^63, and
// StartRequest draws those 8 bytes first, so a request the ratio drops
// costs one random number and a comparison (no SamplingParameters, no
// context lookups). The rule and the SDK's sampler agree on every ID:
// the span of a kept request is started with the ID the rule kept, and
// the SDK decides for it again, alike.
//
// known false (a sampler given in Options) leaves the decision to the
// sampler itself.
type rootRule struct {
	known bool
	// always: every root is kept (ratio 1, always_on); otherwise one is
	// kept when its ID's last 8 bytes >> 1 are below bound (0: none).
	always bool
	bound  uint64
}

// ratioRule is TraceIDRatioBased(fraction)'s rule, bound computed as the
// SDK computes it.
func ratioRule(fraction float64) rootRule {
	if fraction >= 1 {
		return rootRule{known: true, always: true}
	}
	if fraction <= 0 {
		return rootRule{known: true}
	}
	return rootRule{known: true, bound: uint64(fraction * (1 << 63))}
}

// keeps reports whether the rule samples a trace whose ID ends in lo.
func (r rootRule) keeps(lo uint64) bool { return r.always || lo>>1 < r.bound }

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
func newTraceID() trace.TraceID { return rootTraceID(rand.Uint64()) }

func newSpanID() trace.SpanID {
	a := rand.Uint64()
	for a == 0 {
		a = rand.Uint64()
	}
	var s trace.SpanID
	binary.BigEndian.PutUint64(s[:], a)
	return s
}

const hexDigits = "0123456789abcdef"

// traceparent formats a W3C traceparent in one allocation.
func traceparent(t trace.TraceID, s trace.SpanID, sampled bool) string {
	var b [TraceparentLen]byte
	return string(appendTraceparent(b[:0], t, s, sampled))
}

// TraceparentLen is the length of a version-00 traceparent.
const TraceparentLen = 55

// appendTraceparent appends a W3C traceparent's value to dst.
func appendTraceparent(dst []byte, t trace.TraceID, s trace.SpanID, sampled bool) []byte {
	dst = append(dst, "00-"...)
	for _, c := range t {
		dst = append(dst, hexDigits[c>>4], hexDigits[c&15])
	}
	dst = append(dst, '-')
	for _, c := range s {
		dst = append(dst, hexDigits[c>>4], hexDigits[c&15])
	}
	if sampled {
		return append(dst, "-01"...)
	}
	return append(dst, "-00"...)
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
