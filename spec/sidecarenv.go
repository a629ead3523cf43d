package spec

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Environment variables that configure the queue-proxy sidecar. The compiler
// (nomadjob) writes them into the sidecar task; the sidecar reads them at
// start. Both sides use SidecarConfig, so the contract lives in one place.
const (
	EnvSidecarPort        = "PORT"                    // serving port (Nomad: ${NOMAD_PORT_http})
	EnvSidecarAppHost     = "SERVERLESS_APP_HOST"     // where the app listens; default 127.0.0.1
	EnvSidecarAppPort     = "SERVERLESS_APP_PORT"     // the user app's port on the app host
	EnvSidecarAppProtocol = "SERVERLESS_APP_PROTOCOL" // "h2c", or empty for HTTP/1.1
	EnvSidecarAdminPort   = "SERVERLESS_ADMIN_PORT"   // stats, metrics, liveness
	EnvSidecarService     = "SERVERLESS_SERVICE"      // service name (metric label)
	EnvSidecarRevision    = "SERVERLESS_REVISION"     // revision name (metric label)
	EnvSidecarInstance    = "SERVERLESS_INSTANCE"     // allocation ID (stats identity)
	EnvSidecarConcurrency = "SERVERLESS_CONCURRENCY"  // per-instance hard limit, 0 = none
	EnvSidecarQueueDepth  = "SERVERLESS_QUEUE_DEPTH"  // requests waiting for the breaker
	EnvSidecarTimeout     = "SERVERLESS_TIMEOUT"      // whole request, Go duration
	EnvSidecarRespStart   = "SERVERLESS_RESPONSE_START_TIMEOUT"
	EnvSidecarIdle        = "SERVERLESS_IDLE_TIMEOUT"
	EnvSidecarReadiness   = "SERVERLESS_READINESS" // JSON of Probe; empty = TCP connect to the app port
	EnvSidecarLiveness    = "SERVERLESS_LIVENESS"  // JSON of Probe; empty = no liveness
	EnvSidecarDrainGrace  = "SERVERLESS_DRAIN_GRACE"
	EnvSidecarDrainLimit  = "SERVERLESS_DRAIN_TIMEOUT"
	EnvSidecarAccessLog   = "SERVERLESS_ACCESS_LOG" // "true" to log every request
	// EnvSidecarLogFile is where the sidecar keeps its own log, as files
	// <value>.<n>, when Nomad does not collect it (the compiled job:
	// ${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr); empty: stderr.
	EnvSidecarLogFile = "SERVERLESS_LOG_FILE"
)

// defaultDrainGrace is the longest drain grace: requests that still arrive
// after SIGTERM are served this long (at most half the drain).
const defaultDrainGrace = 3 * time.Second

// DefaultQueueDepthFactor sizes the breaker's queue as a multiple of the
// concurrency limit when the job does not set it (Knative uses 10x).
const DefaultQueueDepthFactor = 10

// SidecarConfig is the sidecar's whole configuration.
type SidecarConfig struct {
	Port int
	// AppHost and AppPort are where the user's app listens: 127.0.0.1 for
	// exec drivers and bridge networking, the node's address for a
	// container whose port Nomad publishes in host networking.
	AppHost   string
	AppPort   int
	AdminPort int
	// AppProtocol is what the app speaks: "" (HTTP/1.1) or ProtocolH2C.
	AppProtocol string

	Service  string
	Revision string
	Instance string

	Concurrency int
	QueueDepth  int

	Timeout              time.Duration
	ResponseStartTimeout time.Duration
	IdleTimeout          time.Duration

	Readiness *Probe
	Liveness  *Probe

	// DrainGrace is how long, after SIGTERM, requests that still arrive are
	// served; DrainTimeout bounds the whole drain and must end before
	// Nomad's kill_timeout.
	DrainGrace   time.Duration
	DrainTimeout time.Duration

	AccessLog bool
}

// SidecarConfigForRevision is the configuration a revision's sidecars run
// with, ports left at zero: the compiler fills the port variables with Nomad
// interpolations.
func SidecarConfigForRevision(r Revision) SidecarConfig {
	t := r.Template
	depth := t.Concurrency * DefaultQueueDepthFactor
	drain := t.Task.KillTimeout - time.Second
	grace := min(defaultDrainGrace, drain/2)
	return SidecarConfig{
		AppHost:              DefaultAppHost,
		AppProtocol:          t.Task.Protocol,
		Service:              r.Service,
		Revision:             r.Name(),
		Concurrency:          t.Concurrency,
		QueueDepth:           depth,
		Timeout:              t.Timeout,
		ResponseStartTimeout: t.ResponseStartTimeout,
		IdleTimeout:          t.IdleTimeout,
		Readiness:            t.Readiness,
		Liveness:             t.Liveness,
		DrainGrace:           grace,
		DrainTimeout:         drain,
	}
}

// DefaultAppHost is where the sidecar finds the app unless told otherwise.
const DefaultAppHost = "127.0.0.1"

// Env renders every setting except the app host and the three ports, which
// only the caller knows how to spell (a number, or a Nomad interpolation).
func (c SidecarConfig) Env() map[string]string {
	env := map[string]string{
		EnvSidecarService:     c.Service,
		EnvSidecarRevision:    c.Revision,
		EnvSidecarConcurrency: strconv.Itoa(c.Concurrency),
		EnvSidecarQueueDepth:  strconv.Itoa(c.QueueDepth),
		EnvSidecarTimeout:     c.Timeout.String(),
		EnvSidecarRespStart:   c.ResponseStartTimeout.String(),
		EnvSidecarIdle:        c.IdleTimeout.String(),
		EnvSidecarDrainGrace:  c.DrainGrace.String(),
		EnvSidecarDrainLimit:  c.DrainTimeout.String(),
	}
	if c.Instance != "" {
		env[EnvSidecarInstance] = c.Instance
	}
	if c.AppProtocol != "" {
		env[EnvSidecarAppProtocol] = c.AppProtocol
	}
	if c.Readiness != nil {
		env[EnvSidecarReadiness] = mustJSON(c.Readiness)
	}
	if c.Liveness != nil {
		env[EnvSidecarLiveness] = mustJSON(c.Liveness)
	}
	if c.AccessLog {
		env[EnvSidecarAccessLog] = "true"
	}
	return env
}

