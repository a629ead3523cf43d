package e2e

import (
	"strings"
	"testing"
)

// TestUnitProdConfigs checks the settings that make scenario 26's agents a
// production cluster rather than dev agents.
func TestUnitProdConfigs(t *testing.T) {
	tf := TLSFiles{CA: "/d/ca.pem", Cert: "/d/c.pem", Key: "/d/k.pem"}
	srv := ProdConsulConfig{Name: "server", Addr: ProdServerAddr(), DataDir: "/d/consul", Server: true, TLS: tf, GossipKey: "KEY", ManagementToken: "MGMT", AgentToken: "AGENT"}.Render()
	node := ProdConsulConfig{Name: "node-1", Addr: ProdNodeAddr(1), DataDir: "/d/n1", JoinAddr: ProdServerAddr(), TLS: tf, GossipKey: "KEY", ManagementToken: "MGMT", AgentToken: "AGENT"}.Render()
	for _, want := range []string{`encrypt              = "KEY"`, `default_policy           = "deny"`, "verify_incoming = true", "verify_server_hostname = true", "http     = -1", `agent = "AGENT"`} {
		for name, cfg := range map[string]string{"server": srv, "node": node} {
			if !strings.Contains(cfg, want) {
				t.Errorf("Consul %s config lacks %q:\n%s", name, want, cfg)
			}
		}
	}
	if !strings.Contains(srv, `initial_management = "MGMT"`) || strings.Contains(node, "initial_management") {
		t.Errorf("only the Consul server holds the management token:\nserver:\n%s\nnode:\n%s", srv, node)
	}
	if !strings.Contains(node, `retry_join = ["127.0.26.1:8301"]`) {
		t.Errorf("Consul node does not join the server:\n%s", node)
	}

	nsrv := ProdNomadConfig{Name: "server", Addr: ProdServerAddr(), DataDir: "/d/nomad", Server: true, TLS: tf, ConsulAddr: ProdServerAddr(), ConsulTLS: tf, ConsulToken: "T"}.Render()
	ncli := ProdNomadConfig{Name: "node-1", Addr: ProdNodeAddr(1), DataDir: "/d/n1n", ServerAddr: ProdServerAddr(), TLS: tf, ConsulAddr: ProdNodeAddr(1), ConsulTLS: tf, ConsulToken: "T",
		NetworkInterface: NodeInterface(1), MinDynamicPort: 21000, MaxDynamicPort: 22999, DockerEndpoint: "unix:///var/run/docker.sock"}.Render()
	for _, want := range []string{"enabled = true", "verify_https_client    = true", "rpc                    = true", `address      = "`, "ssl          = true"} {
		for name, cfg := range map[string]string{"server": nsrv, "client": ncli} {
			if !strings.Contains(cfg, want) {
				t.Errorf("Nomad %s config lacks %q:\n%s", name, want, cfg)
			}
		}
	}
	if !strings.Contains(nsrv, "service_identity") || !strings.Contains(nsrv, "task_identity") || strings.Contains(ncli, "service_identity") {
		t.Errorf("the Nomad server, alone, signs workload identities for Consul:\nserver:\n%s\nclient:\n%s", nsrv, ncli)
	}
	for _, want := range []string{`network_interface = "ns26n1"`, "min_dynamic_port  = 21000", `endpoint = "unix:///var/run/docker.sock"`} {
		if !strings.Contains(ncli, want) {
			t.Errorf("Nomad client config lacks %q:\n%s", want, ncli)
		}
	}
	lo1, hi1 := NodeDynamicPorts(1)
	if lo2, _ := NodeDynamicPorts(2); hi1 >= lo2 || lo1 < 20000 {
		t.Errorf("nodes' dynamic ports overlap: node 1 %d-%d, node 2 from %d", lo1, hi1, lo2)
	}
	if !strings.Contains(ncli, `"fingerprint.denylist" = "env_aws,`) || !strings.Contains(ncli, `servers           = ["127.0.26.1:4647"]`) {
		t.Errorf("Nomad client config:\n%s", ncli)
	}
}
