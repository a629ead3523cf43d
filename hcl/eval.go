package hcl

import (
	"fmt"
	"math"
	"math/big"
	"sort"
	"strconv"
	"strings"
	"unicode"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// runtimeRoot reports whether a variable root name belongs to Nomad's runtime
// interpolation (${attr.kernel.name}, ${node.unique.id}, ${meta.rack},
// ${NOMAD_PORT_app}, ${PORT}, ...). Such references are not evaluated here:
// they are written back as "${...}" so Nomad or the task's environment
// resolves them at run time, as Nomad's own HCL2 jobspec parser does.
// Lower-case names other than these stay errors, so a typo such as vars.x is
// reported instead of passed through.
func runtimeRoot(name string) bool {
	switch name {
	case "attr", "node", "meta", "env", "device":
		return true
	}
	r := []rune(name)
	return len(r) > 0 && (unicode.IsUpper(r[0]) || r[0] == '_')
}

// runtimeNode is one level of the object built for runtime references.
type runtimeNode struct {
	text     string // the reference as Nomad will see it, without ${}
	children map[string]*runtimeNode
}

func (n *runtimeNode) value() cty.Value {
	if len(n.children) == 0 {
		return cty.StringVal("${" + n.text + "}")
	}
	attrs := make(map[string]cty.Value, len(n.children))
	for k, c := range n.children {
		attrs[k] = c.value()
	}
	return cty.ObjectVal(attrs)
}

// evalContext returns ctx extended with stand-ins for the runtime references
// expr makes (see runtimeRoot). Names ctx already defines win.
func evalContext(ctx *hcl2.EvalContext, expr hcl2.Expression) *hcl2.EvalContext {
	roots := map[string]*runtimeNode{}
	for _, tr := range expr.Variables() {
		if len(tr) == 0 {
			continue
		}
		root := tr.RootName()
		if _, defined := ctx.Variables[root]; defined || !runtimeRoot(root) {
			continue
		}
		n := roots[root]
		if n == nil {
			n = &runtimeNode{text: root}
			roots[root] = n
		}
	steps:
		for _, step := range tr[1:] {
			var key, text string
			switch s := step.(type) {
			case hcl2.TraverseAttr:
				key, text = s.Name, n.text+"."+s.Name
			case hcl2.TraverseIndex:
				if !s.Key.IsKnown() || s.Key.IsNull() || s.Key.Type() != cty.String {
					break steps
				}
				key = s.Key.AsString()
				text = n.text + "[" + strconv.Quote(key) + "]"
			default:
				break steps
			}
			if n.children == nil {
				n.children = map[string]*runtimeNode{}
			}
			c := n.children[key]
			if c == nil {
				c = &runtimeNode{text: text}
				n.children[key] = c
			}
			n = c
		}
	}
	if len(roots) == 0 {
		return ctx
	}
	child := ctx.NewChild()
	child.Variables = make(map[string]cty.Value, len(roots))
	for k, n := range roots {
		child.Variables[k] = n.value()
	}
	return child
}

// typeName is how a value's type is named in messages.
func typeName(ty cty.Type) string {
	switch {
	case ty == cty.String:
		return "a string"
	case ty == cty.Number:
		return "a number"
	case ty == cty.Bool:
		return "a bool"
	case ty.IsListType(), ty.IsTupleType(), ty.IsSetType():
		return "a list"
	case ty.IsMapType(), ty.IsObjectType():
		return "a map or object"
	case ty == cty.DynamicPseudoType:
		return "null"
	}
	return ty.FriendlyName()
}

// toGo converts a known cty value into plain JSON-compatible Go values:
// map[string]any, []any, string, int64 (whole numbers that fit), float64,
// bool and nil. It fails on values JSON cannot carry.
func toGo(v cty.Value) (any, error) {
	if v.IsNull() {
		return nil, nil
	}
	if !v.IsWhollyKnown() {
		return nil, fmt.Errorf("the value is not known until run time")
	}
	ty := v.Type()
	switch {
	case ty == cty.String:
		return v.AsString(), nil
	case ty == cty.Bool:
		return v.True(), nil
	case ty == cty.Number:
		return numberToGo(v.AsBigFloat())
	case ty.IsListType(), ty.IsTupleType(), ty.IsSetType():
		out := make([]any, 0, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			_, e := it.Element()
			g, err := toGo(e)
			if err != nil {
				return nil, err
			}
			out = append(out, g)
		}
		return out, nil
	case ty.IsMapType(), ty.IsObjectType():
		out := make(map[string]any, v.LengthInt())
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			g, err := toGo(e)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", k.AsString(), err)
			}
			out[k.AsString()] = g
		}
		return out, nil
	}
	return nil, fmt.Errorf("%s values cannot be sent to Nomad", ty.FriendlyName())
}

func numberToGo(bf *big.Float) (any, error) {
	if bf.IsInt() {
		if i, acc := bf.Int64(); acc == big.Exact {
			return i, nil
		}
	}
	f, _ := bf.Float64()
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, fmt.Errorf("the number %s is too large", numberText(bf))
	}
	return f, nil
}

// sortedKeys returns m's keys in order, so diagnostics come out stable.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// lastSegment is the attribute name at the end of a path ("scaling.min" ->
// "min", "traffic[0].percent" -> "percent").
func lastSegment(path string) string {
	if i := strings.LastIndexAny(path, ".]"); i >= 0 {
		return path[i+1:]
	}
	return path
}

// explain adds this language's advice to HCL's generic diagnostics.
func explain(diags hcl2.Diagnostics) hcl2.Diagnostics {
	for _, d := range diags {
		if d.Summary == "Call to unknown function" && strings.Contains(d.Detail, `named "env"`) {
			d.Detail += " Service files read nothing from the environment directly: declare a variable and set it with " +
				"-var, -var-file or " + EnvVarPrefix + "<name>."
		}
	}
	return diags
}
