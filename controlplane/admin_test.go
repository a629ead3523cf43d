package controlplane

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/adminauth"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// adminReplica is the part of one serve replica that the admin API involves:
// its catalog fed from Nomad, its autoscaler, its gateway, its keyring and
// its admin API on a test server.
type adminReplica struct {
	cat   *catalog.Catalog
	auto  *autoscaler.Autoscaler
	keys  *adminKeys
	admin *httptest.Server
	sink  *autoscaler.RemoteSink
}

func startAdminReplica(t *testing.T, ctx context.Context, c *fakecluster.Cluster, name string, leader func() (string, bool)) *adminReplica {
	t.Helper()
	nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	nc.SetLogger(quietLog)
	consul, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica(name), consulroute.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	r := &adminReplica{cat: catalog.New()}
	if r.keys, err = newAdminKeys(ctx, consul, quietLog, prometheus.NewRegistry()); err != nil {
		t.Fatal(err)
	}
	if r.auto, err = autoscaler.New(autoscaler.Config{Revisions: r.cat, Scaler: nc, Tick: 100 * time.Millisecond, Logger: quietLog}); err != nil {
		t.Fatal(err)
	}
	if r.sink, err = autoscaler.NewRemoteSink(autoscaler.RemoteSinkConfig{Leader: leader, Local: r.auto, Client: r.keys.client, Logger: quietLog}); err != nil {
		t.Fatal(err)
	}
	gw, err := activator.New(activator.Config{Catalog: r.cat, Autoscaler: r.sink, Domain: "localhost", Replica: name, Logger: quietLog})
	if err != nil {
		t.Fatal(err)
	}
	h, err := adminHandler(gw, r.auto, r.keys.verifier, nil)
	if err != nil {
		t.Fatal(err)
	}
	r.admin = httptest.NewServer(h)
	t.Cleanup(r.admin.Close)
	go func() { _ = feedNomad(ctx, nc, r.cat, newRevisionTags(), nil, nil, nil, quietLog) }()
	go func() { _ = r.keys.follow(ctx, consul) }()
	return r
}

func groupCountOf(t *testing.T, ctx context.Context, nc *nomadjob.Client, rev string) int {
	t.Helper()
	j, err := nc.Job(ctx, rev)
	if err != nil {
		t.Fatal(err)
	}
	return *j.TaskGroups[0].Count
}

