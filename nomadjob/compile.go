package nomadjob

import (
	"errors"
	"fmt"
	"maps"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Job meta keys beyond spec/contract.go's, written by nomadjob and read by
// the gateway (timeout) and the CLI (created).
const (
	// JobMetaTimeout is the revision's whole-request timeout as a Go
	// duration, so the gateway can bound a request without the spec.
	JobMetaTimeout = "serverless.timeout"
	// JobMetaCreated is when Client.Register first registered the
	// revision (RFC 3339, UTC). Compile does not write it, so compiling
	// stays pure; Nomad's SubmitTime changes on every scale.
	JobMetaCreated = "serverless.created"
)

// Names inside the compiled job that are ours rather than the contract's.
const (
	CheckReady    = "ready"
	CheckLiveness = "liveness"
	// LivenessPath is where the sidecar answers the user's liveness
	// probe on the admin port.
	LivenessPath = "/liveness"
)

// Restart and reschedule policy of every revision. A serverless instance is
// cheap to replace and is waited on by a request or a deploy, so failures
// must surface fast rather than back off for minutes as Nomad's defaults
// (15 s between restarts, 30 s+ before rescheduling) do:
//   - restart: up to 3 restarts within 1 minute, 1 s apart, then fail the
//     allocation ("fail" mode) so deploy sees "restarts exceeded";
//   - reschedule: without limit, starting 5 s after a failure and doubling
//     up to 1 minute, like Kubernetes' CrashLoopBackOff, so a revision that
//     must keep min instances keeps trying without hammering the cluster.
const (
	restartAttempts      = 3
	restartInterval      = time.Minute
	restartDelay         = time.Second
	restartMode          = "fail"
	rescheduleDelay      = 5 * time.Second
	rescheduleMaxDelay   = time.Minute
	rescheduleDelayFunc  = "exponential"
	rescheduleUnlimited  = true
	defaultLivenessCheck = spec.DefaultLivenessPeriod
)

// Compile builds the Nomad job of a revision, exactly as DESIGN.md's
// "Contract between the parts" describes it. It does no I/O and returns
// equal jobs for equal inputs. It checks only what it needs; validating
// the service (spec.Service.Validate) is the caller's job.
func Compile(rev spec.Revision, opts Options) (*api.Job, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	name := rev.Name()
	if err := checkRevision(rev, o); err != nil {
		return nil, fmt.Errorf("compile revision %s: %w", name, err)
	}
	t := rev.Template

	job := &api.Job{
		ID:          new(name),
		Name:        new(name),
		Type:        new(api.JobTypeService),
		Namespace:   new(rev.Namespace),
		Datacenters: append([]string(nil), t.Datacenters...),
		Meta: map[string]string{
			spec.JobMetaService:   rev.Service,
			spec.JobMetaRevision:  name,
			spec.JobMetaGen:       strconv.Itoa(rev.Generation),
			spec.JobMetaSpecHash:  rev.SpecHash,
			spec.JobMetaConcurren: strconv.Itoa(t.Concurrency),
			JobMetaTimeout:        t.Timeout.String(),
		},
		// Deployments off: with an update block every scale call becomes
		// a deployment and the next one is refused until it finishes
		// ("job scaling blocked due to active deployment"), which would
		// stall a wake from zero followed by a burst. Revisions never
		// change in place, so deployments buy nothing.
		Update: &api.UpdateStrategy{MaxParallel: new(0)},
	}
	g, err := group(rev, o)
	if err != nil {
		return nil, fmt.Errorf("compile revision %s: %w", name, err)
	}
	job.TaskGroups = []*api.TaskGroup{g}
	if t.Region != "" {
		job.Region = new(t.Region)
	}
	if t.NodePool != "" {
		job.NodePool = new(t.NodePool)
	}
	for _, c := range t.Constraints {
		job.Constraints = append(job.Constraints, &api.Constraint{LTarget: c.Attribute, Operand: c.Operator, RTarget: c.Value})
	}
	return job, nil
}

func checkRevision(rev spec.Revision, o Options) error {
	var errs []error
	if _, _, ok := spec.ParseRevisionName(rev.Name()); !ok || rev.Service == "" {
		errs = append(errs, fmt.Errorf("service %q generation %d does not make a revision name", rev.Service, rev.Generation))
	}
	if rev.Namespace == "" {
		errs = append(errs, errors.New("namespace is empty"))
	}
	t := rev.Template
	if t.Task.Driver == "" {
		errs = append(errs, errors.New("the template has no task driver"))
	}
	switch t.Network.Mode {
	case spec.NetworkHost, spec.NetworkBridge:
	default:
		errs = append(errs, fmt.Errorf("network mode %q is not supported (host or bridge)", t.Network.Mode))
	}
	if t.Connect != nil && t.Network.Mode != spec.NetworkBridge {
		errs = append(errs, errors.New("connect needs bridge networking"))
	}
	if t.Network.Mode == spec.NetworkBridge && (t.Task.Port < 1 || t.Task.Port > 65535) {
		errs = append(errs, fmt.Errorf("app port %d is not a port", t.Task.Port))
	}
	lo, hi := nomadBounds(rev.Scaling, o.UnboundedMax)
	if lo < 0 || lo > hi {
		errs = append(errs, fmt.Errorf("scaling min %d is outside 0..%d", lo, hi))
	}
	return errors.Join(errs...)
}

// initialCount is the count a new revision starts with: Initial, raised to
// Min and lowered to the max Nomad enforces (Nomad refuses a count outside
// the scaling block).
func initialCount(s spec.Scaling, unbounded int) int {
	lo, hi := nomadBounds(s, unbounded)
	return min(max(s.Initial, lo), hi)
}

func group(rev spec.Revision, o Options) (*api.TaskGroup, error) {
	t := rev.Template
	scaling, err := scalingBlock(rev.Scaling, o.UnboundedMax)
	if err != nil {
		return nil, err
	}
	g := &api.TaskGroup{
		Name:     new(spec.GroupName),
		Count:    new(initialCount(rev.Scaling, o.UnboundedMax)),
		Scaling:  scaling,
		Networks: []*api.NetworkResource{network(t)},
		Services: []*api.Service{consulService(rev, o)},
		RestartPolicy: &api.RestartPolicy{
			Attempts: new(restartAttempts),
			Interval: new(restartInterval),
			Delay:    new(restartDelay),
			Mode:     new(restartMode),
		},
		ReschedulePolicy: &api.ReschedulePolicy{
			Delay:         new(rescheduleDelay),
			DelayFunction: new(rescheduleDelayFunc),
			MaxDelay:      new(rescheduleMaxDelay),
			Unlimited:     new(rescheduleUnlimited),
		},
		Tasks:   append([]*api.Task{userTask(rev), sidecarTask(rev, o)}, sideTasks(rev)...),
		Volumes: volumes(t.Volumes),
	}
	for _, task := range g.Tasks {
		if task.Name != spec.SidecarTaskName {
			writeOwnLogs(task, o)
		}
	}
	if d := t.EphemeralDisk; d != nil {
		g.EphemeralDisk = &api.EphemeralDisk{SizeMB: new(d.SizeMB), Sticky: new(d.Sticky), Migrate: new(d.Migrate)}
	}
	if o.ShutdownDelay > 0 {
		g.ShutdownDelay = new(o.ShutdownDelay)
	}
	return g, nil
}

// network: host mode gives the sidecar, the app and the admin port each a
// dynamic port. Bridge mode gives the allocation its own network namespace:
// the app listens on its fixed port inside it, unexposed (Nomad has no way
// to declare a port label without binding a host port, so the app's port is
// not a label at all), and only the sidecar's http and admin ports are
// mapped to the host.
func network(t spec.Template) *api.NetworkResource {
	if t.Network.Mode == spec.NetworkBridge {
		return &api.NetworkResource{
			Mode:         "bridge",
			DynamicPorts: onHostNetwork(t.Network, []api.Port{{Label: spec.PortHTTP}, {Label: spec.PortAdmin}}),
		}
	}
	app := api.Port{Label: spec.PortApp}
	if publishesAppPort(t) {
		app.To = t.Task.Port
	}
	return &api.NetworkResource{
		Mode:         "host",
		DynamicPorts: onHostNetwork(t.Network, []api.Port{{Label: spec.PortHTTP}, app, {Label: spec.PortAdmin}}),
	}
}

// publishesAppPort reports whether the user task is a container in host
// networking whose port Nomad publishes: the container keeps its own
// network, the app listens on its declared port inside it (nginx on 80, say,
// whatever PORT says), and Nomad maps a dynamic port of the node's address to
// it. Two instances on one node then never fight over the same port. A user
// who sets network_mode or ports in the driver config chose otherwise.
func publishesAppPort(t spec.Template) bool {
	if t.Network.Mode != spec.NetworkHost || !isContainerDriver(t.Task.Driver) {
		return false
	}
	_, mode := t.Task.Config["network_mode"]
	_, ports := t.Task.Config["ports"]
	return !mode && !ports
}

// PublishesDockerPort reports whether a revision's queue-proxy starts
// beside its app or after it depending on Options.DockerAnnounces: its app
// is a docker container whose port Nomad publishes.
func PublishesDockerPort(t spec.Template) bool {
	return publishesAppPort(t) && t.Task.Driver == "docker"
}

// appPort is the app's port as the app itself sees it (its PORT): the fixed
// number in bridge mode and inside a published container, Nomad's
// interpolation otherwise.
func appPort(t spec.Template) string {
	if t.Network.Mode == spec.NetworkBridge || publishesAppPort(t) {
		return strconv.Itoa(t.Task.Port)
	}
	return "${NOMAD_PORT_" + spec.PortApp + "}"
}

// sidecarAppAddress is where the sidecar reaches the app: a published
// container port is bound on the node's address, everything else listens
// on loopback (bridge mode shares the allocation's namespace).
func sidecarAppAddress(t spec.Template) (host, port string) {
	if publishesAppPort(t) {
		return "${NOMAD_IP_" + spec.PortApp + "}", "${NOMAD_HOST_PORT_" + spec.PortApp + "}"
	}
	return spec.DefaultAppHost, appPort(t)
}

func consulService(rev spec.Revision, o Options) *api.Service {
	t := rev.Template
	name := rev.Name()
	tags := append([]string{spec.TagServerless, spec.TagServicePrefix + rev.Service}, t.Tags...)
	meta := maps.Clone(t.Meta)
	if meta == nil {
		meta = map[string]string{}
	}
	meta[spec.ServiceMetaService] = rev.Service
	meta[spec.ServiceMetaRevision] = name
	// The autoscaler scrapes each instance's stats on the admin port; it
	// learns the port from Consul with the instance.
	meta[spec.ServiceMetaAdminPort] = "${NOMAD_HOST_PORT_" + spec.PortAdmin + "}"

	svc := &api.Service{
		Name:      name,
		PortLabel: spec.PortHTTP,
		Provider:  api.ServiceProviderConsul,
		Tags:      tags,
		Meta:      meta,
		Checks: []api.ServiceCheck{{
			// Passes only when the user's readiness passes and the
			// sidecar is not draining: Consul health wraps readiness.
			Name:      CheckReady,
			Type:      "http",
			Path:      "/",
			PortLabel: spec.PortHTTP,
			Interval:  o.CheckInterval,
			Timeout:   o.CheckTimeout,
			Header:    map[string][]string{spec.ProbeHeader: {spec.ProbeHeaderValue}},
		}},
	}
	if p := t.Liveness; p != nil {
		period := p.Period
		if period <= 0 {
			period = defaultLivenessCheck
		}
		timeout := p.Timeout
		if timeout <= 0 || timeout > period {
			timeout = min(time.Second, period)
		}
		svc.Checks = append(svc.Checks, api.ServiceCheck{
			Name:      CheckLiveness,
			Type:      "http",
			Path:      LivenessPath,
			PortLabel: spec.PortAdmin,
			TaskName:  spec.UserTaskName,
			Interval:  period,
			Timeout:   timeout,
			// Consul staggers a check's first run by up to its interval
			// and marks it critical until then; liveness must not hold a
			// fresh instance out of the pool, so it starts passing.
			InitialStatus: "passing",
			CheckRestart: &api.CheckRestart{
				Limit: max(p.FailureThreshold, 1),
				Grace: new(p.InitialDelay + o.LivenessGrace),
			},
		})
	}
	if t.Connect != nil {
		proxy := &api.ConsulProxy{}
		for _, u := range t.Connect.Upstreams {
			proxy.Upstreams = append(proxy.Upstreams, &api.ConsulUpstream{DestinationName: u.Destination, LocalBindPort: u.LocalBindPort})
		}
		svc.Connect = &api.ConsulConnect{SidecarService: &api.ConsulSidecarService{Proxy: proxy}}
	}
	return svc
}

func userTask(rev spec.Revision) *api.Task {
	t := rev.Template
	env := maps.Clone(t.Task.Env)
	if env == nil {
		env = map[string]string{}
	}
	env[spec.EnvPort] = appPort(t)
	env[spec.EnvKService] = rev.Service
	env[spec.EnvConfiguration] = rev.Service
	env[spec.EnvRevision] = rev.Name()

	task := &api.Task{
		Name:   spec.UserTaskName,
		Driver: t.Task.Driver,
		Config: driverConfig(t),
		Env:    env,
		User:   t.Task.User,
		Resources: &api.Resources{
			CPU:      new(t.Task.Resources.CPU),
			MemoryMB: new(t.Task.Resources.MemoryMB),
		},
		KillTimeout: new(t.Task.KillTimeout),
		// The leader is stopped first when the instance stops, before
		// the other main tasks (the queue-proxy, see sidecarLifecycle)
		// and the sidecars: the proxy outlives the app it drains. It
		// also ends the instance when the app ends for good, as it did
		// when the app was the only main task.
		Leader:       true,
		VolumeMounts: volumeMounts(t.Task.VolumeMounts),
	}
	addFiles(task, t.Task.Artifacts, t.Task.Templates)
	return task
}

// addFiles adds a task's artifacts and templates.
func addFiles(task *api.Task, artifacts []spec.Artifact, templates []spec.TaskTemplate) {
	for _, a := range artifacts {
		art := &api.TaskArtifact{GetterSource: new(a.Source), GetterOptions: maps.Clone(a.Options)}
		if a.Destination != "" {
			art.RelativeDest = new(a.Destination)
		}
		if a.Mode != "" {
			art.GetterMode = new(a.Mode)
		}
		task.Artifacts = append(task.Artifacts, art)
	}
	for _, tp := range templates {
		tmpl := &api.Template{DestPath: new(tp.Destination)}
		if tp.Data != "" {
			tmpl.EmbeddedTmpl = new(tp.Data)
		}
		if tp.Source != "" {
			tmpl.SourcePath = new(tp.Source)
		}
		if tp.ChangeMode != "" {
			tmpl.ChangeMode = new(tp.ChangeMode)
		}
		if tp.Env {
			tmpl.Envvars = new(true)
		}
		task.Templates = append(task.Templates, tmpl)
	}
}

// driverConfig is the user's driver config, copied; a container in host
// networking gets its app port published (see publishesAppPort). In bridge
// mode Nomad joins the containers to the allocation's namespace itself.
func driverConfig(t spec.Template) map[string]any {
	cfg := cloneConfig(t.Task.Config)
	if publishesAppPort(t) {
		cfg["ports"] = []string{spec.PortApp}
	}
	return cfg
}

// cloneConfig copies a driver config; nil stays an empty config, which
// Nomad requires.
func cloneConfig(c map[string]any) map[string]any {
	cfg := cloneValue(c).(map[string]any)
	if cfg == nil {
		cfg = map[string]any{}
	}
	return cfg
}

func isContainerDriver(d string) bool { return d == "docker" || d == "podman" }

// cloneValue deep-copies the JSON-like values of a driver config so the
// job never aliases the revision's template.
func cloneValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		if x == nil {
			return map[string]any(nil)
		}
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = cloneValue(e)
		}
		return m
	case []any:
		l := make([]any, len(x))
		for i, e := range x {
			l[i] = cloneValue(e)
		}
		return l
	case []string:
		return append([]string(nil), x...)
	case map[string]string:
		return maps.Clone(x)
	default:
		return v
	}
}

