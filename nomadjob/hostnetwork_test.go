package nomadjob

import (
	"testing"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// hostNetworkService is a raw_exec service whose instances listen on the
// clients' "private" host network (golden case host-network).
func hostNetworkService() spec.Service {
	s := spec.NewService("ledger")
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "/opt/ledger/bin/ledger"}
	s.Template.Network.HostNetwork = "private"
	return s
}

// Every port of an instance goes on the service's host network, in host
// and in bridge mode, and none names one when the service does not.
func TestPortsOnHostNetwork(t *testing.T) {
	docker := func(s spec.Service) spec.Service {
		s.Template.Task.Driver = "docker"
		s.Template.Task.Config = map[string]any{"image": "example/ledger:1"}
		s.Template.Task.Port = 8080
		return s
	}
	for _, tc := range []struct {
		name string
		svc  spec.Service
		mode spec.NetworkMode
		want string
	}{
		{"raw_exec host", hostNetworkService(), spec.NetworkHost, "private"},
		{"docker host (published app port)", docker(hostNetworkService()), spec.NetworkHost, "private"},
		{"docker bridge", docker(hostNetworkService()), spec.NetworkBridge, "private"},
		{"no host network", spec.NewService("plain"), spec.NetworkHost, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			svc := tc.svc
			svc.Template.Network.Mode = tc.mode
			if svc.Template.Task.Driver == "" {
				svc.Template.Task.Driver = "raw_exec"
				svc.Template.Task.Config = map[string]any{"command": "/bin/plain"}
			}
			if ps := svc.Validate(); len(ps) > 0 {
				t.Fatalf("invalid service: %v", ps)
			}
			job, err := Compile(spec.NewRevision(&svc, 1), testOptions())
			if err != nil {
				t.Fatal(err)
			}
			nets := job.TaskGroups[0].Networks
			if len(nets) != 1 || len(nets[0].DynamicPorts) == 0 {
				t.Fatalf("networks = %+v", nets)
			}
			for _, p := range nets[0].DynamicPorts {
				if p.HostNetwork != tc.want {
					t.Errorf("port %s: host_network %q, want %q", p.Label, p.HostNetwork, tc.want)
				}
			}
		})
	}
}
