package sidecar

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// A gRPC server ends a call whose deadline (the grpc-timeout header)
// passed with RST_STREAM CANCEL, and a client whose own timer has not
// fired yet would see the sidecar's answer to that reset, a 502, as
// Unavailable. Both ends' timers run out at about the same moment, so
// which one wins was a race. For such a call the sidecar answers what the
// call's deadline says: DEADLINE_EXCEEDED, as a gRPC trailers-only
// response.

// grpcDeadlineStatus is gRPC's DEADLINE_EXCEEDED.
const grpcDeadlineStatus = "4"

// grpcDeadlinePassed reports whether r is a gRPC call whose deadline,
// counted from start (when the sidecar received it, before the app did),
// has passed at now.
func grpcDeadlinePassed(r *http.Request, start, now time.Time) bool {
	if !strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
		return false
	}
	d, ok := parseGRPCTimeout(r.Header.Get("Grpc-Timeout"))
	return ok && now.Sub(start) >= d
}

// parseGRPCTimeout reads a grpc-timeout value: at most 8 digits and a unit
// (H, M, S, m, u, n), as the gRPC over HTTP/2 protocol defines it.
func parseGRPCTimeout(v string) (time.Duration, bool) {
	if len(v) < 2 || len(v) > 9 {
		return 0, false
	}
	n, err := strconv.ParseInt(v[:len(v)-1], 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	var unit time.Duration
	switch v[len(v)-1] {
	case 'H':
		unit = time.Hour
	case 'M':
		unit = time.Minute
	case 'S':
		unit = time.Second
	case 'm':
		unit = time.Millisecond
	case 'u':
		unit = time.Microsecond
	case 'n':
		unit = time.Nanosecond
	default:
		return 0, false
	}
	return time.Duration(n) * unit, true
}

// grpcDeadlineExceeded answers x as a gRPC server whose call's deadline
// passed: HTTP 200, grpc-status 4 in the headers, no body.
func (x *exchange) grpcDeadlineExceeded() {
	if x.wroteHeader {
		return
	}
	hd := x.w.Header()
	clear(hd)
	hd["Content-Type"] = []string{"application/grpc"}
	hd["Grpc-Status"] = []string{grpcDeadlineStatus}
	hd["Grpc-Message"] = []string{"deadline exceeded (the app ended the call at its grpc-timeout)"}
	x.WriteHeader(http.StatusOK)
}
