package nomadjob

import (
	"errors"
	"fmt"
	"time"
)

// Defaults of Options. Each says why it is what it is.
const (
	// UnboundedMax is the scaling block's max for a service whose
	// scaling.max is 0 (unbounded): Nomad's scaling block needs a number,
	// and a thousand instances of one revision is past what a single
	// Nomad cluster of the size this tool targets would place anyway.
	UnboundedMax = 1000

	// DefaultCheckInterval is how often Consul runs the readiness check
	// on the sidecar. The gateway does not wait for it (it probes new
	// instances itself), but catalog-driven proxies do, so keep it short:
	// the check is a local HTTP request the sidecar answers from memory.
	DefaultCheckInterval = time.Second
	// DefaultCheckTimeout bounds one check.
	DefaultCheckTimeout = time.Second

	// DefaultShutdownDelay is the group's shutdown_delay: Nomad
	// deregisters the instance from Consul, waits this long, and only
	// then sends SIGTERM (main tasks first, the sidecar after).
	// It must cover the time for everything routing from Consul to drop
	// the instance: our gateway sees it within a blocking-query round
	// trip (well under a second), catalog-driven proxies within their
	// poll interval. 5 s covers the first with a wide margin and most
	// configured proxies, delays a scale-down by only 5 s, and stays well
	// below the default kill_timeout (30 s) that the sidecar's drain then
	// has for itself.
	DefaultShutdownDelay = 5 * time.Second

	// DefaultLivenessGrace is added to a liveness probe's initial_delay
	// to form check_restart's grace: the time after a (re)start during
	// which failing liveness checks do not restart the task. It covers
	// the app's start-up, which initial_delay alone often underestimates.
	DefaultLivenessGrace = 10 * time.Second

	// DefaultSidecarCPU and DefaultSidecarMemoryMB size the queue-proxy
	// task. The proxy is light (one goroutine per request, small buffers)
	// but memory is a hard limit with the docker driver: 64 MiB leaves
	// room for a few thousand concurrent connections.
	DefaultSidecarCPU      = 50
	DefaultSidecarMemoryMB = 64

	// DefaultArtifactDriver runs a sidecar fetched as an artifact.
	DefaultArtifactDriver = "exec"
	// DefaultArtifactCommand is where the binary is after Nomad unpacks
	// the artifact into the task's local/ directory.
	DefaultArtifactCommand = "local/nomad-serverless"
)

// SidecarCommandArg is the subcommand that runs the queue-proxy.
const SidecarCommandArg = "sidecar"

// Options tune Compile. The zero value of every field but Sidecar means
// "the default"; Sidecar must say how the binary reaches the node.
type Options struct {
	// Sidecar says how the queue-proxy (this same binary, run as
	// `nomad-serverless sidecar`) reaches the node.
	Sidecar SidecarOptions

	// CheckInterval and CheckTimeout are the Consul readiness check's
	// (DefaultCheckInterval, DefaultCheckTimeout). The timeout never
	// exceeds the interval.
	CheckInterval time.Duration
	CheckTimeout  time.Duration

	// ShutdownDelay is the group's shutdown_delay (DefaultShutdownDelay);
	// a negative value turns it off.
	ShutdownDelay time.Duration

	// UnboundedMax is the scaling block's max when the service's max is 0
	// (UnboundedMax).
	UnboundedMax int

	// LivenessGrace is added to a liveness probe's initial_delay for
	// check_restart's grace (DefaultLivenessGrace).
	LivenessGrace time.Duration

	// SidecarEnv is more environment for the queue-proxy task: the
	// control plane's tracing settings (OTEL_*, consulroute.TracingKey).
	// The revision's own sidecar settings win over it.
	SidecarEnv map[string]string

	// DockerAnnounces says that every docker engine of the cluster
	// announces a container's address as its network comes up
	// (DockerAnnounces of Client.DockerEngines), so the queue-proxy may
	// start beside a published docker container instead of after it
	// (sidecarLifecycle). False, the safe order, when unknown.
	DockerAnnounces bool
}

