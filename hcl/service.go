package hcl

import (
	"fmt"
	"slices"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A service block's attributes and blocks. Every setting maps to one field of
// spec.Service; what the file leaves out keeps spec.NewService's default.
var (
	serviceAttrs = []string{
		"namespace", "region", "datacenters", "node_pool", "image",
		"concurrency", "timeout", "response_start_timeout", "idle_timeout",
		"tags", "domains", "visibility",
		// With image: what a docker task's users set first.
		"port", "protocol", "args",
	}
	serviceBlocks = []string{"constraint", "task", "readiness", "liveness", "scaling", "traffic", "network", "connect", "resources", "https", "rollout",
		"ephemeral_disk", "volume_mount"}
	// imageShorthand are the task settings the image shorthand takes at the
	// service level, with where each goes in the long form.
	imageShorthand = []struct{ name, longForm string }{
		{"port", "task { port = 8080 }"},
		{"protocol", "task { protocol = \"h2c\" }"},
		{"env", "task { env = { KEY = \"value\" } }"},
		{"resources", "task { resources { cpu = 100 memory = 128 } }"},
		{"args", "task { config { args = [\"--flag\"] } }"},
		{"volume_mount", "task { volume_mount { volume = \"data\" destination = \"/data\" } }"},
	}

	// taskAttrs and taskBlocks are what every task takes (the serving
	// task and the named ones beside it); servingAttrs only the serving
	// task, sideBlocks only the others.
	taskAttrs    = []string{"user", "kill_timeout"}
	taskBlocks   = []string{"config", "resources", "artifact", "template", "volume_mount"}
	servingAttrs = []string{"port", "protocol"}
	sideBlocks   = []string{"lifecycle"}

	probeAttrs = []string{"initial_delay", "period", "timeout", "success_threshold", "failure_threshold", "port"}
	probeTypes = []string{"http", "tcp", "grpc", "exec"}

	scalingAttrs = []string{
		"min", "max", "initial", "target", "metric", "utilization", "window",
		"panic_window_percentage", "panic_threshold_percentage", "scale_to_zero_grace",
		"scale_down_delay", "burst_capacity", "activation_scale", "max_scale_up_rate", "max_scale_down_rate",
	}
)

// schema builds a body schema. mapNames are settings that may be written
// either as a map attribute (env = { A = "1" }) or as a block
// (env { A = "1" }), like Nomad's env and meta: the body decides which.
func schema(body hcl2.Body, attrs, blocks, mapNames []string, required ...string) *hcl2.BodySchema {
	s := &hcl2.BodySchema{}
	for _, a := range attrs {
		s.Attributes = append(s.Attributes, hcl2.AttributeSchema{Name: a, Required: slices.Contains(required, a)})
	}
	for _, b := range blocks {
		s.Blocks = append(s.Blocks, hcl2.BlockHeaderSchema{Type: b})
	}
	sb, _ := body.(*hclsyntax.Body)
	for _, m := range mapNames {
		if sb != nil {
			if _, isAttr := sb.Attributes[m]; isAttr {
				s.Attributes = append(s.Attributes, hcl2.AttributeSchema{Name: m})
				continue
			}
		}
		s.Blocks = append(s.Blocks, hcl2.BlockHeaderSchema{Type: m})
	}
	return s
}

// single returns the only block of type typ, reporting every extra one.
func (d *decoder) single(blocks hcl2.Blocks, typ, where string) *hcl2.Block {
	var first *hcl2.Block
	for _, b := range blocks.OfType(typ) {
		if first == nil {
			first = b
			continue
		}
		d.errorf(typ, b.DefRange, "Duplicate "+typ+" block",
			"%s has at most one %s block; the first is on line %d. Merge them into one.", where, typ, first.DefRange.Start.Line)
	}
	return first
}

// stringMap reads a setting written either as a map attribute or as a block.
func (d *decoder) stringMap(c *hcl2.BodyContent, name, path, where string) (map[string]string, bool) {
	if a := c.Attributes[name]; a != nil {
		return d.strMap(a, path)
	}
	if b := d.single(c.Blocks, name, where); b != nil {
		return d.attrsMap(b, path), true
	}
	return nil, false
}

// content decodes body against s; errors mark path failed (see decoder.failed).
func (d *decoder) content(body hcl2.Body, s *hcl2.BodySchema, path string) *hcl2.BodyContent {
	c, diags := body.Content(s)
	d.addDiags(path, diags)
	return c
}

// decodeService decodes one service block on top of spec.NewService.
func (d *decoder) decodeService(b *hcl2.Block) spec.Service {
	svc := spec.NewService(b.Labels[0])
	d.ranges[""] = b.DefRange
	d.ranges["name"] = b.LabelRanges[0]
	// Named tasks (task "migrate" {}) sit beside the serving task (task
	// {}) under the same block type, which one schema cannot say: they are
	// taken out of the body first and decoded on their own.
	body, named := splitNamedTasks(b.Body)
	s := schema(body, serviceAttrs, serviceBlocks, []string{"meta", "env"})
	s.Blocks = append(s.Blocks, hcl2.BlockHeaderSchema{Type: "volume", LabelNames: []string{"name"}})
	c := d.content(body, s, "")
	a := c.Attributes
	t := &svc.Template

	d.setStr(&svc.Namespace, a["namespace"], "namespace")
	d.setStr(&t.Region, a["region"], "region")
	d.setStrList(&t.Datacenters, a["datacenters"], "datacenters")
	d.setStr(&t.NodePool, a["node_pool"], "node_pool")
	d.setInt(&t.Concurrency, a["concurrency"], "concurrency")
	d.setDuration(&t.Timeout, a["timeout"], "timeout")
	d.setDuration(&t.ResponseStartTimeout, a["response_start_timeout"], "response_start_timeout")
	d.setDuration(&t.IdleTimeout, a["idle_timeout"], "idle_timeout")
	d.setStrList(&t.Tags, a["tags"], "tags")
	if v, ok := d.stringMap(c, "meta", "meta", "A service"); ok {
		t.Meta = v
	}
	d.setStrList(&svc.Domains, a["domains"], "domains")
	if v, ok := d.str(a["visibility"], "visibility"); ok {
		svc.Visibility = spec.Visibility(v)
	}

	for i, cb := range c.Blocks.OfType("constraint") {
		t.Constraints = append(t.Constraints, d.decodeConstraint(cb, fmt.Sprintf("constraint[%d]", i)))
	}

	task := d.single(c.Blocks, "task", "A service")
	if img := a["image"]; img != nil {
		if task != nil {
			d.errorf("task", img.NameRange, "Both image and task are set",
				"image = \"...\" is a shorthand for a docker task, and this service also has a task block on line %d. "+
					"Remove image, or move it into the task block: task { driver = \"docker\" config { image = \"...\" } }.", task.DefRange.Start.Line)
		} else if v, ok := d.str(img, "task.config.image"); ok {
			t.Task.Driver = "docker"
			t.Task.Config = map[string]any{"image": v}
			d.ranges["task"] = img.Range
			d.ranges["task.config"] = img.Expr.Range()
		}
	}
	d.decodeImageShorthand(c, task, &t.Task)
	if task != nil {
		d.decodeServingTask(task, &t.Task)
	}
	d.decodeSideTasks(named, task != nil || a["image"] != nil, t)
	d.decodeVolumes(c.Blocks.OfType("volume"), t)
	if eb := d.single(c.Blocks, "ephemeral_disk", "A service"); eb != nil {
		t.EphemeralDisk = d.decodeEphemeralDisk(eb)
	}

	if rb := d.single(c.Blocks, "readiness", "A service"); rb != nil {
		t.Readiness = d.decodeProbe(rb, "readiness", false)
	}
	if lb := d.single(c.Blocks, "liveness", "A service"); lb != nil {
		t.Liveness = d.decodeProbe(lb, "liveness", true)
	}
	if sb := d.single(c.Blocks, "scaling", "A service"); sb != nil {
		d.decodeScaling(sb, &svc.Scaling)
	}
	for i, tb := range c.Blocks.OfType("traffic") {
		if i == 0 {
			d.ranges["traffic"] = tb.DefRange
		}
		svc.Traffic = append(svc.Traffic, d.decodeTraffic(tb, fmt.Sprintf("traffic[%d]", i)))
	}
	if rb := d.single(c.Blocks, "rollout", "A service"); rb != nil {
		svc.Rollout = d.decodeRollout(rb)
	}
	if nb := d.single(c.Blocks, "network", "A service"); nb != nil {
		d.decodeNetwork(nb, &t.Network)
	}
	if cb := d.single(c.Blocks, "connect", "A service"); cb != nil {
		t.Connect = d.decodeConnect(cb)
	}
	if hb := d.single(c.Blocks, "https", "A service"); hb != nil {
		d.ranges["https"] = hb.DefRange
		hc := d.content(hb.Body, schema(hb.Body, []string{"redirect"}, nil, nil), "https")
		d.setBool(&svc.HTTPS.Redirect, hc.Attributes["redirect"], "https.redirect")
	}
	return svc
}

// decodeImageShorthand reads the task settings written beside image =
// "..." (port, env, resources, args), so that a docker service needs no
// task block. Next to a task block, or without image, each says where it
// goes instead.
func (d *decoder) decodeImageShorthand(c *hcl2.BodyContent, task *hcl2.Block, t *spec.Task) {
	img := c.Attributes["image"]
	for _, s := range imageShorthand {
		var at hcl2.Range
		if a := c.Attributes[s.name]; a != nil {
			at = a.NameRange
		} else if bs := c.Blocks.OfType(s.name); len(bs) > 0 {
			at = bs[0].DefRange
		} else {
			continue
		}
		switch {
		case task != nil:
			d.errorf("task."+s.name, at, "Task setting outside the task block",
				"%s is a setting of the task, and this service has a task block on line %d: move it there, as in %s.",
				s.name, task.DefRange.Start.Line, s.longForm)
			continue
		case img == nil:
			d.errorf("task."+s.name, at, "Task setting without image",
				"%s at the service level goes with the image shorthand (image = \"nginx:1.27\" makes a docker task). "+
					"Add image, or write a task block: %s.", s.name, s.longForm)
			continue
		}
		switch s.name {
		case "port":
			d.setInt(&t.Port, c.Attributes["port"], "task.port")
		case "protocol":
			d.setProtocol(&t.Protocol, c.Attributes["protocol"])
		case "env":
			if v, ok := d.stringMap(c, "env", "task.env", "A service"); ok {
				t.Env = v
			}
		case "resources":
			if rb := d.single(c.Blocks, "resources", "A service"); rb != nil {
				d.decodeResources(rb, &t.Resources, "task.resources")
			}
		case "volume_mount":
			for i, mb := range c.Blocks.OfType("volume_mount") {
				t.VolumeMounts = append(t.VolumeMounts, d.decodeVolumeMount(mb, fmt.Sprintf("task.volume_mount[%d]", i)))
			}
		case "args":
			if v, ok := d.strList(c.Attributes["args"], "task.config.args"); ok && t.Config != nil {
				args := make([]any, len(v))
				for i, a := range v {
					args[i] = a
				}
				t.Config["args"] = args
			}
		}
	}
}

// setProtocol reads the app's protocol; "http1", the default, is stored
// as no protocol, so writing it out changes no revision.
func (d *decoder) setProtocol(dst *string, a *hcl2.Attribute) {
	d.setStr(dst, a, "task.protocol")
	if *dst == spec.ProtocolHTTP1 {
		*dst = ""
	}
}

func (d *decoder) decodeResources(rb *hcl2.Block, r *spec.Resources, path string) {
	d.ranges[path] = rb.DefRange
	rc := d.content(rb.Body, schema(rb.Body, []string{"cpu", "memory"}, nil, nil), path)
	d.setInt(&r.CPU, rc.Attributes["cpu"], path+".cpu")
	d.setInt(&r.MemoryMB, rc.Attributes["memory"], path+".memory")
}

func (d *decoder) decodeConstraint(b *hcl2.Block, path string) spec.Constraint {
	d.ranges[path] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"attribute", "operator", "value"}, nil, nil), path)
	var con spec.Constraint
	d.setStr(&con.Attribute, c.Attributes["attribute"], path+".attribute")
	d.setStr(&con.Operator, c.Attributes["operator"], path+".operator")
	d.setStr(&con.Value, c.Attributes["value"], path+".value")
	return con
}

