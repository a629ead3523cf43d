package tracing

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	resourcepb "go.opentelemetry.io/proto/otlp/resource/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// otlpHTTP exports spans as OTLP/HTTP with protobuf bodies (the
// specification's default protocol), configured by the OTEL_EXPORTER_OTLP_*
// variables: endpoint, headers, timeout, compression, certificates.
//
// Why not the SDK's otlptracehttp: it links grpc-go (its config package,
// and the generated collector package it encodes with), which the shipped
// binary must not link (test/house: megabytes on every sidecar). The
// span messages of go.opentelemetry.io/proto/otlp/trace/v1 link nothing
// of gRPC; the request that wraps them (ExportTraceServiceRequest, one
// repeated field) is written here with protowire.
type otlpHTTP struct {
	url     string
	headers http.Header
	gzip    bool
	timeout time.Duration
	client  *http.Client
}

// newOTLPHTTP reads the exporter's settings; the traces-specific variable
// wins over the general one, as the specification says.
func newOTLPHTTP(getenv func(string) string) (*otlpHTTP, error) {
	get := func(name string) string {
		if v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_" + name)); v != "" {
			return v
		}
		return strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_" + name))
	}
	e := &otlpHTTP{headers: http.Header{}, timeout: 10 * time.Second}
	if v := strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")); v != "" {
		e.url = v // used as given
	} else {
		e.url = strings.TrimSuffix(strings.TrimSpace(getenv("OTEL_EXPORTER_OTLP_ENDPOINT")), "/") + "/v1/traces"
	}
	u, err := url.Parse(e.url)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("OTLP endpoint %q: want an http:// or https:// URL (OTEL_EXPORTER_OTLP_ENDPOINT)", e.url)
	}
	if v := get("HEADERS"); v != "" {
		for _, kv := range strings.Split(v, ",") {
			k, val, ok := strings.Cut(kv, "=")
			if !ok {
				return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_HEADERS: %q is not key=value", kv)
			}
			k, _ = url.PathUnescape(strings.TrimSpace(k))
			val, _ = url.PathUnescape(strings.TrimSpace(val))
			e.headers.Add(k, val)
		}
	}
	if v := get("TIMEOUT"); v != "" {
		ms, err := strconv.Atoi(v)
		if err != nil || ms <= 0 {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_TIMEOUT=%q: want milliseconds", v)
		}
		e.timeout = time.Duration(ms) * time.Millisecond
	}
	switch c := get("COMPRESSION"); c {
	case "", "none":
	case "gzip":
		e.gzip = true
	default:
		return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_COMPRESSION=%q: want gzip or none", c)
	}
	tlsCfg, err := otlpTLS(get("CERTIFICATE"), get("CLIENT_CERTIFICATE"), get("CLIENT_KEY"))
	if err != nil {
		return nil, err
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	tr.MaxIdleConnsPerHost = 2
	e.client = &http.Client{Transport: tr}
	return e, nil
}

// otlpTLS is the TLS of an https endpoint: the CA file that verifies the
// collector, and the client certificate it may ask for.
func otlpTLS(ca, cert, key string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("reading OTEL_EXPORTER_OTLP_CERTIFICATE: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("OTEL_EXPORTER_OTLP_CERTIFICATE %s holds no PEM certificate", ca)
		}
		cfg.RootCAs = pool
	}
	if cert != "" || key != "" {
		c, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("loading OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE and _CLIENT_KEY: %w", err)
		}
		cfg.Certificates = []tls.Certificate{c}
	}
	return cfg, nil
}

// ExportSpans sends one batch; a non-2xx answer is an error (the queue
// counts the batch as dropped).
func (e *otlpHTTP) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if len(spans) == 0 {
		return nil
	}
	body, err := encodeExport(spans)
	if err != nil {
		return fmt.Errorf("encoding %d spans: %w", len(spans), err)
	}
	if e.gzip {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		_, _ = zw.Write(body)
		if err := zw.Close(); err != nil {
			return fmt.Errorf("compressing spans: %w", err)
		}
		body = b.Bytes()
	}
	ctx, cancel := context.WithTimeout(ctx, e.timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.url, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("exporting spans to %s: %w", e.url, err)
	}
	for k, v := range e.headers {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	if e.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	resp, err := e.client.Do(req)
	if err != nil {
		return fmt.Errorf("exporting spans to %s: %w", e.url, err)
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("exporting spans to %s: %s: %s", e.url, resp.Status, bytes.TrimSpace(msg))
	}
	return nil
}

func (e *otlpHTTP) Shutdown(context.Context) error {
	e.client.CloseIdleConnections()
	return nil
}

