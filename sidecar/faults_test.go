package sidecar_test

import (
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/sidecar"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// kill -9 of the app: the sidecar answers requests that cannot reach it
// with a 502 that says so (spec.NotServedHeader), marks itself not ready at
// the first refused connection (not at the next probe, a second later),
// and is ready again within a few aggressive probes of the app's return.
func TestAppKilledNotServedAndNotReady(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	cfg := config(a.port)
	cfg.Concurrency = 10
	var out testbin.Buffer
	r := startSidecar(t, cfg, sidecar.Options{Log: slog.New(slog.NewTextHandler(&out, nil))})
	r.waitReady(t)
	// Warm the pool: these connections are dead once the app is.
	for range 3 {
		if code, _ := get(t, r.url+"/"); code != 200 {
			t.Fatal(code)
		}
	}
	if err := a.proc.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.proc.Done()

	notServed := func(resp *http.Response, err error) string {
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return strconv.Itoa(resp.StatusCode) + " " + resp.Header.Get(spec.NotServedHeader)
	}
	want := "502 " + spec.NotServedValue
	// A GET on a pooled connection the app's death closed, and a POST
	// with a body (looked at before use, then refused on a new one).
	if got := notServed(http.Get(r.url + "/")); got != want {
		t.Fatalf("GET to a dead app: %q, want %q", got, want)
	}
	if code, body := probe(t, r.url); code != http.StatusServiceUnavailable || !strings.Contains(body, "not ready") {
		t.Fatalf("probe right after the refusal: %d %q", code, body)
	}
	if got := notServed(http.Post(r.url+"/echo", "text/plain", strings.NewReader("payload"))); got != want {
		t.Fatalf("POST to a dead app: %q, want %q", got, want)
	}

	// The refusal switched the readiness probe to the aggressive period
	// (the schedule's rules are TestProbeScheduleRefused's; how soon that makes
	// the sidecar ready again is a latency, logged below).
	every := "probe_every=" + spec.AggressiveProbePeriod.String()
	testbin.Eventually(t, 20*time.Second, 10*time.Millisecond, "the log says "+every, func() (bool, string) {
		return strings.Contains(out.String(), every), out.String()
	})
	// The app comes back on its port: ready again.
	env := map[string]string{testapp.EnvPort: strconv.Itoa(a.port)}
	p := testbin.Start(t, testbin.Path(t), []string{"testapp"}, env)
	p.WaitPort(t, a.port, 20*time.Second)
	took := testbin.Eventually(t, 20*time.Second, time.Millisecond, "ready again", func() (bool, string) {
		code, body := probe(t, r.url)
		return code == 200, body
	})
	t.Logf("ready %s after the app listened again (probes every %s)", took.Round(time.Millisecond), spec.AggressiveProbePeriod)
	if code, _ := get(t, r.url+"/"); code != 200 {
		t.Fatalf("after the app's return: %d", code)
	}
}
