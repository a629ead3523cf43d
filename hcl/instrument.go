package hcl

import (
	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"
)

// instrumentBody rewrites, in place, the expressions of body and of every
// block in it so that evaluating them draws on b, and so that no value they
// build goes past the value bounds (see limits.go). HCL evaluates loops,
// templates and constructors itself, with no hook, so the nodes that can
// multiply work or size are wrapped in types that embed them: each wrapper
// keeps its node's methods (ranges, walking, Variables), so everything that
// inspects the syntax sees the same tree, and only Value changes.
//
// Scope traversals (var.x, local.y) are never wrapped: HCL recognises them
// by type to find a file's variables and keywords. A traversal only looks a
// value up; the value was checked when it was built.
func instrumentBody(body *hclsyntax.Body, b *budget) {
	for _, a := range body.Attributes {
		a.Expr = instrument(a.Expr, b)
	}
	for _, blk := range body.Blocks {
		instrumentBody(blk.Body, b)
	}
}

// instrument returns e with its children instrumented, wrapped when it is a
// node that loops, builds strings or collections, or does arithmetic.
func instrument(e hclsyntax.Expression, b *budget) hclsyntax.Expression {
	if e == nil {
		return nil
	}
	switch n := e.(type) {
	case *hclsyntax.LiteralValueExpr:
		if n.Val.Type() == cty.Number && n.Val.IsKnown() && !n.Val.IsNull() {
			if err := checkNumber(n.Val.AsBigFloat()); err != nil {
				return &refusedExpr{LiteralValueExpr: n, diag: b.diag(err, n.SrcRange)}
			}
		}
	case *hclsyntax.ForExpr:
		n.CollExpr = instrument(n.CollExpr, b)
		n.KeyExpr = instrument(n.KeyExpr, b)
		n.ValExpr = instrument(n.ValExpr, b)
		n.CondExpr = instrument(n.CondExpr, b)
		return &forHook{ForExpr: n, b: b}
	case *hclsyntax.SplatExpr:
		n.Source = instrument(n.Source, b)
		n.Each = instrument(n.Each, b)
		return &splatHook{SplatExpr: n, b: b}
	case *hclsyntax.TemplateExpr:
		literal := true
		for i := range n.Parts {
			n.Parts[i] = instrument(n.Parts[i], b)
			_, isLit := n.Parts[i].(*hclsyntax.LiteralValueExpr)
			literal = literal && isLit
		}
		if literal {
			return n // "text" and heredocs without interpolations: their size is the file's
		}
		return &templateHook{TemplateExpr: n, b: b}
	case *hclsyntax.TupleConsExpr:
		for i := range n.Exprs {
			n.Exprs[i] = instrument(n.Exprs[i], b)
		}
		return &tupleHook{TupleConsExpr: n, b: b}
	case *hclsyntax.ObjectConsExpr:
		for i := range n.Items {
			n.Items[i].KeyExpr = instrument(n.Items[i].KeyExpr, b)
			n.Items[i].ValueExpr = instrument(n.Items[i].ValueExpr, b)
		}
		return &objectHook{ObjectConsExpr: n, b: b}
	case *hclsyntax.BinaryOpExpr:
		n.LHS = instrument(n.LHS, b)
		n.RHS = instrument(n.RHS, b)
		return &binaryHook{BinaryOpExpr: n, b: b}
	case *hclsyntax.UnaryOpExpr:
		n.Val = instrument(n.Val, b)
	case *hclsyntax.ConditionalExpr:
		n.Condition = instrument(n.Condition, b)
		n.TrueResult = instrument(n.TrueResult, b)
		n.FalseResult = instrument(n.FalseResult, b)
		return &condHook{ConditionalExpr: n, b: b}
	case *hclsyntax.FunctionCallExpr:
		for i := range n.Args {
			n.Args[i] = instrument(n.Args[i], b)
		}
	case *hclsyntax.IndexExpr:
		n.Collection = instrument(n.Collection, b)
		n.Key = instrument(n.Key, b)
	case *hclsyntax.RelativeTraversalExpr:
		n.Source = instrument(n.Source, b)
	case *hclsyntax.TemplateJoinExpr:
		n.Tuple = instrument(n.Tuple, b)
	case *hclsyntax.TemplateWrapExpr:
		n.Wrapped = instrument(n.Wrapped, b)
	case *hclsyntax.ParenthesesExpr:
		n.Expression = instrument(n.Expression, b)
	case *hclsyntax.ObjectConsKeyExpr:
		n.Wrapped = instrument(n.Wrapped, b)
	}
	return e
}

