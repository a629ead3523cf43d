package nomadjob

import (
	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// onHostNetwork puts every port on the service's host network, when it
// names one. All of an instance's ports go together: the gateway reaches
// the sidecar's http port, the autoscaler its admin port, and a published
// app port is the sidecar's way to the app, each at the one address Consul
// and Nomad report for the instance (the http port's), so they must share
// it. NOMAD_IP_<port>, the allocation's ports and the Consul service's
// address all follow.
func onHostNetwork(n spec.Network, ports []api.Port) []api.Port {
	if n.HostNetwork == "" {
		return ports
	}
	for i := range ports {
		ports[i].HostNetwork = n.HostNetwork
	}
	return ports
}