// sidecarLifecycle is when the queue-proxy starts. Everywhere but beside
// a published container it is a main task (nil: no hook) that Nomad starts
// at the same time as the app, as Knative starts queue-proxy and the user
// container together: a prestart sidecar would cost a wake the time
// between Nomad starting it and then the app (121 ms, then 103 ms more
// on a Nomad 2.0.5 dev agent, raw_exec). The app is the group's leader,
// so on stop Nomad still stops it first and the proxy after it.
//
// Beside a container whose app port is published (publishesAppPort) it
// is a poststart sidecar, started once the container runs. The sidecar
// reaches such an app at the published port, and a connection made there
// before the container's network is up waits a whole ARP retry (1 s on
// Linux): the host resolves the container's address on the first packet,
// no one answers yet, and every packet to that address queues until the
// retry. A sidecar started with the container has its first readiness
// probes in that window on every cold start (median first byte of a wake
// 1.34 s on a Nomad 1.6 dev agent with dockerd 20.10, e2e scenario 18;
// 0.75 s poststart). Docker 28 and later announce a container's address
// (an unsolicited ARP) as its network comes up, which ends the wait at
// once: with Options.DockerAnnounces (every docker engine of the cluster
// that new, DockerAnnounces) the queue-proxy starts with a docker app too.
// In bridge mode the sidecar reaches the app on the allocation's loopback,
// and exec and raw_exec apps on the node's.
//
// The order of a group's tasks, which Nomad runs hook by hook: the
// user's prestart tasks (init steps run to completion, sidecars keep
// running), then the main tasks together (the app, the queue-proxy and
// named tasks without a hook), then the poststart tasks (the queue-proxy
// here beside a published container); on stop the leader (the app), the
// other main tasks, the sidecars, and last the poststop tasks.
func sidecarLifecycle(t spec.Template, o Options) *api.TaskLifecycle {
	if publishesAppPort(t) && !(PublishesDockerPort(t) && o.DockerAnnounces) {
		return &api.TaskLifecycle{Hook: api.TaskLifecycleHookPoststart, Sidecar: true}
	}
	return nil
}

