package nomadjob

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/nomad/api"
)

// FormatHCL prints a compiled job as a Nomad jobspec for people (`render
// -format=hcl`). It shows every field Compile sets, in jobspec spelling,
// formatted like `hcl fmt` (attributes of a block aligned on "=").
//
// The output is valid HCL and meant to be read; `nomad job run` accepts it
// for the common drivers, but a driver config's nested maps are printed as
// object attributes (Nomad's jobspec sometimes wants blocks there), so a
// round trip is not guaranteed: submit the JSON job to be exact.
//
// It writes HCL with its own small emitter rather than hclwrite: hclwrite
// imports github.com/google/go-cmp, which this module's go.mod does not
// list. Tests parse every output with hclsyntax.
func FormatHCL(job *api.Job) ([]byte, error) {
	if job == nil || job.ID == nil {
		return nil, fmt.Errorf("format job as HCL: the job has no ID")
	}
	w := &hclWriter{}
	jb := newBlock("job", *job.ID)
	w.str(jb, "name", job.Name, *job.ID)
	w.str(jb, "region", job.Region, "")
	w.str(jb, "namespace", job.Namespace, "")
	w.str(jb, "type", job.Type, "")
	w.str(jb, "node_pool", job.NodePool, "")
	if job.Priority != nil {
		w.attr(jb, "priority", *job.Priority)
	}
	if len(job.Datacenters) > 0 {
		w.attr(jb, "datacenters", job.Datacenters)
	}
	w.mapping(jb, "meta", job.Meta)
	for _, c := range job.Constraints {
		w.constraint(jb, c)
	}
	if u := job.Update; u != nil {
		ub := jb.block("update")
		w.intp(ub, "max_parallel", u.MaxParallel)
		w.durp(ub, "min_healthy_time", u.MinHealthyTime)
		w.durp(ub, "healthy_deadline", u.HealthyDeadline)
		w.durp(ub, "progress_deadline", u.ProgressDeadline)
		w.strp(ub, "health_check", u.HealthCheck)
	}
	for _, g := range job.TaskGroups {
		w.group(jb, g)
	}
	if w.err != nil {
		return nil, fmt.Errorf("format job %s as HCL: %w", *job.ID, w.err)
	}
	var sb strings.Builder
	jb.write(&sb, 0)
	return []byte(sb.String()), nil
}

// hblock is a block being written: attributes and nested blocks in the
// order they were added.
type hblock struct {
	typ    string
	labels []string
	items  []hitem
}

// hitem is one attribute (name = expr) or one nested block.
type hitem struct {
	name  string
	expr  string // rendered value; may span lines
	block *hblock
}

func newBlock(typ string, labels ...string) *hblock { return &hblock{typ: typ, labels: labels} }

func (b *hblock) block(typ string, labels ...string) *hblock {
	nb := newBlock(typ, labels...)
	b.items = append(b.items, hitem{block: nb})
	return nb
}

// write prints the block at an indent depth. Runs of single-line
// attributes are aligned on "=", blocks are set apart by blank lines, as
// `hcl fmt` does.
func (b *hblock) write(sb *strings.Builder, depth int) {
	ind := strings.Repeat("  ", depth)
	sb.WriteString(ind + b.typ)
	for _, l := range b.labels {
		sb.WriteString(" " + quote(l))
	}
	if len(b.items) == 0 {
		sb.WriteString(" {}\n")
		return
	}
	sb.WriteString(" {\n")
	for i := 0; i < len(b.items); {
		it := b.items[i]
		if it.block != nil {
			if i > 0 {
				sb.WriteString("\n")
			}
			it.block.write(sb, depth+1)
			if i+1 < len(b.items) && b.items[i+1].block == nil {
				sb.WriteString("\n")
			}
			i++
			continue
		}
		// A run of attributes up to the next block.
		j := i
		width := 0
		for j < len(b.items) && b.items[j].block == nil {
			if !strings.Contains(b.items[j].expr, "\n") {
				width = max(width, len(b.items[j].name))
			}
			j++
		}
		for _, a := range b.items[i:j] {
			pad := ""
			if !strings.Contains(a.expr, "\n") {
				pad = strings.Repeat(" ", width-len(a.name))
			}
			sb.WriteString(ind + "  " + a.name + pad + " = " + indentLines(a.expr, ind+"  ") + "\n")
		}
		i = j
	}
	sb.WriteString(ind + "}\n")
}

