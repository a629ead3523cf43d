package spec

import "time"

// ProbeType is how a probe checks the app.
type ProbeType string

const (
	ProbeHTTP ProbeType = "http"
	ProbeTCP  ProbeType = "tcp"
	ProbeGRPC ProbeType = "grpc"
	ProbeExec ProbeType = "exec"
)

// AggressiveProbePeriod is how often the sidecar probes readiness while
// Period is 0, until the first success (Knative's 25 ms).
const AggressiveProbePeriod = 25 * time.Millisecond

// ListenProbePeriod is how often the sidecar probes readiness while Period
// is 0, before the first success, as long as nothing listens at the app's
// port (the connection is refused, or a proxy in front of it, such as
// docker's, closes it unanswered). A refusal costs a reset and no work of
// the app, and the probe that finds the app listening starts its cold
// start's last steps: at 25 ms the app waited half of that, on average,
// in every wake.
const ListenProbePeriod = 5 * time.Millisecond

// MaxProbeWait bounds how long a sidecar holds a probe that asked to wait
// for readiness (ProbeWaitHeader): longer asks are held this long.
const MaxProbeWait = 10 * time.Second

// Probe is a readiness or liveness check of the user's app, run by the sidecar
// against 127.0.0.1.
type Probe struct {
	Type ProbeType `json:"type"`
	// Path and Headers apply to http probes.
	Path    string            `json:"path,omitempty"`
	Headers map[string]string `json:"headers,omitempty"`
	// Port defaults (0) to the app's port.
	Port int `json:"port,omitempty"`
	// GRPCService is the service name sent in a grpc health check; empty
	// asks about the server as a whole.
	GRPCService string `json:"grpc_service,omitempty"`
	// Command is run for exec probes; exit 0 means success.
	Command []string `json:"command,omitempty"`

	InitialDelay time.Duration `json:"initial_delay,omitempty"`
	// Period 0 means probe every AggressiveProbePeriod until the first
	// success, then every DefaultProbePeriod.
	Period           time.Duration `json:"period"`
	Timeout          time.Duration `json:"timeout"`
	SuccessThreshold int           `json:"success_threshold"`
	FailureThreshold int           `json:"failure_threshold"`
}

// DefaultProbe returns a probe of the given type with Knative's defaults.
func DefaultProbe(t ProbeType) Probe {
	p := Probe{
		Type:             t,
		Timeout:          time.Second,
		SuccessThreshold: 1,
		FailureThreshold: 3,
	}
	if t == ProbeHTTP {
		p.Path = "/"
	}
	return p
}

// DefaultLivenessPeriod is the period used for a liveness probe that does not
// set one: liveness is never probed aggressively.
const DefaultLivenessPeriod = 10 * time.Second

// DefaultProbePeriod is the period after the first success of a readiness
// probe declared with period 0.
const DefaultProbePeriod = time.Second
