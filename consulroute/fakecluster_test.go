package consulroute_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// A stand-in carries the revision's own tags besides ours, once each, and
// the activator's instances are left out of what we count.
func TestStandInCarriesTheRevisionsTags(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 100 * time.Millisecond})
	cl := fakeClusterClient(t, c, "r1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gateway, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gateway.Close()
	port := gateway.Addr().(*net.TCPAddr).Port
	if err := cl.RegisterActivator(ctx, consulroute.ActivatorRegistration{Address: "127.0.0.1", Port: port, AdminPort: port}); err != nil {
		t.Fatal(err)
	}
	if err := cl.RegisterStandIn(ctx, "whoami-00001", "whoami", "127.0.0.1", port,
		spec.TagServerless, "service=whoami", "traefik.enable=true"); err != nil {
		t.Fatal(err)
	}
	want := []string{spec.TagServerless, spec.TagServicePrefix + "whoami", spec.TagActivator, "traefik.enable=true"}
	// On a catalog node of its own, not the agent's.
	if inst := c.Consul.Services("whoami-00001"); len(inst) != 1 || !slices.Equal(inst[0].Tags, want) || inst[0].Port != port ||
		inst[0].Node != cl.StandInNode("whoami-00001") {
		t.Fatalf("stand-in %+v, want tags %v on port %d, on node %s", inst, want, port, cl.StandInNode("whoami-00001"))
	}
	// Passing at once (its check is registered passing): a catalog-driven
	// proxy takes the stand-in into its table from its registration on.
	if inst := c.Consul.Services("whoami-00001"); len(inst) != 1 || inst[0].Status != "passing" {
		t.Errorf("the stand-in does not pass from its registration on: %+v", inst)
	}
	if h, err := cl.Health(ctx, "whoami-00001"); err != nil || len(h) != 0 {
		t.Errorf("Health counts the stand-in: %+v, %v", h, err)
	}
	if err := cl.DeregisterStandIn(ctx, "whoami-00001"); err != nil || len(c.Consul.Services("whoami-00001")) != 0 {
		t.Errorf("deregister: %v, left %+v", err, c.Consul.Services("whoami-00001"))
	}
}

