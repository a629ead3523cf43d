package certs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// replica is one control-plane replica's Manager in a test.
type replica struct {
	m   *Manager
	reg *prometheus.Registry
}

func startReplica(t *testing.T, c *fakecluster.Cluster, name string, iss *countingIssuer, check time.Duration) replica {
	t.Helper()
	reg := prometheus.NewRegistry()
	m, err := New(Config{
		Consul:     fakeConsul(t, c, name),
		Replica:    name,
		ACME:       &ACME{Directory: "https://127.0.0.1:1/directory", Email: "ops@example.com", RenewCheckInterval: check},
		Registerer: reg,
		Logger:     testLogger(t, name),
		issuer:     iss,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = m.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return replica{m: m, reg: reg}
}

// testLogger writes to the test's log when -v and TLSTEST_LOG is set.
func testLogger(t *testing.T, name string) *slog.Logger {
	if os.Getenv("TLSTEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("replica", name)
}

func (r replica) serial(t *testing.T, name string) string {
	t.Helper()
	c, err := r.m.GetCertificate(hello(name))
	if err != nil || c == nil {
		return ""
	}
	return leafOf(t, c).SerialNumber.String()
}

func (r replica) orders(kind, result string) float64 {
	return testutil.ToFloat64(r.m.metrics.orders.WithLabelValues(kind, result))
}

// Three replicas manage the same names through one Consul: each name is
// ordered once for the cluster, and every replica serves that one
// certificate, the others without ordering. A name that is not public is
// not ordered, and says so.
func TestOneOrderPerNameForTheCluster(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{})
	iss := &countingIssuer{t: t, ca: newTestCA(t, "Test ACME CA"), validity: 90 * 24 * time.Hour}
	names := []Name{
		{Host: "a.example.com", Service: "a", Namespace: "default"},
		{Host: "b.example.com", Service: "b", Namespace: "default"},
		{Host: "a.default.localhost", Service: "a", Namespace: "default"},
	}
	var rs []replica
	for _, n := range []string{"r1", "r2", "r3"} {
		r := startReplica(t, c, n, iss, time.Hour)
		r.m.SetNames(names)
		rs = append(rs, r)
	}
	for _, host := range []string{"a.example.com", "b.example.com"} {
		eventually(t, 20*time.Second, "every replica serves "+host, func() bool {
			for _, r := range rs {
				if r.serial(t, host) == "" {
					return false
				}
			}
			return true
		})
		if n := iss.ordersOf(host); n != 1 {
			t.Errorf("%s ordered %d times, want once for the cluster", host, n)
		}
		for _, r := range rs[1:] {
			if r.serial(t, host) != rs[0].serial(t, host) {
				t.Errorf("%s: replicas serve different certificates", host)
			}
		}
	}
	total := 0.0
	for _, r := range rs {
		total += r.orders("obtain", "ok")
	}
	if total != 2 {
		t.Errorf("replicas counted %v orders in all, want 2 (one per name)", total)
	}
	if n := iss.ordersOf("a.default.localhost"); n != 0 {
		t.Errorf("a.default.localhost was ordered %d times", n)
	}
	st := rs[1].m.Status()
	byName := map[string]NameStatus{}
	for _, s := range st {
		byName[s.Name] = s
	}
	if s := byName["a.example.com"]; s.State != "valid" || s.Source != SourceACME || s.Issuer != "Test ACME CA" || s.Service != "a" || s.RenewBy.IsZero() || s.LastError != "" {
		t.Errorf("status of a.example.com: %+v", s)
	}
	if s := byName["a.default.localhost"]; s.State != "none" || !strings.Contains(s.Note, "not a public DNS name") {
		t.Errorf("status of a.default.localhost: %+v", s)
	}
	// In KV: the account's storage and certificates under the store
	// prefix, nothing left locked.
	if keys := c.Consul.KVKeys(consulroute.TLSStorePrefix + "certificates/"); len(keys) != 6 {
		t.Errorf("stored certificate keys: %v (want crt, key and json for two names)", keys)
	}
	if keys := c.Consul.KVKeys(consulroute.TLSKVPrefix + "locks/"); len(keys) != 0 {
		t.Errorf("locks left: %v", keys)
	}
	// A name that leaves the routes is no longer served from ACME.
	for _, r := range rs {
		r.m.SetNames(names[1:])
	}
	if rs[0].serial(t, "a.example.com") != "" {
		t.Error("a.example.com still served after it left the routes")
	}
}

// A certificate is renewed before it expires, ordered once however many
// replicas hold it; when the CA fails, the valid certificate goes on being
// served, and the failure shows in Status and in the metrics.
func TestRenewalAndAFailingCA(t *testing.T) {
	if testing.Short() {
		t.Skip("waits for certificates of a few seconds to come due")
	}
	c := fakecluster.Start(t, fakecluster.Options{})
	// 6 s certificates checked every 200 ms: due a third before expiry.
	iss := &countingIssuer{t: t, ca: newTestCA(t, "Test ACME CA"), validity: 6 * time.Second}
	r1 := startReplica(t, c, "r1", iss, 200*time.Millisecond)
	r2 := startReplica(t, c, "r2", iss, 200*time.Millisecond)
	// A name of its own: certmagic's job queue is the process's, and a
	// renewal failing here is retried there after the test (or a -count
	// repetition) ends.
	host := fmt.Sprintf("renew-%d.example.com", time.Now().UnixNano())
	names := []Name{{Host: host, Service: "a", Namespace: "default"}}
	r1.m.SetNames(names)
	r2.m.SetNames(names)
	eventually(t, 20*time.Second, "both replicas serve the name", func() bool {
		return r1.serial(t, host) != "" && r2.serial(t, host) != ""
	})
	first := r1.serial(t, host)
	// A renewed certificate is served. (That the other replica picks it up
	// from storage is the e2e scenario's to show, with processes: in one
	// process certmagic runs one renewal job per name at a time, whatever
	// the replica.)
	eventually(t, 30*time.Second, "a renewed certificate is served", func() bool {
		for _, r := range []replica{r1, r2} {
			if s := r.serial(t, host); s != "" && s != first {
				return true
			}
		}
		return false
	})
	if renewals := r1.orders("renew", "ok") + r2.orders("renew", "ok"); renewals < 1 {
		t.Errorf("no renewal counted")
	}
	// One order for each certificate: the first, then one per renewal,
	// never one per replica.
	if o, r := iss.ordersOf(host), 1+r1.orders("renew", "ok")+r2.orders("renew", "ok"); float64(o) != r {
		t.Errorf("the CA saw %d orders; the replicas counted %v", o, r)
	}

	iss.fail.Store(true)
	served := r1.serial(t, host)
	eventually(t, 20*time.Second, "a failed renewal in status", func() bool {
		for _, r := range []replica{r1, r2} {
			for _, s := range r.m.Status() {
				if s.Name == host && strings.Contains(s.LastError, "test CA is down") {
					return true
				}
			}
		}
		return false
	})
	if r1.orders("renew", "error")+r2.orders("renew", "error") < 1 {
		t.Error("the failed renewal is not counted")
	}
	if got := r1.serial(t, host); got != served && got != "" {
		t.Logf("served certificate changed from %s to %s (renewed by the other replica before the CA failed)", served, got)
	}
	if !r1.m.HasCertificate(host) && !r2.m.HasCertificate(host) {
		t.Error("the name lost its certificate while it was still valid")
	}
	n, err := testutil.GatherAndCount(r1.reg, "nomad_serverless_tls_names", "nomad_serverless_tls_acme_orders_total")
	if err != nil || n == 0 {
		t.Errorf("metrics: %d, %v", n, err)
	}
}
