package install

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/nomad/api"
)

// Options is everything `install` needs to render the control plane's
// Nomad job and its ACL policies. Validate reports every bad field at once.
type Options struct {
	JobName     string
	Namespace   string // Nomad namespace the control-plane job runs in
	Region      string
	Datacenters []string
	Replicas    int

	Domain string
	// GatewayIP is the address the gateway's HTTP and HTTPS listeners
	// bind on each node: "" for every interface, or one address such as
	// ${NOMAD_IP_gateway} (the node address Nomad gave the port) on a node
	// with a public and a private side.
	GatewayIP   string
	GatewayPort int
	AdminPort   int
	// InternalPort is the gateway's internal listener on each node (0:
	// none), where internal services (visibility = "internal") are
	// served beside public ones. It binds the address Nomad gives the
	// port (${NOMAD_IP_internal}: the node's own, private address, not
	// every interface as the gateway's ports do).
	InternalPort int
	// HTTPSPort is the gateway's HTTPS port on each node (0: no HTTPS).
	// ACMEEmail turns ACME on (serve -acme-email), from ACMEDirectory
	// ("" is serve's default, Let's Encrypt).
	HTTPSPort     int
	ACMEEmail     string
	ACMEDirectory string

	// Exactly one way to get the binary onto the node: a Docker image
	// (driver docker) or an artifact URL (driver exec).
	Image    string
	Artifact string

	// NomadAuth is how serve reaches Nomad: "identity" (Nomad 1.7+: the task
	// API socket with the task's workload identity), "variable" (NomadAddr
	// plus a token kept in the job's Nomad Variable) or "none" (NomadAddr, no
	// ACLs).
	NomadAuth string
	NomadAddr string
	// ConsulAuth is "variable" (token kept in the job's Nomad Variable) or
	// "none" (Consul without ACLs).
	ConsulAuth string
	ConsulAddr string
	// ConsulTLS is "variable" (Consul's HTTPS with mutual TLS: the CA,
	// a client certificate and its key, kept in the job's Nomad Variable
	// beside the token) or "none" (plain HTTP, or HTTPS verified against
	// the image's or node's roots).
	ConsulTLS string

	// GatewayTags are extra Consul tags on the gateway service, for a
	// catalog-driven proxy in front (Fabio's urlprefix-, Traefik's
	// traefik.*).
	GatewayTags []string

	// ServiceNamespace is the Nomad namespace the revision jobs live in;
	// the ACL policies grant access there ("*" for every namespace).
	ServiceNamespace string

	CPU      int
	MemoryMB int

	// Tracing is the OTEL_* environment of serve (the OTLP endpoint, the
	// sampler, the resource): install passes its own (tracing.Settings,
	// plus OTEL_SERVICE_NAME), and serve publishes it for the revisions'
	// sidecars. Empty: tracing off.
	Tracing map[string]string
}

// Nomad and Consul authentication modes of the control-plane job.
const (
	AuthIdentity = "identity"
	AuthVariable = "variable"
	AuthNone     = "none"
)

// Names shared by the job and the policies.
const (
	groupName      = "control-plane"
	taskName       = "serve"
	keeperTaskName = "sockets"
	gatewayService = "nomad-serverless-gateway"
	portGateway    = "gateway"
	portAdmin      = "admin"
	portHTTPS      = "https"
	portInternal   = "internal"
	// Nomad lets every job read the variables under nomad/jobs/<job ID>
	// without a policy, so the tokens live there.
	varNomadToken  = "nomad_token"
	varConsulToken = "consul_token"
	// The Consul TLS items (-consul-tls variable), PEM each.
	varConsulCA         = "consul_ca"
	varConsulClientCert = "consul_client_cert"
	varConsulClientKey  = "consul_client_key"
)

// imageUID is the user and group of the repository's image
// (distroless's nonroot, 65532:65532).
const imageUID = 65532

// DefaultImage is the image `install` uses when neither -image nor -artifact
// is given: the Dockerfile at the repository root builds it.
func DefaultImage(version string) string {
	tag := "latest"
	if version != "" && version != "dev" {
		tag = version
	}
	return "ghcr.io/nomad-serverless/nomad-serverless:" + tag
}

func Defaults() Options {
	return Options{
		JobName:          "nomad-serverless",
		Namespace:        "default",
		Datacenters:      []string{"*"},
		Replicas:         2,
		Domain:           "example.com",
		GatewayPort:      8080,
		AdminPort:        8081,
		InternalPort:     8082,
		HTTPSPort:        443,
		NomadAuth:        AuthIdentity,
		ConsulAuth:       AuthVariable,
		ConsulAddr:       "127.0.0.1:8500",
		ConsulTLS:        AuthNone,
		ServiceNamespace: "default",
		CPU:              500,
		MemoryMB:         256,
	}
}

