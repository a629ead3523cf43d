package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/adminauth"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// Scenario 15: the admin API obeys only the control plane. With a revision
// at zero, POSTs to the leader's wake and demand endpoints that are
// unsigned, signed with a key of another cluster, or replayed are refused
// (401) and Nomad's count stays 0; `status` still reads the autoscaler's
// state; a second replica, signing with the keyring both read from Consul,
// has its demand accepted by the leader and wakes the revision through its
// own gateway.
func TestE2E15AdminAPIOnlyObeysTheControlPlane(t *testing.T) {
	h := newHarness(t, "15 admin auth")
	const svc = "e2e-adminauth"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-15a", "", "")
	h.deploy(h.writeServices("adminauth.hcl", testService(svc)))
	h.waitZero(rev, 90*time.Second)

	wakeBody := fmt.Sprintf(`{"replica":"e2e-15-intruder","demand":{"revision":%q,"queued":100}}`, rev)
	demandBody := fmt.Sprintf(`{"replica":"e2e-15-intruder","demand":[{"revision":%q,"queued":100}]}`, rev)
	probeStart := time.Now()
	client := NewClient(4)

	// Unsigned: what issue 13 measured (204 and a scale to 3) is now 401.
	for path, body := range map[string]string{autoscaler.PathWake: wakeBody, autoscaler.PathDemand: demandBody} {
		status, msg := adminPost(t, client, g.adminURL()+path, nil, []byte(body))
		if status != http.StatusUnauthorized {
			t.Errorf("unsigned POST %s: %d %s, want 401", path, status, msg)
		}
		t.Logf("unsigned POST %s: %d %s", path, status, msg)
	}

	// Signed with a key this cluster does not have.
	foreign, err := adminauth.NewKey(time.Now(), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for path, body := range map[string]string{autoscaler.PathWake: wakeBody, autoscaler.PathDemand: demandBody} {
		req := signedAdminRequest(t, g.adminURL()+path, foreign, []byte(body))
		status, msg := adminPost(t, client, req.URL.String(), req.Header, []byte(body))
		if status != http.StatusUnauthorized {
			t.Errorf("POST %s signed with a foreign key: %d %s, want 401", path, status, msg)
		}
		t.Logf("POST %s signed with a foreign key: %d %s", path, status, msg)
	}

	// Signed with the cluster's key (read as a replica would, from Consul
	// KV, open here since the suite's agents run without ACLs): an empty
	// demand report, which changes no decision, is accepted once and
	// refused when played again.
	cc, err := consulroute.NewClient(nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	ring, _, err := cc.AdminKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	empty := []byte(`{"replica":"e2e-15-probe","demand":[]}`)
	req := signedAdminRequest(t, g.adminURL()+autoscaler.PathDemand, ring.Signing(time.Now()), empty)
	if status, msg := adminPost(t, client, req.URL.String(), req.Header, empty); status != http.StatusNoContent {
		t.Fatalf("signed empty demand report: %d %s, want 204", status, msg)
	}
	status, msg := adminPost(t, client, req.URL.String(), req.Header, empty)
	if status != http.StatusUnauthorized || !strings.Contains(msg, "replayed") {
		t.Errorf("replayed signed request: %d %s, want 401 replayed", status, msg)
	}
	t.Logf("signed demand report played a second time: %d %s", status, msg)

	// Nothing moved: the count stays 0 over several of the leader's ticks,
	// with no scale-up from zero recorded since the first probe.
	time.Sleep(6 * time.Second)
	if n, err := h.groupCount(rev); err != nil || n != 0 {
		t.Fatalf("count of %s after the refused writes: %d (%v), want 0", rev, n, err)
	}
	if ups := ScaleUpsFromZero(h.scalingEvents(rev), probeStart); len(ups) != 0 {
		t.Fatalf("refused writes woke %s: %+v", rev, h.scalingEvents(rev))
	}
	t.Logf("%s: count 0 and no scale-up from zero %s after the first refused write", rev, time.Since(probeStart).Round(100*time.Millisecond))
	metrics := adminMetrics(t, g)
	t.Logf("leader's nomad_serverless_admin_auth_total by result: %v", metrics)
	for _, result := range []string{"missing", "unknown_key", "replayed"} {
		if metrics[result] < 1 {
			t.Errorf("nomad_serverless_admin_auth_total{result=%q} = %v on the leader, want >= 1 (%v)", result, metrics[result], metrics)
		}
	}

	// status reads without the key (the GETs stay open).
	out := h.mustCLI("status", svc)
	if !strings.Contains(out, rev) || strings.Contains(out, "no leader answered") {
		t.Errorf("status did not show the autoscaler's view of %s:\n%s", rev, out)
	}

	// A second replica: it does not lead, so its activator reports demand
	// to the leader every second, signed; the leader accepts them, and a
	// request at zero through its gateway wakes the revision.
	accepted := metrics["accepted"]
	b := h.startSecondReplica("e2e-15b")
	eventually(t, 30*time.Second, "e2e-15b's gateway knows "+rev, func() (bool, string) {
		view := b.gatewayView(t)
		_, ok := view[rev]
		return ok, fmt.Sprintf("%d revisions", len(view))
	})
	eventually(t, 30*time.Second, "the leader accepts e2e-15b's signed demand reports", func() (bool, string) {
		m := adminMetrics(t, g)
		return m["accepted"] > accepted, fmt.Sprintf("admin auth results %v", m)
	})
	wakeStart := time.Now()
	o := b.request(svc, "", "/", NewClient(1)).Do(ctx)
	if !o.OK() {
		t.Fatalf("request at zero through the second replica: %s\ne2e-15b:\n%s", o.Describe(), b.proc.Output())
	}
	h.timing("request at zero through a second replica", o.End.Sub(o.Start))
	t.Logf("leader's nomad_serverless_admin_auth_total by result after e2e-15b joined: %v", adminMetrics(t, g))
	if ups := ScaleUpsFromZero(h.scalingEvents(rev), wakeStart); len(ups) == 0 {
		t.Errorf("no scale-up from zero after the request through e2e-15b: %+v", h.scalingEvents(rev))
	}
	for _, p := range []*gateway{g, b} {
		if out := p.proc.Output(); strings.Contains(out, "401 Unauthorized") || strings.Contains(out, "no admin API key") {
			t.Errorf("a replica's signed write was refused:\n%s", out)
		}
	}
}

// startSecondReplica runs a `serve` replica that will not lead (another holds
// the lock): startServe's wait for leadership does not apply. It waits for
// /healthz and its passing registration in Consul.
func (h *harness) startSecondReplica(replica string) *gateway {
	h.t.Helper()
	listen := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(h.t))
	admin := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(h.t))
	p := testbin.Start(h.t, h.bin, []string{"serve", "-listen", listen, "-admin-listen", admin, "-domain", "localhost", "-replica", replica}, h.env)
	g := &gateway{proc: p, listen: listen, admin: admin}
	client := NewClient(1)
	_, port, _ := strings.Cut(listen, ":")
	eventually(h.t, 30*time.Second, "serve "+replica+" is up and registered", func() (bool, string) {
		select {
		case <-p.Done():
			h.t.Fatalf("serve %s exited:\n%s", replica, p.Output())
		default:
		}
		status, _, err := getBody(client, g.adminURL()+"/healthz")
		if err != nil || status != http.StatusOK {
			return false, fmt.Sprintf("healthz %d %v", status, err)
		}
		entries, _, err := h.consul.Health().Service(spec.ActivatorServiceName, "", true, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, e := range entries {
			if e.Service.Meta[consulroute.MetaReplica] == replica && strconv.Itoa(e.Service.Port) == port {
				return true, ""
			}
		}
		return false, "not passing in Consul yet"
	})
	return g
}

// signedAdminRequest is a POST of body to url signed with key now, as a
// replica's client would send it.
func signedAdminRequest(t *testing.T, url string, key adminauth.Key, body []byte) *http.Request {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if err := adminauth.Sign(req, key, body, time.Now()); err != nil {
		t.Fatal(err)
	}
	return req
}

// adminPost POSTs body with header and returns the status and body.
func adminPost(t *testing.T, client *http.Client, url string, header http.Header, body []byte) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range header {
		req.Header[k] = v
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// adminMetrics reads nomad_serverless_admin_auth_total by result from a
// replica's /metrics.
func adminMetrics(t *testing.T, g *gateway) map[string]float64 {
	t.Helper()
	status, body, err := getBody(NewClient(1), g.adminURL()+"/metrics")
	if err != nil || status != http.StatusOK {
		t.Fatalf("GET /metrics: %d %v", status, err)
	}
	out := map[string]float64{}
	const prefix = `nomad_serverless_admin_auth_total{result="`
	for line := range strings.SplitSeq(body, "\n") {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		result, value, ok := strings.Cut(rest, `"} `)
		if !ok {
			continue
		}
		if v, err := strconv.ParseFloat(strings.TrimSpace(value), 64); err == nil {
			out[result] = v
		}
	}
	return out
}
