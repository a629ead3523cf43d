package hcl

import (
	"fmt"
	"time"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// The tasks of a service: the serving task (task {} without a label, or the
// image shorthand) and the named tasks beside it (task "migrate" {}), the
// group's volumes (volume "data" {}) and its ephemeral_disk.

// splitNamedTasks takes the labelled task blocks out of a service body, so
// the rest decodes against a schema whose task block has no label. The
// body is copied, never changed: the file is decoded once per parse, but
// its syntax tree belongs to the caller.
func splitNamedTasks(body hcl2.Body) (hcl2.Body, []*hcl2.Block) {
	sb, ok := body.(*hclsyntax.Body)
	if !ok {
		return body, nil
	}
	var named []*hcl2.Block
	rest := make(hclsyntax.Blocks, 0, len(sb.Blocks))
	for _, b := range sb.Blocks {
		if b.Type == "task" && len(b.Labels) > 0 {
			named = append(named, b.AsHCLBlock())
			continue
		}
		rest = append(rest, b)
	}
	if len(named) == 0 {
		return body, nil
	}
	cp := *sb
	cp.Blocks = rest
	return &cp, named
}

// taskFields points at the settings every task has, in a spec.Task or a
// spec.SideTask, so one decoder reads both.
type taskFields struct {
	driver    *string
	config    *map[string]any
	env       *map[string]string
	resources *spec.Resources
	artifacts *[]spec.Artifact
	templates *[]spec.TaskTemplate
	user      *string
	kill      *time.Duration
	mounts    *[]spec.VolumeMount
}

// decodeServingTask reads the task {} block: the task that serves traffic.
func (d *decoder) decodeServingTask(b *hcl2.Block, task *spec.Task) {
	const p = "task"
	d.ranges[p] = b.DefRange
	attrs := append(append([]string{"driver"}, taskAttrs...), servingAttrs...)
	c := d.content(b.Body, schema(b.Body, attrs, append(taskBlocks, sideBlocks...), []string{"env"}, "driver"), p)
	d.decodeTaskFields(b, c, p, taskFields{
		&task.Driver, &task.Config, &task.Env, &task.Resources, &task.Artifacts,
		&task.Templates, &task.User, &task.KillTimeout, &task.VolumeMounts,
	})
	d.setInt(&task.Port, c.Attributes["port"], p+".port")
	d.setProtocol(&task.Protocol, c.Attributes["protocol"])
	if lb := c.Blocks.OfType("lifecycle"); len(lb) > 0 {
		d.errorf(p+".lifecycle", lb[0].DefRange, "The serving task has a lifecycle",
			"task {} without a label is the task that serves traffic: it runs for the instance's whole life, beside the queue-proxy. "+
				"Remove lifecycle here, or move what must run before, beside or after it into a named task: "+
				"task \"migrate\" { lifecycle { hook = \"prestart\" } ... }.")
	}
}

// decodeSideTasks reads the named tasks. hasServing says whether the
// service has a serving task (a task {} block or image).
func (d *decoder) decodeSideTasks(blocks []*hcl2.Block, hasServing bool, t *spec.Template) {
	seen := map[string]*hcl2.Block{}
	for _, b := range blocks {
		name := b.Labels[0]
		p := sideTaskPath(name)
		if len(b.Labels) > 1 {
			d.errorf(p, b.LabelRanges[1], "Extraneous label for task",
				"A task has one label, its name: task %q { ... }.", name)
			continue
		}
		if first, dup := seen[name]; dup {
			d.errorf(p, b.LabelRanges[0], "Duplicate task",
				"Task %q is already declared on line %d. Task names are unique within a service (they name the Nomad tasks); rename one.",
				name, first.DefRange.Start.Line)
			continue
		}
		seen[name] = b
		d.ranges[p] = b.DefRange
		d.ranges[p+".name"] = b.LabelRanges[0]
		if _, ok := d.ranges["task"]; !ok && !hasServing {
			// "No serving task" is said at the first named one.
			d.ranges["task"] = b.LabelRanges[0]
		}
		attrs := append(append([]string{"driver"}, taskAttrs...), servingAttrs...)
		c := d.content(b.Body, schema(b.Body, attrs, append(taskBlocks, sideBlocks...), []string{"env"}, "driver"), p)
		st := spec.SideTask{Name: name, Resources: spec.Resources{CPU: spec.DefaultCPU, MemoryMB: spec.DefaultMemoryMB}, KillTimeout: spec.DefaultSideKillTimeout}
		d.decodeTaskFields(b, c, p, taskFields{
			&st.Driver, &st.Config, &st.Env, &st.Resources, &st.Artifacts,
			&st.Templates, &st.User, &st.KillTimeout, &st.VolumeMounts,
		})
		for _, attr := range servingAttrs {
			a := c.Attributes[attr]
			if a == nil {
				continue
			}
			summary := "Named task with " + attr
			if attr == "port" && hasServing {
				summary = "Two tasks with port"
			}
			d.errorf(p+"."+attr, a.NameRange, summary,
				"Exactly one task serves traffic: the task {} block without a label (or image = \"...\"), and only it takes %s. "+
					"Task %q runs beside it: remove %s here; to make it the serving task, write it as task { ... } without the label.",
				attr, name, attr)
		}
		if lb := d.single(c.Blocks, "lifecycle", "A task"); lb != nil {
			st.Lifecycle = d.decodeLifecycle(lb, p+".lifecycle")
		}
		t.SideTasks = append(t.SideTasks, st)
	}
}

// sideTaskPath is the spec.Problem path of a named task.
func sideTaskPath(name string) string { return spec.SideTaskPath(name) }

func (d *decoder) decodeLifecycle(b *hcl2.Block, p string) *spec.Lifecycle {
	d.ranges[p] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"hook", "sidecar"}, nil, nil, "hook"), p)
	var l spec.Lifecycle
	d.setStr(&l.Hook, c.Attributes["hook"], p+".hook")
	d.setBool(&l.Sidecar, c.Attributes["sidecar"], p+".sidecar")
	return &l
}

