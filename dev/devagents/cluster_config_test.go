package devagents

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

func TestClusterServerConfigs(t *testing.T) {
	p := Ports{ConsulHTTP: 18500, ConsulDNS: 18600, ConsulServer: 18300, ConsulSerfLAN: 18301, ConsulSerfWAN: 18302, ConsulGRPC: 18502,
		NomadHTTP: 14646, NomadRPC: 14647, NomadSerf: 14648}
	consul := hclAttrs(t, ClusterConsulServerConfig(p, ConfigOptions{LogLevel: "DEBUG"}))
	for k, v := range map[string]string{
		"node_name": "server", "bind_addr": "127.0.0.1", "client_addr": "127.0.0.1", "log_level": "DEBUG",
		"ports.http": "18500", "ports.serf_lan": "18301", "ports.server": "18300", "ports.grpc": "18502",
	} {
		if consul[k] != v {
			t.Errorf("consul server: %s = %q, want %q", k, consul[k], v)
		}
	}
	if _, ok := consul["acl.enabled"]; ok {
		t.Errorf("consul server: a dev cluster has no ACLs")
	}

	nomad := hclAttrs(t, ClusterNomadServerConfig(p, "/tmp/c/server/nomad-data", ConfigOptions{}))
	for k, v := range map[string]string{
		"name": "server", "data_dir": "/tmp/c/server/nomad-data", "bind_addr": "127.0.0.1", "log_level": "INFO",
		"ports.http": "14646", "ports.rpc": "14647", "ports.serf": "14648",
		"advertise.http": "127.0.0.1", "advertise.rpc": "127.0.0.1", "advertise.serf": "127.0.0.1",
		"server.enabled": "true", "server.bootstrap_expect": "1",
		"server.min_heartbeat_ttl": "2s", "server.heartbeat_grace": "2s",
		"consul.address": "127.0.0.1:18500", "consul.grpc_address": "127.0.0.1:18502",
	} {
		if nomad[k] != v {
			t.Errorf("nomad server: %s = %q, want %q", k, nomad[k], v)
		}
	}
	for _, k := range []string{"client.enabled", "plugin.raw_exec.config.enabled"} {
		if _, ok := nomad[k]; ok {
			t.Errorf("nomad server: %s is set; the server runs no allocations", k)
		}
	}
}

func TestNodeConfigs(t *testing.T) {
	n := NodeConfig{
		Name: "node-2", Addr: netip.MustParseAddr("127.0.0.3"),
		Ports:         NodePorts{ConsulHTTP: 21500, ConsulSerfLAN: 21301, ConsulGRPC: 21502, NomadHTTP: 24646, NomadRPC: 24647, NomadSerf: 24648},
		ConsulDataDir: "/tmp/c d/node-2/consul-data", NomadDataDir: "/tmp/c d/node-2/nomad-data",
		ConsulJoin: "127.0.0.1:18301", NomadServer: "127.0.0.1:14647", ServerRPCPort: 18300,
		MinDynamicPort: 24000, MaxDynamicPort: 27999,
	}
	consul := hclAttrs(t, NodeConsulConfig(n, ConfigOptions{}))
	for k, v := range map[string]string{
		"node_name": "node-2", "server": "false", "data_dir": "/tmp/c d/node-2/consul-data",
		"bind_addr": "127.0.0.3", "client_addr": "127.0.0.3", "advertise_addr": "127.0.0.3",
		"ports.http": "21500", "ports.serf_lan": "21301", "ports.grpc": "21502", "ports.server": "18300",
		"ports.dns": "-1", "ports.serf_wan": "-1",
	} {
		if consul[k] != v {
			t.Errorf("consul agent: %s = %q, want %q", k, consul[k], v)
		}
	}
	if !strings.Contains(NodeConsulConfig(n, ConfigOptions{}), `retry_join           = ["127.0.0.1:18301"]`) {
		t.Errorf("consul agent does not join the server:\n%s", NodeConsulConfig(n, ConfigOptions{}))
	}

	nomad := hclAttrs(t, NodeNomadConfig(n, ConfigOptions{LogLevel: "DEBUG"}))
	for k, v := range map[string]string{
		"name": "node-2", "data_dir": "/tmp/c d/node-2/nomad-data", "bind_addr": "127.0.0.3", "log_level": "DEBUG",
		"ports.http": "24646", "ports.rpc": "24647", "ports.serf": "24648",
		"advertise.http": "127.0.0.3", "advertise.rpc": "127.0.0.3", "advertise.serf": "127.0.0.3",
		"client.enabled": "true", "client.network_interface": "lo",
		"client.host_network." + HostNetwork + ".cidr": "127.0.0.3/32",
		"client.min_dynamic_port":                      "24000", "client.max_dynamic_port": "27999",
		"consul.address": "127.0.0.3:21500", "consul.grpc_address": "127.0.0.3:21502",
		"plugin.raw_exec.config.enabled": "true",
	} {
		if nomad[k] != v {
			t.Errorf("nomad client: %s = %q, want %q", k, nomad[k], v)
		}
	}
	if !strings.Contains(NodeNomadConfig(n, ConfigOptions{}), `servers = ["127.0.0.1:14647"]`) {
		t.Errorf("nomad client does not name the server:\n%s", NodeNomadConfig(n, ConfigOptions{}))
	}
	if _, ok := nomad["server.enabled"]; ok {
		t.Errorf("nomad client: server.enabled is set")
	}
}

