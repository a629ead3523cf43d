package nomadjob

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math/big"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/hcl/v2/hclwrite"
	"github.com/hashicorp/nomad/api"
	"github.com/zclconf/go-cty/cty"
)

// FormatHCL prints a job as a Nomad jobspec for people (`render -format
// hcl`, `install -format hcl`), formatted like `nomad fmt`.
//
// It is faithful: every field set in the job is printed, by the `hcl` struct
// tags of nomad/api (the names Nomad's own HCL2 jobspec parser decodes into)
// plus the few places where a jobspec is spelled differently from the API
// (the job's label is its ID, reserved ports are `port` blocks with
// `static`, the default workload identity is an `identity` block,
// durations are strings). Before returning, it reads its output back and
// compares it with the job (CheckHCL), so a field it cannot print, or
// prints wrongly, is an error rather than a jobspec that silently differs.
//
// One limit remains: a driver config's nested maps are printed as object
// attributes (`logging = { ... }`) where some drivers' jobspecs want blocks,
// so `nomad job run` may refuse such a config; submit the JSON job to be
// exact there.
func FormatHCL(job *api.Job) ([]byte, error) {
	if job == nil || job.ID == nil || *job.ID == "" {
		return nil, errors.New("format job as HCL: the job has no ID")
	}
	f := hclwrite.NewEmptyFile()
	w := &jobspecWriter{}
	w.body(f.Body().AppendNewBlock("job", []string{*job.ID}).Body(), reflect.ValueOf(job).Elem(), "job")
	if w.err != nil {
		return nil, fmt.Errorf("format job %s as HCL: %w", *job.ID, w.err)
	}
	// An empty block or object reads better on one line: port "http" {}.
	out := emptyBraces.ReplaceAll(hclwrite.Format(f.Bytes()), []byte("{}"))
	if err := CheckHCL(job, out); err != nil {
		return nil, fmt.Errorf("format job %s as HCL: %w", *job.ID, err)
	}
	return out, nil
}

// emptyBraces is an empty block body or object as hclwrite prints it. A
// quoted string cannot hold a raw newline, so this never matches inside
// one.
var emptyBraces = regexp.MustCompile(`\{\n[ \t]*\}`)

// specField is how one field of a nomad/api struct is written in a
// jobspec.
type specField struct {
	index int
	path  string // Go name, for messages
	name  string // jobspec name
	kind  fieldKind
}

type fieldKind int

const (
	kindNone  fieldKind = iota // no jobspec form: an error when set
	kindAttr                   // name = value
	kindBlock                  // name [labels] { ... }, one per element
	kindLabel                  // a label of the block the struct is
	// kindNested is a map[string]any block whose identifier-keyed map
	// values are nested blocks (a scaling policy) rather than objects.
	kindNested
	kindSkip // written another way (the job's ID is its label)
)

// specExceptions are where a jobspec is spelled differently from the
// nomad/api tags (Nomad's jobspec2 decodes these by hand).
var specExceptions = map[reflect.Type]map[string]specField{
	reflect.TypeFor[api.Job]():             {"ID": {kind: kindSkip}},
	reflect.TypeFor[api.NetworkResource](): {"ReservedPorts": {name: "port", kind: kindBlock}},
	reflect.TypeFor[api.Task]():            {"Identity": {name: "identity", kind: kindBlock}},
	reflect.TypeFor[api.ScalingPolicy]():   {"Policy": {name: "policy", kind: kindNested}},
}

// specFields lists the exported fields of a struct type with their jobspec
// form, in declaration order.
func specFields(t reflect.Type) []specField {
	var out []specField
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		if !sf.IsExported() {
			continue
		}
		f := specField{index: i, path: sf.Name}
		if ex, ok := specExceptions[t][sf.Name]; ok {
			ex.index, ex.path = i, sf.Name
			out = append(out, ex)
			continue
		}
		tag, ok := sf.Tag.Lookup("hcl")
		if ok && tag != "-" {
			name, opt, _ := strings.Cut(tag, ",")
			f.name = name
			switch opt {
			case "label":
				f.kind = kindLabel
			case "block":
				f.kind = kindBlock
			default: // "optional", "attr", ""
				f.kind = kindAttr
			}
		}
		out = append(out, f)
	}
	return out
}