func mustJSON(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("spec: %T is not JSON-encodable: %v", v, err))
	}
	return string(b)
}

// ParseSidecarEnv reads and validates the configuration from getenv (pass
// os.Getenv). Every problem is reported at once, each naming its variable.
func ParseSidecarEnv(getenv func(string) string) (SidecarConfig, error) {
	var c SidecarConfig
	var errs []error
	bad := func(name, val, want string) {
		errs = append(errs, fmt.Errorf("%s=%q: %s", name, val, want))
	}
	port := func(name string, required bool) int {
		v := getenv(name)
		if v == "" {
			if required {
				errs = append(errs, fmt.Errorf("%s is not set: the sidecar needs it (Nomad sets it from the job's ports)", name))
			}
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 65535 {
			bad(name, v, "want a port from 1 to 65535")
		}
		return n
	}
	count := func(name string) int {
		v := getenv(name)
		if v == "" {
			return 0
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			bad(name, v, "want a whole number, 0 or more")
		}
		return n
	}
	dur := func(name string, def time.Duration) time.Duration {
		v := getenv(name)
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			bad(name, v, "want a duration such as \"30s\" or \"250ms\"")
		}
		return d
	}
	probe := func(name string) *Probe {
		v := getenv(name)
		if v == "" {
			return nil
		}
		var p Probe
		dec := json.NewDecoder(strings.NewReader(v))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&p); err != nil {
			bad(name, v, "want a JSON probe as the compiler writes it: "+err.Error())
			return nil
		}
		for _, pr := range p.validate(name) {
			errs = append(errs, errors.New(pr.Error()))
		}
		return &p
	}

	c.Port = port(EnvSidecarPort, true)
	c.AppHost = getenv(EnvSidecarAppHost)
	if c.AppHost == "" {
		c.AppHost = DefaultAppHost
	} else if strings.ContainsAny(c.AppHost, " /:") && !strings.HasPrefix(c.AppHost, "[") {
		bad(EnvSidecarAppHost, c.AppHost, "want a host name or IP address, without a port")
	}
	c.AppPort = port(EnvSidecarAppPort, true)
	switch v := getenv(EnvSidecarAppProtocol); v {
	case "", ProtocolHTTP1:
	case ProtocolH2C:
		c.AppProtocol = v
	default:
		bad(EnvSidecarAppProtocol, v, "want h2c, or http1 (the default)")
	}
	c.AdminPort = port(EnvSidecarAdminPort, true)
	c.Service = getenv(EnvSidecarService)
	c.Revision = getenv(EnvSidecarRevision)
	c.Instance = getenv(EnvSidecarInstance)
	c.Concurrency = count(EnvSidecarConcurrency)
	c.QueueDepth = count(EnvSidecarQueueDepth)
	if getenv(EnvSidecarQueueDepth) == "" {
		c.QueueDepth = c.Concurrency * DefaultQueueDepthFactor
	}
	c.Timeout = dur(EnvSidecarTimeout, DefaultTimeout)
	c.ResponseStartTimeout = dur(EnvSidecarRespStart, 0)
	c.IdleTimeout = dur(EnvSidecarIdle, 0)
	c.Readiness = probe(EnvSidecarReadiness)
	c.Liveness = probe(EnvSidecarLiveness)
	c.DrainGrace = dur(EnvSidecarDrainGrace, defaultDrainGrace)
	c.DrainTimeout = dur(EnvSidecarDrainLimit, DefaultKillTimeout-time.Second)
	switch v := getenv(EnvSidecarAccessLog); v {
	case "", "false", "0":
	case "true", "1":
		c.AccessLog = true
	default:
		bad(EnvSidecarAccessLog, v, "want true or false")
	}

	if c.Service == "" {
		errs = append(errs, fmt.Errorf("%s is not set: the sidecar needs the service name for its stats and metrics", EnvSidecarService))
	}
	if c.Revision == "" {
		errs = append(errs, fmt.Errorf("%s is not set: the sidecar needs the revision name for its stats and metrics", EnvSidecarRevision))
	}
	if c.Port != 0 && c.Port == c.AdminPort || c.AppHost == DefaultAppHost && (c.Port != 0 && c.Port == c.AppPort || c.AppPort != 0 && c.AppPort == c.AdminPort) {
		errs = append(errs, fmt.Errorf("ports must differ: %s=%d %s=%d %s=%d", EnvSidecarPort, c.Port, EnvSidecarAppPort, c.AppPort, EnvSidecarAdminPort, c.AdminPort))
	}
	if c.Timeout == 0 {
		bad(EnvSidecarTimeout, getenv(EnvSidecarTimeout), "want a positive duration")
	}
	if c.DrainGrace > c.DrainTimeout {
		errs = append(errs, fmt.Errorf("%s (%s) is longer than %s (%s)", EnvSidecarDrainGrace, c.DrainGrace, EnvSidecarDrainLimit, c.DrainTimeout))
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("sidecar configuration: %w", errors.Join(errs...))
	}
	return c, nil
}
