package spec

// The names below are the contract between the parts (DESIGN.md, "Contract
// between the parts"). They live here, at the bottom of the dependency graph,
// so the compiler, the sidecar, the route publisher, the gateway and the
// autoscaler all read the same spelling.

// Nomad job layout.
const (
	GroupName        = "app"
	UserTaskName     = "user"
	SidecarTaskName  = "queue-proxy"
	PortHTTP         = "http"  // sidecar serving port, the Consul service port
	PortApp          = "app"   // the user's app
	PortAdmin        = "admin" // sidecar stats, metrics, liveness
	JobMetaService   = "serverless.service"
	JobMetaRevision  = "serverless.revision"
	JobMetaGen       = "serverless.generation"
	JobMetaSpecHash  = "serverless.spec-hash"
	JobMetaConcurren = "serverless.concurrency"
)

// Consul service conventions. A revision's Consul service is named after the
// revision.
const (
	TagServerless = "serverless"
	// TagServicePrefix + service name is the tag that groups a service's
	// revisions ("service=hello").
	TagServicePrefix = "service="
	// TagActivator marks the stand-in instance the activator registers in a
	// revision's service while it has no ready instance; everything of ours
	// that counts instances ignores it.
	TagActivator = "activator"

	ServiceMetaService   = "service"
	ServiceMetaRevision  = "revision"
	ServiceMetaAdminPort = "admin-port"

	// ActivatorServiceName is the Consul service of the control plane's
	// gateway/activator; revision resolvers fail over to it.
	ActivatorServiceName = "nomad-serverless-activator"
	// InternalServiceName is the Consul service of the gateways'
	// internal listeners (serve -internal-listen), where every service is
	// served, internal ones included; the revisions of an internal
	// service fail over to it instead of ActivatorServiceName.
	InternalServiceName = "nomad-serverless-internal"
	// ReservedPrefix starts names users may not take.
	ReservedPrefix = "nomad-serverless"
)

// Request headers.
const (
	// ProbeHeader with value ProbeHeaderValue is answered by the sidecar
	// itself: 200 "queue" when the app is ready and the sidecar not draining.
	ProbeHeader      = "K-Network-Probe"
	ProbeHeaderValue = "queue"
	// ProbeWaitHeader on such a probe (a Go duration, at most MaxProbeWait)
	// asks the sidecar to hold the probe while its app is not ready, and to
	// answer the moment it becomes ready (or the sidecar drains), or when
	// the wait is over, not ready. The gateway's probe of a new allocation
	// then learns of readiness within the answer's round trip instead of
	// one probe interval later; a sidecar that does not know the header
	// answers at once, and the gateway probes again as before.
	ProbeWaitHeader = "K-Network-Probe-Wait"
	// RevisionHeader carries the revision a request was routed to.
	RevisionHeader = "X-Serverless-Revision"
	// TagHeader selects a tagged revision in the mesh.
	TagHeader = "X-Serverless-Tag"
)

// Response headers between the sidecar and the gateway.
const (
	// NotServedHeader (value NotServedValue) is set by the sidecar, and
	// only by it, on the 502 it answers when the app did not serve a
	// request and another instance may be given it, whatever its method:
	// nothing of the request reached the app (the connection to the app
	// was refused, or broke before any byte of the request was written),
	// or the request is replayable (no body, a method http.Transport
	// replays: GET, HEAD, OPTIONS, TRACE) and the app dropped it without a
	// byte of an answer, on a second connection too, or no longer accepts
	// connections. The gateway retries such a request on
	// another instance and takes this one out of balancing until a probe
	// passes. The sidecar removes the header from the app's own
	// responses and the gateway from every response it passes on, so
	// neither an app nor a client can forge it.
	NotServedHeader = "X-Serverless-Not-Served"
	NotServedValue  = "app-unreachable"
)

// Environment given to the user task.
const (
	EnvPort     = "PORT"
	EnvKService = "K_SERVICE"
	EnvRevision = "K_REVISION"
	// EnvConfiguration is Knative's name for what makes the revisions: a
	// service's template. Here every service has one, named as the
	// service, so K_CONFIGURATION equals K_SERVICE (as in Knative, where a
	// Service's Configuration bears its name).
	EnvConfiguration = "K_CONFIGURATION"
)
