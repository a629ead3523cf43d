package sidecar

import (
	"net/http"
	"testing"
	"time"
)

func TestGRPCDeadlinePassed(t *testing.T) {
	start := time.Unix(1_800_000_000, 0)
	for _, c := range []struct {
		name, contentType, timeout string
		after                      time.Duration
		want                       bool
	}{
		{"a gRPC call past its deadline", "application/grpc", "1S", time.Second, true},
		{"gRPC+proto, in milliseconds", "application/grpc+proto", "1500m", 1600 * time.Millisecond, true},
		{"before its deadline", "application/grpc", "1S", 999 * time.Millisecond, false},
		{"hours", "application/grpc", "1H", 59 * time.Minute, false},
		{"no grpc-timeout", "application/grpc", "", time.Hour, false},
		{"not gRPC", "application/json", "1S", time.Hour, false},
		{"no unit", "application/grpc", "100", time.Hour, false},
		{"an unknown unit", "application/grpc", "1d", time.Hour, false},
		{"more than 8 digits", "application/grpc", "123456789S", 200 * 365 * 24 * time.Hour, false},
		{"negative", "application/grpc", "-1S", time.Hour, false},
	} {
		r, _ := http.NewRequest(http.MethodPost, "http://x/svc/Method", nil)
		r.Header.Set("Content-Type", c.contentType)
		if c.timeout != "" {
			r.Header.Set("Grpc-Timeout", c.timeout)
		}
		if got := grpcDeadlinePassed(r, start, start.Add(c.after)); got != c.want {
			t.Errorf("%s (grpc-timeout %q, %s later): %v, want %v", c.name, c.timeout, c.after, got, c.want)
		}
	}
}