// Each replica's stand-ins are on catalog nodes of its own: a replica
// lists every replica's nodes, finds its own stand-ins there, tells which
// replicas exist, and removes another's nodes with their stand-ins.
func TestStandInsOnCatalogNodes(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gateway, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gateway.Close()
	port := gateway.Addr().(*net.TCPAddr).Port
	clients := map[string]*consulroute.Client{}
	for _, r := range []string{"r1", "r2"} {
		cl := fakeClusterClient(t, c, r)
		clients[r] = cl
		for _, rev := range []string{"hello-00001", "other-00001"} {
			if err := cl.RegisterStandIn(ctx, rev, strings.TrimSuffix(rev, "-00001"), "127.0.0.1", port); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := clients["r1"].RegisterActivator(ctx, consulroute.ActivatorRegistration{Address: "127.0.0.1", Port: port, AdminPort: port}); err != nil {
		t.Fatal(err)
	}
	nodes, err := clients["r1"].StandInNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	byReplica := map[string]int{}
	for _, n := range nodes {
		if !strings.HasPrefix(n.Node, consulroute.StandInNodePrefix+n.Replica+"-") {
			t.Errorf("stand-in node %+v is not named after its replica", n)
		}
		byReplica[n.Replica]++
	}
	if byReplica["r1"] == 0 || byReplica["r2"] == 0 || len(byReplica) != 2 {
		t.Fatalf("StandInNodes = %+v, want nodes of r1 and r2", nodes)
	}
	if own, err := clients["r2"].OwnStandIns(ctx, nodes); err != nil || !slices.Equal(own, []string{"hello-00001", "other-00001"}) {
		t.Fatalf("r2's OwnStandIns = %v, %v", own, err)
	}
	if clients["r1"].StandInNode("hello-00001") == clients["r2"].StandInNode("hello-00001") {
		t.Error("two replicas' stand-ins of one revision share a node")
	}
	replicas, err := clients["r1"].Replicas(ctx)
	if err != nil || len(replicas) != 1 || !replicas["r1"] {
		t.Errorf("Replicas = %v, %v; want r1 only (r2 never registered its activator)", replicas, err)
	}
	// Registrations lists both, naming their replicas, and a blocking
	// query on its index answers when one goes.
	regs, index, err := clients["r1"].Registrations(ctx, "hello-00001", 0)
	if err != nil || len(regs) != 2 || regs[0].Replica != "r1" || regs[1].Replica != "r2" || regs[0].Node == "" || index == 0 {
		t.Fatalf("Registrations = %+v (index %d), %v", regs, index, err)
	}
	type answer struct {
		regs []consulroute.Registration
		err  error
	}
	blocked := make(chan answer, 1)
	go func() {
		regs, _, err := clients["r1"].Registrations(ctx, "hello-00001", index)
		blocked <- answer{regs, err}
	}()
	removed, err := clients["r1"].RemoveStandInsOf(ctx, "r2")
	if err != nil || len(removed) != byReplica["r2"] {
		t.Fatalf("RemoveStandInsOf(r2) = %v, %v; want its %d nodes", removed, err, byReplica["r2"])
	}
	if a := <-blocked; a.err != nil || len(a.regs) != 1 || a.regs[0].ID != "hello-00001-activator-r1" {
		t.Errorf("the blocking Registrations after a removal = %+v, %v", a.regs, a.err)
	}
	if err := clients["r2"].DeregisterStandIn(ctx, "hello-00001"); err != nil {
		t.Errorf("deregistering an absent stand-in: %v", err)
	}
	if err := clients["r1"].RemoveStandInNode(ctx, removed[0]); err != nil {
		t.Errorf("removing an absent node: %v", err)
	}
	for _, rev := range []string{"hello-00001", "other-00001"} {
		if inst := c.Consul.Services(rev); len(inst) != 1 || inst[0].ID != rev+"-activator-r1" {
			t.Errorf("after removing r2's stand-ins: %+v", inst)
		}
	}
	if own, err := clients["r2"].OwnStandIns(ctx, nodes); err != nil || len(own) != 0 {
		t.Errorf("r2's OwnStandIns after its nodes went = %v, %v (the listing named them; they are gone)", own, err)
	}
}

// ActivatorRegistered tells a registration the local agent holds from one
// it lost (reaped after its check stayed critical, or an agent restarted
// without its state), by ID, and says Consul is unreachable as an error,
// not as "lost".
func TestActivatorRegisteredOnTheLocalAgent(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 100 * time.Millisecond})
	cl := fakeClusterClient(t, c, "r1")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ok, err := cl.ActivatorRegistered(ctx, ""); err != nil || ok {
		t.Fatalf("before registering: ActivatorRegistered = %v, %v; want false, nil", ok, err)
	}
	if err := cl.RegisterActivator(ctx, consulroute.ActivatorRegistration{Address: "127.0.0.1", Port: 1, AdminPort: 2}); err != nil {
		t.Fatal(err)
	}
	if ok, err := cl.ActivatorRegistered(ctx, ""); err != nil || !ok {
		t.Fatalf("registered: ActivatorRegistered = %v, %v; want true, nil", ok, err)
	}
	// Another replica's registration is not this one's.
	r2 := fakeClusterClient(t, c, "r2")
	if ok, err := r2.ActivatorRegistered(ctx, ""); err != nil || ok {
		t.Errorf("r2 sees r1's registration as its own: %v, %v", ok, err)
	}
	if !c.Consul.Deregister(spec.ActivatorServiceName + "-r1") {
		t.Fatal("the fake agent did not hold r1's registration under its ID")
	}
	if ok, err := cl.ActivatorRegistered(ctx, ""); err != nil || ok {
		t.Errorf("after the agent dropped it: ActivatorRegistered = %v, %v; want false, nil", ok, err)
	}
	c.Consul.Down()
	if ok, err := cl.ActivatorRegistered(ctx, ""); err == nil || ok {
		t.Errorf("Consul down: ActivatorRegistered = %v, %v; want an error", ok, err)
	}
}

// fakeClusterClient is replica's client of the fake cluster's Consul.
func fakeClusterClient(t *testing.T, c *fakecluster.Cluster, replica string) *consulroute.Client {
	t.Helper()
	cl, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica(replica))
	if err != nil {
		t.Fatal(err)
	}
	return cl
}

