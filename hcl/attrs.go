package hcl

import (
	"fmt"
	"math/big"
	"strconv"
	"time"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// decoder turns attributes of one service block into Go values. It collects
// diagnostics instead of stopping at the first, and remembers where each
// setting was written (by its spec.Problem path) so problems found later by
// spec validation point at the right file:line:col.
type decoder struct {
	ctx    *hcl2.EvalContext
	budget *budget
	diags  hcl2.Diagnostics
	ranges map[string]hcl2.Range
	// failed holds the paths that had errors while decoding, so follow-on
	// validation problems about them (a default left in place) are not
	// reported on top.
	failed map[string]bool
}

func newDecoder(ctx *hcl2.EvalContext, b *budget) *decoder {
	return &decoder{ctx: ctx, budget: b, ranges: map[string]hcl2.Range{}, failed: map[string]bool{}}
}

func (d *decoder) addDiags(path string, diags hcl2.Diagnostics) {
	d.diags = append(d.diags, explain(diags)...)
	if diags.HasErrors() && path != "" {
		d.failed[path] = true
	}
}

// failedNear reports whether decoding failed at path, inside it or around
// it: then a validation problem at path may only echo that failure.
func (d *decoder) failedNear(path string) bool {
	for f := range d.failed {
		if f == path || within(path, f) || within(f, path) {
			return true
		}
	}
	return false
}

// within reports whether path names something inside parent
// ("traffic[0].percent" is within "traffic[0]" and "traffic").
func within(path, parent string) bool {
	return parent != "" && len(path) > len(parent) && path[:len(parent)] == parent &&
		(path[len(parent)] == '.' || path[len(parent)] == '[')
}

func (d *decoder) errorf(path string, subject hcl2.Range, summary, detail string, args ...any) {
	d.failed[path] = true
	d.diags = append(d.diags, &hcl2.Diagnostic{
		Severity: hcl2.DiagError,
		Summary:  summary,
		Detail:   fmt.Sprintf(detail, args...),
		Subject:  subject.Ptr(),
	})
}

// value evaluates a's expression. ok is false when a is absent, the value is
// null (null means "not set": the default stays) or evaluation failed.
func (d *decoder) value(a *hcl2.Attribute, path string) (cty.Value, bool) {
	if a == nil {
		return cty.NilVal, false
	}
	d.ranges[path] = a.Expr.Range()
	if diags := checkReferences(d.ctx, a.Expr); diags.HasErrors() {
		d.addDiags(path, diags)
		return cty.NilVal, false
	}
	v, diags := a.Expr.Value(evalContext(d.ctx, a.Expr))
	d.addDiags(path, diags)
	if diags.HasErrors() || v.IsNull() {
		return cty.NilVal, false
	}
	if !v.IsWhollyKnown() && d.budget.spent() {
		d.failed[path] = true // unknown because evaluation stopped; that is reported once
		return cty.NilVal, false
	}
	if !v.IsWhollyKnown() {
		d.errorf(path, a.Expr.Range(), "Value not known", "The value of %s cannot be known while reading the file.", path)
		return cty.NilVal, false
	}
	if err := d.budget.value(v); err != nil {
		d.failed[path] = true
		d.diags = append(d.diags, d.budget.diag(err, a.Expr.Range()))
		return cty.NilVal, false
	}
	return v, true
}

func (d *decoder) typeError(a *hcl2.Attribute, path, want, example string, got cty.Type) {
	d.errorf(path, a.Expr.Range(), "Incorrect attribute value type",
		"%s must be %s, for example %s = %s; this value is %s.", path, want, lastSegment(path), example, typeName(got))
}

func (d *decoder) convert(a *hcl2.Attribute, path string, v cty.Value, ty cty.Type, want, example string) (cty.Value, bool) {
	cv, err := convert.Convert(v, ty)
	if err != nil {
		d.typeError(a, path, want, example, v.Type())
		return cty.NilVal, false
	}
	return cv, true
}

func (d *decoder) str(a *hcl2.Attribute, path string) (string, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return "", false
	}
	if !v.Type().IsPrimitiveType() {
		d.typeError(a, path, "a string", `"..."`, v.Type())
		return "", false
	}
	cv, ok := d.convert(a, path, v, cty.String, "a string", `"..."`)
	if !ok {
		return "", false
	}
	return cv.AsString(), true
}

func (d *decoder) bool(a *hcl2.Attribute, path string) (bool, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return false, false
	}
	cv, ok := d.convert(a, path, v, cty.Bool, "true or false", "true")
	if !ok {
		return false, false
	}
	return cv.True(), true
}

