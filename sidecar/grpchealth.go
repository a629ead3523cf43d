package sidecar

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// The gRPC health checking protocol (grpc.health.v1.Health/Check) spoken
// by hand over h2c: one length-prefixed protobuf message each way and the
// status in the trailers. It saves the sidecar the whole grpc module for
// two tiny messages:
//
//	message HealthCheckRequest  { string service = 1; }
//	message HealthCheckResponse { ServingStatus status = 1; }  // SERVING = 1
const grpcHealthPath = "/grpc.health.v1.Health/Check"

// grpcServingStatus names a HealthCheckResponse.status value.
func grpcServingStatus(s uint64) string {
	switch s {
	case 0:
		return "UNKNOWN"
	case 1:
		return "SERVING"
	case 2:
		return "NOT_SERVING"
	case 3:
		return "SERVICE_UNKNOWN"
	}
	return fmt.Sprint(s)
}

// grpcProber passes when the app's health service answers SERVING.
type grpcProber struct {
	url     string
	service string
	body    []byte
	client  *http.Client
}

func newGRPCProber(addr, service string) *grpcProber {
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	return &grpcProber{
		url:     "http://" + addr + grpcHealthPath,
		service: service,
		body:    encodeGRPCHealthRequest(service),
		client:  &http.Client{Transport: &http.Transport{Proxy: nil, Protocols: &p}},
	}
}

// encodeGRPCHealthRequest returns the framed request: a 5-byte gRPC
// message header (not compressed, big-endian length) and the protobuf.
func encodeGRPCHealthRequest(service string) []byte {
	var msg []byte
	if service != "" {
		// Field 1, wire type 2 (length-delimited): tag 0x0a.
		msg = append(msg, 0x0a)
		msg = binary.AppendUvarint(msg, uint64(len(service)))
		msg = append(msg, service...)
	}
	frame := make([]byte, 5, 5+len(msg))
	binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
	return append(frame, msg...)
}

// decodeGRPCHealthResponse returns the status field of a framed
// HealthCheckResponse; an absent field is 0 (UNKNOWN), as in proto3.
func decodeGRPCHealthResponse(b []byte) (uint64, error) {
	if len(b) < 5 {
		return 0, fmt.Errorf("gRPC response of %d bytes is shorter than a message header", len(b))
	}
	if b[0] != 0 {
		return 0, errors.New("gRPC response is compressed; the health check asks for none")
	}
	n := binary.BigEndian.Uint32(b[1:5])
	msg := b[5:]
	if uint64(len(msg)) < uint64(n) {
		return 0, fmt.Errorf("gRPC message truncated: header says %d bytes, got %d", n, len(msg))
	}
	msg = msg[:n]
	var status uint64
	for len(msg) > 0 {
		key, k := binary.Uvarint(msg)
		if k <= 0 {
			return 0, errors.New("bad protobuf field key in HealthCheckResponse")
		}
		msg = msg[k:]
		field, wire := key>>3, key&7
		switch wire {
		case 0: // varint
			v, k := binary.Uvarint(msg)
			if k <= 0 {
				return 0, errors.New("bad protobuf varint in HealthCheckResponse")
			}
			msg = msg[k:]
			if field == 1 {
				status = v
			}
		case 1: // fixed64
			if len(msg) < 8 {
				return 0, errors.New("truncated fixed64 in HealthCheckResponse")
			}
			msg = msg[8:]
		case 2: // length-delimited
			l, k := binary.Uvarint(msg)
			if k <= 0 || uint64(len(msg)-k) < l {
				return 0, errors.New("truncated field in HealthCheckResponse")
			}
			msg = msg[k+int(l):]
		case 5: // fixed32
			if len(msg) < 4 {
				return 0, errors.New("truncated fixed32 in HealthCheckResponse")
			}
			msg = msg[4:]
		default:
			return 0, fmt.Errorf("unsupported protobuf wire type %d in HealthCheckResponse", wire)
		}
	}
	return status, nil
}

func (g *grpcProber) probe(ctx context.Context) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, g.url, bytes.NewReader(g.body))
	if err != nil {
		return err
	}
	req.Header = http.Header{
		"Content-Type": {"application/grpc"},
		"Te":           {"trailers"},
		"User-Agent":   {"nomad-serverless-probe"},
	}
	resp, err := g.client.Do(req)
	if err != nil {
		// Drop a connection the app may have closed or never completed.
		g.client.CloseIdleConnections()
		return fmt.Errorf("gRPC health check %s: %w", g.url, err)
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("gRPC health check: read response: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("gRPC health check: HTTP status %s", resp.Status)
	}
	// grpc-status is a trailer, or a header in a trailers-only response.
	code := resp.Trailer.Get("Grpc-Status")
	msg := resp.Trailer.Get("Grpc-Message")
	if code == "" {
		code, msg = resp.Header.Get("Grpc-Status"), resp.Header.Get("Grpc-Message")
	}
	if code != "0" {
		if code == "" {
			return errors.New("gRPC health check: response has no grpc-status")
		}
		return fmt.Errorf("gRPC health check failed with grpc-status %s: %s", code, msg)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "application/grpc") {
		return fmt.Errorf("gRPC health check: content-type %q is not gRPC", ct)
	}
	status, err := decodeGRPCHealthResponse(body)
	if err != nil {
		return fmt.Errorf("gRPC health check: %w", err)
	}
	if status != 1 {
		return fmt.Errorf("gRPC health check of service %q: status %s", g.service, grpcServingStatus(status))
	}
	return nil
}
