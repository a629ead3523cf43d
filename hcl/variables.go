package hcl

import (
	"fmt"
	"os"
	"sort"

	"github.com/agext/levenshtein"
	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/ext/typeexpr"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/convert"
)

// EnvVarPrefix + a variable's name is the environment variable that sets it,
// like Nomad's NOMAD_VAR_.
const EnvVarPrefix = "NOMAD_SERVERLESS_VAR_"

// variable is one declared `variable "name" {}` block.
type variable struct {
	name  string
	ty    cty.Type
	block *hcl2.Block
	// value is cty.NilVal until the default or an outside value sets it.
	value cty.Value
}

var variableSchema = &hcl2.BodySchema{
	Attributes: []hcl2.AttributeSchema{{Name: "type"}, {Name: "default"}, {Name: "description"}},
}

// functionsOnly is the context of expressions that may not use variables:
// variable defaults and -var-file values.
func functionsOnly(b *budget) *hcl2.EvalContext {
	return &hcl2.EvalContext{Functions: functions(b)}
}

// buildContext builds the context service blocks are evaluated in: var.*,
// local.* and the functions. Values come, lowest precedence first, from each
// variable's default, the NOMAD_SERVERLESS_VAR_<name> environment variable,
// the -var-file files in order, and -var flags.
func buildContext(p *hclparse.Parser, filename string, content *hcl2.BodyContent, opts Options, b *budget) (*hcl2.EvalContext, hcl2.Diagnostics) {
	vars, diags := declareVariables(content.Blocks.OfType("variable"), b)
	diags = append(diags, assignVariables(p, filename, vars, opts, b)...)
	varVals := map[string]cty.Value{}
	for _, v := range vars {
		if v.value == cty.NilVal {
			diags = append(diags, &hcl2.Diagnostic{
				Severity: hcl2.DiagError,
				Summary:  "No value for required variable",
				Detail: fmt.Sprintf("Variable %q has no default. Set it with -var %s=VALUE, in a -var-file, or with the environment variable %s%s.",
					v.name, v.name, EnvVarPrefix, v.name),
				Subject: v.block.DefRange.Ptr(),
			})
			continue
		}
		varVals[v.name] = v.value
	}
	ctx := &hcl2.EvalContext{
		Variables: map[string]cty.Value{"var": cty.ObjectVal(varVals), "local": cty.EmptyObjectVal},
		Functions: functions(b),
	}
	if diags.HasErrors() {
		return ctx, diags
	}
	diags = append(diags, evalLocals(ctx, content.Blocks.OfType("locals"), b)...)
	return ctx, diags
}

func declareVariables(blocks hcl2.Blocks, b *budget) (map[string]*variable, hcl2.Diagnostics) {
	var diags hcl2.Diagnostics
	vars := map[string]*variable{}
	for _, blk := range blocks {
		name := blk.Labels[0]
		if !hclsyntax.ValidIdentifier(name) {
			diags = append(diags, &hcl2.Diagnostic{
				Severity: hcl2.DiagError, Summary: "Invalid variable name",
				Detail:  fmt.Sprintf("%q is not a valid name: use letters, digits, '_' and '-', starting with a letter.", name),
				Subject: blk.LabelRanges[0].Ptr(),
			})
			continue
		}
		if prev, dup := vars[name]; dup {
			diags = append(diags, &hcl2.Diagnostic{
				Severity: hcl2.DiagError, Summary: "Duplicate variable",
				Detail:  fmt.Sprintf("Variable %q is already declared on line %d; each variable is declared once.", name, prev.block.DefRange.Start.Line),
				Subject: blk.LabelRanges[0].Ptr(),
			})
			continue
		}
		v := &variable{name: name, ty: cty.DynamicPseudoType, block: blk}
		vars[name] = v
		c, d := blk.Body.Content(variableSchema)
		diags = append(diags, d...)
		if a := c.Attributes["type"]; a != nil {
			ty, d := typeexpr.TypeConstraint(a.Expr)
			diags = append(diags, d...)
			if !d.HasErrors() {
				v.ty = ty
			}
		}
		if a := c.Attributes["description"]; a != nil {
			_, d := a.Expr.Value(nil)
			diags = append(diags, d...)
		}
		if a := c.Attributes["default"]; a != nil {
			val, d := a.Expr.Value(functionsOnly(b))
			diags = append(diags, d...)
			if d.HasErrors() {
				continue
			}
			if err := b.value(val); err != nil {
				diags = append(diags, b.diag(err, a.Expr.Range()))
				continue
			}
			cv, err := convert.Convert(val, v.ty)
			if err != nil {
				diags = append(diags, &hcl2.Diagnostic{
					Severity: hcl2.DiagError, Summary: "Invalid default value for variable",
					Detail:  fmt.Sprintf("The default of %q does not match its type %s: %s.", name, typeexpr.TypeString(v.ty), err),
					Subject: a.Expr.Range().Ptr(),
				})
				continue
			}
			v.value = cv
		}
	}
	return vars, diags
}

