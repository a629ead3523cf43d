package sidecar

import (
	"context"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/benchhttp"
	"github.com/nomad-serverless/nomad-serverless/test/otlpsink"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// rawApp is a minimal HTTP/1.1 app for benchmarks and tests
// (benchhttp.Serve): it answers every request with a fixed 200 and
// allocates nothing per request, so allocs/op of a benchmark count the
// sidecar's side only. It returns the app's port.
func rawApp(tb testing.TB) int {
	tb.Helper()
	_, port, err := net.SplitHostPort(benchhttp.Serve(tb, benchhttp.OK))
	if err != nil {
		tb.Fatal(err)
	}
	n, _ := strconv.Atoi(port)
	return n
}

func benchConfig(appPort, concurrency int) spec.SidecarConfig {
	return spec.SidecarConfig{
		Port: 1, AppPort: appPort, AdminPort: 2,
		Service: "bench", Revision: "bench-00001",
		Concurrency: concurrency, QueueDepth: 10 * concurrency,
		Timeout: 300 * time.Second, DrainGrace: time.Second, DrainTimeout: 2 * time.Second,
	}
}

// discardWriter is a ResponseWriter that keeps nothing, reused across
// iterations so the benchmark measures the handler, not the recorder.
type discardWriter struct{ h http.Header }

func (d *discardWriter) Header() http.Header         { return d.h }
func (d *discardWriter) Write(p []byte) (int, error) { return len(p), nil }
func (d *discardWriter) WriteHeader(int)             {}

// BenchmarkHandler is one proxied GET through the handler (probe check,
// stats, timer, ReverseProxy, Transport to a loopback app), without the
// serving side's HTTP server.
func BenchmarkHandler(b *testing.B) {
	for _, c := range []struct {
		name        string
		concurrency int
	}{{"concurrency=0", 0}, {"concurrency=10", 10}} {
		b.Run(c.name, func(b *testing.B) {
			s, err := New(benchConfig(rawApp(b), c.concurrency), Options{})
			if err != nil {
				b.Fatal(err)
			}
			h := s.Handler()
			req := httptest.NewRequest("GET", "http://sidecar/", nil)
			req.RemoteAddr = "127.0.0.1:1234"
			w := &discardWriter{h: http.Header{}}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				clear(w.h)
				h.ServeHTTP(w, req)
			}
		})
	}
}

// BenchmarkProbe is the K-Network-Probe answer: it must not allocate.
func BenchmarkProbe(b *testing.B) {
	s, err := New(benchConfig(rawApp(b), 0), Options{})
	if err != nil {
		b.Fatal(err)
	}
	s.state.ready.Store(true)
	req := httptest.NewRequest("GET", "http://sidecar/", nil)
	req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
	w := &discardWriter{h: http.Header{}}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		s.Handler().ServeHTTP(w, req)
	}
}

// BenchmarkServe is the whole serving side, as deployed (the front door:
// the keepalive loop) and with net/http alone (what the loop hands off),
// driven over loopback by raw keep-alive clients that allocate nothing per
// request, so allocs/op are the sidecar's.
func BenchmarkServe(b *testing.B) {
	for _, front := range []bool{true, false} {
		b.Run(map[bool]string{true: "front door", false: "net/http"}[front], func(b *testing.B) {
			s, err := New(benchConfig(rawApp(b), 0), Options{})
			if err != nil {
				b.Fatal(err)
			}
			var addr string
			if front {
				ln, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					b.Fatal(err)
				}
				f := s.frontDoor(ln, log.New(io.Discard, "", 0))
				go f.serve()
				defer f.close()
				addr = ln.Addr().String()
			} else {
				srv := httptest.NewServer(s.Handler())
				defer srv.Close()
				addr = srv.Listener.Addr().String()
			}
			benchhttp.Drive(b, addr, "GET / HTTP/1.1\r\nHost: bench\r\nUser-Agent: bench\r\n\r\n")
		})
	}
}

// BenchmarkHandlerTracing is BenchmarkHandler (concurrency=10: every span
// the sidecar makes) with tracing off, sampling 1 % and sampling every
// request, exporting over OTLP/HTTP to a sink that keeps nothing: the
// cost of tracing on the sidecar, as ratios of one run (benchstat). Each
// request carries the gateway's traceparent, as behind the gateway: the
// sampled flag set on 1 in 100 (every one at 100 %), so the sidecar
// follows the gateway's decision as it does in production.
func BenchmarkHandlerTracing(b *testing.B) {
	for _, c := range []struct{ name, ratio string }{{"tracing=off", ""}, {"tracing=1%", "0.01"}, {"tracing=100%", "1"}} {
		b.Run(c.name, func(b *testing.B) {
			var tp *tracing.Provider
			if c.ratio != "" {
				for k, v := range otlpsink.Start(b).Env(c.ratio) {
					b.Setenv(k, v)
				}
				var err error
				if tp, err = tracing.New(context.Background(), tracing.Options{ServiceName: "bench"}); err != nil {
					b.Fatal(err)
				}
				defer tp.Shutdown(context.Background())
			}
			s, err := New(benchConfig(rawApp(b), 10), Options{Tracing: tp})
			if err != nil {
				b.Fatal(err)
			}
			h := s.Handler()
			req := httptest.NewRequest("GET", "http://sidecar/", nil)
			req.RemoteAddr = "127.0.0.1:1234"
			w := &discardWriter{h: http.Header{}}
			sampled := []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
			dropped := []string{"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"}
			every := map[string]int{"0.01": 100, "1": 1}[c.ratio]
			b.ReportAllocs()
			b.ResetTimer()
			cpu := benchhttp.ProcessCPU()
			for i := 0; i < b.N; i++ {
				clear(w.h)
				// The gateway's header, anew: the app span's replaces it.
				req.Header["Traceparent"] = dropped
				if every > 0 && i%every == 0 {
					req.Header["Traceparent"] = sampled
				}
				h.ServeHTTP(w, req)
			}
			if tp != nil {
				_ = tp.ForceFlush(context.Background()) // the export of these requests' spans counts
			}
			// CPU per request of the whole process (sidecar, app,
			// exporter), which a shared machine's wall clock blurs.
			b.ReportMetric(float64(benchhttp.ProcessCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