// syntaxOf returns the HCL node an instrumented expression wraps, for code
// that looks at the shape of what the file wrote (where each element of a
// list literal is).
func syntaxOf(e hcl2.Expression) hcl2.Expression {
	switch h := e.(type) {
	case *tupleHook:
		return h.TupleConsExpr
	case *objectHook:
		return h.ObjectConsExpr
	case *templateHook:
		return h.TemplateExpr
	case *forHook:
		return h.ForExpr
	}
	return e
}

// checked returns v, or an error diagnostic at subject when v goes past a
// bound; every hook passes what it built through it.
func (b *budget) checked(v cty.Value, diags hcl2.Diagnostics, subject hcl2.Range) (cty.Value, hcl2.Diagnostics) {
	if diags.HasErrors() {
		return v, diags
	}
	if err := b.value(v); err != nil {
		return cty.DynamicVal, append(diags, b.diag(err, subject))
	}
	return v, diags
}

// refusedExpr is a number literal past MaxNumberExponent: using it fails.
type refusedExpr struct {
	*hclsyntax.LiteralValueExpr
	diag *hcl2.Diagnostic
}

func (e *refusedExpr) Value(*hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	return cty.DynamicVal, hcl2.Diagnostics{e.diag}
}

// forHook charges a for expression's iterations before it runs them.
// Nested loops multiply: the inner loop is charged on every iteration of
// the outer one.
type forHook struct {
	*hclsyntax.ForExpr
	b *budget
}

func (h *forHook) Value(ctx *hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	if h.b.spent() {
		return cty.DynamicVal, nil
	}
	coll, diags := h.b.chargeElements(ctx, h.CollExpr, stepsPerIteration)
	if diags.HasErrors() {
		return cty.DynamicVal, diags
	}
	// Run HCL's loop over the value just computed, so the collection is
	// evaluated once.
	e := *h.ForExpr
	e.CollExpr = &hclsyntax.LiteralValueExpr{Val: coll, SrcRange: h.CollExpr.Range()}
	v, d := e.Value(ctx)
	return h.b.checked(v, append(diags, d...), h.SrcRange)
}

// chargeElements evaluates the collection a loop or splat goes over and
// charges per steps for each of its elements before anything iterates it.
func (b *budget) chargeElements(ctx *hcl2.EvalContext, coll hclsyntax.Expression, per int) (cty.Value, hcl2.Diagnostics) {
	v, diags := coll.Value(ctx)
	if diags.HasErrors() {
		return v, diags
	}
	if u, _ := v.Unmark(); u.IsKnown() && !u.IsNull() && u.CanIterateElements() {
		if err := b.spend(per * u.LengthInt()); err != nil {
			return v, append(diags, b.diag(err, coll.Range()))
		}
	}
	return v, diags
}

// splatHook charges a splat expression (list[*].name) for the elements it
// goes over.
type splatHook struct {
	*hclsyntax.SplatExpr
	b *budget
}

func (h *splatHook) Value(ctx *hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	if h.b.spent() {
		return cty.DynamicVal, nil
	}
	src, diags := h.b.chargeElements(ctx, h.Source, stepsPerElement)
	if diags.HasErrors() {
		return cty.DynamicVal, diags
	}
	e := *h.SplatExpr
	e.Source = &hclsyntax.LiteralValueExpr{Val: src, SrcRange: h.Source.Range()}
	v, d := e.Value(ctx)
	return h.b.checked(v, append(diags, d...), h.SrcRange)
}

// templateHook evaluates a string template's parts one by one and stops as
// soon as the string they make would go past MaxValueBytes, before HCL
// joins them: "${local.s}${local.s}..." would otherwise build the whole
// string first.
type templateHook struct {
	*hclsyntax.TemplateExpr
	b *budget
}

func (h *templateHook) Value(ctx *hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	if h.b.spent() {
		return cty.DynamicVal, nil
	}
	var diags hcl2.Diagnostics
	parts := make([]hclsyntax.Expression, len(h.Parts))
	size := 0
	for i, p := range h.Parts {
		v, d := p.Value(ctx)
		diags = append(diags, d...)
		if err := h.b.value(v); err != nil {
			return cty.DynamicVal, append(diags, h.b.diag(err, p.Range()))
		}
		if u, _ := v.Unmark(); u.Type() == cty.String && u.IsKnown() && !u.IsNull() {
			size += len(u.AsString())
		}
		if size > MaxValueBytes {
			return cty.DynamicVal, append(diags, h.b.diag(limitErrorf(summaryValueTooLarge,
				"the string this template builds is longer than %d bytes (%d MiB); a service file's strings are short", MaxValueBytes, MaxValueBytes>>20), h.SrcRange))
		}
		parts[i] = &hclsyntax.LiteralValueExpr{Val: v, SrcRange: p.Range()}
	}
	if err := h.b.spend(size); err != nil {
		return cty.DynamicVal, append(diags, h.b.diag(err, h.SrcRange))
	}
	e := *h.TemplateExpr
	e.Parts = parts
	v, d := e.Value(ctx)
	return v, append(diags, d...)
}