func assignVariables(p *hclparse.Parser, filename string, vars map[string]*variable, opts Options, b *budget) hcl2.Diagnostics {
	var diags hcl2.Diagnostics
	names := sortedKeys(vars)
	if opts.Getenv != nil {
		for _, name := range names {
			raw := opts.Getenv(EnvVarPrefix + name)
			if raw == "" {
				continue
			}
			diags = append(diags, vars[name].setRaw(raw, "environment variable "+EnvVarPrefix+name, b)...)
		}
	}
	for _, path := range opts.VarFiles {
		f, d := parseVarFile(p, path, b)
		diags = append(diags, d...)
		if d.HasErrors() {
			continue
		}
		attrs, d := f.Body.JustAttributes()
		diags = append(diags, d...)
		for _, name := range sortedKeys(attrs) {
			a := attrs[name]
			v := vars[name]
			if v == nil {
				diags = append(diags, &hcl2.Diagnostic{
					Severity: hcl2.DiagWarning, Summary: "Value for undeclared variable",
					Detail:  fmt.Sprintf("%s declares no variable %q, so this value is ignored there.%s", filename, name, suggest(name, names)),
					Subject: a.NameRange.Ptr(),
				})
				continue
			}
			val, d := a.Expr.Value(functionsOnly(b))
			diags = append(diags, d...)
			if d.HasErrors() {
				continue
			}
			if err := b.value(val); err != nil {
				diags = append(diags, b.diag(err, a.Expr.Range()))
				continue
			}
			cv, err := convert.Convert(val, v.ty)
			if err != nil {
				diags = append(diags, &hcl2.Diagnostic{
					Severity: hcl2.DiagError, Summary: "Invalid value for variable",
					Detail:  fmt.Sprintf("Variable %q is of type %s: %s.", name, typeexpr.TypeString(v.ty), err),
					Subject: a.Expr.Range().Ptr(),
				})
				continue
			}
			v.value = cv
		}
	}
	for _, name := range sortedKeys(opts.Vars) {
		v := vars[name]
		if v == nil {
			diags = append(diags, &hcl2.Diagnostic{
				Severity: hcl2.DiagWarning, Summary: "Value for undeclared variable",
				Detail: fmt.Sprintf("-var %s=... sets a variable that %s does not declare, so it is ignored there.%s",
					name, filename, suggest(name, names)),
			})
			continue
		}
		diags = append(diags, v.setRaw(opts.Vars[name], "-var "+name, b)...)
	}
	return diags
}

// setRaw sets the variable from a string given outside HCL (a flag or an
// environment variable). Strings, numbers and bools are taken as written;
// lists, maps and objects are parsed as HCL expressions, as Terraform and
// Nomad do.
func (v *variable) setRaw(raw, source string, b *budget) hcl2.Diagnostics {
	var val cty.Value
	if v.ty == cty.DynamicPseudoType || v.ty.IsPrimitiveType() {
		val = cty.StringVal(raw)
	} else {
		diags := checkSource(source, []byte(raw))
		if !diags.HasErrors() {
			var expr hclsyntax.Expression
			expr, diags = hclsyntax.ParseExpression([]byte(raw), source, hcl2.InitialPos)
			if !diags.HasErrors() {
				val, diags = instrument(expr, b).Value(functionsOnly(b))
			}
		}
		if diags.HasErrors() {
			return hcl2.Diagnostics{{
				Severity: hcl2.DiagError, Summary: "Invalid value for variable",
				Detail: fmt.Sprintf("%s: variable %q is of type %s, so its value is written in HCL syntax, for example %s; %s",
					source, v.name, typeexpr.TypeString(v.ty), exampleFor(v.ty), diags[0].Detail),
				Subject: v.block.DefRange.Ptr(),
			}}
		}
	}
	if err := b.value(val); err != nil {
		return hcl2.Diagnostics{{
			Severity: hcl2.DiagError, Summary: summaryValueTooLarge,
			Detail:  fmt.Sprintf("%s: variable %q: %s.", source, v.name, err),
			Subject: v.block.DefRange.Ptr(),
		}}
	}
	cv, err := convert.Convert(val, v.ty)
	if err != nil {
		return hcl2.Diagnostics{{
			Severity: hcl2.DiagError, Summary: "Invalid value for variable",
			Detail:  fmt.Sprintf("%s: variable %q is of type %s: %s.", source, v.name, typeexpr.TypeString(v.ty), err),
			Subject: v.block.DefRange.Ptr(),
		}}
	}
	v.value = cv
	return nil
}

func exampleFor(ty cty.Type) string {
	switch {
	case ty.IsListType(), ty.IsSetType(), ty.IsTupleType():
		return `["a", "b"]`
	default:
		return `{ key = "value" }`
	}
}

