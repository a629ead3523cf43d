package activator

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/benchhttp"
	"github.com/nomad-serverless/nomad-serverless/test/otlpsink"
	"github.com/nomad-serverless/nomad-serverless/tracing"
)

// BenchmarkProxy measures one request through the gateway over real
// loopback HTTP to a trivial backend, clients in parallel.
func BenchmarkProxy(b *testing.B) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") }))
	defer backend.Close()
	cat := oneRevision(0, time.Minute)
	host, port := splitHostPort(b, backend.Listener.Addr().String())
	cat.SetReady("hello-00001", []consulroute.Instance{{ID: "x", Revision: "hello-00001", Address: host, Port: port}})
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{ebc: 1000, known: true}})
	if err != nil {
		b.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(g)
	srv.Config = g.Server("")
	srv.Start()
	defer srv.Close()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	b.ReportAllocs()
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+"/", nil)
		req.Host = "hello.default.localhost"
		for pb.Next() {
			resp, err := client.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}

// BenchmarkServe is the gateway's whole serving side (its server, the
// keep-alive loop, routing, forwarding) between raw keep-alive clients and
// a raw backend that allocate nothing per request, so allocs/op are the
// gateway's own.
func BenchmarkServe(b *testing.B) {
	backend := benchhttp.Serve(b, benchhttp.OK)
	cat := oneRevision(0, time.Minute)
	host, port := splitHostPort(b, backend)
	cat.SetReady("hello-00001", []consulroute.Instance{{ID: "x", Revision: "hello-00001", Address: host, Port: port}})
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{ebc: 1000, known: true}})
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := g.Server("")
	go srv.Serve(ln)
	defer srv.Close()
	benchhttp.Drive(b, ln.Addr().String(), "GET / HTTP/1.1\r\nHost: hello.default.localhost\r\nUser-Agent: bench\r\n\r\n")
}

// BenchmarkServeTracing is BenchmarkServe with tracing off, sampling 1 %
// and sampling every request, exporting over OTLP/HTTP to a sink that
// keeps nothing: the cost of tracing on the gateway, as ratios of one run
// (benchstat). tracing=0% samples none: every request is a root the
// sampler drops, what tracing being on costs each request by itself.
func BenchmarkServeTracing(b *testing.B) {
	for _, c := range []struct{ name, ratio string }{{"tracing=off", ""}, {"tracing=0%", "0"}, {"tracing=1%", "0.01"}, {"tracing=100%", "1"}} {
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
			backend := benchhttp.Serve(b, benchhttp.OK)
			cat := oneRevision(0, time.Minute)
			host, port := splitHostPort(b, backend)
			cat.SetReady("hello-00001", []consulroute.Instance{{ID: "x", Revision: "hello-00001", Address: host, Port: port}})
			g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{ebc: 1000, known: true}, Tracing: tp})
			if err != nil {
				b.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := g.Server("")
			go srv.Serve(ln)
			defer srv.Close()
			// CPU per request of the whole process (client, gateway,
			// backend, exporter): what tracing costs the machine, which a
			// shared machine's wall clock blurs.
			cpu := benchhttp.ProcessCPU()
			benchhttp.Drive(b, ln.Addr().String(), "GET / HTTP/1.1\r\nHost: hello.default.localhost\r\nUser-Agent: bench\r\n\r\n")
			if tp != nil {
				_ = tp.ForceFlush(context.Background()) // the export of these requests' spans counts
			}
			b.ReportMetric(float64(benchhttp.ProcessCPU()-cpu)/float64(b.N), "cpu-ns/op")
		})
	}
}
