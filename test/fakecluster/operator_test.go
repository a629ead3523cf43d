package fakecluster_test

import (
	"context"
	"slices"
	"testing"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// The endpoints an operator's tools (and the e2e suite) use besides ours:
// `nomad alloc stop`, the allocation list, the Consul catalog, a service's
// checks and KV key listing, through the official API clients.

func officialClients(t *testing.T, c *fakecluster.Cluster) (*nomadapi.Client, *consulapi.Client) {
	t.Helper()
	nc, err := nomadapi.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	cc, err := consulapi.NewClient(c.Consul.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	return nc, cc
}

// nomad alloc stop stops that allocation and, since the job still wants its
// count, Nomad places a replacement.
func TestAllocStopReplacesTheAllocation(t *testing.T) {
	opts, _ := fastOptions(t)
	c := fakecluster.Start(t, opts)
	nc, _ := clients(t, c)
	official, _ := officialClients(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := nc.Register(ctx, shellRevision(t, "stopme", 1, "exec sleep 60", "exec sleep 60"), 0); err != nil {
		t.Fatal(err)
	}
	var first *nomadapi.AllocationListStub
	eventually(t, 10*time.Second, "one running allocation", func() (bool, string) {
		stubs, _, err := official.Allocations().List(&nomadapi.QueryOptions{Prefix: ""})
		if err != nil || len(stubs) != 1 || stubs[0].ClientStatus != "running" {
			return false, "list error or not running yet"
		}
		first = stubs[0]
		return true, ""
	})
	if first.JobID != "stopme-00001" {
		t.Fatalf("allocation list: job %q, want stopme-00001", first.JobID)
	}
	if stubs, _, err := official.Allocations().List(&nomadapi.QueryOptions{Prefix: first.ID[:8]}); err != nil || len(stubs) != 1 {
		t.Fatalf("list by the ID's prefix: %d allocations, %v; want 1", len(stubs), err)
	}
	if stubs, _, err := official.Allocations().List(&nomadapi.QueryOptions{Prefix: "ffffffff-nope"}); err != nil || len(stubs) != 0 {
		t.Fatalf("list by an unknown prefix: %d allocations, %v; want 0", len(stubs), err)
	}

	full, _, err := official.Allocations().Info(first.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := official.Allocations().Stop(full, nil)
	if err != nil {
		t.Fatalf("alloc stop: %v", err)
	}
	if resp.EvalID == "" || resp.LastIndex == 0 {
		t.Errorf("alloc stop answered eval %q index %d, want both set", resp.EvalID, resp.LastIndex)
	}
	eventually(t, 15*time.Second, "the stopped allocation is complete and a replacement runs", func() (bool, string) {
		stubs, _, err := official.Allocations().List(nil)
		if err != nil {
			return false, err.Error()
		}
		var stopped, replacement bool
		for _, s := range stubs {
			switch {
			case s.ID == first.ID:
				stopped = s.DesiredStatus == "stop" && s.ClientStatus == "complete"
			case s.ClientStatus == "running" && s.DesiredStatus == "run":
				replacement = true
			}
		}
		return stopped && replacement, ""
	})
	if _, err := official.Allocations().Stop(&nomadapi.Allocation{ID: "00000000-0000-0000-0000-000000000000"}, nil); err == nil {
		t.Error("stopping an unknown allocation succeeded")
	}
}

// The catalog lists every registered instance, passing or not, with its
// address; health/checks lists each instance's checks.
func TestCatalogServiceAndHealthChecks(t *testing.T) {
	opts, _ := fastOptions(t)
	c := fakecluster.Start(t, opts)
	_, cc := officialClients(t, c)
	for _, reg := range []*consulapi.AgentServiceRegistration{
		{ID: "web-1", Name: "web", Tags: []string{"a", "b"}, Address: "127.0.0.1", Port: 1111,
			Check: &consulapi.AgentServiceCheck{CheckID: "web-1-ttl", TTL: "30s", Status: consulapi.HealthPassing}},
		{ID: "web-2", Name: "web", Tags: []string{"a"}, Address: "127.0.0.1", Port: 2222,
			Check: &consulapi.AgentServiceCheck{CheckID: "web-2-ttl", TTL: "30s", Status: consulapi.HealthCritical}},
		{ID: "other-1", Name: "other", Port: 3333},
	} {
		if err := cc.Agent().ServiceRegister(reg); err != nil {
			t.Fatalf("register %s: %v", reg.ID, err)
		}
	}
	all, meta, err := cc.Catalog().Service("web", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	if meta.LastIndex == 0 {
		t.Error("catalog answered without an index")
	}
	var ids []string
	for _, s := range all {
		ids = append(ids, s.ServiceID)
		if s.ServiceName != "web" || s.Node == "" || s.ServiceAddress != "127.0.0.1" {
			t.Errorf("catalog entry %+v", s)
		}
	}
	if !slices.Equal(ids, []string{"web-1", "web-2"}) {
		t.Errorf("catalog lists %v, want both instances, critical one included", ids)
	}
	if tagged, _, err := cc.Catalog().Service("web", "b", nil); err != nil || len(tagged) != 1 || tagged[0].ServicePort != 1111 {
		t.Errorf("catalog by tag b: %+v, %v; want web-1 alone", tagged, err)
	}
	if none, _, err := cc.Catalog().Service("nothing", "", nil); err != nil || len(none) != 0 {
		t.Errorf("catalog of an unknown service: %+v, %v; want empty", none, err)
	}

	checks, _, err := cc.Health().Checks("web", nil)
	if err != nil {
		t.Fatal(err)
	}
	status := map[string]string{}
	for _, chk := range checks {
		status[chk.CheckID] = chk.Status
	}
	if len(status) != 2 || status["web-1-ttl"] != consulapi.HealthPassing || status["web-2-ttl"] != consulapi.HealthCritical {
		t.Errorf("health checks of web: %v", status)
	}
}

// KV ?keys lists keys under a prefix, folded at the separator.
func TestKVKeys(t *testing.T) {
	opts, _ := fastOptions(t)
	c := fakecluster.Start(t, opts)
	_, cc := officialClients(t, c)
	for _, k := range []string{"app/a", "app/b/c", "app/b/d", "apples", "zzz"} {
		if _, err := cc.KV().Put(&consulapi.KVPair{Key: k, Value: []byte("v")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		prefix, sep string
		want        []string
	}{
		{"app/", "", []string{"app/a", "app/b/c", "app/b/d"}},
		{"app/", "/", []string{"app/a", "app/b/"}},
		{"app", "/", []string{"app/", "apples"}},
		{"nothing/", "", nil},
	} {
		got, _, err := cc.KV().Keys(tt.prefix, tt.sep, nil)
		if err != nil {
			t.Errorf("keys %q sep %q: %v", tt.prefix, tt.sep, err)
			continue
		}
		if !slices.Equal(got, tt.want) {
			t.Errorf("keys %q sep %q = %v, want %v", tt.prefix, tt.sep, got, tt.want)
		}
	}
}