var (
	// Nomad job IDs and namespaces: printable, no spaces; we keep to the
	// safe subset so the name also works as a Variable path segment.
	nameRE   = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_-]{0,127}$`)
	domainRE = regexp.MustCompile(`^([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)
)

func (o Options) Validate() error {
	var errs []error
	if !nameRE.MatchString(o.JobName) {
		errs = append(errs, fmt.Errorf("-job %q: want letters, digits, '-' or '_'", o.JobName))
	}
	if !nameRE.MatchString(o.Namespace) {
		errs = append(errs, fmt.Errorf("-namespace %q: want a Nomad namespace name", o.Namespace))
	}
	if o.ServiceNamespace != "*" && !nameRE.MatchString(o.ServiceNamespace) {
		errs = append(errs, fmt.Errorf("-service-namespace %q: want a Nomad namespace name or \"*\"", o.ServiceNamespace))
	}
	if len(o.Datacenters) == 0 {
		errs = append(errs, errors.New("-datacenters: want at least one datacenter (\"*\" for all)"))
	}
	if o.Replicas < 1 {
		errs = append(errs, fmt.Errorf("-replicas %d: want 1 or more", o.Replicas))
	}
	if !domainRE.MatchString(o.Domain) {
		errs = append(errs, fmt.Errorf("-domain %q: want a DNS name such as example.com", o.Domain))
	}
	for _, p := range []struct {
		flag string
		port int
	}{{"-gateway-port", o.GatewayPort}, {"-admin-port", o.AdminPort}} {
		if p.port < 1 || p.port > 65535 {
			errs = append(errs, fmt.Errorf("%s %d: want a port from 1 to 65535", p.flag, p.port))
		}
	}
	if o.GatewayIP != "" && net.ParseIP(o.GatewayIP) == nil && !strings.HasPrefix(o.GatewayIP, "${") {
		errs = append(errs, fmt.Errorf("-gateway-ip %q: want an IP address or a Nomad interpolation such as ${NOMAD_IP_gateway}", o.GatewayIP))
	}
	if o.GatewayPort == o.AdminPort {
		errs = append(errs, fmt.Errorf("-gateway-port and -admin-port are both %d: they must differ", o.GatewayPort))
	}
	if o.HTTPSPort != 0 {
		if o.HTTPSPort < 1 || o.HTTPSPort > 65535 {
			errs = append(errs, fmt.Errorf("-https-port %d: want a port from 1 to 65535, or 0 for no HTTPS", o.HTTPSPort))
		}
		if o.HTTPSPort == o.GatewayPort || o.HTTPSPort == o.AdminPort {
			errs = append(errs, fmt.Errorf("-https-port %d is also the gateway's or the admin API's port: they must differ", o.HTTPSPort))
		}
	}
	if o.InternalPort != 0 {
		if o.InternalPort < 1 || o.InternalPort > 65535 {
			errs = append(errs, fmt.Errorf("-internal-port %d: want a port from 1 to 65535, or 0 for no internal listener", o.InternalPort))
		}
		if o.InternalPort == o.GatewayPort || o.InternalPort == o.AdminPort || o.InternalPort == o.HTTPSPort {
			errs = append(errs, fmt.Errorf("-internal-port %d is also the gateway's, the admin API's or HTTPS's port: they must differ", o.InternalPort))
		}
	}
	if (o.ACMEEmail != "" || o.ACMEDirectory != "") && o.HTTPSPort == 0 {
		errs = append(errs, errors.New("-acme-email and -acme-directory need an HTTPS port (-https-port)"))
	}
	if o.ACMEDirectory != "" && o.ACMEEmail == "" {
		errs = append(errs, errors.New("-acme-directory needs -acme-email, which turns ACME on"))
	}
	if o.Image != "" && o.Artifact != "" {
		errs = append(errs, errors.New("-image and -artifact both given: choose one (docker image, or a binary for the exec driver)"))
	}
	switch o.NomadAuth {
	case AuthIdentity:
		if o.NomadAddr != "" {
			errs = append(errs, errors.New("-nomad-addr is only used with -nomad-auth variable or none: with identity serve talks to the task API socket"))
		}
	case AuthVariable, AuthNone:
		if o.NomadAddr == "" {
			errs = append(errs, fmt.Errorf("-nomad-auth %s needs -nomad-addr (for example http://${attr.unique.network.ip-address}:4646)", o.NomadAuth))
		}
	default:
		errs = append(errs, fmt.Errorf("-nomad-auth %q: want identity, variable or none", o.NomadAuth))
	}
	switch o.ConsulAuth {
	case AuthVariable, AuthNone:
	default:
		errs = append(errs, fmt.Errorf("-consul-auth %q: want variable or none", o.ConsulAuth))
	}
	if o.ConsulAddr == "" {
		errs = append(errs, errors.New("-consul-addr: want the Consul HTTP address serve uses, such as 127.0.0.1:8500"))
	}
	switch o.ConsulTLS {
	case AuthNone:
	case AuthVariable:
		if !strings.HasPrefix(o.ConsulAddr, "https://") {
			errs = append(errs, fmt.Errorf("-consul-tls variable needs an https:// -consul-addr (for example https://${attr.unique.network.ip-address}:8501), not %q", o.ConsulAddr))
		}
	default:
		errs = append(errs, fmt.Errorf("-consul-tls %q: want variable (CA and client certificate from the job's Variable) or none", o.ConsulTLS))
	}
	for _, tag := range o.GatewayTags {
		if tag == "" || strings.ContainsAny(tag, " \t\n") {
			errs = append(errs, fmt.Errorf("-gateway-tags: %q is not a Consul tag (no spaces, not empty)", tag))
		}
	}
	if o.CPU < 1 || o.MemoryMB < 16 {
		errs = append(errs, fmt.Errorf("-cpu %d / -memory %d: want at least 1 MHz and 16 MiB", o.CPU, o.MemoryMB))
	}
	return errors.Join(errs...)
}