// isSet reports whether a field holds a value a jobspec must show: a
// non-nil pointer (even to a zero value: max_parallel = 0 is not unset), a
// non-empty map or slice, a non-zero value.
func isSet(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		return !v.IsNil()
	case reflect.Map, reflect.Slice:
		return v.Len() > 0
	}
	return !v.IsZero()
}

// labelsOf returns a block's labels: its struct's label fields.
func labelsOf(v reflect.Value) []string {
	var out []string
	for _, f := range specFields(v.Type()) {
		if f.kind == kindLabel {
			fv := reflect.Indirect(v.Field(f.index))
			if fv.IsValid() {
				out = append(out, fv.String())
			}
		}
	}
	return out
}

// jobspecWriter writes a struct's fields into a body; it keeps the first
// error so the recursion stays flat.
type jobspecWriter struct{ err error }

func (w *jobspecWriter) fail(path string, format string, a ...any) {
	if w.err == nil {
		w.err = fmt.Errorf("%s: %s", path, fmt.Sprintf(format, a...))
	}
}

// body writes the set fields of struct v: attributes first, then blocks,
// with groups and tasks (the bulk of a job) last.
func (w *jobspecWriter) body(b *hclwrite.Body, v reflect.Value, path string) {
	fields := specFields(v.Type())
	for _, f := range fields {
		fv := v.Field(f.index)
		if !isSet(fv) {
			continue
		}
		switch {
		case f.kind == kindNone:
			w.fail(path+"."+f.path, "set, but a jobspec has no place for it")
		case f.kind == kindAttr && isDefaultJobName(v, f):
			// Not written: the label says it.
		case f.kind == kindAttr:
			w.attr(b, f.name, fv, path)
		case objectMap(fv):
			// A map that cannot be a block is an attribute among the
			// others (meta = { "serverless.service" = ... }).
			w.attr(b, f.name, fv, path)
		}
	}
	for _, pass := range []bool{false, true} {
		for _, f := range fields {
			if fv := v.Field(f.index); (f.kind == kindBlock || f.kind == kindNested) && writtenLast(f) == pass && isSet(fv) && !objectMap(fv) {
				w.blocks(b, f, fv, path)
			}
		}
	}
}

// writtenLast reports whether a block field is written after the others:
// groups and tasks, the bulk of a job.
func writtenLast(f specField) bool { return f.name == "group" || f.name == "task" }

// isDefaultJobName reports whether f is a job's Name equal to its ID: the
// name defaults to the ID, the job's label, so it is not written.
func isDefaultJobName(v reflect.Value, f specField) bool {
	return v.Type() == reflect.TypeFor[api.Job]() && f.path == "Name" &&
		v.Field(f.index).Elem().String() == v.FieldByName("ID").Elem().String()
}

// objectMap reports whether a block field is a map of values with a key
// that is not an HCL identifier: a block cannot hold such a key, an object
// attribute can.
func objectMap(v reflect.Value) bool {
	return v.Kind() == reflect.Map && !isStructMap(v) && !allIdentifierKeys(sortedKeys(v))
}

// attr writes name = value.
func (w *jobspecWriter) attr(b *hclwrite.Body, name string, v reflect.Value, path string) {
	toks, err := valueTokens(v.Interface())
	if err != nil {
		w.fail(path+"."+name, "%v", err)
		return
	}
	b.SetAttributeRaw(name, toks)
}

// blocks writes a block field: one block per element of a slice, one per
// key of a map of structs, a block of attributes for a map of values.
func (w *jobspecWriter) blocks(b *hclwrite.Body, f specField, v reflect.Value, path string) {
	path += "." + f.name
	v = reflect.Indirect(v)
	switch v.Kind() {
	case reflect.Struct:
		w.block(b, f.name, labelsOf(v), v, path)
	case reflect.Slice:
		for i := 0; i < v.Len(); i++ {
			if e := reflect.Indirect(v.Index(i)); e.IsValid() {
				w.block(b, f.name, labelsOf(e), e, fmt.Sprintf("%s[%d]", path, i))
			}
		}
	case reflect.Map:
		if isStructMap(v) {
			for _, k := range sortedKeys(v) {
				e := reflect.Indirect(v.MapIndex(reflect.ValueOf(k)))
				w.block(b, f.name, mapBlockLabels(k, e), e, path+"."+k)
			}
			return
		}
		w.mapBlock(b, f.name, v, f.kind == kindNested, path)
	default:
		w.fail(path, "a %s cannot be a block", v.Type())
	}
}

