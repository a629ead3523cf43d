package devagents

import (
	"cmp"
	"fmt"
	"net/netip"
	"time"
)

// HostNetwork is the name of the host network every node of a dev cluster
// declares for its own loopback address. A service whose instances should
// listen on their node's address says
//
//	network { host_network = "own" }
//
// Nomad gives a port its node's "default" network otherwise, and on a dev
// cluster that is 127.0.0.1 on every node: every client fingerprints all of
// lo's addresses as "default", 127.0.0.1 first, and no client configuration
// takes the alias from it (measured with Nomad 1.6.5; a network_interface
// without addresses leaves the node with no host network at all, and jobs
// fail with "missing network").
const HostNetwork = "own"

// The Nomad server's heartbeat settings in a dev cluster. With Nomad's
// defaults (10 s each) a node that dies is marked down, and its allocations
// lost and replaced, 15 to 20 s later (issue 14 measured it). A dev cluster
// is there to watch that happen, so it is made quicker: the server gives
// each node a TTL between the minimum and twice it and marks the node down
// when a TTL plus the grace pass without a heartbeat, 2 to 6 s after the
// node's last one. The clients are local and heartbeat over loopback, so
// a 2 s grace is far more than a heartbeat's delay even on a busy machine.
const (
	ClusterMinHeartbeatTTL = 2 * time.Second
	ClusterHeartbeatGrace  = 2 * time.Second
)

// Nomad's default range of dynamic ports (client min_dynamic_port and
// max_dynamic_port).
const (
	nomadMinDynamicPort = 20000
	nomadMaxDynamicPort = 32000
)

// NodePorts are the ports of one dev-cluster node's agents, on the node's own
// address.
type NodePorts struct {
	ConsulHTTP, ConsulSerfLAN, ConsulGRPC int
	NomadHTTP, NomadRPC, NomadSerf        int
}

func (p *NodePorts) fields() []*int {
	return []*int{&p.ConsulHTTP, &p.ConsulSerfLAN, &p.ConsulGRPC, &p.NomadHTTP, &p.NomadRPC, &p.NomadSerf}
}

// NodeConfig is what one node's configuration files say.
type NodeConfig struct {
	// Name is the node's name in Nomad and in Consul ("node-1").
	Name string
	// Addr is the node's own loopback address: its agents bind it and its
	// host network HostNetwork is it alone.
	Addr  netip.Addr
	Ports NodePorts
	// ConsulDataDir and NomadDataDir are the agents' data directories.
	ConsulDataDir, NomadDataDir string
	// ConsulJoin is the Consul server's serf LAN address (host:port) and
	// NomadServer the Nomad server's RPC address (host:port).
	ConsulJoin, NomadServer string
	// ServerRPCPort is the Consul server's RPC port. A client agent does
	// not listen on it, but Consul refuses to start without one.
	ServerRPCPort int
	// MinDynamicPort and MaxDynamicPort bound the ports Nomad gives this
	// node's allocations (DynamicPortRange).
	MinDynamicPort, MaxDynamicPort int
}

// DynamicPortRange is node i's (0-based) share of Nomad's dynamic ports when
// n nodes share one machine. The nodes' ranges do not overlap: a sidecar
// listens on its port on every address (":port"), and so does any app that
// does not bind NOMAD_IP_<port>, so two nodes giving the same number to two
// allocations would have the second fail to bind, although Nomad sees two
// different addresses.
func DynamicPortRange(i, n int) (lo, hi int) {
	width := (nomadMaxDynamicPort - nomadMinDynamicPort + 1) / n
	lo = nomadMinDynamicPort + i*width
	return lo, lo + width - 1
}

// ClusterConsulServerConfig renders the Consul server of a dev cluster: the
// single dev agent's configuration (ConsulConfig: loopback, every port from
// p) with a node name, which the nodes' Consul agents join.
func ClusterConsulServerConfig(p Ports, o ConfigOptions) string {
	return ConsulConfig(p, ConfigOptions{LogLevel: o.LogLevel}) + `
# The server of a dev cluster (devagents.StartCluster): each node's Consul
# agent joins it.
node_name = "server"
`
}

