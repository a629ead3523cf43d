package e2e

import "fmt"

// AgentPorts are every port of one Consul dev agent and one Nomad dev agent.
// The suite picks them free so it never collides with agents already running
// on the machine (Consul's -dev defaults are fixed: 8500, 8600, 8300-8302).
type AgentPorts struct {
	ConsulHTTP, ConsulDNS, ConsulServer, ConsulSerfLAN, ConsulSerfWAN, ConsulGRPC int
	NomadHTTP, NomadRPC, NomadSerf                                                int
}

// ACL turns on ACLs in both agents: Consul with ManagementToken as its
// initial management and agent token (so nothing needs bootstrapping), Nomad
// bootstrapped by the suite with NomadManagementToken.
type ACL struct {
	ConsulManagementToken string
	NomadManagementToken  string
}

// ConsulConfig renders a Consul dev agent's configuration: loopback only,
// every port from p, ACLs when acl is not nil.
func ConsulConfig(p AgentPorts, acl *ACL) string {
	s := fmt.Sprintf(`bind_addr      = "127.0.0.1"
client_addr    = "127.0.0.1"
advertise_addr = "127.0.0.1"
log_level      = "DEBUG"

ports {
  http     = %d
  dns      = %d
  server   = %d
  serf_lan = %d
  serf_wan = %d
  grpc     = %d
  grpc_tls = -1
}
`, p.ConsulHTTP, p.ConsulDNS, p.ConsulServer, p.ConsulSerfLAN, p.ConsulSerfWAN, p.ConsulGRPC)
	if acl != nil {
		s += fmt.Sprintf(`
acl {
  enabled                  = true
  default_policy           = "deny"
  enable_token_persistence = false
  tokens {
    initial_management = %q
    agent              = %q
  }
}
`, acl.ConsulManagementToken, acl.ConsulManagementToken)
	}
	return s
}

// NomadConfig renders a Nomad dev agent's configuration: loopback only, data
// in dataDir, raw_exec enabled, services registered in the Consul at
// p.ConsulHTTP (with the management token when acl is not nil), Nomad ACLs
// on when acl is not nil.
func NomadConfig(p AgentPorts, dataDir string, acl *ACL) string {
	token := ""
	if acl != nil {
		token = fmt.Sprintf("\n  token        = %q", acl.ConsulManagementToken)
	}
	s := fmt.Sprintf(`data_dir  = %q
bind_addr = "127.0.0.1"
log_level = "DEBUG"

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

consul {
  address      = "127.0.0.1:%d"
  grpc_address = "127.0.0.1:%d"%s
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}
`, dataDir, p.NomadHTTP, p.NomadRPC, p.NomadSerf, p.ConsulHTTP, p.ConsulGRPC, token)
	if acl != nil {
		s += `
acl {
  enabled = true
}
`
	}
	return s
}
