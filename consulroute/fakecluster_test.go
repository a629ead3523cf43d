package consulroute_test

import (
	"context"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
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
	// Passing at once, before any probe: its alias check mirrors the
	// activator registration, itself passing from its registration on.
	if inst := c.Consul.Services("whoami-00001"); len(inst) != 1 || !slices.Equal(inst[0].Tags, want) || inst[0].Port != port {
		t.Fatalf("stand-in %+v, want tags %v on port %d", inst, want, port)
	}
	// Passing at once, before the first probe: a catalog-driven proxy
	// takes the stand-in into its table from its registration on.
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

// A replica finds the stand-ins its agent holds, whoever registered them,
// tells which replicas exist, and removes another's by ID.
func TestStandInsOnTheLocalAgent(t *testing.T) {
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
		if err := cl.RegisterStandIn(ctx, "hello-00001", "hello", "127.0.0.1", port); err != nil {
			t.Fatal(err)
		}
	}
	if err := clients["r1"].RegisterActivator(ctx, consulroute.ActivatorRegistration{Address: "127.0.0.1", Port: port, AdminPort: port}); err != nil {
		t.Fatal(err)
	}
	local, err := clients["r1"].LocalStandIns(ctx)
	want := []consulroute.StandIn{
		{ID: "hello-00001-activator-r1", Revision: "hello-00001", Replica: "r1"},
		{ID: "hello-00001-activator-r2", Revision: "hello-00001", Replica: "r2"},
	}
	if err != nil || !slices.Equal(local, want) {
		t.Fatalf("LocalStandIns = %+v, %v; want %+v", local, err, want)
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
	if err := clients["r1"].RemoveStandIn(ctx, "hello-00001-activator-r2"); err != nil {
		t.Fatal(err)
	}
	if a := <-blocked; a.err != nil || len(a.regs) != 1 || a.regs[0].ID != "hello-00001-activator-r1" {
		t.Errorf("the blocking Registrations after a removal = %+v, %v", a.regs, a.err)
	}
	if err := clients["r1"].RemoveStandIn(ctx, "hello-00001-activator-r2"); err != nil {
		t.Errorf("removing an absent stand-in: %v", err)
	}
	if inst := c.Consul.Services("hello-00001"); len(inst) != 1 || inst[0].ID != "hello-00001-activator-r1" {
		t.Errorf("after removing r2's stand-in: %+v", inst)
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
	want := []string{dead.StandInID("a-00001"), dead.StandInID("b-00001"), spec.ActivatorServiceName + "-dead"}
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