// SidecarProcs is the GOMAXPROCS a sidecar reserving cpuMHz runs with: one
// per 1,000 MHz of its reservation, rounded up. Go would otherwise start
// one per core of the node, and a proxy sharing the node with its app (and
// on a busy node with everyone's) spends on idle spinning threads and
// cross-thread hand-offs what it has not reserved: on a two-core machine
// shared by client, proxy and app, one P gave 9 to 19 % more requests a
// second than two, at less CPU per request (make bench-sidecar
// -proxy-env GOMAXPROCS=1, paired against HAProxy in the same runs).
// Envoy sidecars are sized the same way (Istio's concurrency 2).
func SidecarProcs(cpuMHz int) int {
	return max(1, (cpuMHz+999)/1000)
}

// SidecarLogFile is the queue-proxy's log, which a raw_exec sidecar writes
// itself (tasklog.File) where Nomad would have, under the names Nomad's
// logmon gives (queue-proxy.stderr.0, .1, ...), so that Nomad's logs API
// and `nomad alloc logs` read it as any task's. Nomad then collects no log
// of the task: its logmon is a process (a copy of the nomad binary)
// spawned before the task starts, on the path of every wake, and kept for
// the instance's life. Only raw_exec: Nomad 2.0 mounts the allocation's
// logs directory read-only into docker containers and exec chroots, so
// there the sidecar's log stays Nomad's to collect.
const SidecarLogFile = "${NOMAD_ALLOC_DIR}/logs/" + spec.SidecarTaskName + ".stderr"

