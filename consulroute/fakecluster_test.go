package consulroute_test

import (
	"context"
	"net"
	"slices"
	"testing"
	"time"

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
