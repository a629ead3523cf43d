package hcl

import (
	"fmt"
	"time"

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
		"tags", "domains",
	}
	serviceBlocks = []string{"constraint", "task", "readiness", "liveness", "scaling", "traffic", "network", "connect"}

	taskAttrs  = []string{"port", "user", "kill_timeout"}
	taskBlocks = []string{"config", "resources", "artifact", "template"}

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
		req := false
		for _, r := range required {
			req = req || r == a
		}
		s.Attributes = append(s.Attributes, hcl2.AttributeSchema{Name: a, Required: req})
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
	c := d.content(b.Body, schema(b.Body, serviceAttrs, serviceBlocks, []string{"meta"}), "")
	a := c.Attributes
	t := &svc.Template

	if v, ok := d.str(a["namespace"], "namespace"); ok {
		svc.Namespace = v
	}
	if v, ok := d.str(a["region"], "region"); ok {
		t.Region = v
	}
	if v, ok := d.strList(a["datacenters"], "datacenters"); ok {
		t.Datacenters = v
	}
	if v, ok := d.str(a["node_pool"], "node_pool"); ok {
		t.NodePool = v
	}
	if v, ok := d.int(a["concurrency"], "concurrency"); ok {
		t.Concurrency = v
	}
	if v, ok := d.duration(a["timeout"], "timeout"); ok {
		t.Timeout = v
	}
	if v, ok := d.duration(a["response_start_timeout"], "response_start_timeout"); ok {
		t.ResponseStartTimeout = v
	}
	if v, ok := d.duration(a["idle_timeout"], "idle_timeout"); ok {
		t.IdleTimeout = v
	}
	if v, ok := d.strList(a["tags"], "tags"); ok {
		t.Tags = v
	}
	if v, ok := d.stringMap(c, "meta", "meta", "A service"); ok {
		t.Meta = v
	}
	if v, ok := d.strList(a["domains"], "domains"); ok {
		svc.Domains = v
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
	if task != nil {
		d.decodeTask(task, &t.Task)
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
	if nb := d.single(c.Blocks, "network", "A service"); nb != nil {
		d.ranges["network"] = nb.DefRange
		nc := d.content(nb.Body, schema(nb.Body, []string{"mode"}, nil, nil), "network")
		if v, ok := d.str(nc.Attributes["mode"], "network.mode"); ok {
			t.Network.Mode = spec.NetworkMode(v)
		}
	}
	if cb := d.single(c.Blocks, "connect", "A service"); cb != nil {
		t.Connect = d.decodeConnect(cb)
	}
	return svc
}

func (d *decoder) decodeConstraint(b *hcl2.Block, path string) spec.Constraint {
	d.ranges[path] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"attribute", "operator", "value"}, nil, nil), path)
	var con spec.Constraint
	if v, ok := d.str(c.Attributes["attribute"], path+".attribute"); ok {
		con.Attribute = v
	}
	if v, ok := d.str(c.Attributes["operator"], path+".operator"); ok {
		con.Operator = v
	}
	if v, ok := d.str(c.Attributes["value"], path+".value"); ok {
		con.Value = v
	}
	return con
}