// decodeTaskFields reads what every task has, under path p.
func (d *decoder) decodeTaskFields(b *hcl2.Block, c *hcl2.BodyContent, p string, f taskFields) {
	a := c.Attributes
	d.setStr(f.driver, a["driver"], p+".driver")
	if cb := d.single(c.Blocks, "config", "A task"); cb != nil {
		d.ranges[p+".config"] = cb.DefRange
		*f.config = d.configBody(cb.Body, p+".config")
	} else {
		// Point problems about a missing config at the driver line.
		d.ranges[p+".config"] = d.rangeOr(p+".driver", b.DefRange)
	}
	if v, ok := d.stringMap(c, "env", p+".env", "A task"); ok {
		*f.env = v
	}
	if rb := d.single(c.Blocks, "resources", "A task"); rb != nil {
		d.decodeResources(rb, f.resources, p+".resources")
	}
	d.setStr(f.user, a["user"], p+".user")
	d.setDuration(f.kill, a["kill_timeout"], p+".kill_timeout")
	for i, ab := range c.Blocks.OfType("artifact") {
		ap := fmt.Sprintf("%s.artifact[%d]", p, i)
		d.ranges[ap] = ab.DefRange
		ac := d.content(ab.Body, schema(ab.Body, []string{"source", "destination", "mode", "options"}, nil, nil), ap)
		var art spec.Artifact
		d.setStr(&art.Source, ac.Attributes["source"], ap+".source")
		d.setStr(&art.Destination, ac.Attributes["destination"], ap+".destination")
		d.setStr(&art.Mode, ac.Attributes["mode"], ap+".mode")
		d.setStrMap(&art.Options, ac.Attributes["options"], ap+".options")
		*f.artifacts = append(*f.artifacts, art)
	}
	for i, tb := range c.Blocks.OfType("template") {
		tp := fmt.Sprintf("%s.template[%d]", p, i)
		d.ranges[tp] = tb.DefRange
		tc := d.content(tb.Body, schema(tb.Body, []string{"data", "source", "destination", "change_mode", "env"}, nil, nil), tp)
		var tt spec.TaskTemplate
		d.setStr(&tt.Data, tc.Attributes["data"], tp+".data")
		d.setStr(&tt.Source, tc.Attributes["source"], tp+".source")
		d.setStr(&tt.Destination, tc.Attributes["destination"], tp+".destination")
		d.setStr(&tt.ChangeMode, tc.Attributes["change_mode"], tp+".change_mode")
		d.setBool(&tt.Env, tc.Attributes["env"], tp+".env")
		*f.templates = append(*f.templates, tt)
	}
	for i, mb := range c.Blocks.OfType("volume_mount") {
		*f.mounts = append(*f.mounts, d.decodeVolumeMount(mb, fmt.Sprintf("%s.volume_mount[%d]", p, i)))
	}
}

