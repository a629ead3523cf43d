package dev

import (
	"context"
	"fmt"
	"io"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

// startCluster starts the dev cluster of -nodes in dir: the servers on
// the ports dev was given, the nodes on 127.0.0.2 and up.
func startCluster(ctx context.Context, e Env, c Config, dir, consulBin, nomadBin string) (*devagents.Cluster, error) {
	return devagents.StartCluster(ctx, devagents.ClusterOptions{
		ConsulBin: consulBin, NomadBin: nomadBin, Dir: dir,
		Nodes:        c.Nodes,
		Ports:        devagents.Ports{ConsulHTTP: c.ConsulHTTPPort, NomadHTTP: c.NomadHTTPPort},
		ReadyTimeout: c.ReadyTimeout, Poll: c.Poll, StopGrace: c.StopGrace,
		Progress: e.Stderr,
	})
}

// nodeProcs are the nodes' agents, whose end ends dev as a server's
// does.
func nodeProcs(cl *devagents.Cluster) []*devagents.Proc {
	var procs []*devagents.Proc
	for _, n := range cl.Nodes {
		procs = append(procs, n.Consul, n.Nomad)
	}
	return procs
}

// firstExit returns a channel that receives the first of procs to end.
func firstExit(procs []*devagents.Proc) <-chan *devagents.Proc {
	ch := make(chan *devagents.Proc, len(procs))
	for _, p := range procs {
		go func() {
			<-p.Done()
			ch <- p
		}()
	}
	return ch
}

// clusterBanner lists the nodes and says how a service puts its
// instances on its node's own address.
func clusterBanner(w io.Writer, cl *devagents.Cluster) {
	fmt.Fprintf(w, "\nA cluster: one Nomad server (the addresses above) and %d client nodes, each with its own\naddress and Consul agent:\n", len(cl.Nodes))
	for _, n := range cl.Nodes {
		fmt.Fprintf(w, "  %-8s %-11s Nomad client %s   Consul agent %s   logs %s/\n", n.Name, n.Addr, n.NomadAddr, n.ConsulAddr, n.Dir)
	}
	fmt.Fprintf(w, `Instances listen on their node's own address when the service says
  network { host_network = %q }
(without it they get 127.0.0.1 on every node). A node whose agents die is
marked down within %s to %s, and its instances are replaced on the others.

`, devagents.HostNetwork, devagents.ClusterHeartbeatGrace, devagents.ClusterMinHeartbeatTTL*2+devagents.ClusterHeartbeatGrace)
}
