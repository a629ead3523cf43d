package sidecar

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// A request waiting in the queue past its timeout gets 504 and leaves the
// queue. (With one timeout for all requests, a queued request only outlives
// its deadline when the slot is held from outside, as here.)
func TestQueuedRequestTimesOut(t *testing.T) {
	cfg := benchConfig(rawApp(t), 1)
	cfg.Timeout = 200 * time.Millisecond
	s, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	if err := s.breaker.Acquire(context.Background()); err != nil {
		t.Fatal(err)
	}
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusGatewayTimeout || !strings.Contains(string(b), "timeout (200ms)") {
		t.Fatalf("%d %q", resp.StatusCode, b)
	}
	if s.breaker.Waiting() != 0 || s.meter.inFlight() != 0 {
		t.Fatalf("waiting %d in flight %d after the timeout", s.breaker.Waiting(), s.meter.inFlight())
	}
	s.breaker.Release()
	resp, err = http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("after release: %d", resp.StatusCode)
	}
}
