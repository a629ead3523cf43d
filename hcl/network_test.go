package hcl

import (
	"testing"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// The network block's host_network reaches the template, with mode or
// without; without it the template names none.
func TestNetworkHostNetwork(t *testing.T) {
	for _, tc := range []struct {
		name, block string
		want        spec.Network
	}{
		{"host_network alone", "  network {\n    host_network = \"own\"\n  }", spec.Network{Mode: spec.NetworkHost, HostNetwork: "own"}},
		{"with bridge", "  network {\n    mode         = \"bridge\"\n    host_network = \"private\"\n  }", spec.Network{Mode: spec.NetworkBridge, HostNetwork: "private"}},
		{"mode alone", "  network {\n    mode = \"host\"\n  }", spec.Network{Mode: spec.NetworkHost}},
		{"no network block", "", spec.Network{Mode: spec.NetworkHost}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := mustParse(t, docker(tc.block), Options{})
			if got := f.Services[0].Template.Network; got != tc.want {
				t.Errorf("network = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestNetworkHostNetworkErrors(t *testing.T) {
	runDiagCases(t, []diagCase{
		{name: "host_network not a string", src: docker("  network {\n    host_network = »[\"own\"]\n  }"), summary: "Incorrect attribute value type", detail: "network.host_network must be a string"},
		{name: "unknown network attribute", src: docker("  network {\n    »host_networks = \"own\"\n  }"), summary: "Unsupported argument"},
	})
}