func (d *decoder) decodeVolumeMount(b *hcl2.Block, p string) spec.VolumeMount {
	d.ranges[p] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"volume", "destination", "read_only"}, nil, nil, "volume", "destination"), p)
	var m spec.VolumeMount
	d.setStr(&m.Volume, c.Attributes["volume"], p+".volume")
	d.setStr(&m.Destination, c.Attributes["destination"], p+".destination")
	d.setBool(&m.ReadOnly, c.Attributes["read_only"], p+".read_only")
	return m
}

// decodeVolumes reads the service's volume "name" {} blocks.
func (d *decoder) decodeVolumes(blocks hcl2.Blocks, t *spec.Template) {
	seen := map[string]*hcl2.Block{}
	for _, b := range blocks {
		name := b.Labels[0]
		p := spec.VolumePath(name)
		if first, dup := seen[name]; dup {
			d.errorf(p, b.LabelRanges[0], "Duplicate volume",
				"Volume %q is already declared on line %d; rename one (tasks mount volumes by name).", name, first.DefRange.Start.Line)
			continue
		}
		seen[name] = b
		d.ranges[p] = b.DefRange
		d.ranges[p+".name"] = b.LabelRanges[0]
		attrs := []string{"type", "source", "read_only", "access_mode", "attachment_mode", "per_alloc"}
		c := d.content(b.Body, schema(b.Body, attrs, nil, nil, "type", "source"), p)
		v := spec.Volume{Name: name}
		d.setStr(&v.Type, c.Attributes["type"], p+".type")
		d.setStr(&v.Source, c.Attributes["source"], p+".source")
		d.setBool(&v.ReadOnly, c.Attributes["read_only"], p+".read_only")
		d.setStr(&v.AccessMode, c.Attributes["access_mode"], p+".access_mode")
		d.setStr(&v.AttachmentMode, c.Attributes["attachment_mode"], p+".attachment_mode")
		d.setBool(&v.PerAlloc, c.Attributes["per_alloc"], p+".per_alloc")
		t.Volumes = append(t.Volumes, v)
	}
}

func (d *decoder) decodeEphemeralDisk(b *hcl2.Block) *spec.EphemeralDisk {
	const p = "ephemeral_disk"
	d.ranges[p] = b.DefRange
	c := d.content(b.Body, schema(b.Body, []string{"size", "sticky", "migrate"}, nil, nil), p)
	e := spec.EphemeralDisk{SizeMB: spec.DefaultEphemeralDiskMB}
	d.setInt(&e.SizeMB, c.Attributes["size"], p+".size")
	d.setBool(&e.Sticky, c.Attributes["sticky"], p+".sticky")
	d.setBool(&e.Migrate, c.Attributes["migrate"], p+".migrate")
	return &e
}
