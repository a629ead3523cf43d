package controlplane

import (
	"context"
	"net"
	"strings"
	"testing"

	consulapi "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// clients are Nomad and Consul clients for addresses nothing answers at:
// what Run must not reach before it has said what is wrong.
func clients(t *testing.T, replica string) (*nomadjob.Client, *consulroute.Client) {
	t.Helper()
	ncfg := nomadapi.DefaultConfig()
	ncfg.Address = "http://127.0.0.1:1"
	nc, err := nomadjob.NewClient(ncfg)
	if err != nil {
		t.Fatal(err)
	}
	ccfg := consulapi.DefaultConfig()
	ccfg.Address = "127.0.0.1:1"
	cc, err := consulroute.NewClient(ccfg, consulroute.WithReplica(replica), consulroute.WithLogger(quietLog))
	if err != nil {
		t.Fatal(err)
	}
	return nc, cc
}

func TestRunChecksItsConfig(t *testing.T) {
	nc, cc := clients(t, "r1")
	for _, tc := range []struct {
		name string
		c    Config
		want string
	}{
		{"no clients", Config{Replica: "r1"}, "Config.Nomad is nil"},
		{"no Consul", Config{Replica: "r1", Nomad: nc}, "Config.Consul is nil"},
		{"no replica", Config{Nomad: nc, Consul: cc}, "Config.Replica is empty"},
		{"another replica than Consul's", Config{Replica: "r2", Nomad: nc, Consul: cc}, `the Consul client's replica is "r1"`},
		{"negative tick", Config{Replica: "r1", Nomad: nc, Consul: cc, Tick: -1}, "Config.Tick -1ns is negative"},
	} {
		err := Run(context.Background(), tc.c)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Run = %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

// A port in use is said first, before anything talks to Nomad or Consul.
func TestRunSaysAPortInUseFirst(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	nc, cc := clients(t, "r1")
	for _, tc := range []struct{ listen, admin, want string }{
		{ln.Addr().String(), "127.0.0.1:0", "listen for the gateway on " + ln.Addr().String()},
		{"127.0.0.1:0", ln.Addr().String(), "listen for the admin API on " + ln.Addr().String()},
	} {
		err := Run(context.Background(), Config{Listen: tc.listen, AdminListen: tc.admin, Replica: "r1", Nomad: nc, Consul: cc, Logger: quietLog})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Run = %v, want %q", err, tc.want)
		}
	}
}
