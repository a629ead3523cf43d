// Package spec is the model of nomad-serverless: what a user declares (Service,
// Template, Probe, Scaling, Traffic), its defaults, its validation and the
// identity of a revision. It depends on nothing of ours and does no I/O, so
// every other package can share these values.
package spec

import "time"

// Service is one `service "name" {}` block after parsing and defaulting.
//
// Only Template decides a revision's identity: changing Scaling, Traffic,
// Rollout, Domains or HTTPS updates the existing revision and route in place.
type Service struct {
	Name      string   `json:"name"`
	Namespace string   `json:"namespace"`
	Template  Template `json:"template"`
	Scaling   Scaling  `json:"scaling"`
	// Traffic lists how requests split over revisions. Empty means all
	// traffic to the latest revision.
	Traffic []TrafficTarget `json:"traffic,omitempty"`
	// Domains are extra host names the gateway serves for this service, on top
	// of <service>.<namespace>.<domain>.
	Domains []string `json:"domains,omitempty"`
	// HTTPS is how the gateway treats the service's plain HTTP requests.
	HTTPS HTTPS `json:"https,omitzero"`
	// Visibility is who may reach the service through the gateway:
	// VisibilityPublic (also "", as written before the setting existed)
	// on its public ports, VisibilityInternal only on its internal
	// listener (Knative's cluster-local). It is a route setting, not part
	// of the template.
	Visibility Visibility `json:"visibility,omitempty"`
	// Rollout is how the latest share moves to a new revision (nil: at
	// once). A route setting, not part of the template (spec/rollout.go).
	Rollout *Rollout `json:"rollout,omitempty"`
}

// Visibility says on which of the gateway's listeners a service is served.
type Visibility string

const (
	VisibilityPublic   Visibility = "public"
	VisibilityInternal Visibility = "internal"
)

// Internal reports whether the service is served only on the gateway's
// internal listener.
func (s *Service) Internal() bool { return s.Visibility == VisibilityInternal }

// HTTPS is a service's `https {}` block.
type HTTPS struct {
	// Redirect answers a plain HTTP request for one of the service's
	// names with 308 to the same URL over HTTPS, when the gateway holds a
	// valid certificate for the name (never an ACME HTTP-01 challenge).
	Redirect bool `json:"redirect,omitempty"`
}

// Template is everything that ends up inside a revision's Nomad job except its
// count and scaling bounds. Its hash is the revision's identity.
type Template struct {
	Region      string       `json:"region,omitempty"`
	Datacenters []string     `json:"datacenters"`
	NodePool    string       `json:"node_pool,omitempty"`
	Constraints []Constraint `json:"constraints,omitempty"`

	Task      Task   `json:"task"`
	Readiness *Probe `json:"readiness,omitempty"`
	Liveness  *Probe `json:"liveness,omitempty"`

	// Concurrency is the hard limit of requests one instance receives at
	// once; 0 means no limit.
	Concurrency int `json:"concurrency"`
	// Timeout bounds a whole request; ResponseStartTimeout the wait for the
	// first response byte; IdleTimeout the gap between two bytes of a
	// streaming response. Zero disables the last two.
	Timeout              time.Duration `json:"timeout"`
	ResponseStartTimeout time.Duration `json:"response_start_timeout,omitempty"`
	IdleTimeout          time.Duration `json:"idle_timeout,omitempty"`

	Network Network  `json:"network"`
	Connect *Connect `json:"connect,omitempty"`

	// Tags and Meta are added to each revision's Consul service, for
	// catalog-driven ingresses such as Traefik or Fabio.
	Tags []string          `json:"tags,omitempty"`
	Meta map[string]string `json:"meta,omitempty"`

	// SideTasks run beside the serving task (spec/tasks.go); Volumes
	// are the group's volume requests, mounted by name in tasks;
	// EphemeralDisk is the group's scratch disk (Nomad's default when
	// nil). All are omitted when empty so templates written before they
	// existed keep their hash.
	SideTasks     []SideTask     `json:"side_tasks,omitempty"`
	Volumes       []Volume       `json:"volumes,omitempty"`
	EphemeralDisk *EphemeralDisk `json:"ephemeral_disk,omitempty"`
}

