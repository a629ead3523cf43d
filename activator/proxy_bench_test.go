package activator

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
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
	backend, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer backend.Close()
	resp := []byte("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 3\r\n\r\nok\n")
	go func() {
		for {
			c, err := backend.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					for {
						line, err := br.ReadSlice('\n')
						if err != nil {
							return
						}
						if len(line) <= 2 {
							break
						}
					}
					if _, err := c.Write(resp); err != nil {
						return
					}
				}
			}()
		}
	}()
	cat := oneRevision(0, time.Minute)
	host, port := splitHostPort(b, backend.Addr().String())
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
	req := []byte("GET / HTTP/1.1\r\nHost: hello.default.localhost\r\nUser-Agent: bench\r\n\r\n")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		br := bufio.NewReader(c)
		for pb.Next() {
			if _, err := c.Write(req); err != nil {
				b.Error(err)
				return
			}
			if err := readBenchResponse(br); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// readBenchResponse reads a 200 response with a Content-Length body
// without allocating.
func readBenchResponse(br *bufio.Reader) error {
	length := -1
	for first := true; ; first = false {
		line, err := br.ReadSlice('\n')
		if err != nil {
			return err
		}
		if first {
			if !bytes.HasPrefix(line, []byte("HTTP/1.1 200")) {
				return fmt.Errorf("status line %q", line)
			}
			continue
		}
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			length = 0
			for _, c := range bytes.TrimSpace(v) {
				length = length*10 + int(c-'0')
			}
		}
	}
	if length < 0 {
		return errors.New("no Content-Length")
	}
	_, err := br.Discard(length)
	return err
}