// The nodes' dynamic port ranges cover Nomad's default range in order and
// never overlap.
func TestDynamicPortRange(t *testing.T) {
	for _, n := range []int{1, 2, 3, 5, 7} {
		prevHi := nomadMinDynamicPort - 1
		for i := range n {
			lo, hi := DynamicPortRange(i, n)
			if lo != prevHi+1 || hi < lo || hi > nomadMaxDynamicPort {
				t.Errorf("%d nodes: node %d gets %d-%d after %d", n, i, lo, hi, prevHi)
			}
			prevHi = hi
		}
		if n == 1 && prevHi != nomadMaxDynamicPort {
			t.Errorf("one node gets up to %d, want Nomad's whole range", prevHi)
		}
	}
}

func TestNodeAddrs(t *testing.T) {
	got, err := NodeAddrs(DefaultFirstNodeAddr(), 3)
	if err != nil || len(got) != 3 || got[0].String() != "127.0.0.2" || got[2].String() != "127.0.0.4" {
		t.Errorf("NodeAddrs(127.0.0.2, 3) = %v, %v", got, err)
	}
	if got, err := NodeAddrs(netip.MustParseAddr("127.0.20.254"), 3); err != nil || got[2].String() != "127.0.21.0" {
		t.Errorf("NodeAddrs across an octet = %v, %v", got, err)
	}
	for _, tc := range []struct {
		first string
		n     int
	}{
		{"127.0.0.1", 2},       // the server's
		{"127.0.0.0", 1},       // the network's
		{"127.255.255.254", 2}, // runs into the last
		{"10.0.0.2", 1},        // not loopback
		{"::1", 1},
		{"127.0.0.2", 0},
	} {
		if got, err := NodeAddrs(netip.MustParseAddr(tc.first), tc.n); err == nil {
			t.Errorf("NodeAddrs(%s, %d) = %v, want an error", tc.first, tc.n, got)
		}
	}
}

// The soak's cluster: Nomad's default heartbeats and a declared compute.
func TestClusterConfigsHeartbeatAndCompute(t *testing.T) {
	p := Ports{NomadHTTP: 14646, NomadRPC: 14647, NomadSerf: 14648, ConsulHTTP: 18500, ConsulGRPC: 18502}
	o := ConfigOptions{HeartbeatTTL: 10 * time.Second, HeartbeatGrace: 10 * time.Second, CPUTotalCompute: 16000}
	server := hclAttrs(t, ClusterNomadServerConfig(p, "/tmp/c/server/nomad-data", o))
	if server["server.min_heartbeat_ttl"] != "10s" || server["server.heartbeat_grace"] != "10s" {
		t.Errorf("heartbeats: %v", server)
	}
	n := NodeConfig{Name: "node-1", Addr: netip.MustParseAddr("127.0.0.2"), NomadServer: "127.0.0.1:14647"}
	if cfg := NodeNomadConfig(n, o); !strings.Contains(cfg, "cpu_total_compute = 16000") {
		t.Errorf("no cpu_total_compute:\n%s", cfg)
	}
	if cfg := NodeNomadConfig(n, ConfigOptions{}); strings.Contains(cfg, "cpu_total_compute") {
		t.Errorf("cpu_total_compute without one asked for:\n%s", cfg)
	}
}
