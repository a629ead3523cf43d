package spec

import (
	"encoding/json"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
	"time"
)

// Problem is one reason a service is invalid. Path names the offending
// attribute inside the service block with the HCL spelling ("scaling.min",
// "traffic[1].percent", "task.resources.cpu"), so the HCL layer can point at
// its file:line:col; Detail says what is allowed.
type Problem struct {
	Path    string
	Summary string
	Detail  string
}

func (p Problem) Error() string {
	if p.Detail == "" {
		return p.Path + ": " + p.Summary
	}
	return p.Path + ": " + p.Summary + " " + p.Detail
}

// MaxServiceNameLength keeps "<service>-00001" within a 63-character DNS
// label, which Consul needs for DNS and the gateway for host names.
const MaxServiceNameLength = 63 - 1 - GenerationDigits

var (
	dnsLabel      = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)
	revisionTail  = regexp.MustCompile(`-[0-9]{5}$`)
	hostName      = regexp.MustCompile(`^(\*\.)?([a-z0-9]([-a-z0-9]*[a-z0-9])?\.)*[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	envName       = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	consulMetaKey = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
)

var knownProbeTypes = []ProbeType{ProbeHTTP, ProbeTCP, ProbeGRPC, ProbeExec}

// ValidateName checks a service name.
func ValidateName(name string) *Problem {
	switch {
	case name == "":
		return &Problem{"name", "service name is empty.", "Give the service block a label: service \"hello\" { ... }."}
	case len(name) > MaxServiceNameLength:
		return &Problem{"name", fmt.Sprintf("service name %q is %d characters long.", name, len(name)),
			fmt.Sprintf("At most %d are allowed so that its revision names (%s) stay valid DNS labels for Consul.", MaxServiceNameLength, RevisionName("<name>", 1))}
	case !dnsLabel.MatchString(name):
		return &Problem{"name", fmt.Sprintf("service name %q is not allowed.", name),
			"Use lowercase letters, digits and '-', starting with a letter and not ending with '-' (Consul and DNS need this)."}
	case revisionTail.MatchString(name):
		return &Problem{"name", fmt.Sprintf("service name %q ends like a revision name.", name),
			"A name ending in '-' and five digits would collide with revision names such as " + RevisionName("hello", 1) + "; choose another."}
	case strings.HasPrefix(name, ReservedPrefix):
		return &Problem{"name", fmt.Sprintf("service name %q starts with the reserved prefix %q.", name, ReservedPrefix), "Choose another name."}
	}
	return nil
}

// Validate returns every problem of the service; none means it can be
// deployed. It checks the service alone: whether a named revision exists is
// checked against the cluster by ValidateTrafficRevisions.
func (s *Service) Validate() []Problem {
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{path, summary, detail}) }

	if p := ValidateName(s.Name); p != nil {
		ps = append(ps, *p)
	}
	if !dnsLabel.MatchString(s.Namespace) || len(s.Namespace) > 63 {
		add("namespace", fmt.Sprintf("namespace %q is not allowed.", s.Namespace),
			"Use lowercase letters, digits and '-', starting with a letter (it becomes part of the service's host name).")
	}
	ps = append(ps, s.Template.validate()...)
	ps = append(ps, s.Scaling.validate()...)
	ps = append(ps, validateVolumeScaling(s.Template.Volumes, s.Scaling)...)
	ps = append(ps, validateTraffic(s.Name, s.Traffic)...)
	ps = append(ps, s.Rollout.validate(s)...)
	switch s.Visibility {
	case "", VisibilityPublic, VisibilityInternal:
	default:
		add("visibility", fmt.Sprintf("visibility %q is not one the gateway knows.", s.Visibility),
			fmt.Sprintf("Use %q (served on the gateway's public ports, the default) or %q (served only on the gateway's internal listener, serve -internal-listen, and through the mesh).", VisibilityPublic, VisibilityInternal))
	}
	for i, d := range s.Domains {
		if !hostName.MatchString(d) {
			add(fmt.Sprintf("domains[%d]", i), fmt.Sprintf("domain %q is not a host name.", d),
				"Use lowercase host names such as \"api.example.com\".")
		}
	}
	return ps
}

func (t *Template) validate() []Problem {
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{path, summary, detail}) }

	if len(t.Datacenters) == 0 {
		add("datacenters", "datacenters is empty.", "List at least one datacenter, or \"*\" for all.")
	}
	for i, c := range t.Constraints {
		if c.Attribute == "" && c.Operator != "distinct_hosts" && c.Operator != "distinct_property" {
			add(fmt.Sprintf("constraint[%d].attribute", i), "constraint has no attribute.", "Set attribute, for example \"${attr.kernel.name}\".")
		}
	}
	if t.Task.Driver == "" && len(t.SideTasks) > 0 {
		ps = append(ps, Problem{"task", "the service has no serving task, only named ones.",
			fmt.Sprintf("Named tasks (task %q { ... }) run beside the task that serves traffic, which is written task { ... } without a label (or image = \"...\") and takes port. "+
				"Remove the label from the task that serves.", t.SideTasks[0].Name)})
	} else {
		ps = append(ps, t.Task.validate(t.Network.Mode)...)
	}
	ps = append(ps, t.validateSideTasks()...)
	ps = append(ps, t.validateVolumes()...)

	for _, pr := range []struct {
		name  string
		probe *Probe
	}{{"readiness", t.Readiness}, {"liveness", t.Liveness}} {
		if pr.probe == nil {
			continue
		}
		ps = append(ps, pr.probe.validate(pr.name)...)
		// A container in host networking has only its app port published
		// to the node, so the sidecar cannot reach any other.
		if pr.probe.Port != 0 && pr.probe.Port != t.Task.Port && t.Network.Mode == NetworkHost &&
			(t.Task.Driver == "docker" || t.Task.Driver == "podman") && t.Task.Config["network_mode"] == nil {
			add(pr.name+".port", fmt.Sprintf("%s probes port %d, but only the app's port %d of the container is reachable.", pr.name, pr.probe.Port, t.Task.Port),
				"Probe the app's port, or use network { mode = \"bridge\" } so the sidecar shares the container's network.")
		}
	}

	if t.Concurrency < 0 {
		add("concurrency", fmt.Sprintf("concurrency is %d.", t.Concurrency), "Use 0 for no limit or a positive number of requests per instance.")
	}
	if t.Timeout <= 0 {
		add("timeout", fmt.Sprintf("timeout is %s.", t.Timeout), "Use a positive duration such as \"300s\".")
	}
	if t.ResponseStartTimeout < 0 || (t.Timeout > 0 && t.ResponseStartTimeout > t.Timeout) {
		add("response_start_timeout", fmt.Sprintf("response_start_timeout is %s.", t.ResponseStartTimeout),
			fmt.Sprintf("Use 0 (off) or a positive duration no longer than timeout (%s).", t.Timeout))
	}
	if t.IdleTimeout < 0 {
		add("idle_timeout", fmt.Sprintf("idle_timeout is %s.", t.IdleTimeout), "Use 0 (off) or a positive duration.")
	}

	switch t.Network.Mode {
	case NetworkHost, NetworkBridge:
	default:
		add("network.mode", fmt.Sprintf("network mode %q is not supported.", t.Network.Mode), "Use \"host\" or \"bridge\".")
	}
	if t.Connect != nil {
		if t.Network.Mode != NetworkBridge {
			add("connect", "connect needs bridge networking.", "Add network { mode = \"bridge\" } to the service: Consul Connect sidecars run in the allocation's network namespace.")
		}
		seen := map[int]bool{}
		for i, u := range t.Connect.Upstreams {
			p := fmt.Sprintf("connect.upstream[%d]", i)
			if u.Destination == "" {
				add(p+".destination", "upstream has no destination.", "Name the Consul service to call.")
			}
			if u.LocalBindPort <= 0 || u.LocalBindPort > 65535 {
				add(p+".local_bind_port", fmt.Sprintf("local_bind_port is %d.", u.LocalBindPort), "Use a port from 1 to 65535.")
			} else if seen[u.LocalBindPort] {
				add(p+".local_bind_port", fmt.Sprintf("local_bind_port %d is used twice.", u.LocalBindPort), "Give each upstream its own port.")
			}
			seen[u.LocalBindPort] = true
		}
	}
	for i, tag := range t.Tags {
		if strings.TrimSpace(tag) == "" {
			add(fmt.Sprintf("tags[%d]", i), "tag is empty.", "Remove it or write the tag.")
		}
		if tag == TagActivator || tag == TagServerless || strings.HasPrefix(tag, TagServicePrefix) {
			add(fmt.Sprintf("tags[%d]", i), fmt.Sprintf("tag %q is reserved.", tag),
				fmt.Sprintf("nomad-serverless sets the tags %q, %q and %q itself.", TagServerless, TagActivator, TagServicePrefix+"<service>"))
		}
	}
	for _, k := range slices.Sorted(maps.Keys(t.Meta)) {
		if !consulMetaKey.MatchString(k) {
			add("meta."+k, fmt.Sprintf("meta key %q is not allowed by Consul.", k), "Use letters, digits, '_' and '-' (at most 128).")
		}
		if k == ServiceMetaService || k == ServiceMetaRevision || k == ServiceMetaAdminPort {
			add("meta."+k, fmt.Sprintf("meta key %q is reserved.", k), "nomad-serverless sets it on every revision.")
		}
	}
	return ps
}

func (t *Task) validate(mode NetworkMode) []Problem {
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{path, summary, detail}) }
	if t.Driver == "" {
		add("task", "the service has no task to run.",
			"Add a task block with a driver, for example task { driver = \"docker\" config { image = \"nginx\" } }, or the shorthand image = \"nginx\".")
		return ps
	}
	ps = append(ps, validateProcess("task", process{t.Driver, t.Config, t.Env, t.Resources, t.Artifacts, t.Templates})...)
	if t.Port < 1 || t.Port > 65535 {
		add("task.port", fmt.Sprintf("port is %d.", t.Port), "Use a port from 1 to 65535.")
	}
	switch t.Protocol {
	case "", ProtocolH2C:
	case ProtocolHTTP1:
		add("task.protocol", "protocol is \"http1\" here; it is written as no protocol at all.", "Leave protocol out for HTTP/1.1 (the parser does this for you).")
	default:
		add("task.protocol", fmt.Sprintf("protocol %q is not one the sidecar speaks to an app.", t.Protocol),
			"Use \"http1\" (the default: HTTP/1.1) or \"h2c\" (HTTP/2 without TLS, as a plain gRPC server speaks).")
	}
	if t.KillTimeout < time.Second {
		add("task.kill_timeout", fmt.Sprintf("kill_timeout is %s.", t.KillTimeout), "Use at least \"1s\": the sidecar drains requests in this time.")
	}
	for _, k := range slices.Sorted(maps.Keys(t.Env)) {
		switch k {
		case EnvPort, EnvKService, EnvRevision, EnvConfiguration:
			add("task.env."+k, fmt.Sprintf("%s is set by nomad-serverless.", k), "Remove it: PORT is where the app must listen; K_SERVICE, K_CONFIGURATION and K_REVISION name the revision.")
		}
	}
	return ps
}

// process is what every task runs, the serving one and the named ones.
type process struct {
	driver    string
	config    map[string]any
	env       map[string]string
	resources Resources
	artifacts []Artifact
	templates []TaskTemplate
}

// validateProcess checks what every task has, under path p ("task" or
// "task[migrate]").
func validateProcess(p string, t process) []Problem {
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{p + path, summary, detail}) }
	if _, err := json.Marshal(t.config); err != nil {
		add(".config", "driver config holds a value that cannot be sent to Nomad.", err.Error())
	}
	if t.driver == "docker" || t.driver == "podman" {
		if img, _ := t.config["image"].(string); img == "" {
			add(".config", fmt.Sprintf("the %s driver needs an image.", t.driver), "Set config { image = \"...\" } or the shorthand image = \"...\".")
		}
	}
	if (t.driver == "exec" || t.driver == "raw_exec") && t.config["command"] == nil {
		add(".config", fmt.Sprintf("the %s driver needs a command.", t.driver), "Set config { command = \"/path/to/binary\" }.")
	}
	if t.resources.CPU < 1 {
		add(".resources.cpu", fmt.Sprintf("cpu is %d MHz.", t.resources.CPU), "Nomad needs at least 1 MHz.")
	}
	if t.resources.MemoryMB < 10 {
		add(".resources.memory", fmt.Sprintf("memory is %d MiB.", t.resources.MemoryMB), "Nomad needs at least 10 MiB.")
	}
	for _, k := range slices.Sorted(maps.Keys(t.env)) {
		if !envName.MatchString(k) {
			add(".env."+k, fmt.Sprintf("%q is not an environment variable name.", k), "Use letters, digits and '_', not starting with a digit.")
		}
	}
	for i, a := range t.artifacts {
		if a.Source == "" {
			add(fmt.Sprintf(".artifact[%d].source", i), "artifact has no source.", "Set source to a URL go-getter understands.")
		}
	}
	for i, tp := range t.templates {
		tpp := fmt.Sprintf(".template[%d]", i)
		if tp.Destination == "" {
			add(tpp+".destination", "template has no destination.", "Set destination, for example \"local/config.env\".")
		}
		if (tp.Data == "") == (tp.Source == "") {
			add(tpp, "template needs exactly one of data and source.", "")
		}
	}
	return ps
}

func (p *Probe) validate(name string) []Problem {
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{name + path, summary, detail}) }
	known := false
	for _, t := range knownProbeTypes {
		known = known || p.Type == t
	}
	if !known {
		add("", fmt.Sprintf("%s probe type %q is not supported.", name, p.Type), "Use one of http, tcp, grpc, exec.")
	}
	switch p.Type {
	case ProbeHTTP:
		if !strings.HasPrefix(p.Path, "/") {
			add(".path", fmt.Sprintf("path %q does not start with '/'.", p.Path), "Write an absolute path such as \"/healthz\".")
		}
	case ProbeExec:
		if len(p.Command) == 0 {
			add(".command", "exec probe has no command.", "Set command = [\"/bin/check\", \"arg\"].")
		}
	}
	if p.Port < 0 || p.Port > 65535 {
		add(".port", fmt.Sprintf("port is %d.", p.Port), "Leave it out to probe the app's port, or use 1 to 65535.")
	}
	if p.InitialDelay < 0 {
		add(".initial_delay", fmt.Sprintf("initial_delay is %s.", p.InitialDelay), "Use 0 or a positive duration.")
	}
	if p.Period < 0 {
		add(".period", fmt.Sprintf("period is %s.", p.Period), "Use 0 (probe every 25ms until ready) or a positive duration.")
	}
	if p.Timeout <= 0 {
		add(".timeout", fmt.Sprintf("timeout is %s.", p.Timeout), "Use a positive duration such as \"1s\".")
	} else if p.Period > 0 && p.Timeout > p.Period {
		add(".timeout", fmt.Sprintf("timeout %s is longer than period %s.", p.Timeout, p.Period), "A probe must finish before the next one starts.")
	}
	if p.SuccessThreshold < 1 {
		add(".success_threshold", fmt.Sprintf("success_threshold is %d.", p.SuccessThreshold), "Use 1 or more.")
	}
	if p.FailureThreshold < 1 {
		add(".failure_threshold", fmt.Sprintf("failure_threshold is %d.", p.FailureThreshold), "Use 1 or more.")
	}
	return ps
}

func (s *Scaling) validate() []Problem {
	var ps []Problem
	add := func(path, summary, detail string) { ps = append(ps, Problem{"scaling." + path, summary, detail}) }
	if s.Min < 0 {
		add("min", fmt.Sprintf("min is %d.", s.Min), "Use 0 (scale to zero) or more.")
	}
	if s.Max < 0 {
		add("max", fmt.Sprintf("max is %d.", s.Max), "Use 0 (unbounded) or a positive count.")
	}
	if s.Max > 0 && s.Min > s.Max {
		add("min", fmt.Sprintf("min %d is greater than max %d.", s.Min, s.Max), "Lower min or raise max.")
	}
	if s.Initial < 0 {
		add("initial", fmt.Sprintf("initial is %d.", s.Initial), "Use 0 or more.")
	} else if s.Max > 0 && s.Initial > s.Max {
		add("initial", fmt.Sprintf("initial %d is greater than max %d.", s.Initial, s.Max), "Lower initial or raise max.")
	}
	switch s.Metric {
	case MetricConcurrency, MetricRPS, MetricCPU, MetricMemory:
	default:
		add("metric", fmt.Sprintf("metric %q is not supported.", s.Metric), "Use \"concurrency\", \"rps\", \"cpu\" or \"memory\".")
	}
	switch {
	case s.Metric.Resource() && (s.Target <= 0 || s.Target > 100):
		add("target", fmt.Sprintf("target is %g with metric %q.", s.Target, s.Metric),
			fmt.Sprintf("Use a percentage of the serving task's reserved %s above 0 and at most 100, such as 70.", s.Metric))
	case s.Target <= 0:
		add("target", fmt.Sprintf("target is %g.", s.Target), "Use a positive number of concurrent requests (or requests per second) per instance.")
	}
	if s.Metric.Resource() && s.Min < MinResourceScale {
		add("min", fmt.Sprintf("min is %d, and a service scaled on %s cannot scale to zero.", s.Min, s.Metric),
			fmt.Sprintf("Set min = %d or more (the floor for cpu and memory, as in Knative's HPA class: at zero there is no %s to measure and no request wakes it), or scale on metric = \"concurrency\" to keep scale to zero.", MinResourceScale, s.Metric))
	}
	if s.Utilization <= 0 || s.Utilization > 100 {
		add("utilization", fmt.Sprintf("utilization is %g.", s.Utilization), "Use a percentage above 0 and at most 100.")
	}
	if s.Window < 6*time.Second || s.Window > time.Hour {
		add("window", fmt.Sprintf("window is %s.", s.Window), "Use a duration from \"6s\" to \"1h\" (Knative's bounds).")
	}
	if s.PanicWindowPercentage < 1 || s.PanicWindowPercentage > 100 {
		add("panic_window_percentage", fmt.Sprintf("panic_window_percentage is %g.", s.PanicWindowPercentage), "Use 1 to 100.")
	}
	if s.PanicThresholdPercentage < 110 || s.PanicThresholdPercentage > 1000 {
		add("panic_threshold_percentage", fmt.Sprintf("panic_threshold_percentage is %g.", s.PanicThresholdPercentage), "Use 110 to 1000.")
	}
	if s.ScaleToZeroGrace < 0 {
		add("scale_to_zero_grace", fmt.Sprintf("scale_to_zero_grace is %s.", s.ScaleToZeroGrace), "Use 0 or a positive duration.")
	}
	if s.ScaleDownDelay < 0 || s.ScaleDownDelay > time.Hour {
		add("scale_down_delay", fmt.Sprintf("scale_down_delay is %s.", s.ScaleDownDelay), "Use 0 to \"1h\".")
	}
	if s.BurstCapacity < 0 && s.BurstCapacity != Unlimited {
		add("burst_capacity", fmt.Sprintf("burst_capacity is %g.", s.BurstCapacity), "Use 0 or more, or -1 to keep the activator always in the path.")
	}
	if s.ActivationScale < 1 {
		add("activation_scale", fmt.Sprintf("activation_scale is %d.", s.ActivationScale), "Use 1 or more.")
	} else if s.Max > 0 && s.ActivationScale > s.Max {
		add("activation_scale", fmt.Sprintf("activation_scale %d is greater than max %d.", s.ActivationScale, s.Max), "Lower activation_scale or raise max.")
	}
	if s.MaxScaleUpRate <= 1 {
		add("max_scale_up_rate", fmt.Sprintf("max_scale_up_rate is %g.", s.MaxScaleUpRate), "Use a ratio above 1.")
	}
	if s.MaxScaleDownRate <= 1 {
		add("max_scale_down_rate", fmt.Sprintf("max_scale_down_rate is %g.", s.MaxScaleDownRate), "Use a ratio above 1.")
	}
	return ps
}

func validateTraffic(service string, ts []TrafficTarget) []Problem {
	var ps []Problem
	if len(ts) == 0 {
		return nil
	}
	sum := 0
	tags := map[string]int{}
	for i, t := range ts {
		p := fmt.Sprintf("traffic[%d]", i)
		if t.Latest == (t.Revision != "") {
			ps = append(ps, Problem{p, "traffic target needs exactly one of revision and latest.",
				fmt.Sprintf("Write revision = %q or latest = true.", RevisionName(service, 1))})
		}
		if t.Revision != "" {
			if svc, _, ok := ParseRevisionName(t.Revision); !ok || svc != service {
				ps = append(ps, Problem{p + ".revision", fmt.Sprintf("%q is not a revision of %q.", t.Revision, service),
					fmt.Sprintf("Revisions of this service are named like %q.", RevisionName(service, 1))})
			}
		}
		if t.Percent < 0 || t.Percent > 100 {
			ps = append(ps, Problem{p + ".percent", fmt.Sprintf("percent is %d.", t.Percent), "Use 0 to 100."})
		}
		sum += t.Percent
		if t.Tag != "" {
			if !dnsLabel.MatchString(t.Tag) || len(t.Tag)+1+len(service) > 63 {
				ps = append(ps, Problem{p + ".tag", fmt.Sprintf("tag %q is not allowed.", t.Tag),
					"Use lowercase letters, digits and '-' (it becomes the host name <tag>-<service>, at most 63 characters)."})
			}
			if j, dup := tags[t.Tag]; dup {
				ps = append(ps, Problem{p + ".tag", fmt.Sprintf("tag %q is also used by traffic[%d].", t.Tag, j), "Each tag names one revision."})
			}
			tags[t.Tag] = i
		} else if t.Percent == 0 {
			ps = append(ps, Problem{p + ".percent", "traffic target has neither percent nor tag.", "Give it a percent, a tag, or remove it."})
		}
	}
	if sum != 100 {
		ps = append(ps, Problem{"traffic", fmt.Sprintf("traffic percentages add up to %d.", sum), "They must add up to 100."})
	}
	return ps
}

// ValidateTrafficRevisions checks that every revision the traffic list names
// exists (known holds the service's revisions). It runs at deploy time
// against what Nomad has.
func ValidateTrafficRevisions(s *Service, known map[string]bool) []Problem {
	var ps []Problem
	for i, t := range s.Traffic {
		if t.Revision != "" && !known[t.Revision] {
			names := slices.Sorted(maps.Keys(known))
			detail := "The service has no revisions yet; use latest = true."
			if len(names) > 0 {
				detail = "Known revisions: " + strings.Join(names, ", ") + "."
			}
			ps = append(ps, Problem{fmt.Sprintf("traffic[%d].revision", i), fmt.Sprintf("revision %q does not exist.", t.Revision), detail})
		}
	}
	return ps
}
