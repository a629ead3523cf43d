package sidecar

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// grpcHealthServer is a tiny h2c server speaking the health protocol's
// framing: it decodes HealthCheckRequest.service by hand and answers with
// the status configured for that service, or NOT_FOUND (grpc-status 5) in a
// trailers-only response for an unknown one.
func grpcHealthServer(t *testing.T, statuses map[string]uint64) int {
	t.Helper()
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &p, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor != 2 || r.URL.Path != grpcHealthPath || r.Header.Get("Content-Type") != "application/grpc" {
			t.Errorf("unexpected request %s %s %s", r.Proto, r.URL.Path, r.Header.Get("Content-Type"))
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		body, _ := io.ReadAll(r.Body)
		if len(body) < 5 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
			t.Errorf("bad frame % x", body)
			return
		}
		service := ""
		if msg := body[5:]; len(msg) > 0 {
			if msg[0] != 0x0a {
				t.Errorf("bad field tag % x", msg)
				return
			}
			l, k := binary.Uvarint(msg[1:])
			service = string(msg[1+k : 1+k+int(l)])
		}
		status, ok := statuses[service]
		w.Header().Set("Content-Type", "application/grpc")
		if !ok {
			w.Header().Set("Grpc-Status", "5")
			w.Header().Set("Grpc-Message", "unknown service")
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("Trailer", "Grpc-Status, Grpc-Message")
		w.WriteHeader(http.StatusOK)
		msg := []byte{0x08}
		msg = binary.AppendUvarint(msg, status)
		frame := make([]byte, 5)
		binary.BigEndian.PutUint32(frame[1:], uint32(len(msg)))
		w.Write(append(frame, msg...))
		w.Header().Set("Grpc-Status", "0")
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

func TestGRPCProber(t *testing.T) {
	port := grpcHealthServer(t, map[string]uint64{"": 1, "db": 2, "cache": 1})
	ctx := context.Background()
	for _, c := range []struct {
		service string
		wantErr string
	}{
		{"", ""},
		{"cache", ""},
		{"db", "NOT_SERVING"},
		{"nope", "grpc-status 5"},
	} {
		p, err := newProber(probeGRPC(c.service), "127.0.0.1", port, false)
		if err != nil {
			t.Fatal(err)
		}
		err = p.probe(ctx)
		if c.wantErr == "" && err != nil || c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)) {
			t.Errorf("service %q: got %v, want error containing %q", c.service, err, c.wantErr)
		}
	}
}

func TestGRPCCodec(t *testing.T) {
	req := encodeGRPCHealthRequest("svc")
	if want := []byte{0, 0, 0, 0, 5, 0x0a, 3, 's', 'v', 'c'}; string(req) != string(want) {
		t.Fatalf("request % x, want % x", req, want)
	}
	if req := encodeGRPCHealthRequest(""); string(req) != string([]byte{0, 0, 0, 0, 0}) {
		t.Fatalf("empty request % x", req)
	}
	for _, c := range []struct {
		name string
		in   []byte
		want uint64
		err  bool
	}{
		{"serving", []byte{0, 0, 0, 0, 2, 0x08, 1}, 1, false},
		{"absent field is UNKNOWN", []byte{0, 0, 0, 0, 0}, 0, false},
		{"unknown fields skipped", []byte{0, 0, 0, 0, 11, 0x12, 2, 'h', 'i', 0x1d, 1, 2, 3, 4, 0x08, 2}, 2, false},
		{"compressed", []byte{1, 0, 0, 0, 2, 0x08, 1}, 0, true},
		{"truncated", []byte{0, 0, 0, 0, 9, 0x08}, 0, true},
		{"short", []byte{0, 0}, 0, true},
	} {
		got, err := decodeGRPCHealthResponse(c.in)
		if got != c.want || (err != nil) != c.err {
			t.Errorf("%s: got %d, %v", c.name, got, err)
		}
	}
}
