package sidecar_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// With tracing on, a request is a server span under the trace context it
// carries, a request that waited behind the concurrency limit has a queue
// span, and the call to the app is a client span whose context the app
// gets as its traceparent.
func TestTracingSidecarSpans(t *testing.T) {
	exp := tracetest.NewInMemoryExporter()
	tp, err := tracing.New(context.Background(), tracing.Options{ServiceName: "sidecar", Exporter: exp,
		Sampler: sdktrace.ParentBased(sdktrace.AlwaysSample())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })

	release := make(chan struct{})
	var mu sync.Mutex
	got := map[string]string{} // path -> traceparent the app got
	app := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got[r.URL.Path] = r.Header.Get("traceparent")
		mu.Unlock()
		if r.URL.Path == "/first" {
			<-release
		}
		io.WriteString(w, "ok")
	}))
	app.Start()
	t.Cleanup(app.Close)
	cfg := config(app.Listener.Addr().(*net.TCPAddr).Port)
	cfg.Concurrency = 1
	cfg.QueueDepth = 10
	r := startSidecar(t, cfg, sidecar.Options{Tracing: tp})
	r.waitReady(t)

	const (
		trace1 = "4bf92f3577b34da6a3ce929d0e0e4736"
		trace2 = "4bf92f3577b34da6a3ce929d0e0e4737"
	)
	get := func(path, tid string) <-chan int {
		done := make(chan int, 1)
		go func() {
			req, _ := http.NewRequest("GET", r.url+path, nil)
			req.Header.Set("traceparent", "00-"+tid+"-00f067aa0ba902b7-01")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				done <- 0
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			done <- resp.StatusCode
		}()
		return done
	}
	first := get("/first", trace1)
	waitUntil(t, "the first request reaches the app", func() bool { mu.Lock(); defer mu.Unlock(); return got["/first"] != "" })
	second := get("/second", trace2)
	waitUntil(t, "the second request waits in the queue", func() bool { return r.stats(t).Queued == 1 })
	close(release)
	if c1, c2 := <-first, <-second; c1 != 200 || c2 != 200 {
		t.Fatalf("statuses %d, %d", c1, c2)
	}
	if err := tp.ForceFlush(context.Background()); err != nil {
		t.Fatal(err)
	}
	byTrace := map[string]map[string]tracetest.SpanStub{}
	for _, s := range exp.GetSpans() {
		tid := s.SpanContext.TraceID().String()
		if byTrace[tid] == nil {
			byTrace[tid] = map[string]tracetest.SpanStub{}
		}
		byTrace[tid][s.Name] = s
	}
	for _, tc := range []struct {
		tid, path string
		queued    bool
	}{{trace1, "/first", false}, {trace2, "/second", true}} {
		spans := byTrace[tc.tid]
		srv, ok1 := spans["sidecar"]
		cl, ok2 := spans["sidecar -> app"]
		q, queued := spans["sidecar queue"]
		if !ok1 || !ok2 || !queued {
			t.Fatalf("%s: spans %v; want sidecar, sidecar queue and sidecar -> app", tc.path, keys(spans))
		}
		if waited := q.Attributes; len(waited) != 1 || waited[0].Value.AsBool() != tc.queued {
			t.Errorf("%s: queue span attributes %v, want waited=%v", tc.path, waited, tc.queued)
		}
		if srv.Parent.SpanID().String() != "00f067aa0ba902b7" || cl.Parent.SpanID() != srv.SpanContext.SpanID() {
			t.Errorf("%s: sidecar span under %v, app span under %v", tc.path, srv.Parent.SpanID(), cl.Parent.SpanID())
		}
		if queued && q.Parent.SpanID() != srv.SpanContext.SpanID() {
			t.Errorf("%s: queue span is not the sidecar span's child", tc.path)
		}
		mu.Lock()
		tpHeader := got[tc.path]
		mu.Unlock()
		if want := "00-" + tc.tid + "-" + cl.SpanContext.SpanID().String() + "-01"; tpHeader != want {
			t.Errorf("%s: the app got traceparent %q, want %q", tc.path, tpHeader, want)
		}
	}
}

// A sampled request's latency is an exemplar of the sidecar's histogram,
// in the OpenMetrics page a scraper asks for.
func TestTracingSidecarExemplar(t *testing.T) {
	tp, err := tracing.New(context.Background(), tracing.Options{ServiceName: "sidecar", Exporter: tracetest.NewNoopExporter(),
		Sampler: sdktrace.ParentBased(sdktrace.AlwaysSample())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") }))
	t.Cleanup(app.Close)
	r := startSidecar(t, config(app.Listener.Addr().(*net.TCPAddr).Port), sidecar.Options{Tracing: tp})
	r.waitReady(t)
	req, _ := http.NewRequest("GET", r.url+"/", nil)
	req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mreq, _ := http.NewRequest("GET", r.adminURL+"/metrics", nil)
	mreq.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	mresp, err := http.DefaultClient.Do(mreq)
	if err != nil {
		t.Fatal(err)
	}
	defer mresp.Body.Close()
	page, _ := io.ReadAll(mresp.Body)
	for _, line := range strings.Split(string(page), "\n") {
		if strings.HasPrefix(line, "nomad_serverless_sidecar_request_duration_seconds_bucket") && strings.Contains(line, `trace_id="4bf92f3577b34da6a3ce929d0e0e4736"`) {
			return
		}
	}
	t.Errorf("no exemplar of the request's trace on the latency histogram:\n%s", page)
}

func keys[V any](m map[string]V) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