// reservedPorts are the static ports of each replica.
func reservedPorts(o Options) []api.Port {
	ports := []api.Port{
		{Label: portGateway, Value: o.GatewayPort},
		{Label: portAdmin, Value: o.AdminPort},
	}
	if o.HTTPSPort != 0 {
		ports = append(ports, api.Port{Label: portHTTPS, Value: o.HTTPSPort})
	}
	if o.InternalPort != 0 {
		ports = append(ports, api.Port{Label: portInternal, Value: o.InternalPort})
	}
	return ports
}

// runsBinary is how a task of the job runs nomad-serverless with args: the
// exec driver with the binary from o.Artifact, or the image with docker in
// the node's network (serve reaches the node's Consul agent on 127.0.0.1
// and sidecars on node addresses, like an exec task).
func runsBinary(o Options, version string, args []string) (driver string, config map[string]any, artifacts []*api.TaskArtifact) {
	if o.Artifact != "" {
		return "exec", map[string]any{"command": "local/nomad-serverless", "args": args},
			[]*api.TaskArtifact{{GetterSource: new(o.Artifact), RelativeDest: new("local/")}}
	}
	image := o.Image
	if image == "" {
		image = DefaultImage(version)
	}
	return "docker", map[string]any{"image": image, "args": args, "network_mode": "host"}, nil
}

// variablePath is the Nomad Variable the job reads its tokens from.
func (o Options) variablePath() string { return "nomad/jobs/" + o.JobName }