func (d *decoder) number(a *hcl2.Attribute, path, want, example string) (*big.Float, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return nil, false
	}
	cv, ok := d.convert(a, path, v, cty.Number, want, example)
	if !ok {
		return nil, false
	}
	return cv.AsBigFloat(), true
}

func (d *decoder) int(a *hcl2.Attribute, path string) (int, bool) {
	bf, ok := d.number(a, path, "a whole number", "1")
	if !ok {
		return 0, false
	}
	i, acc := bf.Int64()
	if !bf.IsInt() || acc != big.Exact || int64(int(i)) != i || i > 1<<31 || i < -(1<<31) {
		d.errorf(path, a.Expr.Range(), "Whole number required",
			"%s must be a whole number, for example %s = 1; this value is %s.", path, lastSegment(path), numberText(bf))
		return 0, false
	}
	return int(i), true
}

func (d *decoder) float(a *hcl2.Attribute, path string) (float64, bool) {
	bf, ok := d.number(a, path, "a number", "70")
	if !ok {
		return 0, false
	}
	g, err := numberToGo(bf)
	if err != nil {
		d.errorf(path, a.Expr.Range(), "Number out of range", "%s: %s.", path, err)
		return 0, false
	}
	switch n := g.(type) {
	case int64:
		return float64(n), true
	case float64:
		return n, true
	}
	return 0, false
}

// duration reads a Go duration string. A bare number is refused: "30" could
// mean seconds or milliseconds, so the unit must be written.
func (d *decoder) duration(a *hcl2.Attribute, path string) (time.Duration, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return 0, false
	}
	name := lastSegment(path)
	if v.Type() == cty.Number {
		d.errorf(path, a.Expr.Range(), "Invalid duration",
			"%s must be a duration string with a unit, for example %s = \"30s\"; a bare number has no unit. Units are ns, us, ms, s, m and h.", path, name)
		return 0, false
	}
	if v.Type() != cty.String {
		d.typeError(a, path, "a duration string", `"30s"`, v.Type())
		return 0, false
	}
	s := v.AsString()
	dur, err := time.ParseDuration(s)
	if err != nil {
		d.errorf(path, a.Expr.Range(), "Invalid duration",
			"%q is not a duration (%s). Write a number immediately followed by a unit, for example %s = \"30s\", \"1m30s\" or \"250ms\"; units are ns, us, ms, s, m and h.", s, path, name)
		return 0, false
	}
	return dur, true
}

// The set* helpers store a setting that the file writes (and that decodes)
// in *dst, and leave the default there otherwise.

func (d *decoder) setStr(dst *string, a *hcl2.Attribute, path string) {
	if v, ok := d.str(a, path); ok {
		*dst = v
	}
}

func (d *decoder) setBool(dst *bool, a *hcl2.Attribute, path string) {
	if v, ok := d.bool(a, path); ok {
		*dst = v
	}
}

func (d *decoder) setInt(dst *int, a *hcl2.Attribute, path string) {
	if v, ok := d.int(a, path); ok {
		*dst = v
	}
}

func (d *decoder) setFloat(dst *float64, a *hcl2.Attribute, path string) {
	if v, ok := d.float(a, path); ok {
		*dst = v
	}
}

func (d *decoder) setDuration(dst *time.Duration, a *hcl2.Attribute, path string) {
	if v, ok := d.duration(a, path); ok {
		*dst = v
	}
}

func (d *decoder) setStrList(dst *[]string, a *hcl2.Attribute, path string) {
	if v, ok := d.strList(a, path); ok {
		*dst = v
	}
}

func (d *decoder) setStrMap(dst *map[string]string, a *hcl2.Attribute, path string) {
	if v, ok := d.strMap(a, path); ok {
		*dst = v
	}
}

// strList reads a list of strings and remembers where each element was
// written (path[i]) when the list is written out literally.
func (d *decoder) strList(a *hcl2.Attribute, path string) ([]string, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return nil, false
	}
	ty := v.Type()
	if !(ty.IsListType() || ty.IsTupleType() || ty.IsSetType()) {
		d.typeError(a, path, "a list of strings", `["a", "b"]`, ty)
		return nil, false
	}
	if tup, isTuple := syntaxOf(a.Expr).(*hclsyntax.TupleConsExpr); isTuple {
		for i, e := range tup.Exprs {
			d.ranges[fmt.Sprintf("%s[%d]", path, i)] = e.Range()
		}
	}
	out := make([]string, 0, v.LengthInt())
	i := 0
	for it := v.ElementIterator(); it.Next(); i++ {
		_, e := it.Element()
		if e.IsNull() || !e.Type().IsPrimitiveType() {
			d.errorf(path, d.rangeOr(fmt.Sprintf("%s[%d]", path, i), a.Expr.Range()), "Incorrect attribute value type",
				"%s must be a list of strings, for example %s = [\"a\", \"b\"]; element %d is %s.", path, lastSegment(path), i, typeName(e.Type()))
			return nil, false
		}
		s, _ := convert.Convert(e, cty.String)
		out = append(out, s.AsString())
	}
	return out, true
}