// A replica that died (its activator check critical, no session) is
// removed through the agent that holds its registrations: its stand-ins
// and its activator registration go, a live replica's stay.
func TestRemoveReplicaThroughItsAgent(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer healthy.Close()
	livePort := healthy.Listener.Addr().(*net.TCPAddr).Port
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadPort := gone.Addr().(*net.TCPAddr).Port
	gone.Close() // nothing answers there: the dead replica's check fails

	live, dead := fakeClusterClient(t, c, "live"), fakeClusterClient(t, c, "dead")
	for _, r := range []struct {
		cl   *consulroute.Client
		port int
	}{{live, livePort}, {dead, deadPort}} {
		if err := r.cl.RegisterActivator(ctx, consulroute.ActivatorRegistration{Address: "127.0.0.1", Port: r.port, AdminPort: r.port}); err != nil {
			t.Fatal(err)
		}
		for _, rev := range []string{"a-00001", "b-00001"} {
			svc, _, _ := spec.ParseRevisionName(rev)
			if err := r.cl.RegisterStandIn(ctx, rev, svc, "127.0.0.1", r.port); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, _, err := live.API().Session().Create(&api.SessionEntry{Name: "nomad-serverless-autoscaler", TTL: "10s",
		ServiceChecks: []api.ServiceCheck{{ID: live.ActivatorCheckID("")}}}, nil); err != nil {
		t.Fatal(err)
	}

	var regs []consulroute.ReplicaRegistration
	testbin.Eventually(t, 10*time.Second, 20*time.Millisecond, "the dead replica's check critical", func() (bool, string) {
		regs, err = live.ReplicaRegistrations(ctx)
		return err == nil && len(regs) == 2 && regs[0].Replica == "dead" && regs[0].Critical && !regs[1].Critical, fmt.Sprintf("%+v %v", regs, err)
	})
	holders, err := live.SessionHolders(ctx)
	if err != nil || !maps.Equal(holders, map[string]bool{"live": true}) {
		t.Fatalf("session holders %v, %v; want live only", holders, err)
	}
	removed, err := live.RemoveReplica(ctx, regs[0])
	if err != nil {
		t.Fatal(err)
	}
	// Its stand-in nodes first (through the catalog), then its activator
	// registration through its agent.
	want := []string{dead.StandInNode("a-00001"), dead.StandInNode("b-00001")}
	slices.Sort(want)
	want = append(slices.Compact(want), spec.ActivatorServiceName+"-dead")
	if !slices.Equal(removed, want) {
		t.Errorf("removed %v, want %v", removed, want)
	}
	for _, rev := range []string{"a-00001", "b-00001"} {
		if inst := c.Consul.Services(rev); len(inst) != 1 || inst[0].ID != live.StandInID(rev) {
			t.Errorf("%s after removing the dead replica: %+v, want the live replica's stand-in only", rev, inst)
		}
	}
	if inst := c.Consul.Services(spec.ActivatorServiceName); len(inst) != 1 || inst[0].ID != spec.ActivatorServiceName+"-live" {
		t.Errorf("activator registrations left: %+v, want the live one only", inst)
	}
}

// AgentOf reaches another node's agent as the client reaches its own.
func TestAgentOfKeepsSchemeAndPort(t *testing.T) {
	for _, tc := range []struct{ addr, scheme, want string }{
		{"127.0.0.1:8500", "", "http://10.0.0.7:8500"},
		{"https://127.0.0.1:8501", "", "https://10.0.0.7:8501"},
		{"localhost:18500", "http", "http://10.0.0.7:18500"},
	} {
		cl, err := consulroute.NewClient(&api.Config{Address: tc.addr, Scheme: tc.scheme})
		if err != nil {
			t.Fatal(err)
		}
		other, err := cl.AgentOf("10.0.0.7")
		if err != nil {
			t.Fatalf("%s: %v", tc.addr, err)
		}
		if other.Addr() != tc.want {
			t.Errorf("AgentOf from %s: %s, want %s", tc.addr, other.Addr(), tc.want)
		}
	}
	cl, _ := consulroute.NewClient(&api.Config{Address: "unix:///run/consul.sock"})
	if _, err := cl.AgentOf("10.0.0.7"); err == nil {
		t.Error("AgentOf from a unix socket: no error")
	}
}
