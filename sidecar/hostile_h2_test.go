package sidecar_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/test/rawh2"
)

// Hostile HTTP/2 input straight to the sidecar's h2c listener (the front
// door: the keep-alive loop hands a connection that opens with the
// preface to net/http's HTTP/2 server), a real test app behind it: the
// table the gateway's listener passes (activator), with the sidecar's
// limits (net/http's: 250 streams, a 1 MiB header list). Each case ends
// in a GOAWAY, stream errors or a close, as RFC 9113 says, never hangs,
// keeps the heap bounded and passes on to the app no more than it allows.
func TestHostileInputSidecarH2(t *testing.T) {
	if testing.Short() {
		t.Skip("floods of frames (skipped in -short)")
	}
	a := startApp(t, nil)
	r := startSidecar(t, config(a.port), sidecar.Options{})
	r.waitReady(t)
	rawh2.Run(t, &rawh2.Target{
		Addr: strings.TrimPrefix(r.url, "http://"),
		Host: "hello.default.localhost", Path: "/",
		Hold: func(i int) string { return fmt.Sprintf("/?stream=2&gate=h2-%d", i) },
		Release: func(tb testing.TB, n int) {
			for i := range n {
				a.post(tb.(*testing.T), fmt.Sprintf("/release?gate=h2-%d", i))
			}
		},
		AtInstance:     func(tb testing.TB) int64 { return a.stats(tb.(*testing.T)).Requests },
		MaxStreams:     250, // net/http's default, the sidecar's
		MaxHeaderBytes: http.DefaultMaxHeaderBytes,
		// Rapid reset: net/http bounds the sidecar's handlers (250 at a
		// time per connection) and its memory, but a started handler
		// passes its request on before the reset is read: 10,000
		// open-then-reset streams put about 1,500 requests (and their
		// cancellations) on the app. The sidecar does not close such a
		// connection, as the gateway does (activator/h2reset.go): its
		// client is the gateway, whose one connection carries the streams
		// of many clients, and their cancellations must not cost every
		// other client its stream. Here it is bounded by the attack only.
		RapidResetReach: rawh2.RapidResets,
		MaxHeapGrowth:   64 << 20,
	}, rawh2.Cases())
}