// Constraint is a Nomad placement constraint, passed through as written.
type Constraint struct {
	Attribute string `json:"attribute,omitempty"`
	Operator  string `json:"operator,omitempty"`
	Value     string `json:"value,omitempty"`
}

// Task is the user's Nomad task. Config is the driver's own configuration,
// passed to Nomad untouched (JSON-compatible values only).
type Task struct {
	Driver    string            `json:"driver"`
	Config    map[string]any    `json:"config,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Resources Resources         `json:"resources"`
	// Port is where the app listens. The sidecar sets PORT to it; with host
	// networking Nomad picks the real port and PORT tells the app.
	Port int `json:"port"`
	// Protocol is what the app speaks on Port: "" (HTTP/1.1, the
	// default; "http1" in a file) or ProtocolH2C (HTTP/2 without TLS,
	// with prior knowledge: a plain gRPC server). The sidecar speaks it to
	// the app whatever the client spoke, and probes over it.
	Protocol  string         `json:"protocol,omitempty"`
	Artifacts []Artifact     `json:"artifacts,omitempty"`
	Templates []TaskTemplate `json:"templates,omitempty"`
	User      string         `json:"user,omitempty"`
	// KillTimeout is how long Nomad waits after SIGTERM before SIGKILL.
	KillTimeout time.Duration `json:"kill_timeout"`
	// VolumeMounts mount the template's Volumes into the serving task.
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
}

// Resources are the Nomad resources of the user task, in MHz and MiB.
type Resources struct {
	CPU      int `json:"cpu"`
	MemoryMB int `json:"memory"`
}

// Artifact is a Nomad artifact block, passed through.
type Artifact struct {
	Source      string            `json:"source"`
	Destination string            `json:"destination,omitempty"`
	Mode        string            `json:"mode,omitempty"`
	Options     map[string]string `json:"options,omitempty"`
}

// TaskTemplate is a Nomad template block, passed through.
type TaskTemplate struct {
	Data        string `json:"data,omitempty"`
	Source      string `json:"source,omitempty"`
	Destination string `json:"destination"`
	ChangeMode  string `json:"change_mode,omitempty"`
	Env         bool   `json:"env,omitempty"`
}

// NetworkMode is how an instance's ports are exposed.
type NetworkMode string

const (
	// NetworkHost uses the node's network with dynamic ports for the
	// sidecar, the app and the sidecar's admin port.
	NetworkHost NetworkMode = "host"
	// NetworkBridge gives the allocation its own network namespace: the app
	// listens on its fixed port inside it and only the sidecar is exposed.
	NetworkBridge NetworkMode = "bridge"
)

// Network is the allocation's network.
type Network struct {
	Mode NetworkMode `json:"mode"`
	// HostNetwork names the client host network (a client's
	// host_network block) every port of an instance is given an address
	// from; "" is the node's default network. Clusters use it to keep
	// instances on a private network; a dev cluster's nodes each declare
	// one for their own address.
	HostNetwork string `json:"host_network,omitempty"`
}

// Connect makes each revision a Consul service mesh service (requires bridge
// networking). Upstreams are the mesh services the app calls.
type Connect struct {
	Upstreams []Upstream `json:"upstreams,omitempty"`
}

// Upstream is a Consul Connect upstream reachable on 127.0.0.1:LocalBindPort.
type Upstream struct {
	Destination   string `json:"destination"`
	LocalBindPort int    `json:"local_bind_port"`
}

// TrafficTarget is one entry of a service's traffic list.
type TrafficTarget struct {
	// Exactly one of Revision and Latest is set.
	Revision string `json:"revision,omitempty"`
	Latest   bool   `json:"latest,omitempty"`
	Percent  int    `json:"percent"`
	// Tag names a route to this revision alone: <tag>-<service>.<ns>.<domain>
	// on the gateway, header X-Serverless-Tag in the mesh.
	Tag string `json:"tag,omitempty"`
}