func sidecarTask(rev spec.Revision, o Options) *api.Task {
	t := rev.Template
	env := spec.SidecarConfigForRevision(rev).Env()
	env[spec.EnvSidecarPort] = "${NOMAD_PORT_" + spec.PortHTTP + "}"
	appHost, appPortEnv := sidecarAppAddress(t)
	if appHost != spec.DefaultAppHost {
		env[spec.EnvSidecarAppHost] = appHost
	}
	env[spec.EnvSidecarAppPort] = appPortEnv
	env[spec.EnvSidecarAdminPort] = "${NOMAD_PORT_" + spec.PortAdmin + "}"
	env[spec.EnvSidecarInstance] = "${NOMAD_ALLOC_ID}"
	s := o.Sidecar
	env["GOMAXPROCS"] = strconv.Itoa(SidecarProcs(s.CPU))
	for k, v := range o.SidecarEnv {
		if _, set := env[k]; !set {
			env[k] = v
		}
	}
	task := &api.Task{
		Name:      spec.SidecarTaskName,
		Lifecycle: sidecarLifecycle(t, o),
		Env:       env,
		Resources: &api.Resources{CPU: new(s.CPU), MemoryMB: new(s.MemoryMB)},
		// The sidecar drains within the user's kill_timeout
		// (spec.SidecarConfigForRevision), so it gets the same.
		KillTimeout: new(t.Task.KillTimeout),
	}
	switch {
	case s.Image != "":
		task.Driver = "docker"
		task.Config = map[string]any{"image": s.Image, "args": []string{SidecarCommandArg}}
		if t.Network.Mode == spec.NetworkHost {
			task.Config["network_mode"] = "host"
		}
	case s.Command != "":
		task.Driver = "raw_exec"
		task.Config = map[string]any{"command": s.Command, "args": []string{SidecarCommandArg}}
	default:
		task.Driver = s.ArtifactDriver
		task.Config = map[string]any{"command": s.ArtifactCommand, "args": []string{SidecarCommandArg}}
		task.Artifacts = []*api.TaskArtifact{{GetterSource: new(s.ArtifactURL), RelativeDest: new("local/")}}
	}
	if task.Driver == "raw_exec" {
		// The sidecar writes its log itself: no logmon to spawn.
		env[spec.EnvSidecarLogFile] = SidecarLogFile
		task.LogConfig = &api.LogConfig{Disabled: new(true)}
	}
	return task
}