func indentLines(s, ind string) string { return strings.ReplaceAll(s, "\n", "\n"+ind) }

// hclWriter keeps the first conversion error so the emitters stay flat.
type hclWriter struct{ err error }

func (w *hclWriter) fail(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *hclWriter) attr(b *hblock, name string, v any) {
	expr, err := hclValue(v)
	if err != nil {
		w.fail(fmt.Errorf("%s: %w", name, err))
		return
	}
	b.items = append(b.items, hitem{name: name, expr: expr})
}

func (w *hclWriter) str(b *hblock, name string, p *string, skip string) {
	if p != nil && *p != "" && *p != skip {
		w.attr(b, name, *p)
	}
}

func (w *hclWriter) strp(b *hblock, name string, p *string) {
	if p != nil && *p != "" {
		w.attr(b, name, *p)
	}
}

func (w *hclWriter) intp(b *hblock, name string, p *int) {
	if p != nil {
		w.attr(b, name, *p)
	}
}

func (w *hclWriter) durp(b *hblock, name string, p *time.Duration) {
	if p != nil {
		w.attr(b, name, p.String())
	}
}

// mapping writes a string map as a block of attributes when every key is
// an HCL identifier (env { PORT = "..." }), else as an object attribute
// (meta = { "serverless.service" = "hello" }).
func (w *hclWriter) mapping(b *hblock, name string, m map[string]string) {
	if len(m) == 0 {
		return
	}
	keys := sortedKeys(m)
	for _, k := range keys {
		if !hclsyntax.ValidIdentifier(k) {
			w.attr(b, name, m)
			return
		}
	}
	mb := b.block(name)
	for _, k := range keys {
		w.attr(mb, k, m[k])
	}
}

func (w *hclWriter) constraint(b *hblock, c *api.Constraint) {
	if c == nil {
		return
	}
	cb := b.block("constraint")
	if c.LTarget != "" {
		w.attr(cb, "attribute", c.LTarget)
	}
	if c.Operand != "" {
		w.attr(cb, "operator", c.Operand)
	}
	if c.RTarget != "" {
		w.attr(cb, "value", c.RTarget)
	}
}

func (w *hclWriter) group(jb *hblock, g *api.TaskGroup) {
	if g == nil || g.Name == nil {
		return
	}
	gb := jb.block("group", *g.Name)
	w.intp(gb, "count", g.Count)
	w.durp(gb, "shutdown_delay", g.ShutdownDelay)
	for _, c := range g.Constraints {
		w.constraint(gb, c)
	}
	if s := g.Scaling; s != nil {
		sb := gb.block("scaling")
		if s.Enabled != nil {
			w.attr(sb, "enabled", *s.Enabled)
		}
		if s.Min != nil {
			w.attr(sb, "min", *s.Min)
		}
		if s.Max != nil {
			w.attr(sb, "max", *s.Max)
		}
		if len(s.Policy) > 0 {
			w.anyBlock(sb, "policy", s.Policy)
		}
	}
	if r := g.RestartPolicy; r != nil {
		rb := gb.block("restart")
		w.intp(rb, "attempts", r.Attempts)
		w.durp(rb, "interval", r.Interval)
		w.durp(rb, "delay", r.Delay)
		w.strp(rb, "mode", r.Mode)
	}
	if r := g.ReschedulePolicy; r != nil {
		rb := gb.block("reschedule")
		w.intp(rb, "attempts", r.Attempts)
		w.durp(rb, "interval", r.Interval)
		w.durp(rb, "delay", r.Delay)
		w.strp(rb, "delay_function", r.DelayFunction)
		w.durp(rb, "max_delay", r.MaxDelay)
		if r.Unlimited != nil {
			w.attr(rb, "unlimited", *r.Unlimited)
		}
	}
	for _, n := range g.Networks {
		if n == nil {
			continue
		}
		nb := gb.block("network")
		if n.Mode != "" {
			w.attr(nb, "mode", n.Mode)
		}
		for _, p := range n.ReservedPorts {
			pb := nb.block("port", p.Label)
			w.attr(pb, "static", p.Value)
			if p.To != 0 {
				w.attr(pb, "to", p.To)
			}
		}
		for _, p := range n.DynamicPorts {
			pb := nb.block("port", p.Label)
			if p.To != 0 {
				w.attr(pb, "to", p.To)
			}
		}
	}
	for _, s := range g.Services {
		w.service(gb, s)
	}
	for _, t := range g.Tasks {
		w.task(gb, t)
	}
}

