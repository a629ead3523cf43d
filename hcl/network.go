package hcl

import (
	hcl2 "github.com/hashicorp/hcl/v2"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// decodeNetwork reads a service's network block: mode (host or bridge) and
// host_network, the client host network whose address every port of an
// instance gets (a cluster's private network, or a dev cluster node's own
// address).
func (d *decoder) decodeNetwork(b *hcl2.Block, n *spec.Network) {
	d.ranges["network"] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"mode", "host_network"}, nil, nil), "network")
	if v, ok := d.str(c.Attributes["mode"], "network.mode"); ok {
		n.Mode = spec.NetworkMode(v)
	}
	d.setStr(&n.HostNetwork, c.Attributes["host_network"], "network.host_network")
}