// configBody converts a driver's config block, whose schema only the driver
// knows, into plain Go values. Nested blocks become lists of objects (how
// Nomad's JSON API takes blocks), labelled blocks objects keyed by label.
func (d *decoder) configBody(body hcl2.Body, path string) map[string]any {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		d.errorf(path, body.MissingItemRange(), "Unsupported config syntax", "%s must be written in HCL native syntax.", path)
		return nil
	}
	out := make(map[string]any, len(sb.Attributes))
	for _, name := range sortedKeys(sb.Attributes) {
		attr := sb.Attributes[name]
		p := path + "." + name
		v, ok := d.value(attr.AsHCLAttribute(), p)
		if !ok {
			continue
		}
		g, err := toGo(v)
		if err != nil {
			d.errorf(p, attr.Expr.Range(), "Unsupported config value", "%s cannot be sent to Nomad: %s.", p, err)
			continue
		}
		out[name] = g
	}
	for _, blk := range sb.Blocks {
		p := path + "." + blk.Type
		if _, clash := sb.Attributes[blk.Type]; clash {
			d.errorf(p, blk.DefRange(), "Attribute and block of the same name",
				"%s is set as an attribute on line %d and as a block here; keep one.", p, sb.Attributes[blk.Type].SrcRange.Start.Line)
			continue
		}
		if _, seen := d.ranges[p]; !seen {
			d.ranges[p] = blk.DefRange()
		}
		var val any = d.configBody(blk.Body, p)
		for i := len(blk.Labels) - 1; i >= 0; i-- {
			val = map[string]any{blk.Labels[i]: val}
		}
		list, _ := out[blk.Type].([]any)
		out[blk.Type] = append(list, val)
	}
	return out
}

