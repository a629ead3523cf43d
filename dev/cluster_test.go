package dev

import (
	"bytes"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

// The banner names every node with its address, agents and logs, and the
// network block that puts instances on a node's own address.
func TestDevClusterBanner(t *testing.T) {
	cl := &devagents.Cluster{Nodes: []*devagents.Node{
		{Name: "node-1", Addr: netip.MustParseAddr("127.0.0.2"), NomadAddr: "http://127.0.0.2:4646", ConsulAddr: "127.0.0.2:8500", Dir: "/tmp/d/node-1"},
		{Name: "node-2", Addr: netip.MustParseAddr("127.0.0.3"), NomadAddr: "http://127.0.0.3:4646", ConsulAddr: "127.0.0.3:8500", Dir: "/tmp/d/node-2"},
	}}
	var b bytes.Buffer
	clusterBanner(&b, cl)
	for _, want := range []string{
		"2 client nodes",
		"node-1   127.0.0.2   Nomad client http://127.0.0.2:4646   Consul agent 127.0.0.2:8500   logs /tmp/d/node-1/",
		"node-2   127.0.0.3 ",
		`network { host_network = "own" }`,
		"marked down within 2s to 6s",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("banner lacks %q:\n%s", want, b.String())
		}
	}
}

func TestDevFirstExit(t *testing.T) {
	long, err := devagents.StartProc(devagents.Command{Name: "long", Path: "/bin/sleep", Args: []string{"60"}, Output: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	defer long.Stop(time.Second)
	short, err := devagents.StartProc(devagents.Command{Name: "short", Path: "/bin/sh", Args: []string{"-c", "exit 3"}, Output: &bytes.Buffer{}})
	if err != nil {
		t.Fatal(err)
	}
	if p := <-firstExit([]*devagents.Proc{long, short}); p != short {
		t.Errorf("first to end: %s, want short", p.Name)
	}
}
