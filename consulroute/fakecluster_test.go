package consulroute_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/internal/fakecluster"
	"github.com/nomad-serverless/nomad-serverless/internal/testbin"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A stand-in carries the revision's own tags besides ours, once each, and
// the activator's instances are left out of what we count.
func TestStandInCarriesTheRevisionsTags(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{CheckInterval: 100 * time.Millisecond})
	cl, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica("r1"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gateway, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer gateway.Close()
	port := gateway.Addr().(*net.TCPAddr).Port
	if err := cl.RegisterStandIn(ctx, "whoami-00001", "whoami", "127.0.0.1", port,
		spec.TagServerless, "service=whoami", "traefik.enable=true"); err != nil {
		t.Fatal(err)
	}
	want := []string{spec.TagServerless, spec.TagServicePrefix + "whoami", spec.TagActivator, "traefik.enable=true"}
	if inst := c.Consul.Services("whoami-00001"); len(inst) != 1 || !slices.Equal(inst[0].Tags, want) || inst[0].Port != port {
		t.Fatalf("stand-in %+v, want tags %v on port %d", inst, want, port)
	}
	testbin.Eventually(t, 5*time.Second, 50*time.Millisecond, "the stand-in's check on the gateway passes", func() (bool, string) {
		inst := c.Consul.Services("whoami-00001")
		return len(inst) == 1 && inst[0].Status == "passing", fmt.Sprintf("%+v", inst)
	})
	if h, err := cl.Health(ctx, "whoami-00001"); err != nil || len(h) != 0 {
		t.Errorf("Health counts the stand-in: %+v, %v", h, err)
	}
	if err := cl.DeregisterStandIn(ctx, "whoami-00001"); err != nil || len(c.Consul.Services("whoami-00001")) != 0 {
		t.Errorf("deregister: %v, left %+v", err, c.Consul.Services("whoami-00001"))
	}
}