// tupleHook checks the list a list literal builds: [local.l, local.l, ...]
// shares local.l but is as large as all its elements to anything that
// walks it.
type tupleHook struct {
	*hclsyntax.TupleConsExpr
	b *budget
}

func (h *tupleHook) Value(ctx *hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	if h.b.spent() {
		return cty.DynamicVal, nil
	}
	v, diags := h.TupleConsExpr.Value(ctx)
	return h.b.checked(v, diags, h.SrcRange)
}

// objectHook checks the object an object literal builds.
type objectHook struct {
	*hclsyntax.ObjectConsExpr
	b *budget
}

func (h *objectHook) Value(ctx *hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	if h.b.spent() {
		return cty.DynamicVal, nil
	}
	v, diags := h.ObjectConsExpr.Value(ctx)
	return h.b.checked(v, diags, h.SrcRange)
}

// binaryHook charges an operator for its operands (comparing two large
// lists walks both) and checks its result: multiplying large numbers in a
// chain, or in locals that square each other, reaches any exponent.
type binaryHook struct {
	*hclsyntax.BinaryOpExpr
	b *budget
}

func (h *binaryHook) Value(ctx *hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	if h.b.spent() {
		return cty.DynamicVal, nil
	}
	lhs, diags := h.LHS.Value(ctx)
	rhs, d := h.RHS.Value(ctx)
	diags = append(diags, d...)
	if err := h.b.values([]cty.Value{lhs, rhs}); err != nil {
		return cty.DynamicVal, append(diags, h.b.diag(err, h.SrcRange))
	}
	if numeric(h.Op) {
		for _, v := range []cty.Value{lhs, rhs} {
			if s, ok := str(v); ok && len(s) > 2*MaxNumberExponent {
				return cty.DynamicVal, append(diags, h.b.diag(limitErrorf(summaryNumberTooLarge,
					"an operand is a string of %d characters to be read as a number, beyond any number a service file can use", len(s)), h.SrcRange))
			}
		}
	}
	e := *h.BinaryOpExpr
	e.LHS = &hclsyntax.LiteralValueExpr{Val: lhs, SrcRange: h.LHS.Range()}
	e.RHS = &hclsyntax.LiteralValueExpr{Val: rhs, SrcRange: h.RHS.Range()}
	v, d := e.Value(ctx)
	return h.b.checked(v, append(diags, d...), h.SrcRange)
}

// condHook charges a conditional for its results: HCL evaluates both and
// unifies their types, which walks them.
type condHook struct {
	*hclsyntax.ConditionalExpr
	b *budget
}

func (h *condHook) Value(ctx *hcl2.EvalContext) (cty.Value, hcl2.Diagnostics) {
	if h.b.spent() {
		return cty.DynamicVal, nil
	}
	cond, diags := h.Condition.Value(ctx)
	t, tDiags := h.TrueResult.Value(ctx)
	f, fDiags := h.FalseResult.Value(ctx)
	// As HCL does, report the errors of the branch the condition picks
	// (both while it is not known).
	switch u, _ := cond.Unmark(); {
	case u.Type() == cty.Bool && u.IsKnown() && !u.IsNull() && u.True():
		diags = append(diags, tDiags...)
	case u.Type() == cty.Bool && u.IsKnown() && !u.IsNull():
		diags = append(diags, fDiags...)
	default:
		diags = append(append(diags, tDiags...), fDiags...)
	}
	if err := h.b.values([]cty.Value{t, f}); err != nil {
		return cty.DynamicVal, append(diags, h.b.diag(err, h.SrcRange))
	}
	e := *h.ConditionalExpr
	e.Condition = &hclsyntax.LiteralValueExpr{Val: cond, SrcRange: h.Condition.Range()}
	e.TrueResult = &hclsyntax.LiteralValueExpr{Val: t, SrcRange: h.TrueResult.Range()}
	e.FalseResult = &hclsyntax.LiteralValueExpr{Val: f, SrcRange: h.FalseResult.Range()}
	v, d := e.Value(ctx)
	return v, append(diags, d...)
}

// numeric reports whether op converts its operands to numbers (reading a
// number from a long string takes the square of its length).
func numeric(op *hclsyntax.Operation) bool {
	switch op {
	case hclsyntax.OpEqual, hclsyntax.OpNotEqual, hclsyntax.OpLogicalAnd, hclsyntax.OpLogicalOr:
		return false
	}
	return true
}