// SidecarOptions says how the queue-proxy task runs. Set exactly one of
// Image, Command and ArtifactURL.
type SidecarOptions struct {
	// Image runs the sidecar with the docker driver; the image's
	// entrypoint must be nomad-serverless (it is given the argument
	// "sidecar").
	Image string
	// Command runs the sidecar with raw_exec from this absolute path on
	// the node, for example the deploying binary's os.Executable() on a
	// local dev cluster, or where `install` put it.
	Command string
	// ArtifactURL has Nomad download an archive holding the binary into
	// the task's local/ directory and run ArtifactCommand from it with
	// ArtifactDriver (DefaultArtifactDriver, or "raw_exec").
	ArtifactURL     string
	ArtifactDriver  string
	ArtifactCommand string

	// CPU (MHz) and MemoryMB size the task (DefaultSidecarCPU,
	// DefaultSidecarMemoryMB).
	CPU      int
	MemoryMB int
}

// withDefaults returns o with every zero field set to its default, or the
// reasons o cannot be used.
func (o Options) withDefaults() (Options, error) {
	if o.CheckInterval == 0 {
		o.CheckInterval = DefaultCheckInterval
	}
	if o.CheckTimeout == 0 {
		o.CheckTimeout = DefaultCheckTimeout
	}
	o.CheckTimeout = min(o.CheckTimeout, o.CheckInterval)
	if o.ShutdownDelay == 0 {
		o.ShutdownDelay = DefaultShutdownDelay
	} else if o.ShutdownDelay < 0 {
		o.ShutdownDelay = 0
	}
	if o.UnboundedMax == 0 {
		o.UnboundedMax = UnboundedMax
	}
	if o.LivenessGrace == 0 {
		o.LivenessGrace = DefaultLivenessGrace
	}
	s := &o.Sidecar
	if s.CPU == 0 {
		s.CPU = DefaultSidecarCPU
	}
	if s.MemoryMB == 0 {
		s.MemoryMB = DefaultSidecarMemoryMB
	}
	if s.ArtifactURL != "" {
		if s.ArtifactDriver == "" {
			s.ArtifactDriver = DefaultArtifactDriver
		}
		if s.ArtifactCommand == "" {
			s.ArtifactCommand = DefaultArtifactCommand
		}
	}

	var errs []error
	set := 0
	for _, v := range []string{s.Image, s.Command, s.ArtifactURL} {
		if v != "" {
			set++
		}
	}
	if set != 1 {
		errs = append(errs, errors.New("sidecar: set exactly one of Image (docker), Command (raw_exec path on the node) and ArtifactURL"))
	}
	if s.ArtifactURL != "" && s.ArtifactDriver != "exec" && s.ArtifactDriver != "raw_exec" {
		errs = append(errs, fmt.Errorf("sidecar: artifact driver %q: use exec or raw_exec", s.ArtifactDriver))
	}
	if s.CPU < 1 || s.MemoryMB < 10 {
		errs = append(errs, fmt.Errorf("sidecar: resources cpu=%d memory=%d: Nomad needs at least 1 MHz and 10 MiB", s.CPU, s.MemoryMB))
	}
	if o.CheckInterval < 0 || o.CheckTimeout < 0 {
		errs = append(errs, fmt.Errorf("check interval %s / timeout %s: use positive durations", o.CheckInterval, o.CheckTimeout))
	}
	if o.UnboundedMax < 1 {
		errs = append(errs, fmt.Errorf("unbounded max %d: use 1 or more", o.UnboundedMax))
	}
	if o.LivenessGrace < 0 {
		errs = append(errs, fmt.Errorf("liveness grace %s: use 0 or more", o.LivenessGrace))
	}
	if len(errs) > 0 {
		return o, fmt.Errorf("nomadjob options: %w", errors.Join(errs...))
	}
	return o, nil
}
