package tracing

import (
	"compress/gzip"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// What the exporter sends is an ExportTraceServiceRequest a collector
// reads: the resource, the spans with their parents, kinds, attributes,
// links and status; with the headers and the compression the environment
// asks for.
func TestOTLPHTTPExport(t *testing.T) {
	var mu sync.Mutex
	var got []*coltracepb.ExportTraceServiceRequest
	var hdr http.Header
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body io.Reader = r.Body
		if r.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(r.Body)
			if err != nil {
				t.Error(err)
				return
			}
			body = zr
		}
		b, _ := io.ReadAll(body)
		req := &coltracepb.ExportTraceServiceRequest{}
		if r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			t.Errorf("POST %s as %s", r.URL.Path, r.Header.Get("Content-Type"))
		}
		if err := proto.Unmarshal(b, req); err != nil {
			t.Errorf("a collector cannot read the body: %v", err)
		}
		mu.Lock()
		got, hdr = append(got, req), r.Header.Clone()
		mu.Unlock()
	}))
	defer srv.Close()
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL+"/")
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=a%20b,authorization=Bearer t")
	t.Setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
	t.Setenv("OTEL_SERVICE_NAME", "edge")
	p, err := New(context.Background(), Options{ServiceName: "nomad-serverless"})
	if err != nil || p == nil {
		t.Fatalf("New: %v, %v", p, err)
	}
	tr := p.Tracer()
	ctx, root := tr.Start(context.Background(), "root", trace.WithSpanKind(trace.SpanKindServer))
	_, child := tr.Start(ctx, "child", trace.WithSpanKind(trace.SpanKindClient), trace.WithLinks(trace.Link{SpanContext: root.SpanContext()}))
	child.SetAttributes(attrKV("k", "v"), attrInt("n", 3))
	child.SetStatus(codes.Error, "boom")
	child.End()
	root.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 1 || hdr.Get("X-Tenant") != "a b" || hdr.Get("Authorization") != "Bearer t" {
		t.Fatalf("%d exports, headers %v", len(got), hdr)
	}
	rs := got[0].GetResourceSpans()
	if len(rs) != 1 {
		t.Fatalf("resource spans %v", rs)
	}
	name := ""
	for _, a := range rs[0].GetResource().GetAttributes() {
		if a.GetKey() == "service.name" {
			name = a.GetValue().GetStringValue()
		}
	}
	if name != "edge" {
		t.Errorf("service.name %q, want OTEL_SERVICE_NAME's", name)
	}
	spans := map[string]*tracepb.Span{}
	for _, ss := range rs[0].GetScopeSpans() {
		for _, s := range ss.GetSpans() {
			spans[s.GetName()] = s
		}
	}
	r, c := spans["root"], spans["child"]
	if r == nil || c == nil {
		t.Fatalf("spans %v", spans)
	}
	if string(c.GetParentSpanId()) != string(r.GetSpanId()) || string(c.GetTraceId()) != string(r.GetTraceId()) || len(r.GetParentSpanId()) != 0 {
		t.Error("the child's parent is not the root")
	}
	if r.GetKind() != tracepb.Span_SPAN_KIND_SERVER || c.GetKind() != tracepb.Span_SPAN_KIND_CLIENT {
		t.Errorf("kinds %v, %v", r.GetKind(), c.GetKind())
	}
	if c.GetStatus().GetCode() != tracepb.Status_STATUS_CODE_ERROR || c.GetStatus().GetMessage() != "boom" {
		t.Errorf("status %v", c.GetStatus())
	}
	if len(c.GetLinks()) != 1 || string(c.GetLinks()[0].GetSpanId()) != string(r.GetSpanId()) {
		t.Errorf("links %v", c.GetLinks())
	}
	attrs := map[string]string{}
	for _, a := range c.GetAttributes() {
		attrs[a.GetKey()] = a.GetValue().String()
	}
	if len(attrs) != 2 || c.GetEndTimeUnixNano() < c.GetStartTimeUnixNano() || c.GetStartTimeUnixNano() == 0 {
		t.Errorf("attributes %v, times %d..%d", attrs, c.GetStartTimeUnixNano(), c.GetEndTimeUnixNano())
	}
}

// An answer other than 2xx is an error, so the batch is counted dropped.
func TestOTLPHTTPRefused(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "over quota", http.StatusTooManyRequests)
	}))
	defer srv.Close()
	e, err := newOTLPHTTP(func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": srv.URL + "/custom"}[k]
	})
	if err != nil {
		t.Fatal(err)
	}
	if e.url != srv.URL+"/custom" {
		t.Errorf("traces endpoint %q not used as given", e.url)
	}
	p, err := New(context.Background(), Options{Exporter: e})
	if err != nil {
		t.Fatal(err)
	}
	_, s := p.Tracer().Start(context.Background(), "x")
	s.End()
	if err := p.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := p.q.dropped.WithLabelValues(dropExportFailed); counterValue(n) != 1 {
		t.Errorf("a refused export dropped %v spans, want 1", counterValue(n))
	}
	if _, err := newOTLPHTTP(func(k string) string {
		return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}[k]
	}); err == nil {
		t.Error("an endpoint without a scheme was taken")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", srv.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	if _, err := New(context.Background(), Options{}); err == nil || errors.Is(err, context.Canceled) {
		t.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=grpc: %v, want a refusal that says what to set", err)
	}
}
