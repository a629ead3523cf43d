package e2e

import (
	"fmt"
	"strings"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

// Scenario 26's agents are configured the way a production cluster is, not
// as dev agents: ACLs with default deny, mutual TLS on HTTP and RPC with
// hostname verification, Consul gossip encryption, and Nomad's workload
// identities for Consul. Each agent has its own loopback address and the
// agents' standard ports (one address per agent, so no port is shared):
// the Consul server and the Nomad server on ProdServerAddr, node i's Consul
// and Nomad clients on ProdNodeAddr(i).

// The standard ports every agent of the scenario uses on its own address.
const (
	ConsulHTTPSPort   = 8501
	ConsulGRPCTLSPort = 8503
	ConsulServerPort  = 8300
	ConsulSerfLANPort = 8301
	NomadHTTPPort     = 4646
	NomadRPCPort      = 4647
	NomadSerfPort     = 4648
)

// ProdServerAddr is the servers' address: not dev's 127.0.0.x nor
// scenario 20's 127.0.20.x, so they run beside each other.
func ProdServerAddr() string { return "127.0.26.1" }

// ProdNodeAddr is node i's address (i from 1).
func ProdNodeAddr(i int) string { return fmt.Sprintf("127.0.26.%d", 1+i) }

// ProdConsulConfig is what a Consul agent of the scenario needs.
type ProdConsulConfig struct {
	Name, Addr, DataDir string
	// Server is true for the one server; the others join JoinAddr.
	Server   bool
	JoinAddr string
	TLS      TLSFiles
	// GossipKey is the cluster's encrypt key (GossipKey).
	GossipKey string
	// ManagementToken is the server's initial management token;
	// AgentToken is every agent's own token (node identity policy).
	ManagementToken, AgentToken string
	LogLevel                    string
}

// Render is the agent's HCL configuration.
func (c ProdConsulConfig) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by the e2e suite (scenario 26): a production-style Consul agent.
node_name            = %q
datacenter           = "dc1"
data_dir             = %q
bind_addr            = %q
client_addr          = %q
advertise_addr       = %q
log_level            = %q
disable_update_check = true
encrypt              = %q
`, c.Name, c.DataDir, c.Addr, c.Addr, c.Addr, logLevelOr(c.LogLevel), c.GossipKey)
	if c.Server {
		b.WriteString("server           = true\nbootstrap_expect = 1\n")
	} else {
		fmt.Fprintf(&b, "server     = false\nretry_join = [%q]\n", fmt.Sprintf("%s:%d", c.JoinAddr, ConsulSerfLANPort))
	}
	fmt.Fprintf(&b, `
ports {
  http     = -1
  https    = %d
  grpc     = -1
  grpc_tls = %d
  server   = %d
  serf_lan = %d
  serf_wan = -1
  dns      = -1
}

# Mutual TLS on HTTPS, gRPC and RPC: every caller shows a certificate from
# the cluster's CA, and servers prove they are server.dc1.consul.
tls {
  defaults {
    ca_file         = %q
    cert_file       = %q
    key_file        = %q
    verify_incoming = true
    verify_outgoing = true
  }
  internal_rpc {
    verify_server_hostname = true
  }
}

acl {
  enabled                  = true
  default_policy           = "deny"
  enable_token_persistence = true
  tokens {
`, ConsulHTTPSPort, ConsulGRPCTLSPort, ConsulServerPort, ConsulSerfLANPort, c.TLS.CA, c.TLS.Cert, c.TLS.Key)
	if c.Server && c.ManagementToken != "" {
		fmt.Fprintf(&b, "    initial_management = %q\n", c.ManagementToken)
	}
	if c.AgentToken != "" {
		fmt.Fprintf(&b, "    agent = %q\n", c.AgentToken)
	}
	b.WriteString("  }\n}\n")
	return b.String()
}

// ProdNomadConfig is what a Nomad agent of the scenario needs.
type ProdNomadConfig struct {
	Name, Addr, DataDir string
	// Server is true for the one server; clients reach ServerAddr.
	Server     bool
	ServerAddr string
	TLS        TLSFiles
	// ConsulAddr is the agent's own Consul agent (host without port).
	ConsulAddr string
	// ConsulToken is the Nomad agent's Consul token: the server's lets
	// it read what the JWT auth method needs, a client's registers the
	// agent itself; the workloads' tokens come from workload identities.
	ConsulToken string
	// ConsulTLS is the certificate the agent shows Consul.
	ConsulTLS TLSFiles
	LogLevel  string
	// A client's own network: the interface holding its address alone
	// (NodeInterface), so static ports and ${attr.unique.network.ip-address}
	// are the node's as on separate machines, and its share of the dynamic
	// ports (an app binding every interface would collide with another
	// node's on one machine).
	NetworkInterface               string
	MinDynamicPort, MaxDynamicPort int
	// DockerEndpoint, when set, enables the docker driver with this
	// dockerd (the control plane's image runs there).
	DockerEndpoint string
}

// NodeInterface is the name of node i's network interface (a veth whose
// only address is ProdNodeAddr(i)).
func NodeInterface(i int) string { return fmt.Sprintf("ns26n%d", i) }

// NodeDynamicPorts is node i's share of the dynamic port range.
func NodeDynamicPorts(i int) (lo, hi int) {
	const base, size = 21000, 2000
	return base + (i-1)*size, base + i*size - 1
}

// Render is the agent's HCL configuration.
func (c ProdNomadConfig) Render() string {
	var b strings.Builder
	fmt.Fprintf(&b, `# Written by the e2e suite (scenario 26): a production-style Nomad agent.
name                 = %q
region               = "global"
datacenter           = "dc1"
data_dir             = %q
bind_addr            = %q
log_level            = %q
disable_update_check = true

ports {
  http = %d
  rpc  = %d
  serf = %d
}

advertise {
  http = %q
  rpc  = %q
  serf = %q
}

acl {
  enabled = true
}

# Mutual TLS on HTTP and RPC: servers are server.global.nomad, clients
# client.global.nomad, and every HTTP caller shows a certificate from the CA.
tls {
  http                   = true
  rpc                    = true
  ca_file                = %q
  cert_file              = %q
  key_file               = %q
  verify_server_hostname = true
  verify_https_client    = true
}
`, c.Name, c.DataDir, c.Addr, logLevelOr(c.LogLevel), NomadHTTPPort, NomadRPCPort, NomadSerfPort,
		c.Addr, c.Addr, c.Addr, c.TLS.CA, c.TLS.Cert, c.TLS.Key)
	if c.Server {
		b.WriteString(`
server {
  enabled          = true
  bootstrap_expect = 1
}
`)
	} else {
		fmt.Fprintf(&b, `
client {
  enabled           = true
  servers           = [%q]
  network_interface = %q
  min_dynamic_port  = %d
  max_dynamic_port  = %d

%s
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}
`, fmt.Sprintf("%s:%d", c.ServerAddr, NomadRPCPort), c.NetworkInterface, c.MinDynamicPort, c.MaxDynamicPort, devagents.CloudFingerprintsOff)
		if c.DockerEndpoint != "" {
			fmt.Fprintf(&b, `
plugin "docker" {
  config {
    endpoint = %q
    gc {
      image = false
    }
  }
}
`, c.DockerEndpoint)
		}
	}
	fmt.Fprintf(&b, `
consul {
  address      = "%s:%d"
  grpc_address = "%s:%d"
  ssl          = true
  verify_ssl   = true
  ca_file      = %q
  cert_file    = %q
  key_file     = %q
  grpc_ca_file = %q
  token        = %q
`, c.ConsulAddr, ConsulHTTPSPort, c.ConsulAddr, ConsulGRPCTLSPort,
		c.ConsulTLS.CA, c.ConsulTLS.Cert, c.ConsulTLS.Key, c.ConsulTLS.CA, c.ConsulToken)
	if c.Server {
		// The workload identities that Nomad signs for services and
		// tasks, which Consul's JWT auth method (nomad setup consul)
		// exchanges for Consul tokens.
		b.WriteString(`
  service_identity {
    aud = ["consul.io"]
    ttl = "1h"
  }
  task_identity {
    aud = ["consul.io"]
    ttl = "1h"
  }
`)
	}
	b.WriteString("}\n")
	return b.String()
}

func logLevelOr(l string) string {
	if l == "" {
		return "INFO"
	}
	return l
}
