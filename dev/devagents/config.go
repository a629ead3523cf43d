package devagents

import (
	"fmt"
	"maps"
	"slices"
	"time"
)

// ACL turns on ACLs in both agents: Consul with ConsulManagementToken as its
// initial management and agent token (nothing to bootstrap), Nomad
// bootstrapped by Start, which fills NomadManagementToken.
type ACL struct {
	ConsulManagementToken string
	NomadManagementToken  string
}

// ConfigOptions are the settings of the agents' configuration files beyond
// their ports.
type ConfigOptions struct {
	// LogLevel is the agents' log_level; "" is INFO.
	LogLevel string
	// ACL, when not nil, turns ACLs on.
	ACL *ACL
	// HostVolumes are the Nomad client's host volumes, name to path on
	// the node (the directory must exist when Nomad starts).
	HostVolumes map[string]string
	// CPUTotalCompute, when above 0, is the compute (MHz) the Nomad client
	// declares instead of what it measures: the scale run's burst places
	// 100 instances of 100 MHz on a 2-core node (raw_exec caps no CPU).
	CPUTotalCompute int
	// HeartbeatTTL and HeartbeatGrace, when above 0, are a dev cluster's
	// Nomad server min_heartbeat_ttl and heartbeat_grace in place of
	// ClusterMinHeartbeatTTL and ClusterHeartbeatGrace: the soak restarts
	// a node's Nomad client, which takes longer than the short ones, and
	// wants what a production server does (10 s each), not a node marked
	// down.
	HeartbeatTTL, HeartbeatGrace time.Duration
}

func (o ConfigOptions) logLevel() string {
	if o.LogLevel == "" {
		return "INFO"
	}
	return o.LogLevel
}

// ConsulConfig renders a Consul dev agent's configuration: loopback only,
// every port from p, the UI on, ACLs (default deny) when o.ACL is set.
func ConsulConfig(p Ports, o ConfigOptions) string {
	s := fmt.Sprintf(`# Written by nomad-serverless: a single Consul dev agent on loopback.
bind_addr      = "127.0.0.1"
client_addr    = "127.0.0.1"
advertise_addr = "127.0.0.1"
log_level      = %q

ports {
  http     = %d
  dns      = %d
  server   = %d
  serf_lan = %d
  serf_wan = %d
  grpc     = %d
  grpc_tls = -1
}

ui_config {
  enabled = true
}
`, o.logLevel(), p.ConsulHTTP, p.ConsulDNS, p.ConsulServer, p.ConsulSerfLAN, p.ConsulSerfWAN, p.ConsulGRPC)
	if o.ACL != nil {
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
`, o.ACL.ConsulManagementToken, o.ACL.ConsulManagementToken)
	}
	return s
}

// CloudFingerprintsOff is the client options stanza every agent this
// project starts carries (dev agents, the e2e production cluster): the cloud fingerprinters ask metadata services a laptop does
// not have, and Nomad 2.0's env_aws refuses to start the agent when
// AWS_CA_BUNDLE is set (as some machines set it for every AWS tool), so a
// user's environment would decide whether `dev` starts.
const CloudFingerprintsOff = `  # Loopback agents are on no cloud: skip the metadata probes (and Nomad
  # 2.0's refusal to start when AWS_CA_BUNDLE is set).
  options = {
    "fingerprint.denylist" = "env_aws,env_gce,env_azure,env_digitalocean"
  }`

// NomadConfig renders a Nomad dev agent's configuration (server and client):
// loopback only, data in dataDir, raw_exec enabled (examples/raw-exec.hcl
// and the e2e services run nomad-serverless through it), services
// registered in the Consul at p.ConsulHTTP (with the management token when
// o.ACL is set), Nomad ACLs on when o.ACL is set.
func NomadConfig(p Ports, dataDir string, o ConfigOptions) string {
	token := ""
	if o.ACL != nil {
		token = fmt.Sprintf("\n  token        = %q", o.ACL.ConsulManagementToken)
	}
	s := fmt.Sprintf(`# Written by nomad-serverless: a single Nomad dev agent (server and client) on loopback.
data_dir  = %q
bind_addr = "127.0.0.1"
log_level = %q

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

client {
%s
  # Nomad 1.6 collects a terminal allocation on the path of a new one once
  # a client holds more than gc_max_allocs (50 by default), and waits out
  # its group's shutdown_delay again while doing it (2.0 skips that for an
  # allocation already deregistered): every wake from zero then waited 5 s
  # once a dev agent had run 50 instances. Scale to zero makes many.
  gc_max_allocs = 1000
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}
`, dataDir, o.logLevel(), p.NomadHTTP, p.NomadRPC, p.NomadSerf, p.ConsulHTTP, p.ConsulGRPC, token, CloudFingerprintsOff)
	if o.ACL != nil {
		s += `
acl {
  enabled = true
}
`
	}
	if len(o.HostVolumes) > 0 {
		s += "\nclient {\n"
		for _, name := range slices.Sorted(maps.Keys(o.HostVolumes)) {
			s += fmt.Sprintf("  host_volume %q {\n    path = %q\n  }\n", name, o.HostVolumes[name])
		}
		s += "}\n"
	}
	if o.CPUTotalCompute > 0 {
		s += fmt.Sprintf("\nclient {\n  cpu_total_compute = %d\n}\n", o.CPUTotalCompute)
	}
	return s
}