// block writes one struct as a block.
func (w *jobspecWriter) block(b *hclwrite.Body, name string, labels []string, v reflect.Value, path string) {
	newlineBeforeBlock(b)
	w.body(b.AppendNewBlock(name, labels).Body(), v, path)
}

// isStructMap reports whether a map's values are structs (volume "x" {}
// blocks keyed by label) rather than values.
func isStructMap(m reflect.Value) bool {
	e := m.Type().Elem()
	return e.Kind() == reflect.Struct || e.Kind() == reflect.Pointer && e.Elem().Kind() == reflect.Struct
}

// mapBlockLabels are the labels of a block keyed in a map: its struct's
// label fields, or else the key.
func mapBlockLabels(key string, v reflect.Value) []string {
	if l := labelsOf(v); len(l) > 0 {
		return l
	}
	return []string{key}
}

// mapBlock writes a map as a block of attributes (env { PORT = "..." });
// body writes a map with a key that is not an HCL identifier as an object
// attribute instead (objectMap). nested turns map values with identifier
// keys into nested blocks.
func (w *jobspecWriter) mapBlock(b *hclwrite.Body, name string, v reflect.Value, nested bool, path string) {
	newlineBeforeBlock(b)
	mb := b.AppendNewBlock(name, nil).Body()
	var blocks []string
	for _, k := range sortedKeys(v) {
		ev := v.MapIndex(reflect.ValueOf(k))
		if sub, ok := mapValue(ev); nested && ok && allIdentifiers(sub) {
			blocks = append(blocks, k)
			continue
		}
		w.attr(mb, k, ev, path)
	}
	for _, k := range blocks {
		sub, _ := mapValue(v.MapIndex(reflect.ValueOf(k)))
		w.mapBlock(mb, k, reflect.ValueOf(sub), nested, path+"."+k)
	}
}

// mapValue unwraps an interface holding a map[string]any.
func mapValue(v reflect.Value) (map[string]any, bool) {
	if v.Kind() == reflect.Interface {
		v = v.Elem()
	}
	if !v.IsValid() {
		return nil, false
	}
	m, ok := v.Interface().(map[string]any)
	return m, ok
}

func allIdentifiers(m map[string]any) bool {
	return allIdentifierKeys(slices.Collect(maps.Keys(m)))
}

func allIdentifierKeys(keys []string) bool {
	return !slices.ContainsFunc(keys, func(k string) bool { return !hclsyntax.ValidIdentifier(k) })
}

// newlineBeforeBlock sets a block apart from what precedes it in its body,
// as `nomad fmt` output does.
func newlineBeforeBlock(b *hclwrite.Body) {
	if len(b.Attributes()) > 0 || len(b.Blocks()) > 0 {
		b.AppendNewline()
	}
}

func sortedKeys(m reflect.Value) []string {
	keys := make([]string, 0, m.Len())
	for _, k := range m.MapKeys() {
		keys = append(keys, k.String())
	}
	slices.Sort(keys)
	return keys
}

