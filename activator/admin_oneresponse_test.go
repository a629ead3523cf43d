package activator

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/rawhttp"

	"github.com/labstack/echo/v4"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/datapath/keepalive"
)

// passGuard lets every write through: this test is about framing, not
// authentication (autoscaler's own tests cover that).
type passGuard struct{}

func (passGuard) Wrap(next http.Handler) http.Handler { return next }

type noScaler struct{}

func (noScaler) Scale(_ context.Context, _ string, _ int, _ string, _ map[string]string) error {
	return nil
}

// The admin API (echo on net/http, as serve mounts it, the gateway's admin
// handler beside it) answers a broken or ambiguous request body once, and
// closes the connection after: what follows is never read as a request.
// The listener is screened (keepalive.ScreenListener) as serve should
// serve the admin port too: without it net/http takes Content-Length with
// Transfer-Encoding and reads on.
func TestAdminOneResponse(t *testing.T) {
	as, err := autoscaler.New(autoscaler.Config{Revisions: catalog.New(), Scaler: noScaler{}, Tick: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e := echo.New()
	if err := autoscaler.RegisterAdmin(e, as, passGuard{}); err != nil {
		t.Fatal(err)
	}
	g, err := New(Config{Catalog: catalog.New(), Autoscaler: &fakeAutoscaler{}})
	if err != nil {
		t.Fatal(err)
	}
	e.Any(HealthPath, echo.WrapHandler(g.AdminHandler()))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: e, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		_ = srv.Serve(keepalive.ScreenListener{Listener: ln, MaxHead: http.DefaultMaxHeaderBytes + 4<<10})
	}()
	t.Cleanup(func() { srv.Close() })

	const next = "GET " + HealthPath + " HTTP/1.1\r\nHost: a\r\n\r\n"
	post := "POST " + autoscaler.PathDemand + " HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\n"
	for _, c := range []struct {
		name     string
		stream   string
		statuses int
		closed   bool
	}{
		{"control: two reads", next + next, 2, false},
		{"bad chunk size", post + "Transfer-Encoding: chunked\r\n\r\n5\r\n{\"rep\r\nzz\r\n\r\n" + next, 1, true},
		{"body shorter than its length", post + "Content-Length: 100\r\n\r\n{}", 0, false},
		{"Content-Length with Transfer-Encoding", post + "Content-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + next, 1, true},
		{"two different lengths", post + "Content-Length: 1\r\nContent-Length: 2\r\n\r\n{}" + next, 1, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			resps, closed := rawhttp.Exchange(t, ln.Addr().String(), []string{c.stream}, 0,
				rawhttp.Expect{Responses: c.statuses, Closed: c.closed, Quiet: 500 * time.Millisecond})
			switch {
			case c.name == "body shorter than its length":
				if len(resps) != 0 {
					t.Fatalf("answered a request whose body has not arrived: %+v", resps)
				}
			case len(resps) != c.statuses || closed != c.closed:
				t.Fatalf("%d responses %+v closed=%v, want %d closed=%v", len(resps), resps, closed, c.statuses, c.closed)
			}
		})
	}
}
