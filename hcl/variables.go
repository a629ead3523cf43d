package hcl

import (
	"fmt"

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
func functionsOnly() *hcl2.EvalContext {
	return &hcl2.EvalContext{Functions: functions()}
}

// buildContext builds the context service blocks are evaluated in: var.*,
// local.* and the functions. Values come, lowest precedence first, from each
// variable's default, the NOMAD_SERVERLESS_VAR_<name> environment variable,
// the -var-file files in order, and -var flags.
func buildContext(p *hclparse.Parser, filename string, content *hcl2.BodyContent, opts Options) (*hcl2.EvalContext, hcl2.Diagnostics) {
	vars, diags := declareVariables(content.Blocks.OfType("variable"))
	diags = append(diags, assignVariables(p, filename, vars, opts)...)
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
		Functions: functions(),
	}
	if diags.HasErrors() {
		return ctx, diags
	}
	diags = append(diags, evalLocals(ctx, content.Blocks.OfType("locals"))...)
	return ctx, diags
}

func declareVariables(blocks hcl2.Blocks) (map[string]*variable, hcl2.Diagnostics) {
	var diags hcl2.Diagnostics
	vars := map[string]*variable{}
	for _, b := range blocks {
		name := b.Labels[0]
		if !hclsyntax.ValidIdentifier(name) {
			diags = append(diags, &hcl2.Diagnostic{
				Severity: hcl2.DiagError, Summary: "Invalid variable name",
				Detail:  fmt.Sprintf("%q is not a valid name: use letters, digits, '_' and '-', starting with a letter.", name),
				Subject: b.LabelRanges[0].Ptr(),
			})
			continue
		}
		if prev, dup := vars[name]; dup {
			diags = append(diags, &hcl2.Diagnostic{
				Severity: hcl2.DiagError, Summary: "Duplicate variable",
				Detail:  fmt.Sprintf("Variable %q is already declared on line %d; each variable is declared once.", name, prev.block.DefRange.Start.Line),
				Subject: b.LabelRanges[0].Ptr(),
			})
			continue
		}
		v := &variable{name: name, ty: cty.DynamicPseudoType, block: b}
		vars[name] = v
		c, d := b.Body.Content(variableSchema)
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
			val, d := a.Expr.Value(functionsOnly())
			diags = append(diags, d...)
			if d.HasErrors() {
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

func assignVariables(p *hclparse.Parser, filename string, vars map[string]*variable, opts Options) hcl2.Diagnostics {
	var diags hcl2.Diagnostics
	names := sortedKeys(vars)
	if opts.Getenv != nil {
		for _, name := range names {
			raw := opts.Getenv(EnvVarPrefix + name)
			if raw == "" {
				continue
			}
			diags = append(diags, vars[name].setRaw(raw, "environment variable "+EnvVarPrefix+name)...)
		}
	}
	for _, path := range opts.VarFiles {
		f, d := p.ParseHCLFile(path)
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
			val, d := a.Expr.Value(functionsOnly())
			diags = append(diags, d...)
			if d.HasErrors() {
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
		diags = append(diags, v.setRaw(opts.Vars[name], "-var "+name)...)
	}
	return diags
}

// setRaw sets the variable from a string given outside HCL (a flag or an
// environment variable). Strings, numbers and bools are taken as written;
// lists, maps and objects are parsed as HCL expressions, as Terraform and
// Nomad do.
func (v *variable) setRaw(raw, source string) hcl2.Diagnostics {
	var val cty.Value
	if v.ty == cty.DynamicPseudoType || v.ty.IsPrimitiveType() {
		val = cty.StringVal(raw)
	} else {
		expr, diags := hclsyntax.ParseExpression([]byte(raw), source, hcl2.InitialPos)
		if !diags.HasErrors() {
			val, diags = expr.Value(functionsOnly())
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
// local after the locals it refers to.
func evalLocals(ctx *hcl2.EvalContext, blocks hcl2.Blocks) hcl2.Diagnostics {
	var diags hcl2.Diagnostics
	pending := map[string]*hcl2.Attribute{}
	for _, b := range blocks {
		attrs, d := b.Body.JustAttributes()
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
	declared := map[string]bool{}
	for n := range pending {
		declared[n] = true
	}
	done := map[string]cty.Value{}
	for len(pending) > 0 {
		progress := false
		for _, name := range sortedKeys(pending) {
			a := pending[name]
			ready := true
			for _, tr := range a.Expr.Variables() {
				if tr.RootName() != "local" || len(tr) < 2 {
					continue
				}
				if step, ok := tr[1].(hcl2.TraverseAttr); ok && declared[step.Name] {
					if _, have := done[step.Name]; !have {
						ready = false
					}
				}
			}
			if !ready {
				continue
			}
			d := checkReferences(ctx, a.Expr)
			val := cty.DynamicVal
			if !d.HasErrors() {
				val, d = a.Expr.Value(evalContext(ctx, a.Expr))
			}
			diags = append(diags, explain(d)...)
			if d.HasErrors() {
				val = cty.DynamicVal
			}
			done[name] = val
			ctx.Variables["local"] = cty.ObjectVal(done)
			delete(pending, name)
			progress = true
		}
		if !progress {
			for _, name := range sortedKeys(pending) {
				diags = append(diags, &hcl2.Diagnostic{
					Severity: hcl2.DiagError, Summary: "Circular reference between locals",
					Detail:  fmt.Sprintf("local.%s depends, directly or through other locals, on itself. Break the cycle.", name),
					Subject: pending[name].NameRange.Ptr(),
				})
			}
			break
		}
	}
	return diags
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