// valueTokens renders a Go value as an HCL expression: durations as
// strings ("5s"), strings with quote, numbers, bools, lists as tuples, maps
// as objects (keys bare when they are identifiers).
func valueTokens(v any) (hclwrite.Tokens, error) {
	switch x := v.(type) {
	case nil:
		return hclwrite.TokensForIdentifier("null"), nil
	case time.Duration:
		return stringTokens(x.String()), nil
	case json.Number:
		f, _, err := big.ParseFloat(string(x), 10, 512, big.ToNearestEven)
		if err != nil {
			return nil, err
		}
		return hclwrite.TokensForValue(cty.NumberVal(f)), nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Interface:
		if rv.IsNil() {
			return hclwrite.TokensForIdentifier("null"), nil
		}
		return valueTokens(rv.Elem().Interface())
	case reflect.String:
		return stringTokens(rv.String()), nil
	case reflect.Bool:
		return hclwrite.TokensForValue(cty.BoolVal(rv.Bool())), nil
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return hclwrite.TokensForValue(cty.NumberIntVal(rv.Int())), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return hclwrite.TokensForValue(cty.NumberUIntVal(rv.Uint())), nil
	case reflect.Float32, reflect.Float64:
		return hclwrite.TokensForValue(cty.NumberFloatVal(rv.Float())), nil
	case reflect.Slice, reflect.Array:
		elems := make([]hclwrite.Tokens, rv.Len())
		for i := range elems {
			t, err := valueTokens(rv.Index(i).Interface())
			if err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
			elems[i] = t
		}
		return hclwrite.TokensForTuple(elems), nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		var attrs []hclwrite.ObjectAttrTokens
		for _, k := range sortedKeys(rv) {
			t, err := valueTokens(rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key())).Interface())
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k, err)
			}
			name := stringTokens(k)
			if hclsyntax.ValidIdentifier(k) {
				name = hclwrite.TokensForIdentifier(k)
			}
			attrs = append(attrs, hclwrite.ObjectAttrTokens{Name: name, Value: t})
		}
		return hclwrite.TokensForObject(attrs), nil
	}
	return nil, fmt.Errorf("a value of type %T cannot be written as HCL", v)
}

