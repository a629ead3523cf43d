// Package tracing is nomad-serverless's OpenTelemetry tracing: a tracer
// provider configured only by the standard OTEL_* environment variables,
// an exporter queue that never blocks nor grows a request path, and the
// propagation of W3C trace context (B3 accepted on the way in).
//
// Tracing is off unless an OTLP endpoint is set
// (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT). Off,
// New returns a nil *Provider, and every part of the data path tests that
// one pointer before doing anything of tracing's: no allocation, no atomic,
// no context lookup per request.
package tracing
