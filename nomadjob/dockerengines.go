package nomadjob

import (
	"context"
	"strconv"
	"strings"

	"github.com/hashicorp/nomad/api"
)

// DockerAnnouncingSince is the first docker engine that announces a
// container's address (an unsolicited ARP and neighbour advertisement)
// the moment the container's network comes up: moby 28.0.0
// (libnetwork/internal/l2disco).
const DockerAnnouncingSince = 28

// DockerEngine is the docker engine Nomad fingerprinted on one node.
type DockerEngine struct {
	Node    string // node name
	Version string // attribute driver.docker.version; "" when Nomad has none
}

// DockerAnnounces reports whether the queue-proxy may start beside a
// published docker container rather than after it: every docker engine
// of the cluster announces a container's address as its network comes up
// (DockerAnnouncingSince), and there is at least one. An older engine
// answers nothing for the container's address until its network is up, so
// a probe sent through the published port before that waits a whole ARP
// retry (1 s on Linux) before the kernel asks again (docs/design-notes.md);
// with the proxy started after the container, no probe is that early. One
// old engine, or one whose version is unknown, keeps the safe order for
// every node, since the job does not choose its node.
func DockerAnnounces(engines []DockerEngine) bool {
	if len(engines) == 0 {
		return false
	}
	for _, e := range engines {
		major, _, _ := strings.Cut(strings.TrimPrefix(e.Version, "v"), ".")
		n, err := strconv.Atoi(major)
		if err != nil || n < DockerAnnouncingSince {
			return false
		}
	}
	return true
}

// DockerEngines lists the docker engine of every node that is up and has
// the docker driver detected, from the fingerprints in Nomad's node list
// (one request; both Nomad 1.6 and 2.0 list each driver's attributes).
// It needs node:read.
func (c *Client) DockerEngines(ctx context.Context) ([]DockerEngine, error) {
	stubs, _, err := c.api.Nodes().List(c.query(ctx, ""))
	if err != nil {
		return nil, c.wrap("list nodes", "", "node:read", err)
	}
	var out []DockerEngine
	for _, n := range stubs {
		if n == nil || n.Status == api.NodeStatusDown || n.Status == api.NodeStatusDisconnected {
			continue
		}
		if d := n.Drivers["docker"]; d != nil && d.Detected {
			out = append(out, DockerEngine{Node: n.Name, Version: d.Attributes["driver.docker.version"]})
		}
	}
	return out, nil
}