// Job builds the Nomad job that runs `serve` with o.Replicas
// replicas spread over nodes, behind the Consul service
// nomad-serverless-gateway whose check is the admin /healthz.
func Job(o Options, version string) *api.Job {
	gatewayListen := fmt.Sprintf("%s:${NOMAD_PORT_%s}", o.GatewayIP, portGateway)
	args := []string{
		"serve",
		// The gateway answers on every interface of the node (a load
		// balancer or DNS round robin points at nodes:gateway-port); the
		// admin API only on the address Consul checks.
		"-listen", gatewayListen,
		"-admin-listen", fmt.Sprintf("${NOMAD_IP_%[1]s}:${NOMAD_PORT_%[1]s}", portAdmin),
		"-domain", o.Domain,
		"-replica", "${NOMAD_ALLOC_ID}",
	}
	if o.HTTPSPort != 0 {
		// HTTPS on every interface too, with certificates from Consul KV
		// (and ACME when an email is given; the CA reaches the HTTP-01
		// challenge on port 80 of the name, which the load balancer maps
		// to the gateway port, and TLS-ALPN-01 on 443).
		args = append(args, "-https-port", fmt.Sprintf("${NOMAD_PORT_%s}", portHTTPS))
		if o.ACMEEmail != "" {
			args = append(args, "-acme-email", o.ACMEEmail)
			if o.ACMEDirectory != "" {
				args = append(args, "-acme-directory", o.ACMEDirectory)
			}
		}
	}

	// The internal listener answers on the node's own address only:
	// internal services are for the cluster, not for whatever reaches
	// the node's other interfaces.
	internalListen := fmt.Sprintf("${NOMAD_IP_%[1]s}:${NOMAD_PORT_%[1]s}", portInternal)
	if o.InternalPort != 0 {
		args = append(args, "-internal-listen", internalListen)
	}

	env := map[string]string{"CONSUL_HTTP_ADDR": o.ConsulAddr}
	for k, v := range o.Tracing {
		env[k] = v
	}
	task := &api.Task{
		Name: taskName,
		Env:  env,
		Resources: &api.Resources{
			CPU:      new(o.CPU),
			MemoryMB: new(o.MemoryMB),
		},
		// serve drains in-flight requests on SIGTERM; the delay lets Consul
		// take the instance out of the gateway service first.
		KillSignal:    "SIGTERM",
		KillTimeout:   new(35 * time.Second),
		ShutdownDelay: 5 * time.Second,
	}
	task.Driver, task.Config, task.Artifacts = runsBinary(o, version, args)

	// The gateway's listening sockets are held by a prestart sidecar of
	// their own and taken by serve at each start (controlplane.
	// SocketKeeper): a serve that crashes, even with SIGKILL, leaves its
	// ports listening, and the connections made until Nomad has
	// restarted it (a second, restart below) wait for it instead of being
	// refused. Binding 443 takes a capability: the keeper binds, so only
	// it needs one.
	socketPath := "${NOMAD_ALLOC_DIR}/gateway-sockets.sock"
	task.Config["args"] = append(args, "-sockets", socketPath)
	keeperArgs := []string{"keep-sockets", "-socket", socketPath, "-listen", gatewayListen}
	if o.HTTPSPort != 0 {
		keeperArgs = append(keeperArgs, "-https-listen", fmt.Sprintf("%s:${NOMAD_PORT_%s}", o.GatewayIP, portHTTPS))
	}
	if o.InternalPort != 0 {
		keeperArgs = append(keeperArgs, "-internal-listen", internalListen)
	}
	keeper := &api.Task{
		Name:      keeperTaskName,
		Lifecycle: &api.TaskLifecycle{Hook: api.TaskLifecycleHookPrestart, Sidecar: true},
		Resources: &api.Resources{CPU: new(20), MemoryMB: new(32)},
	}
	keeper.Driver, keeper.Config, keeper.Artifacts = runsBinary(o, version, keeperArgs)
	if o.HTTPSPort != 0 && o.HTTPSPort < 1024 {
		// A port below 1024 (443) needs CAP_NET_BIND_SERVICE. The exec
		// driver grants it to the task's user; Docker gives it to root
		// only, so in docker the keeper runs as root (serve keeps the
		// image's nonroot user). -https-port 8443 (or 0) behind a load
		// balancer needs neither.
		keeper.Config["cap_add"] = []string{"net_bind_service"}
		if keeper.Driver == "docker" {
			// serve, as the image's user, must be able to connect to
			// the socket the root keeper makes.
			keeper.User = "root"
			keeper.Config["args"] = append(keeperArgs, "-owner", strconv.Itoa(imageUID))
		}
	}

	var secretsEnv []string
	switch o.NomadAuth {
	case AuthIdentity:
		env["NOMAD_ADDR"] = "unix://${NOMAD_SECRETS_DIR}/api.sock"
		// The default workload identity, exposed as NOMAD_TOKEN; the
		// control-plane policy is attached to this job with
		// `nomad acl policy apply -job`.
		task.Identity = &api.WorkloadIdentity{Env: true}
	case AuthVariable:
		env["NOMAD_ADDR"] = o.NomadAddr
		secretsEnv = append(secretsEnv, "NOMAD_TOKEN", varNomadToken)
	case AuthNone:
		env["NOMAD_ADDR"] = o.NomadAddr
	}
	if o.ConsulAuth == AuthVariable {
		secretsEnv = append(secretsEnv, "CONSUL_HTTP_TOKEN", varConsulToken)
	}
	if o.ConsulTLS == AuthVariable {
		// The PEM files go to secrets/ (never in the image or the node's
		// disk outside the allocation) and the Consul client reads them
		// from the variables its DefaultConfig knows. Nomad writes
		// templates as root: in docker the files belong to the image's
		// user, so the key can be private to it; the exec driver's user
		// (nobody) has no fixed uid, so there they keep Nomad's 0644,
		// inside a secrets/ only the task's chroot shows.
		uid, keyPerms := -1, "0644"
		if task.Driver == "docker" {
			uid, keyPerms = imageUID, "0400"
		}
		for _, f := range []struct{ env, item, file, perms string }{
			{"CONSUL_CACERT", varConsulCA, "consul-ca.pem", "0644"},
			{"CONSUL_CLIENT_CERT", varConsulClientCert, "consul-client.pem", "0644"},
			{"CONSUL_CLIENT_KEY", varConsulClientKey, "consul-client-key.pem", keyPerms},
		} {
			env[f.env] = "${NOMAD_SECRETS_DIR}/" + f.file
			tmpl := &api.Template{
				EmbeddedTmpl: new(fmt.Sprintf("{{ with nomadVar %q }}{{ .%s }}{{ end }}\n", o.variablePath(), f.item)),
				DestPath:     new("secrets/" + f.file),
				Perms:        new(f.perms),
				ChangeMode:   new("restart"),
			}
			if uid >= 0 {
				tmpl.Uid, tmpl.Gid = new(uid), new(uid)
			}
			task.Templates = append(task.Templates, tmpl)
		}
	}
	if len(secretsEnv) > 0 {
		var b strings.Builder
		// nomadVar blocks until the Variable exists, so a forgotten token
		// shows as a pending template in the allocation's events instead of
		// a control plane that fails every call.
		fmt.Fprintf(&b, "{{ with nomadVar %q -}}\n", o.variablePath())
		for i := 0; i < len(secretsEnv); i += 2 {
			fmt.Fprintf(&b, "%s={{ .%s }}\n", secretsEnv[i], secretsEnv[i+1])
		}
		b.WriteString("{{- end }}\n")
		task.Templates = append([]*api.Template{{
			EmbeddedTmpl: new(b.String()),
			DestPath:     new("secrets/tokens.env"),
			Envvars:      new(true),
			ChangeMode:   new("restart"),
		}}, task.Templates...)
	}

	// A task service, not a group one: Nomad deregisters a task's
	// services as soon as the task exits (and registers them again when
	// it restarts), so a replica that crashes leaves a catalog-driven
	// proxy's table at once instead of after its check fails (a group
	// service stays registered, passing until the next check, for as long
	// as the allocation lives).
	task.Services = []*api.Service{{
		Name:      gatewayService,
		PortLabel: portGateway,
		Provider:  "consul",
		Tags:      append([]string{"nomad-serverless", "gateway"}, o.GatewayTags...),
		Meta:      map[string]string{"domain": o.Domain},
		Checks: []api.ServiceCheck{{
			Name:      "serve healthz",
			Type:      "http",
			PortLabel: portAdmin,
			Path:      "/healthz",
			Interval:  5 * time.Second,
			Timeout:   2 * time.Second,
		}},
	}}

	group := &api.TaskGroup{
		Name:  new(groupName),
		Count: new(o.Replicas),
		Spreads: []*api.Spread{{
			Attribute: "${node.unique.id}",
		}},
		Networks: []*api.NetworkResource{{
			ReservedPorts: reservedPorts(o),
		}},
		// One replica at a time, healthy by its Consul check, rolled back
		// if a new version never passes.
		Update: &api.UpdateStrategy{
			MaxParallel:     new(1),
			HealthCheck:     new("checks"),
			MinHealthyTime:  new(10 * time.Second),
			HealthyDeadline: new(3 * time.Minute),
			AutoRevert:      new(true),
		},
		// A crashed replica comes back in about a second, not Nomad's
		// default 15 s: while it is down, the stand-ins it registered on
		// its node's Consul agent stay there (only that agent can remove
		// them for good, and the replica does when it starts), critical,
		// so a service deleted meanwhile is not gone from Consul; and the
		// cluster has one gateway fewer. "delay" mode never gives up on
		// the control plane: after Attempts within Interval it waits out
		// the interval and tries again.
		RestartPolicy: &api.RestartPolicy{
			Attempts: new(5),
			Interval: new(time.Minute),
			Delay:    new(time.Second),
			Mode:     new("delay"),
		},
		Tasks: []*api.Task{task, keeper},
	}

	job := &api.Job{
		ID:          new(o.JobName),
		Name:        new(o.JobName),
		Namespace:   new(o.Namespace),
		Type:        new("service"),
		Datacenters: o.Datacenters,
		Constraints: []*api.Constraint{{
			LTarget: "${attr.kernel.name}",
			RTarget: "linux",
			Operand: "=",
		}},
		Meta: map[string]string{
			"nomad-serverless.version": version,
			"nomad-serverless.domain":  o.Domain,
		},
		TaskGroups: []*api.TaskGroup{group},
	}
	if o.Region != "" {
		job.Region = new(o.Region)
	}
	return job
}