// strMap reads a map of strings (numbers and bools are written as strings)
// and remembers where each key was written (path.key).
func (d *decoder) strMap(a *hcl2.Attribute, path string) (map[string]string, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return nil, false
	}
	ty := v.Type()
	if !(ty.IsMapType() || ty.IsObjectType()) {
		d.typeError(a, path, "a map of strings", `{ KEY = "value" }`, ty)
		return nil, false
	}
	if obj, isObj := syntaxOf(a.Expr).(*hclsyntax.ObjectConsExpr); isObj {
		for _, item := range obj.Items {
			kv, diags := item.KeyExpr.Value(evalContext(d.ctx, item.KeyExpr))
			if diags.HasErrors() || !kv.IsKnown() || kv.IsNull() {
				continue
			}
			if ks, err := convert.Convert(kv, cty.String); err == nil {
				d.ranges[path+"."+ks.AsString()] = hcl2.RangeBetween(item.KeyExpr.Range(), item.ValueExpr.Range())
			}
		}
	}
	out := make(map[string]string, v.LengthInt())
	for it := v.ElementIterator(); it.Next(); {
		k, e := it.Element()
		key := k.AsString()
		if e.IsNull() || !e.Type().IsPrimitiveType() {
			d.errorf(path, d.rangeOr(path+"."+key, a.Expr.Range()), "Incorrect attribute value type",
				"%s must be a map of strings, for example %s = { KEY = \"value\" }; the value of %s is %s.", path, lastSegment(path), strconv.Quote(key), typeName(e.Type()))
			return nil, false
		}
		s, _ := convert.Convert(e, cty.String)
		out[key] = s.AsString()
	}
	return out, true
}

// attrsMap reads a block whose attributes are free-form names, such as
// env { FOO = "bar" }, into a map of strings.
func (d *decoder) attrsMap(b *hcl2.Block, path string) map[string]string {
	d.ranges[path] = b.DefRange
	attrs, diags := b.Body.JustAttributes()
	d.addDiags(path, diags)
	out := make(map[string]string, len(attrs))
	for _, name := range sortedKeys(attrs) {
		a := attrs[name]
		if s, ok := d.str(a, path+"."+name); ok {
			out[name] = s
			d.ranges[path+"."+name] = a.Range
		}
	}
	return out
}

// checkReferences reports references to undeclared variables and locals
// with a suggestion, which HCL's generic "Unsupported attribute" lacks.
func checkReferences(ctx *hcl2.EvalContext, expr hcl2.Expression) hcl2.Diagnostics {
	var diags hcl2.Diagnostics
	for _, tr := range expr.Variables() {
		root := tr.RootName()
		if (root != "var" && root != "local") || len(tr) < 2 {
			continue
		}
		step, ok := tr[1].(hcl2.TraverseAttr)
		if !ok {
			continue
		}
		obj := ctx.Variables[root]
		if !obj.Type().IsObjectType() || obj.Type().HasAttribute(step.Name) {
			continue
		}
		// Sorted, so that of two names equally close the same is suggested
		// every time.
		hint := suggest(step.Name, sortedKeys(obj.Type().AttributeTypes()))
		summary, detail := "Undeclared variable", fmt.Sprintf("There is no variable named %q.", step.Name)
		if root == "local" {
			summary, detail = "Undeclared local value", fmt.Sprintf("There is no local value named %q.", step.Name)
		}
		switch {
		case hint != "":
			detail += hint
		case root == "var":
			detail += fmt.Sprintf(" Declare it with variable %q { default = ... }.", step.Name)
		default:
			detail += " Define it in a locals { } block."
		}
		diags = append(diags, &hcl2.Diagnostic{
			Severity: hcl2.DiagError, Summary: summary, Detail: detail,
			Subject: tr.SourceRange().Ptr(),
		})
	}
	return diags
}

func (d *decoder) rangeOr(path string, def hcl2.Range) hcl2.Range {
	if r, ok := d.ranges[path]; ok {
		return r
	}
	return def
}