// stringTokens is a quoted string literal (see quote).
func stringTokens(s string) hclwrite.Tokens {
	q := quote(s)
	return hclwrite.Tokens{
		{Type: hclsyntax.TokenOQuote, Bytes: []byte(`"`)},
		{Type: hclsyntax.TokenQuotedLit, Bytes: []byte(q[1 : len(q)-1])},
		{Type: hclsyntax.TokenCQuote, Bytes: []byte(`"`)},
	}
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

// nomadRuntimeVar reports whether the text after "${" starts one of the
// interpolations Nomad resolves on the client.
func nomadRuntimeVar(rest string) bool {
	end := strings.IndexByte(rest, '}')
	if end < 0 || strings.ContainsAny(rest[:end], " \t\n{$%") {
		return false // not a closed interpolation: print it literally
	}
	for _, p := range []string{"NOMAD_", "attr.", "node.", "meta.", "env[", "env."} {
		if strings.HasPrefix(rest, p) {
			return true
		}
	}
	return false
}

// CheckHCL compares a job with a jobspec of it (FormatHCL's output) and
// reports every difference: a field set in the job that the jobspec lacks
// or holds with another value, or a setting of the jobspec the job does not
// have. Both are flattened to "path = value" lines, the job by the same
// jobspec names FormatHCL uses, the jobspec by reading it with hclsyntax
// (Nomad's runtime interpolations such as ${NOMAD_PORT_app} read back as
// written). A map compares alike written as a block or as an object.
func CheckHCL(job *api.Job, src []byte) error {
	want := map[string]string{}
	if job != nil {
		root := "job" + labelPath([]string{deref(job.ID, "")})
		want[root] = "{}"
		flattenJob(want, reflect.ValueOf(job).Elem(), root)
	}
	got, err := flattenHCL(src)
	if err != nil {
		return err
	}
	var problems []string
	for _, k := range sortedKeys(reflect.ValueOf(want)) {
		switch g, ok := got[k]; {
		case !ok:
			problems = append(problems, fmt.Sprintf("%s = %s is set in the job but missing from the HCL", k, want[k]))
		case g != want[k]:
			problems = append(problems, fmt.Sprintf("%s is %s in the job but %s in the HCL", k, want[k], g))
		}
	}
	for _, k := range sortedKeys(reflect.ValueOf(got)) {
		if _, ok := want[k]; !ok {
			problems = append(problems, fmt.Sprintf("%s = %s is in the HCL but not set in the job", k, got[k]))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("the HCL differs from the job:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

// labelPath renders block labels in a flattened path: ["a"]["b"].
func labelPath(labels []string) string {
	var sb strings.Builder
	for _, l := range labels {
		sb.WriteString("[" + strconv.Quote(l) + "]")
	}
	return sb.String()
}

// blockPath names a block in a flattened path: type and labels, and for
// an unlabeled block that repeats (constraint, check) its place among its
// siblings of that type.
func blockPath(parent, typ string, labels []string, seen map[string]int) string {
	if len(labels) > 0 {
		return parent + "." + typ + labelPath(labels)
	}
	n := seen[typ]
	seen[typ]++
	return fmt.Sprintf("%s.%s#%d", parent, typ, n)
}

// flattenJob adds the set fields of struct v under path, with the jobspec
// names of specFields. A map of values flattens the same whether FormatHCL
// wrote it as a block of attributes or as an object (see flattenValue), so
// this need not repeat FormatHCL's choice between the two.
func flattenJob(out map[string]string, v reflect.Value, path string) {
	seen := map[string]int{}
	for _, f := range specFields(v.Type()) {
		fv := v.Field(f.index)
		block := func(e reflect.Value, labels []string) {
			p := blockPath(path, f.name, labels, seen)
			out[p] = "{}"
			flattenJob(out, e, p)
		}
		switch {
		case !isSet(fv) || f.kind == kindLabel || f.kind == kindSkip || isDefaultJobName(v, f):
		case f.kind == kindNone:
			out[path+"."+f.path] = "(a field with no jobspec form)"
		case f.kind == kindAttr:
			flattenValue(out, path+"."+f.name, fv.Interface())
		case reflect.Indirect(fv).Kind() == reflect.Struct:
			block(reflect.Indirect(fv), labelsOf(reflect.Indirect(fv)))
		case fv.Kind() == reflect.Slice:
			for i := 0; i < fv.Len(); i++ {
				if e := reflect.Indirect(fv.Index(i)); e.IsValid() {
					block(e, labelsOf(e))
				}
			}
		case isStructMap(fv):
			for _, k := range sortedKeys(fv) {
				e := reflect.Indirect(fv.MapIndex(reflect.ValueOf(k)))
				block(e, mapBlockLabels(k, e))
			}
		default: // a map of values
			flattenValue(out, path+"."+f.name, fv.Interface())
		}
	}
}

// flattenValue adds a value's leaves: a map's keys and a list's indexes
// extend the path; an empty list is a leaf of its own. A map is "{}" at
// mapPath, like a block (FormatHCL writes some maps as blocks, some as
// objects; both read as the same settings).
func flattenValue(out map[string]string, path string, v any) {
	rv := reflect.ValueOf(v)
	for rv.IsValid() && (rv.Kind() == reflect.Pointer || rv.Kind() == reflect.Interface) {
		if rv.IsNil() {
			out[path] = "null"
			return
		}
		rv = rv.Elem()
	}
	if !rv.IsValid() {
		out[path] = "null"
		return
	}
	switch x := rv.Interface().(type) {
	case time.Duration:
		out[path] = strconv.Quote(x.String())
		return
	case json.Number:
		f, _, _ := big.ParseFloat(string(x), 10, 512, big.ToNearestEven)
		out[path] = f.Text('g', -1)
		return
	}
	switch rv.Kind() {
	case reflect.Map:
		path = mapPath(path)
		out[path] = "{}"
		for _, k := range sortedKeys(rv) {
			flattenValue(out, path+"."+objectKey(k), rv.MapIndex(reflect.ValueOf(k).Convert(rv.Type().Key())).Interface())
		}
	case reflect.Slice, reflect.Array:
		if rv.Len() == 0 {
			out[path] = "[]"
		}
		for i := 0; i < rv.Len(); i++ {
			flattenValue(out, fmt.Sprintf("%s[%d]", path, i), rv.Index(i).Interface())
		}
	case reflect.String:
		out[path] = strconv.Quote(rv.String())
	case reflect.Bool:
		out[path] = strconv.FormatBool(rv.Bool())
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		out[path] = new(big.Float).SetInt64(rv.Int()).Text('g', -1)
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		out[path] = new(big.Float).SetUint64(rv.Uint()).Text('g', -1)
	case reflect.Float32, reflect.Float64:
		out[path] = big.NewFloat(rv.Float()).Text('g', -1)
	default:
		out[path] = fmt.Sprintf("(%T)", rv.Interface())
	}
}

// mapPath is where a map, or an object, is in a flattened path: where an
// unlabeled block of that name, the first of its type, is (blockPath).
func mapPath(path string) string { return path + "#0" }

// objectKey is a map key in a flattened path: bare when it is an
// identifier, quoted otherwise.
func objectKey(k string) string {
	if hclsyntax.ValidIdentifier(k) {
		return k
	}
	return strconv.Quote(k)
}

// flattenHCL parses a jobspec and flattens it like flattenJob.
func flattenHCL(src []byte) (map[string]string, error) {
	f, diags := hclsyntax.ParseConfig(src, "job.nomad.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		return nil, fmt.Errorf("the HCL does not parse: %w", diags)
	}
	out := map[string]string{}
	var errs []error
	var walk func(b *hclsyntax.Body, path string)
	walk = func(b *hclsyntax.Body, path string) {
		for name, a := range b.Attributes {
			v, d := a.Expr.Value(runtimeVars(a.Expr, src))
			if d.HasErrors() {
				errs = append(errs, fmt.Errorf("%s.%s: %w", path, name, d))
				continue
			}
			flattenCty(out, path+"."+name, v)
		}
		seen := map[string]int{}
		for _, blk := range b.Blocks {
			p := blockPath(path, blk.Type, blk.Labels, seen)
			if path == "" {
				p = blk.Type + labelPath(blk.Labels)
			}
			out[p] = "{}"
			walk(blk.Body, p)
		}
	}
	walk(f.Body.(*hclsyntax.Body), "")
	return out, errors.Join(errs...)
}

// runtimeVars is an evaluation context in which each of Nomad's runtime
// interpolations in expr (${NOMAD_PORT_app}, ${attr.kernel.name},
// ${env["X"]}) evaluates to its own text, as Nomad's jobspec parser leaves
// it.
func runtimeVars(expr hclsyntax.Expression, src []byte) *hcl.EvalContext {
	tree := map[string]any{}
	for _, tr := range expr.Variables() {
		rng := tr.SourceRange()
		text := "${" + string(src[rng.Start.Byte:rng.End.Byte]) + "}"
		node := tree
		for i, step := range tr {
			var key string
			switch s := step.(type) {
			case hcl.TraverseRoot:
				key = s.Name
			case hcl.TraverseAttr:
				key = s.Name
			case hcl.TraverseIndex:
				if s.Key.Type() == cty.String {
					key = s.Key.AsString()
				}
			}
			if i == len(tr)-1 {
				if _, ok := node[key]; !ok {
					node[key] = text
				}
				break
			}
			next, ok := node[key].(map[string]any)
			if !ok {
				next = map[string]any{}
				node[key] = next
			}
			node = next
		}
	}
	var toCty func(v any) cty.Value
	toCty = func(v any) cty.Value {
		if s, ok := v.(string); ok {
			return cty.StringVal(s)
		}
		m := map[string]cty.Value{}
		for k, x := range v.(map[string]any) {
			m[k] = toCty(x)
		}
		return cty.ObjectVal(m)
	}
	vars := map[string]cty.Value{}
	for k, v := range tree {
		vars[k] = toCty(v)
	}
	return &hcl.EvalContext{Variables: vars}
}

// flattenCty adds a cty value's leaves like flattenValue.
func flattenCty(out map[string]string, path string, v cty.Value) {
	t := v.Type()
	switch {
	case v.IsNull():
		out[path] = "null"
	case t.IsObjectType() || t.IsMapType():
		path = mapPath(path)
		out[path] = "{}"
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			flattenCty(out, path+"."+objectKey(k.AsString()), e)
		}
	case t.IsTupleType() || t.IsListType() || t.IsSetType():
		if v.LengthInt() == 0 {
			out[path] = "[]"
		}
		i := 0
		for it := v.ElementIterator(); it.Next(); i++ {
			_, e := it.Element()
			flattenCty(out, fmt.Sprintf("%s[%d]", path, i), e)
		}
	case t == cty.String:
		out[path] = strconv.Quote(v.AsString())
	case t == cty.Bool:
		out[path] = strconv.FormatBool(v.True())
	case t == cty.Number:
		out[path] = v.AsBigFloat().Text('g', -1)
	default:
		out[path] = "(" + t.FriendlyName() + ")"
	}
}
