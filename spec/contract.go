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
	// ReservedPrefix starts names users may not take.
	ReservedPrefix = "nomad-serverless"
)

// Request headers.
const (
	// ProbeHeader with value ProbeHeaderValue is answered by the sidecar
	// itself: 200 "queue" when the app is ready and the sidecar not draining.
	ProbeHeader      = "K-Network-Probe"
	ProbeHeaderValue = "queue"
	// RevisionHeader carries the revision a request was routed to.
	RevisionHeader = "X-Serverless-Revision"
	// TagHeader selects a tagged revision in the mesh.
	TagHeader = "X-Serverless-Tag"
)

// Environment given to the user task.
const (
	EnvPort     = "PORT"
	EnvKService = "K_SERVICE"
	EnvRevision = "K_REVISION"
)