func (d *decoder) decodeProbe(b *hcl2.Block, name string, liveness bool) *spec.Probe {
	d.ranges[name] = b.DefRange
	c := d.content(b.Body, schema(b.Body, probeAttrs, probeTypes, nil), name)
	var kind *hcl2.Block
	for _, tb := range c.Blocks {
		if kind == nil {
			kind = tb
			continue
		}
		d.errorf(name, tb.DefRange, "More than one probe type",
			"A %s probe checks one way, and this one already has a %s block on line %d. Keep one of http, tcp, grpc and exec.", name, kind.Type, kind.DefRange.Start.Line)
	}
	if kind == nil {
		d.errorf(name, b.DefRange, "Missing probe type",
			"A %s block needs one of the blocks http, tcp, grpc or exec, for example %s { http { path = \"/healthz\" } } or %s { tcp {} }.", name, name, name)
		return nil
	}
	p := spec.DefaultProbe(spec.ProbeType(kind.Type))
	if liveness {
		p.Period = spec.DefaultLivenessPeriod
	}
	d.ranges[name+".type"] = kind.DefRange
	// Kubernetes users write the port inside httpGet, tcpSocket and grpc;
	// it means the probe's port.
	var typePort *hcl2.Attribute
	switch kind.Type {
	case "http":
		kc := d.content(kind.Body, schema(kind.Body, []string{"path", "headers", "port"}, nil, nil), name)
		d.ranges[name+".path"] = kind.DefRange
		d.setStr(&p.Path, kc.Attributes["path"], name+".path")
		d.setStrMap(&p.Headers, kc.Attributes["headers"], name+".headers")
		typePort = kc.Attributes["port"]
	case "tcp":
		kc := d.content(kind.Body, schema(kind.Body, []string{"port"}, nil, nil), name)
		typePort = kc.Attributes["port"]
	case "grpc":
		kc := d.content(kind.Body, schema(kind.Body, []string{"service", "port"}, nil, nil), name)
		d.setStr(&p.GRPCService, kc.Attributes["service"], name+".service")
		typePort = kc.Attributes["port"]
	case "exec":
		kc := d.content(kind.Body, schema(kind.Body, []string{"command"}, nil, nil, "command"), name)
		d.ranges[name+".command"] = kind.DefRange
		d.setStrList(&p.Command, kc.Attributes["command"], name+".command")
	}
	a := c.Attributes
	d.setDuration(&p.InitialDelay, a["initial_delay"], name+".initial_delay")
	d.setDuration(&p.Period, a["period"], name+".period")
	d.setDuration(&p.Timeout, a["timeout"], name+".timeout")
	d.setInt(&p.SuccessThreshold, a["success_threshold"], name+".success_threshold")
	d.setInt(&p.FailureThreshold, a["failure_threshold"], name+".failure_threshold")
	d.setInt(&p.Port, a["port"], name+".port")
	if typePort != nil {
		if a["port"] != nil {
			d.errorf(name+".port", typePort.NameRange, "Probe port set twice",
				"This %s probe sets port on line %d and in its %s block; keep one (both mean the port probed).", name, a["port"].NameRange.Start.Line, kind.Type)
		} else {
			d.setInt(&p.Port, typePort, name+".port")
		}
	}
	return &p
}

