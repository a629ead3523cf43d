package controlplane

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

// A replica whose activator registration the agent dropped (reaped, or an
// agent restarted without its state) registers it again by itself, with
// its check, and asks the stand-in keeper to sweep; while Consul is down
// it keeps asking and registers once it is back.
func TestKeepActivatorRegisteredRegistersWhatTheAgentLost(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 100 * time.Millisecond})
	consul, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica("r1"), consulroute.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	self := consulroute.ActivatorRegistration{Address: "127.0.0.1", Port: 8080, AdminPort: 8081, Domain: "example.test"}
	if err := consul.RegisterActivator(ctx, self); err != nil {
		t.Fatal(err)
	}
	var again atomic.Int32
	done := make(chan struct{})
	go func() {
		keepActivatorRegistered(ctx, consul, self, 20*time.Millisecond, func() { again.Add(1) }, quietLog)
		close(done)
	}()
	defer func() { cancel(); <-done }()

	id := spec.ActivatorServiceName + "-r1"
	registered := func() bool {
		for _, s := range c.Consul.Services(spec.ActivatorServiceName) {
			if s.ID == id && s.Port == 8080 && s.Meta[consulroute.MetaDomain] == "example.test" {
				return true
			}
		}
		return false
	}
	// Left alone while it is there: no registration made again.
	time.Sleep(100 * time.Millisecond)
	if n := again.Load(); n != 0 {
		t.Fatalf("registered again %d times while the agent held the registration", n)
	}
	if !c.Consul.Deregister(id) {
		t.Fatal("the fake agent did not hold the registration")
	}
	waitFor(t, "the registration to come back", registered)
	waitFor(t, "the stand-in keeper asked to sweep", func() bool { return again.Load() == 1 })
	if checks := c.Consul.Services(spec.ActivatorServiceName); len(checks) != 1 || checks[0].Status != "passing" {
		t.Errorf("registered again without its passing check: %+v", checks)
	}

	c.Consul.Down()
	time.Sleep(100 * time.Millisecond) // a few failed looks: not "lost"
	if err := c.Consul.Up(); err != nil {
		t.Fatal(err)
	}
	if !c.Consul.Deregister(id) {
		t.Fatal("the fake agent did not hold the registration after coming back")
	}
	waitFor(t, "the registration to come back after an outage", registered)
	waitFor(t, "a second sweep asked", func() bool { return again.Load() == 2 })
}