// Two replicas over the fake cluster: the leader's admin API refuses
// unsigned and foreign-signed writes and Nomad's count stays at zero; the
// other replica's wake, forwarded and signed with the keyring both read
// from Consul, raises it.
func TestAdminWritesBetweenReplicasAreSigned(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1, RescheduleDelay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	nc, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	nc.SetLogger(quietLog)
	const rev = "hello-00001"
	if _, err := nc.Register(ctx, sleepingRevision(t, "hello", 1, 0), 0); err != nil {
		t.Fatal(err)
	}

	var leaderURL atomic.Pointer[string]
	leaderAt := func() (string, bool) {
		if p := leaderURL.Load(); p != nil {
			return *p, true
		}
		return "", false
	}
	a := startAdminReplica(t, ctx, c, "a", leaderAt)
	b := startAdminReplica(t, ctx, c, "b", leaderAt)
	leaderURL.Store(&a.admin.URL)
	if ka, kb := a.keys.ring.Keyring().Signing(time.Now()).ID, b.keys.ring.Keyring().Signing(time.Now()).ID; ka != kb {
		t.Fatalf("the replicas read different keys from Consul: %s and %s", ka, kb)
	}
	leadCtx, stopLeading := context.WithCancel(ctx)
	leadDone := make(chan struct{})
	go func() { defer close(leadDone); _ = a.auto.Run(leadCtx) }()
	defer func() { stopLeading(); <-leadDone }()
	waitCatalog(t, a.cat, rev+" in the leader's catalog", func() bool {
		_, ok := a.cat.Revision(rev)
		return ok && a.auto.Leading()
	})

	// Anyone on the network: refused, and nothing moves.
	wake := `{"replica":"intruder","demand":{"revision":"` + rev + `","queued":100}}`
	demand := `{"replica":"intruder","demand":[{"revision":"` + rev + `","queued":100}]}`
	for path, body := range map[string]string{autoscaler.PathWake: wake, autoscaler.PathDemand: demand} {
		resp, err := http.Post(a.admin.URL+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("unsigned POST %s: %d, want 401", path, resp.StatusCode)
		}
	}
	// A replica of another cluster (another Consul, another key): refused.
	k, _ := adminauth.NewKey(time.Now(), time.Time{})
	kr, _ := adminauth.NewKeyring([]adminauth.Key{k})
	foreignRing := &adminauth.Ring{}
	foreignRing.Set(kr)
	tr, _ := adminauth.NewTransport(adminauth.TransportConfig{Keys: foreignRing})
	foreign, err := autoscaler.NewRemoteSink(autoscaler.RemoteSinkConfig{Leader: leaderAt, Client: &http.Client{Transport: tr}})
	if err != nil {
		t.Fatal(err)
	}
	if err := foreign.Wake(ctx, "foreign", autoscaler.Demand{Revision: rev, Queued: 100}); err == nil || !strings.Contains(err.Error(), "401") {
		t.Fatalf("wake signed with a foreign key: %v, want 401", err)
	}
	time.Sleep(time.Second) // ten of the leader's ticks
	if n := groupCountOf(t, ctx, nc, rev); n != 0 {
		t.Fatalf("refused writes changed Nomad's count to %d", n)
	}
	// The reads `status` uses need no signature.
	resp, err := http.Get(a.admin.URL + autoscaler.PathRevisions + "?service=hello")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("unsigned GET %s: %d", autoscaler.PathRevisions, resp.StatusCode)
	}

	// Replica b forwards a wake to the leader, signed: it wakes.
	if err := b.sink.Wake(ctx, "b", autoscaler.Demand{Revision: rev, Queued: 1}); err != nil {
		t.Fatalf("forwarded wake: %v", err)
	}
	waitCatalog(t, a.cat, "the forwarded wake raises "+rev+" from zero", func() bool {
		return groupCountOf(t, ctx, nc, rev) >= 1
	})
	if err := b.sink.ReportDemand(ctx, "b", []autoscaler.Demand{{Revision: rev, Queued: 1}}); err != nil {
		t.Fatalf("forwarded demand report: %v", err)
	}

	// Without a keyring (a replica that has not read it yet) the signer
	// sends nothing.
	noKey, _ := adminauth.NewTransport(adminauth.TransportConfig{Keys: &adminauth.Ring{}})
	unkeyed, _ := autoscaler.NewRemoteSink(autoscaler.RemoteSinkConfig{Leader: leaderAt, Client: &http.Client{Transport: noKey}})
	if err := unkeyed.Wake(ctx, "c", autoscaler.Demand{Revision: rev, Queued: 1}); !errors.Is(err, adminauth.ErrNoKey) {
		t.Fatalf("wake without a keyring: %v, want ErrNoKey", err)
	}
}

// The admin API serves the heap and goroutine profiles (what the soak
// compares to find a leak), and no CPU profile, which would hold a core
// for as long as its caller asks.
func TestAdminServesHeapProfilesOnly(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1, RescheduleDelay: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := startAdminReplica(t, ctx, c, "a", func() (string, bool) { return "", false })
	for path, want := range map[string]int{
		PprofPath + "heap?debug=1":      http.StatusOK,
		PprofPath + "goroutine?debug=1": http.StatusOK,
		PprofPath + "allocs?debug=1":    http.StatusOK,
		PprofPath + "profile":           http.StatusNotFound,
		PprofPath + "trace":             http.StatusNotFound,
	} {
		resp, err := http.Get(r.admin.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("GET %s: %s, want %d", path, resp.Status, want)
		}
		if want == http.StatusOK && strings.HasPrefix(path, PprofPath+"heap") && !strings.Contains(string(body), "heap profile") {
			t.Errorf("GET %s: not a heap profile: %.100s", path, body)
		}
	}
}