// encodeExport writes an ExportTraceServiceRequest: field 1, repeated
// ResourceSpans. A process has one resource; spans are grouped by their
// instrumentation scope.
func encodeExport(spans []sdktrace.ReadOnlySpan) ([]byte, error) {
	rs := &tracepb.ResourceSpans{}
	if res := spans[0].Resource(); res != nil {
		rs.Resource = &resourcepb.Resource{Attributes: keyValues(res.Attributes())}
		rs.SchemaUrl = res.SchemaURL()
	}
	scopes := map[string]*tracepb.ScopeSpans{}
	for _, s := range spans {
		sc := s.InstrumentationScope()
		ss := scopes[sc.Name+"\x00"+sc.Version]
		if ss == nil {
			ss = &tracepb.ScopeSpans{Scope: &commonpb.InstrumentationScope{Name: sc.Name, Version: sc.Version}, SchemaUrl: sc.SchemaURL}
			scopes[sc.Name+"\x00"+sc.Version] = ss
			rs.ScopeSpans = append(rs.ScopeSpans, ss)
		}
		ss.Spans = append(ss.Spans, spanProto(s))
	}
	b, err := proto.Marshal(rs)
	if err != nil {
		return nil, err
	}
	out := protowire.AppendTag(nil, 1, protowire.BytesType)
	return protowire.AppendBytes(out, b), nil
}

func spanProto(s sdktrace.ReadOnlySpan) *tracepb.Span {
	sc := s.SpanContext()
	tid, sid := sc.TraceID(), sc.SpanID()
	p := &tracepb.Span{
		TraceId:                tid[:],
		SpanId:                 sid[:],
		TraceState:             sc.TraceState().String(),
		Flags:                  uint32(sc.TraceFlags()),
		Name:                   s.Name(),
		Kind:                   tracepb.Span_SpanKind(s.SpanKind()),
		StartTimeUnixNano:      uint64(s.StartTime().UnixNano()),
		EndTimeUnixNano:        uint64(s.EndTime().UnixNano()),
		Attributes:             keyValues(s.Attributes()),
		DroppedAttributesCount: uint32(s.DroppedAttributes()),
		DroppedEventsCount:     uint32(s.DroppedEvents()),
		DroppedLinksCount:      uint32(s.DroppedLinks()),
	}
	if parent := s.Parent(); parent.IsValid() {
		psid := parent.SpanID()
		p.ParentSpanId = psid[:]
		if parent.IsRemote() {
			p.Flags |= 0x300 // SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK | IS_REMOTE
		} else {
			p.Flags |= 0x100
		}
	}
	for _, ev := range s.Events() {
		p.Events = append(p.Events, &tracepb.Span_Event{TimeUnixNano: uint64(ev.Time.UnixNano()), Name: ev.Name, Attributes: keyValues(ev.Attributes)})
	}
	for _, l := range s.Links() {
		ltid, lsid := l.SpanContext.TraceID(), l.SpanContext.SpanID()
		p.Links = append(p.Links, &tracepb.Span_Link{TraceId: ltid[:], SpanId: lsid[:], TraceState: l.SpanContext.TraceState().String(),
			Attributes: keyValues(l.Attributes), Flags: uint32(l.SpanContext.TraceFlags())})
	}
	switch st := s.Status(); st.Code {
	case codes.Error:
		p.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_ERROR, Message: st.Description}
	case codes.Ok:
		p.Status = &tracepb.Status{Code: tracepb.Status_STATUS_CODE_OK}
	}
	return p
}

func keyValues(attrs []attribute.KeyValue) []*commonpb.KeyValue {
	if len(attrs) == 0 {
		return nil
	}
	out := make([]*commonpb.KeyValue, 0, len(attrs))
	for _, a := range attrs {
		out = append(out, &commonpb.KeyValue{Key: string(a.Key), Value: anyValue(a.Value)})
	}
	return out
}

func anyValue(v attribute.Value) *commonpb.AnyValue {
	switch v.Type() {
	case attribute.BOOL:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: v.AsBool()}}
	case attribute.INT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: v.AsInt64()}}
	case attribute.FLOAT64:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: v.AsFloat64()}}
	case attribute.STRING:
		return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.AsString()}}
	case attribute.STRINGSLICE:
		return array(v.AsStringSlice(), func(s string) *commonpb.AnyValue {
			return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: s}}
		})
	case attribute.INT64SLICE:
		return array(v.AsInt64Slice(), func(i int64) *commonpb.AnyValue {
			return &commonpb.AnyValue{Value: &commonpb.AnyValue_IntValue{IntValue: i}}
		})
	case attribute.BOOLSLICE:
		return array(v.AsBoolSlice(), func(b bool) *commonpb.AnyValue {
			return &commonpb.AnyValue{Value: &commonpb.AnyValue_BoolValue{BoolValue: b}}
		})
	case attribute.FLOAT64SLICE:
		return array(v.AsFloat64Slice(), func(f float64) *commonpb.AnyValue {
			return &commonpb.AnyValue{Value: &commonpb.AnyValue_DoubleValue{DoubleValue: f}}
		})
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_StringValue{StringValue: v.Emit()}}
}

func array[T any](vs []T, f func(T) *commonpb.AnyValue) *commonpb.AnyValue {
	arr := &commonpb.ArrayValue{Values: make([]*commonpb.AnyValue, len(vs))}
	for i, v := range vs {
		arr.Values[i] = f(v)
	}
	return &commonpb.AnyValue{Value: &commonpb.AnyValue_ArrayValue{ArrayValue: arr}}
}