func (d *decoder) decodeScaling(b *hcl2.Block, s *spec.Scaling) {
	d.ranges["scaling"] = b.DefRange
	c := d.content(b.Body, schema(b.Body, scalingAttrs, nil, nil), "scaling")
	a := c.Attributes
	d.setInt(&s.Min, a["min"], "scaling.min")
	d.setInt(&s.Max, a["max"], "scaling.max")
	d.setInt(&s.Initial, a["initial"], "scaling.initial")
	d.setInt(&s.ActivationScale, a["activation_scale"], "scaling.activation_scale")
	d.setFloat(&s.Utilization, a["utilization"], "scaling.utilization")
	d.setFloat(&s.PanicWindowPercentage, a["panic_window_percentage"], "scaling.panic_window_percentage")
	d.setFloat(&s.PanicThresholdPercentage, a["panic_threshold_percentage"], "scaling.panic_threshold_percentage")
	d.setFloat(&s.BurstCapacity, a["burst_capacity"], "scaling.burst_capacity")
	d.setFloat(&s.MaxScaleUpRate, a["max_scale_up_rate"], "scaling.max_scale_up_rate")
	d.setFloat(&s.MaxScaleDownRate, a["max_scale_down_rate"], "scaling.max_scale_down_rate")
	d.setDuration(&s.Window, a["window"], "scaling.window")
	d.setDuration(&s.ScaleToZeroGrace, a["scale_to_zero_grace"], "scaling.scale_to_zero_grace")
	d.setDuration(&s.ScaleDownDelay, a["scale_down_delay"], "scaling.scale_down_delay")
	metricSet := false
	if v, ok := d.str(a["metric"], "scaling.metric"); ok {
		s.Metric = spec.Metric(v)
		metricSet = true
		// CPU and memory scaling has a floor of one instance (there is
		// nothing to measure at zero): a min the file leaves out is 1, as
		// in Knative's HPA class; a min of 0 written out is refused by
		// validation, located at it.
		if s.Metric.Resource() && a["min"] == nil {
			s.Min = max(s.Min, spec.MinResourceScale)
		}
	}
	// A target the file leaves out, or sets to null, follows the metric;
	// one that failed to decode stays as it is (its error is reported).
	if v, ok := d.float(a["target"], "scaling.target"); ok {
		s.Target = v
	} else if metricSet && !d.failed["scaling.target"] {
		s.Target = spec.DefaultTarget(s.Metric)
	}
}

