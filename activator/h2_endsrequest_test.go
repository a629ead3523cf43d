package activator

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

// An instance that ends its answer, trailers included, while the HTTP/2
// client is still sending (a gRPC status in the middle of a bidirectional
// stream) has it passed on at once: the transport to the sidecar no longer
// waits for the client's next bytes (or the request timeout) before the
// response may end (h2proxy.EndsRequest).
func TestH2CResponseEndsBeforeRequestBody(t *testing.T) {
	cat := oneRevision(0, time.Hour)
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		buf := make([]byte, 5)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			t.Errorf("sidecar: read the first message: %v", err)
		}
		w.Header().Set("Trailer", "Grpc-Status")
		w.WriteHeader(http.StatusOK)
		io.WriteString(w, "done early")
		w.Header().Set("Grpc-Status", "10")
	})
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pr, pw := io.Pipe()
	defer pw.Close() // the client's side stays open until the test ends
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tg.srv.URL+"/stream", pr)
	req.Host = "hello.default.localhost"
	go io.WriteString(pw, "first")
	resp, err := h2cClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || string(body) != "done early" {
		t.Fatalf("body %q, %v (a minute is the bound)", body, err)
	}
	if got := resp.Trailer.Get("Grpc-Status"); got != "10" {
		t.Errorf("trailer Grpc-Status %q, want 10", got)
	}
}