// ClusterNomadServerConfig renders the Nomad server of a dev cluster: server
// only (the nodes are client agents of their own), on 127.0.0.1 with every
// port from p, data in dataDir, registered in the Consul server, with the
// short heartbeats of ClusterMinHeartbeatTTL and ClusterHeartbeatGrace.
func ClusterNomadServerConfig(p Ports, dataDir string, o ConfigOptions) string {
	return fmt.Sprintf(`# Written by nomad-serverless: the Nomad server of a dev cluster on loopback;
# the nodes are Nomad client agents of their own.
name                 = "server"
data_dir             = %q
bind_addr            = "127.0.0.1"
log_level            = %q
disable_update_check = true

ports {
  http = %d
  rpc  = %d
  serf = %d
}

advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}

server {
  enabled          = true
  bootstrap_expect = 1
  # By default a dead node is marked down 2 to 6 s after its last
  # heartbeat, not 15 to 20 s (devagents.ClusterHeartbeatGrace says why).
  min_heartbeat_ttl = %q
  heartbeat_grace   = %q
}

consul {
  address      = "127.0.0.1:%d"
  grpc_address = "127.0.0.1:%d"
}
`, dataDir, o.logLevel(), p.NomadHTTP, p.NomadRPC, p.NomadSerf,
		cmp.Or(o.HeartbeatTTL, ClusterMinHeartbeatTTL).String(), cmp.Or(o.HeartbeatGrace, ClusterHeartbeatGrace).String(), p.ConsulHTTP, p.ConsulGRPC)
}

// NodeConsulConfig renders a node's Consul client agent: bound to the node's
// address only, joining the server. Every Nomad client needs a Consul agent
// of its own: a Nomad client syncs its services with its agent every 30 s
// and removes what it did not register, so clients sharing one agent remove
// each other's instances.
func NodeConsulConfig(n NodeConfig, o ConfigOptions) string {
	a := n.Addr.String()
	return fmt.Sprintf(`# Written by nomad-serverless: the Consul agent of dev-cluster node %[1]s.
node_name            = %[1]q
server               = false
data_dir             = %[2]q
bind_addr            = %[3]q
client_addr          = %[3]q
advertise_addr       = %[3]q
retry_join           = [%[4]q]
log_level            = %[5]q
leave_on_terminate   = true
disable_update_check = true

ports {
  http     = %[6]d
  serf_lan = %[7]d
  grpc     = %[8]d
  server   = %[9]d
  dns      = -1
  serf_wan = -1
  grpc_tls = -1
}
`, n.Name, n.ConsulDataDir, a, n.ConsulJoin, o.logLevel(),
		n.Ports.ConsulHTTP, n.Ports.ConsulSerfLAN, n.Ports.ConsulGRPC, n.ServerRPCPort)
}

// NodeNomadConfig renders a node's Nomad client agent: bound to the node's
// address, registering in the node's own Consul agent, raw_exec enabled,
// the host network HostNetwork holding the node's address alone, and the
// node's share of dynamic ports.
func NodeNomadConfig(n NodeConfig, o ConfigOptions) string {
	a := n.Addr.String()
	return fmt.Sprintf(`# Written by nomad-serverless: the Nomad client of dev-cluster node %[1]s.
name                 = %[1]q
data_dir             = %[2]q
bind_addr            = %[3]q
log_level            = %[4]q
disable_update_check = true

ports {
  http = %[5]d
  rpc  = %[6]d
  serf = %[7]d
}

advertise {
  http = %[3]q
  rpc  = %[3]q
  serf = %[3]q
}

client {
  enabled = true
  servers = [%[8]q]

  # Every node fingerprints all of lo's addresses; ports that name the
  # host network %[9]q get this node's own (devagents.HostNetwork).
  network_interface = "lo"
  host_network %[9]q {
    cidr = "%[3]s/32"
  }

  # Nodes share one machine's ports (devagents.DynamicPortRange).
  min_dynamic_port = %[10]d
  max_dynamic_port = %[11]d

%[14]s
}

consul {
  address      = "%[3]s:%[12]d"
  grpc_address = "%[3]s:%[13]d"
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}
`, n.Name, n.NomadDataDir, a, o.logLevel(), n.Ports.NomadHTTP, n.Ports.NomadRPC, n.Ports.NomadSerf,
		n.NomadServer, HostNetwork, n.MinDynamicPort, n.MaxDynamicPort, n.Ports.ConsulHTTP, n.Ports.ConsulGRPC, CloudFingerprintsOff+cpuTotalCompute(o))
}

// cpuTotalCompute is the client block's cpu_total_compute line when o sets
// one ("" otherwise).
func cpuTotalCompute(o ConfigOptions) string {
	if o.CPUTotalCompute <= 0 {
		return ""
	}
	return fmt.Sprintf("\n  cpu_total_compute = %d", o.CPUTotalCompute)
}