func (d *decoder) decodeTraffic(b *hcl2.Block, path string) spec.TrafficTarget {
	d.ranges[path] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"revision", "latest", "percent", "tag"}, nil, nil), path)
	var tt spec.TrafficTarget
	d.setStr(&tt.Revision, c.Attributes["revision"], path+".revision")
	d.setBool(&tt.Latest, c.Attributes["latest"], path+".latest")
	d.setInt(&tt.Percent, c.Attributes["percent"], path+".percent")
	d.setStr(&tt.Tag, c.Attributes["tag"], path+".tag")
	return tt
}

func (d *decoder) decodeConnect(b *hcl2.Block) *spec.Connect {
	d.ranges["connect"] = b.DefRange
	c := d.content(b.Body, schema(b.Body, nil, []string{"upstream"}, nil), "connect")
	conn := &spec.Connect{}
	for i, ub := range c.Blocks.OfType("upstream") {
		p := fmt.Sprintf("connect.upstream[%d]", i)
		d.ranges[p] = ub.DefRange
		uc := d.content(ub.Body, schema(ub.Body, []string{"destination", "local_bind_port"}, nil, nil), p)
		var u spec.Upstream
		d.setStr(&u.Destination, uc.Attributes["destination"], p+".destination")
		d.setInt(&u.LocalBindPort, uc.Attributes["local_bind_port"], p+".local_bind_port")
		conn.Upstreams = append(conn.Upstreams, u)
	}
	return conn
}
