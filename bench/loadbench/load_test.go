package main

import (
	"bufio"
	"context"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestHistogramQuantiles(t *testing.T) {
	var h Histogram
	for i := 1; i <= 10000; i++ {
		h.Record(time.Duration(i) * time.Microsecond)
	}
	for q, want := range map[float64]time.Duration{0.5: 5 * time.Millisecond, 0.99: 9900 * time.Microsecond, 1: 10 * time.Millisecond} {
		got := h.Quantile(q)
		if math.Abs(float64(got-want))/float64(want) > 0.01 {
			t.Errorf("q%.2f = %s, want %s within 1%%", q, got, want)
		}
	}
	if h.Count() != 10000 || h.Mean() != 5000500*time.Nanosecond || h.Max() != 10*time.Millisecond {
		t.Errorf("count %d mean %s max %s", h.Count(), h.Mean(), h.Max())
	}
	var m Histogram
	m.Merge(&h)
	m.Merge(&h)
	if m.Count() != 20000 || m.Quantile(0.5) != h.Quantile(0.5) {
		t.Errorf("merge: count %d p50 %s", m.Count(), m.Quantile(0.5))
	}
	// Every index maps back into its own bucket.
	for _, v := range []uint64{0, 1, 127, 128, 129, 255, 256, 1000, 123456789, 1 << 39} {
		if i := histIndex(v); histIndex(uint64(histValue(i))) != i {
			t.Errorf("value %d: bucket %d's middle %d is in bucket %d", v, i, histValue(i), histIndex(uint64(histValue(i))))
		}
	}
}

func TestReadResponse(t *testing.T) {
	for _, c := range []struct {
		name   string
		in     string
		status int
		keep   bool
		rest   string
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcNEXT", 200, true, "NEXT"},
		{"chunked", "HTTP/1.1 503 No\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\nX-T: 1\r\n\r\nNEXT", 503, true, "NEXT"},
		{"close", "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\nxNEXT", 200, false, "NEXT"},
		{"http/1.0 to EOF", "HTTP/1.0 200 OK\r\n\r\nall of it", 200, false, ""},
		{"no content", "HTTP/1.1 204 No Content\r\n\r\nNEXT", 204, true, "NEXT"},
	} {
		br := bufio.NewReader(strings.NewReader(c.in))
		status, keep, err := readResponse(br)
		rest, _ := br.ReadString(0)
		if err != nil || status != c.status || keep != c.keep || rest != c.rest {
			t.Errorf("%s: status %d keep %v err %v rest %q", c.name, status, keep, err, rest)
		}
	}
	if _, _, err := readResponse(bufio.NewReader(strings.NewReader("garbage\r\n\r\n"))); err == nil {
		t.Error("garbage accepted")
	}
}

func TestRunCountsEverything(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("fail") != "" {
			w.WriteHeader(500)
		}
		w.Write([]byte("ok"))
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().(*net.TCPAddr).String()
	r := Run(context.Background(), Target{Name: "t", Addr: addr}, Load{Conns: 4, Duration: 300 * time.Millisecond})
	if r.Requests == 0 || r.Errors != 0 || r.ByClass[2] != r.Requests || r.Sent < r.Requests || r.Latency.Count() != r.Requests {
		t.Fatalf("result %+v", r)
	}
	bad := Run(context.Background(), Target{Name: "t", Addr: addr, Path: "/?fail=1"}, Load{Conns: 1, Duration: 100 * time.Millisecond})
	if bad.Requests == 0 || bad.ByClass[5] != bad.Requests {
		t.Fatalf("500s: %+v", bad.ByClass)
	}
}
