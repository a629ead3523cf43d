package keepalive

import (
	"io"
	"net/http"
	"testing"
	"time"
)

// Err after Done does not block: Done's watcher waits for the client's
// socket to become readable, holding the socket's read lock while it
// waits, so a peek from Err would wait with it until the client sent or
// left. The gateway met it as a request that had waited in the
// activator's queue (Done) and whose instance took over a second to
// answer (the upstream read's check of Err): the request hung until its
// client gave up.
func TestErrAfterDoneDoesNotBlock(t *testing.T) {
	took := make(chan time.Duration, 1)
	loop := startLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		_ = ctx.Done() // starts the watcher
		// Err looks at the socket at most once a clientCheckInterval.
		time.Sleep(clientCheckInterval + 100*time.Millisecond)
		errc := make(chan error, 1)
		start := time.Now()
		go func() { errc <- ctx.Err() }()
		select {
		case err := <-errc:
			took <- time.Since(start)
			if err != nil {
				t.Errorf("Err = %v with the client waiting", err)
			}
		case <-time.After(30 * time.Second):
			took <- 0
			t.Error("Err blocked for 30s behind Done's watcher")
		}
		io.WriteString(w, "ok")
	}), nil)
	rc := dial(t, loop.addr)
	rc.send("GET / HTTP/1.1\r\nHost: a\r\n\r\n")
	if r := rc.read("GET"); r.body != "ok" {
		t.Fatalf("got %q (%v)", r.body, r.readFail)
	}
	t.Logf("Err answered in %s", <-took)
}