// evalLocals evaluates every locals block into ctx's local object, each
// local after the locals it refers to (a topological order, so a long chain
// of locals costs in proportion to its length). Each local is evaluated in
// a context holding only the locals it refers to.
func evalLocals(ctx *hcl2.EvalContext, blocks hcl2.Blocks, b *budget) hcl2.Diagnostics {
	var diags hcl2.Diagnostics
	pending := map[string]*hcl2.Attribute{}
	for _, blk := range blocks {
		attrs, d := blk.Body.JustAttributes()
		diags = append(diags, d...)
		for _, name := range sortedKeys(attrs) {
			a := attrs[name]
			if prev, dup := pending[name]; dup {
				diags = append(diags, &hcl2.Diagnostic{
					Severity: hcl2.DiagError, Summary: "Duplicate local value",
					Detail:  fmt.Sprintf("local.%s is already defined on line %d.", name, prev.NameRange.Start.Line),
					Subject: a.NameRange.Ptr(),
				})
				continue
			}
			pending[name] = a
		}
	}
	// Undeclared locals are reported against every declared name, so the
	// suggestion is the closest of all of them.
	declared := make(map[string]cty.Value, len(pending))
	for n := range pending {
		declared[n] = cty.DynamicVal
	}
	checkCtx := &hcl2.EvalContext{Variables: map[string]cty.Value{"var": ctx.Variables["var"], "local": cty.ObjectVal(declared)}}

	names := sortedKeys(pending)
	deps := make(map[string][]string, len(pending))
	waiting := make(map[string]int, len(pending)) // how many of its locals are not evaluated yet
	users := map[string][]string{}                // who refers to a local
	for _, name := range names {
		seen := map[string]bool{}
		for _, tr := range pending[name].Expr.Variables() {
			if tr.RootName() != "local" || len(tr) < 2 {
				continue
			}
			if step, ok := tr[1].(hcl2.TraverseAttr); ok && pending[step.Name] != nil && !seen[step.Name] {
				seen[step.Name] = true
				deps[name] = append(deps[name], step.Name)
				users[step.Name] = append(users[step.Name], name)
			}
		}
		waiting[name] = len(deps[name])
	}
	var ready []string // kept sorted, so the order is the same every time
	for _, name := range names {
		if waiting[name] == 0 {
			ready = append(ready, name)
		}
	}
	done := make(map[string]cty.Value, len(pending))
	for len(ready) > 0 {
		name := ready[0]
		ready = ready[1:]
		a := pending[name]
		val := cty.DynamicVal
		d := checkReferences(checkCtx, a.Expr)
		if !d.HasErrors() {
			own := make(map[string]cty.Value, len(deps[name]))
			for _, dep := range deps[name] {
				own[dep] = done[dep]
			}
			local := &hcl2.EvalContext{Variables: map[string]cty.Value{"var": ctx.Variables["var"], "local": cty.ObjectVal(own)}, Functions: ctx.Functions}
			val, d = a.Expr.Value(evalContext(local, a.Expr))
			if !d.HasErrors() {
				if err := b.value(val); err != nil {
					d = append(d, b.diag(err, a.Expr.Range()))
				}
			}
		}
		diags = append(diags, explain(d)...)
		if d.HasErrors() {
			val = cty.DynamicVal
		}
		done[name] = val
		var next []string
		for _, u := range users[name] {
			if waiting[u]--; waiting[u] == 0 {
				next = append(next, u)
			}
		}
		if len(next) > 0 {
			ready = append(ready, next...)
			sort.Strings(ready)
		}
	}
	for _, name := range names {
		if _, ok := done[name]; ok {
			continue
		}
		diags = append(diags, &hcl2.Diagnostic{
			Severity: hcl2.DiagError, Summary: "Circular reference between locals",
			Detail:  fmt.Sprintf("local.%s depends, directly or through other locals, on itself. Break the cycle.", name),
			Subject: pending[name].NameRange.Ptr(),
		})
		done[name] = cty.DynamicVal
	}
	ctx.Variables["local"] = cty.ObjectVal(done)
	return diags
}

// parseVarFile reads a -var-file within the same bounds as a service file.
func parseVarFile(p *hclparse.Parser, path string, b *budget) (*hcl2.File, hcl2.Diagnostics) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, hcl2.Diagnostics{{
			Severity: hcl2.DiagError,
			Summary:  "Failed to read file",
			Detail:   fmt.Sprintf("Cannot read the variables file: %s.", err),
		}}
	}
	if diags := checkSource(path, src); diags.HasErrors() {
		return nil, diags
	}
	f, diags := p.ParseHCL(src, path)
	if diags.HasErrors() {
		return nil, capDiagnostics(diags)
	}
	if body, ok := f.Body.(*hclsyntax.Body); ok {
		instrumentBody(body, b)
	}
	return f, diags
}

// suggest returns " Did you mean "x"?" for the known name closest to given,
// or "" when none is close.
func suggest(given string, known []string) string {
	best, bestDist := "", 3
	for _, k := range known {
		if d := levenshtein.Distance(given, k, nil); d < bestDist {
			best, bestDist = k, d
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" Did you mean %q?", best)
}
