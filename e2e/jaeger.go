package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"time"
)

// Jaeger (github.com/jaegertracing/jaeger, the `jaeger` binary of
// v1.75.0) receives the traces of scenario 31 over OTLP/HTTP and answers
// its query API. It keeps them in memory and runs nothing else: no
// sampling server, no metrics port, so two runs never share a port.

// JaegerGetHint says how to get the binary when it is not on PATH.
const JaegerGetHint = "in a scratch module outside the repo: go mod init scratch && go get -tool github.com/jaegertracing/jaeger/cmd/jaeger@v1.75.0 && go build -o <dir on PATH>/jaeger github.com/jaegertracing/jaeger/cmd/jaeger"

// JaegerConfig is the collector configuration for an OTLP/HTTP receiver
// on otlp and the query API on query (host:port each; grpcQuery is the
// query's gRPC port, which Jaeger always opens).
func JaegerConfig(otlp, query, grpcQuery string) string {
	return fmt.Sprintf(`service:
  extensions: [jaeger_storage, jaeger_query]
  pipelines:
    traces:
      receivers: [otlp]
      processors: [batch]
      exporters: [jaeger_storage_exporter]
  telemetry:
    metrics:
      level: none
    logs:
      level: warn
extensions:
  jaeger_query:
    storage:
      traces: mem
    http:
      endpoint: %[2]s
    grpc:
      endpoint: %[3]s
  jaeger_storage:
    backends:
      mem:
        memory:
          max_traces: 100000
receivers:
  otlp:
    protocols:
      http:
        endpoint: %[1]s
processors:
  batch:
    timeout: 100ms
exporters:
  jaeger_storage_exporter:
    trace_storage: mem
`, otlp, query, grpcQuery)
}

// JaegerTrace is one trace as Jaeger's query API (/api/traces/<id>)
// returns it.
type JaegerTrace struct {
	TraceID   string                   `json:"traceID"`
	Spans     []JaegerSpan             `json:"spans"`
	Processes map[string]JaegerProcess `json:"processes"`
}

// JaegerSpan is one span; times are in microseconds.
type JaegerSpan struct {
	TraceID       string      `json:"traceID"`
	SpanID        string      `json:"spanID"`
	OperationName string      `json:"operationName"`
	References    []JaegerRef `json:"references"`
	StartTime     int64       `json:"startTime"`
	Duration      int64       `json:"duration"`
	Tags          []JaegerTag `json:"tags"`
	ProcessID     string      `json:"processID"`
}

// JaegerRef is a span's parent (CHILD_OF) or link (FOLLOWS_FROM).
type JaegerRef struct {
	RefType string `json:"refType"`
	TraceID string `json:"traceID"`
	SpanID  string `json:"spanID"`
}

// JaegerTag is a span attribute.
type JaegerTag struct {
	Key   string `json:"key"`
	Type  string `json:"type"`
	Value any    `json:"value"`
}

// JaegerProcess is the resource of a span's process.
type JaegerProcess struct {
	ServiceName string `json:"serviceName"`
}

// Parent is the span's CHILD_OF reference ("" for a root).
func (s JaegerSpan) Parent() string {
	for _, r := range s.References {
		if r.RefType == "CHILD_OF" {
			return r.SpanID
		}
	}
	return ""
}

// Tag is a tag's value rendered as text ("" if absent).
func (s JaegerSpan) Tag(key string) string {
	for _, t := range s.Tags {
		if t.Key == key {
			return fmt.Sprint(t.Value)
		}
	}
	return ""
}

// Start and Took are the span's start and duration.
func (s JaegerSpan) Start() time.Time    { return time.UnixMicro(s.StartTime) }
func (s JaegerSpan) Took() time.Duration { return time.Duration(s.Duration) * time.Microsecond }

// Service is the service.name of the span's process.
func (t JaegerTrace) Service(s JaegerSpan) string { return t.Processes[s.ProcessID].ServiceName }

// Named are the spans with an operation name.
func (t JaegerTrace) Named(name string) []JaegerSpan {
	var out []JaegerSpan
	for _, s := range t.Spans {
		if s.OperationName == name {
			out = append(out, s)
		}
	}
	return out
}

// GetJaegerTrace reads a trace from the query API at base
// (http://host:port); found is false when Jaeger has no span of it.
func GetJaegerTrace(ctx context.Context, base, traceID string) (tr JaegerTrace, found bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/traces/"+traceID, nil)
	if err != nil {
		return tr, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return tr, false, fmt.Errorf("query Jaeger for trace %s: %w", traceID, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return tr, false, fmt.Errorf("read Jaeger's answer for trace %s: %w", traceID, err)
	}
	if resp.StatusCode == http.StatusNotFound {
		return tr, false, nil
	}
	if resp.StatusCode != http.StatusOK {
		return tr, false, fmt.Errorf("query Jaeger for trace %s: %s: %s", traceID, resp.Status, b)
	}
	var v struct {
		Data []JaegerTrace `json:"data"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		return tr, false, fmt.Errorf("decode Jaeger's trace %s: %w", traceID, err)
	}
	if len(v.Data) == 0 {
		return tr, false, nil
	}
	return v.Data[0], true, nil
}