func (w *hclWriter) service(gb *hblock, s *api.Service) {
	if s == nil {
		return
	}
	sb := gb.block("service")
	w.attr(sb, "name", s.Name)
	if s.PortLabel != "" {
		w.attr(sb, "port", s.PortLabel)
	}
	if s.Provider != "" {
		w.attr(sb, "provider", s.Provider)
	}
	if len(s.Tags) > 0 {
		w.attr(sb, "tags", s.Tags)
	}
	w.mapping(sb, "meta", s.Meta)
	for _, c := range s.Checks {
		cb := sb.block("check")
		if c.Name != "" {
			w.attr(cb, "name", c.Name)
		}
		w.attr(cb, "type", c.Type)
		if c.Path != "" {
			w.attr(cb, "path", c.Path)
		}
		if c.PortLabel != "" {
			w.attr(cb, "port", c.PortLabel)
		}
		if c.TaskName != "" {
			w.attr(cb, "task", c.TaskName)
		}
		w.attr(cb, "interval", c.Interval.String())
		w.attr(cb, "timeout", c.Timeout.String())
		if c.InitialStatus != "" {
			w.attr(cb, "initial_status", c.InitialStatus)
		}
		if len(c.Header) > 0 {
			hb := cb.block("header")
			for _, k := range sortedKeys(c.Header) {
				if !hclsyntax.ValidIdentifier(k) {
					w.fail(fmt.Errorf("check header %q is not an HCL identifier", k))
					continue
				}
				w.attr(hb, k, c.Header[k])
			}
		}
		if r := c.CheckRestart; r != nil {
			rb := cb.block("check_restart")
			w.attr(rb, "limit", r.Limit)
			w.durp(rb, "grace", r.Grace)
		}
	}
	if c := s.Connect; c != nil && c.SidecarService != nil {
		ssb := sb.block("connect").block("sidecar_service")
		if p := c.SidecarService.Proxy; p != nil {
			pb := ssb.block("proxy")
			for _, u := range p.Upstreams {
				ub := pb.block("upstreams")
				w.attr(ub, "destination_name", u.DestinationName)
				w.attr(ub, "local_bind_port", u.LocalBindPort)
			}
		}
	}
}

func (w *hclWriter) task(gb *hblock, t *api.Task) {
	if t == nil {
		return
	}
	tb := gb.block("task", t.Name)
	w.attr(tb, "driver", t.Driver)
	if t.User != "" {
		w.attr(tb, "user", t.User)
	}
	w.durp(tb, "kill_timeout", t.KillTimeout)
	if l := t.Lifecycle; l != nil {
		lb := tb.block("lifecycle")
		w.attr(lb, "hook", l.Hook)
		w.attr(lb, "sidecar", l.Sidecar)
	}
	if len(t.Config) > 0 {
		cb := tb.block("config")
		for _, k := range sortedKeys(t.Config) {
			w.attr(cb, k, t.Config[k])
		}
	}
	w.mapping(tb, "env", t.Env)
	if r := t.Resources; r != nil {
		rb := tb.block("resources")
		w.intp(rb, "cpu", r.CPU)
		w.intp(rb, "memory", r.MemoryMB)
	}
	for _, a := range t.Artifacts {
		ab := tb.block("artifact")
		w.strp(ab, "source", a.GetterSource)
		w.strp(ab, "destination", a.RelativeDest)
		w.strp(ab, "mode", a.GetterMode)
		w.mapping(ab, "options", a.GetterOptions)
	}
	for _, tp := range t.Templates {
		pb := tb.block("template")
		w.strp(pb, "source", tp.SourcePath)
		w.strp(pb, "data", tp.EmbeddedTmpl)
		w.strp(pb, "destination", tp.DestPath)
		w.strp(pb, "change_mode", tp.ChangeMode)
		if tp.Envvars != nil {
			w.attr(pb, "env", *tp.Envvars)
		}
	}
}

// anyBlock writes a map as a block: nested maps whose keys are identifiers
// become nested blocks, everything else attributes.
func (w *hclWriter) anyBlock(b *hblock, name string, m map[string]any) {
	bb := b.block(name)
	for _, k := range sortedKeys(m) {
		if sub, ok := m[k].(map[string]any); ok && hclsyntax.ValidIdentifier(k) && allIdentifiers(sub) {
			w.anyBlock(bb, k, sub)
			continue
		}
		if !hclsyntax.ValidIdentifier(k) {
			w.fail(fmt.Errorf("%s: key %q is not an HCL identifier", name, k))
			continue
		}
		w.attr(bb, k, m[k])
	}
}

