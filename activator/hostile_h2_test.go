package activator

import (
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/rawh2"
)

// Hostile HTTP/2 input to the gateway's h2c listener (Server on the
// screened Listener, as serve runs it), an instance behind it: invalid
// frames, floods, rapid reset, HPACK bombs and streams beyond the limit.
// Each case ends in a GOAWAY, stream errors or a close, as RFC 9113 says
// (the case's name says which), within rawh2.Within, with bounded heap
// growth, and passes on to the instance no more than the case allows:
// no stream of a malformed connection, and at most
// rawh2.RapidResetReach of rapid reset's cancelled streams.
func TestHostileInputGatewayH2(t *testing.T) {
	if testing.Short() {
		t.Skip("floods of frames (skipped in -short)")
	}
	var mu sync.Mutex
	release := make(chan struct{})
	sc := newFakeSidecar(t, true, func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/hold/") {
			mu.Lock()
			ch := release
			mu.Unlock()
			w.WriteHeader(200)
			io.WriteString(w, "held\n")
			w.(http.Flusher).Flush()
			select {
			case <-ch:
			case <-r.Context().Done():
			}
		}
		io.WriteString(w, "ok")
	})
	cat := oneRevision(0, time.Minute)
	cat.SetReady("hello-00001", []consulroute.Instance{sc.instance("hello-00001")})
	tg := startGateway(t, cat, nil, nil)

	rawh2.Run(t, &rawh2.Target{
		Addr: serveScreened(t, tg.g),
		Host: "hello.default.localhost", Path: "/",
		Hold: func(i int) string { return "/hold/" + string(rune('a'+i%26)) },
		Release: func(testing.TB, int) {
			mu.Lock()
			close(release)
			release = make(chan struct{})
			mu.Unlock()
		},
		AtInstance:     func(testing.TB) int64 { return sc.requests.Load() },
		MaxStreams:     maxConcurrentStreams,
		MaxHeaderBytes: DefaultMaxHeaderBytes,
		MaxHeapGrowth:  64 << 20,
	}, rawh2.Cases())
}
