package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Scenario 22: nothing leaks over wake and load cycles. One serve, a
// revision that always has its one instance (its sidecar lives through
// every cycle) and one that goes to zero and wakes. Each cycle sends the
// steady revision a load step with requests the client abandons mid-way
// (the cancel path through gateway, sidecar and app), and wakes the other
// from zero. After each cycle, at rest, serve's and the steady sidecar's
// goroutines and open file descriptors are read from their /metrics
// (client_golang's go_goroutines and process_open_fds): the least of a
// few readings, so what is only passing through does not count and what
// leaked does. The first cycle warms pools and connections up; a leak of
// one goroutine or descriptor per cycle after it would exceed the slack by
// the last.
func TestE2E22NothingLeaks(t *testing.T) {
	h := newHarness(t, "22 leaks")
	const steadySvc, wakeSvc = "e2e-leak-steady", "e2e-leak-wake"
	steadyRev, wakeRev := revision(steadySvc, 1), revision(wakeSvc, 1)
	h.cleanupService(steadySvc)
	h.cleanupService(wakeSvc)
	g := h.startServe("e2e-22", "", "")
	steady := testService(steadySvc)
	steady.Scaling.Min, steady.Scaling.Max = 1, 1
	h.deploy(h.writeServices("leaks.hcl", steady, testService(wakeSvc)))
	allocs := h.waitRunning(steadyRev, 1, 60*time.Second)
	sidecarMetrics := h.sidecarMetricsURL(steadyRev, allocs[0].ID)

	const cycles, slack = 12, 8
	type sample struct{ serveG, serveFD, sidecarG, sidecarFD float64 }
	var samples []sample
	for cycle := 1; cycle <= cycles; cycle++ {
		client := NewClient(32)
		load := StartLoad(context.Background(), g.request(steadySvc, "", "/?sleep=20ms", client), 6, 0, 30*time.Second)
		// Abandoned mid-way: the client gives up on requests the app
		// still holds.
		abandon := g.request(steadySvc, "", "/?sleep=2s", client)
		abandon.Timeout = 100 * time.Millisecond
		for range 4 {
			if o := abandon.Do(context.Background()); o.OK() {
				t.Errorf("cycle %d: a request abandoned after 100 ms was answered", cycle)
			}
		}
		time.Sleep(2 * time.Second)
		res := load.Stop()
		if failed := res.Failed(); len(failed) > 0 {
			t.Errorf("cycle %d: load on %s: %s", cycle, steadyRev, res.Summary())
		}
		h.waitZero(wakeRev, 90*time.Second)
		if o := g.request(wakeSvc, "", "/", client).Do(context.Background()); !o.OK() {
			t.Fatalf("cycle %d: wake of %s: %s", cycle, wakeRev, o.Describe())
		}
		client.CloseIdleConnections()
		// The abandoned requests finish at the app 2 s after they were
		// sent; the rest settles within that too.
		time.Sleep(2500 * time.Millisecond)
		s := sample{}
		s.serveG, s.serveFD = restingMetrics(t, g.adminURL()+"/metrics")
		s.sidecarG, s.sidecarFD = restingMetrics(t, sidecarMetrics)
		t.Logf("cycle %d at rest: serve %.0f goroutines, %.0f fds; %s's sidecar %.0f goroutines, %.0f fds",
			cycle, s.serveG, s.serveFD, steadyRev, s.sidecarG, s.sidecarFD)
		samples = append(samples, s)
	}
	if now := h.liveAllocs(steadyRev); len(now) != 1 || now[0].ID != allocs[0].ID {
		t.Fatalf("%s's instance changed during the run: the sidecar's readings are not one process's", steadyRev)
	}
	first, last := samples[0], samples[len(samples)-1]
	for _, c := range []struct {
		what        string
		first, last float64
	}{
		{"serve's goroutines", first.serveG, last.serveG},
		{"serve's open fds", first.serveFD, last.serveFD},
		{"the sidecar's goroutines", first.sidecarG, last.sidecarG},
		{"the sidecar's open fds", first.sidecarFD, last.sidecarFD},
	} {
		if c.last > c.first+slack {
			t.Errorf("%s grew from %.0f after the first cycle to %.0f after the %dth, at rest (slack %d): a leak", c.what, c.first, c.last, cycles, slack)
		}
	}
}

// sidecarMetricsURL is the /metrics of the sidecar of rev's allocation,
// from the admin port its Consul service names.
func (h *harness) sidecarMetricsURL(rev, allocID string) string {
	h.t.Helper()
	var url string
	eventually(h.t, 30*time.Second, "the sidecar of "+allocID+" passes in Consul", func() (bool, string) {
		for _, e := range h.passing(rev) {
			if strings.Contains(e.Service.ID, allocID) && e.Service.Meta[spec.ServiceMetaAdminPort] != "" {
				url = "http://" + net.JoinHostPort(e.Service.Address, e.Service.Meta[spec.ServiceMetaAdminPort]) + "/metrics"
				return true, ""
			}
		}
		return false, fmt.Sprintf("%d passing", len(h.passing(rev)))
	})
	return url
}

// restingMetrics reads go_goroutines and process_open_fds five times over
// 2 s and returns the least of each.
func restingMetrics(t *testing.T, url string) (goroutines, fds float64) {
	t.Helper()
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	goroutines, fds = -1, -1
	for i := range 5 {
		if i > 0 {
			time.Sleep(500 * time.Millisecond)
		}
		status, body, err := getBody(client, url)
		if err != nil || status != http.StatusOK {
			t.Fatalf("GET %s: %d %v", url, status, err)
		}
		g, f := MetricSum(body, "go_goroutines", ""), MetricSum(body, "process_open_fds", "")
		if g <= 0 || f <= 0 {
			t.Fatalf("%s has no go_goroutines or process_open_fds", url)
		}
		if goroutines < 0 || g < goroutines {
			goroutines = g
		}
		if fds < 0 || f < fds {
			fds = f
		}
	}
	return goroutines, fds
}
