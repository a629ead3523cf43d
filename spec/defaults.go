package spec

import "time"

// Defaults of a service that are not scaling settings (see DefaultScaling).
const (
	DefaultNamespace   = "default"
	DefaultAppPort     = 8080
	DefaultTimeout     = 300 * time.Second
	DefaultCPU         = 100
	DefaultMemoryMB    = 128
	DefaultKillTimeout = 30 * time.Second
)

// NewService returns a service with every default filled in; the HCL decoder
// starts from it and overwrites what the file sets, so "unset" never has to be
// told apart from "zero" later.
func NewService(name string) Service {
	return Service{
		Name:      name,
		Namespace: DefaultNamespace,
		Template: Template{
			Datacenters: []string{"*"},
			Task: Task{
				Resources:   Resources{CPU: DefaultCPU, MemoryMB: DefaultMemoryMB},
				Port:        DefaultAppPort,
				KillTimeout: DefaultKillTimeout,
			},
			Timeout: DefaultTimeout,
			Network: Network{Mode: NetworkHost},
		},
		Scaling:    DefaultScaling(),
		Visibility: VisibilityPublic,
	}
}

// EffectiveTraffic is the service's traffic list, or all to latest when the
// user declared none.
func (s *Service) EffectiveTraffic() []TrafficTarget {
	if len(s.Traffic) == 0 {
		return []TrafficTarget{{Latest: true, Percent: 100}}
	}
	return s.Traffic
}

// The app protocols a task may declare (Task.Protocol). HTTP/1.1 is the
// empty value, so templates written before the setting existed keep their
// hash.
const (
	ProtocolHTTP1 = "http1"
	ProtocolH2C   = "h2c"
)