func allIdentifiers(m map[string]any) bool {
	for k := range m {
		if !hclsyntax.ValidIdentifier(k) {
			return false
		}
	}
	return true
}

// hclValue renders a JSON-like Go value (driver config, scaling policy,
// string maps and lists) as an HCL expression. Objects with more than one
// key span lines.
func hclValue(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "null", nil
	case string:
		return quote(x), nil
	case bool:
		return strconv.FormatBool(x), nil
	case int:
		return strconv.Itoa(x), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case json.Number:
		if _, err := strconv.ParseFloat(string(x), 64); err != nil {
			return "", err
		}
		return string(x), nil
	case []any:
		parts := make([]string, len(x))
		for i, e := range x {
			s, err := hclValue(e)
			if err != nil {
				return "", fmt.Errorf("[%d]: %w", i, err)
			}
			parts[i] = s
		}
		return "[" + strings.Join(parts, ", ") + "]", nil
	case map[string]any:
		if len(x) == 0 {
			return "{}", nil
		}
		var sb strings.Builder
		sb.WriteString("{\n")
		keys := sortedKeys(x)
		width := 0
		for _, k := range keys {
			width = max(width, len(objectKey(k)))
		}
		for _, k := range keys {
			s, err := hclValue(x[k])
			if err != nil {
				return "", fmt.Errorf("%s: %w", k, err)
			}
			key := objectKey(k)
			sb.WriteString("  " + key + strings.Repeat(" ", width-len(key)) + " = " + indentLines(s, "  ") + "\n")
		}
		sb.WriteString("}")
		return sb.String(), nil
	}
	// Typed slices, maps and numbers: go through reflection.
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return strconv.FormatInt(rv.Int(), 10), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return strconv.FormatUint(rv.Uint(), 10), nil
	case reflect.Float32:
		return strconv.FormatFloat(rv.Float(), 'f', -1, 32), nil
	case reflect.Slice, reflect.Array:
		l := make([]any, rv.Len())
		for i := range l {
			l[i] = rv.Index(i).Interface()
		}
		return hclValue(l)
	case reflect.Map:
		if rv.Type().Key().Kind() == reflect.String {
			m := make(map[string]any, rv.Len())
			for _, k := range rv.MapKeys() {
				m[k.String()] = rv.MapIndex(k).Interface()
			}
			return hclValue(m)
		}
	}
	return "", fmt.Errorf("a value of type %T cannot be written as HCL", v)
}

// objectKey is a key inside an object expression: bare when it is an
// identifier, quoted otherwise.
func objectKey(k string) string {
	if hclsyntax.ValidIdentifier(k) {
		return k
	}
	return quote(k)
}

// quote writes an HCL string literal. Besides the usual escapes, "${" and
// "%{" are doubled so HCL reads them literally, except for Nomad's runtime
// interpolations (${NOMAD_PORT_app}, ${attr.x}, ${node.x}, ${meta.x},
// ${env["X"]}), which Nomad's jobspec parser passes through as written and
// people expect to read that way.
func quote(s string) string {
	var sb strings.Builder
	sb.WriteByte('"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch c {
		case '"':
			sb.WriteString(`\"`)
		case '\\':
			sb.WriteString(`\\`)
		case '\n':
			sb.WriteString(`\n`)
		case '\r':
			sb.WriteString(`\r`)
		case '\t':
			sb.WriteString(`\t`)
		case '$', '%':
			sb.WriteByte(c)
			if i+1 < len(s) && s[i+1] == '{' && (c == '%' || !nomadRuntimeVar(s[i+2:])) {
				sb.WriteByte(c)
			}
		default:
			if c < 0x20 {
				fmt.Fprintf(&sb, `\u%04x`, c)
			} else {
				sb.WriteByte(c)
			}
		}
	}
	sb.WriteByte('"')
	return sb.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// nomadRuntimeVar reports whether the text after "${" starts one of the
// interpolations Nomad resolves on the client.
func nomadRuntimeVar(rest string) bool {
	for _, p := range []string{"NOMAD_", "attr.", "node.", "meta.", "env[", "env."} {
		if strings.HasPrefix(rest, p) {
			return true
		}
	}
	return false
}