func (d *decoder) decodeTask(b *hcl2.Block, task *spec.Task) {
	d.ranges["task"] = b.DefRange
	c := d.content(b.Body, schema(b.Body, append([]string{"driver"}, taskAttrs...), taskBlocks, []string{"env"}, "driver"), "task")
	a := c.Attributes
	if v, ok := d.str(a["driver"], "task.driver"); ok {
		task.Driver = v
	}
	if cb := d.single(c.Blocks, "config", "A task"); cb != nil {
		d.ranges["task.config"] = cb.DefRange
		task.Config = d.configBody(cb.Body, "task.config")
	} else {
		// Point problems about a missing config at the driver line.
		d.ranges["task.config"] = d.rangeOr("task.driver", b.DefRange)
	}
	if v, ok := d.stringMap(c, "env", "task.env", "A task"); ok {
		task.Env = v
	}
	if rb := d.single(c.Blocks, "resources", "A task"); rb != nil {
		d.ranges["task.resources"] = rb.DefRange
		rc := d.content(rb.Body, schema(rb.Body, []string{"cpu", "memory"}, nil, nil), "task.resources")
		if v, ok := d.int(rc.Attributes["cpu"], "task.resources.cpu"); ok {
			task.Resources.CPU = v
		}
		if v, ok := d.int(rc.Attributes["memory"], "task.resources.memory"); ok {
			task.Resources.MemoryMB = v
		}
	}
	if v, ok := d.int(a["port"], "task.port"); ok {
		task.Port = v
	}
	if v, ok := d.str(a["user"], "task.user"); ok {
		task.User = v
	}
	if v, ok := d.duration(a["kill_timeout"], "task.kill_timeout"); ok {
		task.KillTimeout = v
	}
	for i, ab := range c.Blocks.OfType("artifact") {
		p := fmt.Sprintf("task.artifact[%d]", i)
		d.ranges[p] = ab.DefRange
		ac := d.content(ab.Body, schema(ab.Body, []string{"source", "destination", "mode", "options"}, nil, nil), p)
		var art spec.Artifact
		if v, ok := d.str(ac.Attributes["source"], p+".source"); ok {
			art.Source = v
		}
		if v, ok := d.str(ac.Attributes["destination"], p+".destination"); ok {
			art.Destination = v
		}
		if v, ok := d.str(ac.Attributes["mode"], p+".mode"); ok {
			art.Mode = v
		}
		if v, ok := d.strMap(ac.Attributes["options"], p+".options"); ok {
			art.Options = v
		}
		task.Artifacts = append(task.Artifacts, art)
	}
	for i, tb := range c.Blocks.OfType("template") {
		p := fmt.Sprintf("task.template[%d]", i)
		d.ranges[p] = tb.DefRange
		tc := d.content(tb.Body, schema(tb.Body, []string{"data", "source", "destination", "change_mode", "env"}, nil, nil), p)
		var tp spec.TaskTemplate
		if v, ok := d.str(tc.Attributes["data"], p+".data"); ok {
			tp.Data = v
		}
		if v, ok := d.str(tc.Attributes["source"], p+".source"); ok {
			tp.Source = v
		}
		if v, ok := d.str(tc.Attributes["destination"], p+".destination"); ok {
			tp.Destination = v
		}
		if v, ok := d.str(tc.Attributes["change_mode"], p+".change_mode"); ok {
			tp.ChangeMode = v
		}
		if v, ok := d.bool(tc.Attributes["env"], p+".env"); ok {
			tp.Env = v
		}
		task.Templates = append(task.Templates, tp)
	}
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
	switch kind.Type {
	case "http":
		kc := d.content(kind.Body, schema(kind.Body, []string{"path", "headers"}, nil, nil), name)
		d.ranges[name+".path"] = kind.DefRange
		if v, ok := d.str(kc.Attributes["path"], name+".path"); ok {
			p.Path = v
		}
		if v, ok := d.strMap(kc.Attributes["headers"], name+".headers"); ok {
			p.Headers = v
		}
	case "tcp":
		d.content(kind.Body, schema(kind.Body, nil, nil, nil), name)
	case "grpc":
		kc := d.content(kind.Body, schema(kind.Body, []string{"service"}, nil, nil), name)
		if v, ok := d.str(kc.Attributes["service"], name+".service"); ok {
			p.GRPCService = v
		}
	case "exec":
		kc := d.content(kind.Body, schema(kind.Body, []string{"command"}, nil, nil, "command"), name)
		d.ranges[name+".command"] = kind.DefRange
		if v, ok := d.strList(kc.Attributes["command"], name+".command"); ok {
			p.Command = v
		}
	}
	a := c.Attributes
	if v, ok := d.duration(a["initial_delay"], name+".initial_delay"); ok {
		p.InitialDelay = v
	}
	if v, ok := d.duration(a["period"], name+".period"); ok {
		p.Period = v
	}
	if v, ok := d.duration(a["timeout"], name+".timeout"); ok {
		p.Timeout = v
	}
	if v, ok := d.int(a["success_threshold"], name+".success_threshold"); ok {
		p.SuccessThreshold = v
	}
	if v, ok := d.int(a["failure_threshold"], name+".failure_threshold"); ok {
		p.FailureThreshold = v
	}
	if v, ok := d.int(a["port"], name+".port"); ok {
		p.Port = v
	}
	return &p
}

func (d *decoder) decodeScaling(b *hcl2.Block, s *spec.Scaling) {
	d.ranges["scaling"] = b.DefRange
	c := d.content(b.Body, schema(b.Body, scalingAttrs, nil, nil), "scaling")
	a := c.Attributes
	ints := []struct {
		name string
		dst  *int
	}{{"min", &s.Min}, {"max", &s.Max}, {"initial", &s.Initial}, {"activation_scale", &s.ActivationScale}}
	for _, f := range ints {
		if v, ok := d.int(a[f.name], "scaling."+f.name); ok {
			*f.dst = v
		}
	}
	floats := []struct {
		name string
		dst  *float64
	}{
		{"utilization", &s.Utilization}, {"panic_window_percentage", &s.PanicWindowPercentage},
		{"panic_threshold_percentage", &s.PanicThresholdPercentage}, {"burst_capacity", &s.BurstCapacity},
		{"max_scale_up_rate", &s.MaxScaleUpRate}, {"max_scale_down_rate", &s.MaxScaleDownRate},
	}
	for _, f := range floats {
		if v, ok := d.float(a[f.name], "scaling."+f.name); ok {
			*f.dst = v
		}
	}
	durs := []struct {
		name string
		dst  *time.Duration
	}{
		{"window", &s.Window}, {"scale_to_zero_grace", &s.ScaleToZeroGrace}, {"scale_down_delay", &s.ScaleDownDelay},
	}
	for _, f := range durs {
		if v, ok := d.duration(a[f.name], "scaling."+f.name); ok {
			*f.dst = v
		}
	}
	metricSet := false
	if v, ok := d.str(a["metric"], "scaling.metric"); ok {
		s.Metric = spec.Metric(v)
		metricSet = true
	}
	if v, ok := d.float(a["target"], "scaling.target"); ok {
		s.Target = v
	} else if metricSet && a["target"] == nil {
		s.Target = spec.DefaultTarget(s.Metric)
	}
}

func (d *decoder) decodeTraffic(b *hcl2.Block, path string) spec.TrafficTarget {
	d.ranges[path] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"revision", "latest", "percent", "tag"}, nil, nil), path)
	var tt spec.TrafficTarget
	if v, ok := d.str(c.Attributes["revision"], path+".revision"); ok {
		tt.Revision = v
	}
	if v, ok := d.bool(c.Attributes["latest"], path+".latest"); ok {
		tt.Latest = v
	}
	if v, ok := d.int(c.Attributes["percent"], path+".percent"); ok {
		tt.Percent = v
	}
	if v, ok := d.str(c.Attributes["tag"], path+".tag"); ok {
		tt.Tag = v
	}
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
		if v, ok := d.str(uc.Attributes["destination"], p+".destination"); ok {
			u.Destination = v
		}
		if v, ok := d.int(uc.Attributes["local_bind_port"], p+".local_bind_port"); ok {
			u.LocalBindPort = v
		}
		conn.Upstreams = append(conn.Upstreams, u)
	}
	return conn
}
