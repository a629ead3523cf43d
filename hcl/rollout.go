package hcl

import (
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/zclconf/go-cty/cty"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// The rollout block's settings (spec.Rollout). Its values are checked by
// spec; what is decoded here is their spelling: a percentage with its %
// sign, a latency bound as "1.5x" or a duration, whole-number steps.
var (
	rolloutAttrs  = []string{"duration", "steps"}
	analysisAttrs = []string{"interval", "min_requests", "max_error_rate", "max_latency"}
)

// decodeRollout reads a rollout block on top of spec.DefaultAnalysis.
func (d *decoder) decodeRollout(b *hcl2.Block) *spec.Rollout {
	d.ranges["rollout"] = b.DefRange
	c := d.content(b.Body, schema(b.Body, rolloutAttrs, []string{"analysis"}, nil), "rollout")
	r := &spec.Rollout{Analysis: spec.DefaultAnalysis()}
	d.setDuration(&r.Duration, c.Attributes["duration"], "rollout.duration")
	if v, ok := d.intList(c.Attributes["steps"], "rollout.steps"); ok {
		r.Steps = v
	}
	ab := d.single(c.Blocks, "analysis", "A rollout")
	if ab == nil {
		return r
	}
	d.ranges["rollout.analysis"] = ab.DefRange
	ac := d.content(ab.Body, schema(ab.Body, analysisAttrs, nil, nil), "rollout.analysis")
	a := ac.Attributes
	d.setDuration(&r.Analysis.Interval, a["interval"], "rollout.analysis.interval")
	d.setInt(&r.Analysis.MinRequests, a["min_requests"], "rollout.analysis.min_requests")
	if v, ok := d.percentage(a["max_error_rate"], "rollout.analysis.max_error_rate"); ok {
		r.Analysis.MaxErrorRate = v
	}
	if v, ok := d.latencyBound(a["max_latency"], "rollout.analysis.max_latency"); ok {
		r.Analysis.MaxLatency = v
	}
	return r
}

// intList reads a list of whole numbers and remembers where each element
// was written (path[i]) when the list is written out literally.
func (d *decoder) intList(a *hcl2.Attribute, path string) ([]int, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return nil, false
	}
	ty := v.Type()
	if !(ty.IsListType() || ty.IsTupleType()) {
		d.typeError(a, path, "a list of whole numbers", "[1, 5, 25, 50]", ty)
		return nil, false
	}
	if tup, isTuple := syntaxOf(a.Expr).(*hclsyntax.TupleConsExpr); isTuple {
		for i, e := range tup.Exprs {
			d.ranges[fmt.Sprintf("%s[%d]", path, i)] = e.Range()
		}
	}
	out := make([]int, 0, v.LengthInt())
	i := 0
	for it := v.ElementIterator(); it.Next(); i++ {
		_, e := it.Element()
		at := d.rangeOr(fmt.Sprintf("%s[%d]", path, i), a.Expr.Range())
		if e.IsNull() || e.Type() != cty.Number {
			d.errorf(path, at, "Incorrect attribute value type",
				"%s must be a list of whole numbers, for example %s = [1, 5, 25, 50]; element %d is %s.", path, lastSegment(path), i, typeName(e.Type()))
			return nil, false
		}
		bf := e.AsBigFloat()
		n, acc := bf.Int64()
		if !bf.IsInt() || acc != big.Exact || n > 1<<31 || n < -(1<<31) {
			d.errorf(path, at, "Whole number required",
				"%s must be a list of whole numbers, for example %s = [1, 5, 25, 50]; element %d is %s.", path, lastSegment(path), i, numberText(bf))
			return nil, false
		}
		out = append(out, int(n))
	}
	return out, true
}

// percentage reads a percentage written with its sign ("2%", "0.5%"). A
// bare number is refused: 2 could mean 2 % or a fraction of 2.
func (d *decoder) percentage(a *hcl2.Attribute, path string) (float64, bool) {
	v, ok := d.value(a, path)
	if !ok {
		return 0, false
	}
	name := lastSegment(path)
	if v.Type() != cty.String {
		d.errorf(path, a.Expr.Range(), "Invalid percentage",
			"%s must be a percentage string with its %% sign, for example %s = \"2%%\"; this value is %s.", path, name, typeName(v.Type()))
		return 0, false
	}
	s := v.AsString()
	num, hasSign := strings.CutSuffix(strings.TrimSpace(s), "%")
	f, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
	if !hasSign || err != nil {
		d.errorf(path, a.Expr.Range(), "Invalid percentage",
			"%q is not a percentage (%s). Write a number followed by %%, for example %s = \"2%%\" or \"0.5%%\".", s, path, name)
		return 0, false
	}
	return f, true
}

// latencyBound reads max_latency: one bound or a list of at most one of
// each kind, a relative one ("1.5x": times the previous revision's p99)
// and an absolute one ("300ms").
func (d *decoder) latencyBound(a *hcl2.Attribute, path string) (spec.LatencyBound, bool) {
	var b spec.LatencyBound
	v, ok := d.value(a, path)
	if !ok {
		return b, false
	}
	const example = `max_latency = "1.5x" (1.5 times the previous revision's p99), "300ms", or both: ["1.5x", "300ms"]`
	var items []string
	switch ty := v.Type(); {
	case ty == cty.String:
		items = []string{v.AsString()}
	case ty.IsListType() || ty.IsTupleType():
		// Read from the value already evaluated: evaluating the
		// expression again would spend the file's work budget twice.
		if tup, isTuple := syntaxOf(a.Expr).(*hclsyntax.TupleConsExpr); isTuple {
			for i, e := range tup.Exprs {
				d.ranges[fmt.Sprintf("%s[%d]", path, i)] = e.Range()
			}
		}
		i := 0
		for it := v.ElementIterator(); it.Next(); i++ {
			_, e := it.Element()
			if e.IsNull() || e.Type() != cty.String {
				d.errorf(path, d.rangeOr(fmt.Sprintf("%s[%d]", path, i), a.Expr.Range()), "Incorrect attribute value type",
					"%s must be a string or a list of strings, for example %s; element %d is %s.", path, example, i, typeName(e.Type()))
				return b, false
			}
			items = append(items, e.AsString())
		}
	default:
		d.errorf(path, a.Expr.Range(), "Incorrect attribute value type", "%s must be a string or a list of strings, for example %s; this value is %s.", path, example, typeName(ty))
		return b, false
	}
	if len(items) == 0 {
		d.errorf(path, a.Expr.Range(), "Empty latency bound", "%s lists no bound. Write %s, or leave it out to judge no latency.", path, example)
		return b, false
	}
	for i, s := range items {
		at := a.Expr.Range()
		if len(items) > 1 || v.Type() != cty.String {
			at = d.rangeOr(fmt.Sprintf("%s[%d]", path, i), at)
		}
		t := strings.TrimSpace(s)
		if f, rel := strings.CutSuffix(t, "x"); rel {
			factor, err := strconv.ParseFloat(strings.TrimSpace(f), 64)
			if err != nil {
				d.errorf(path, at, "Invalid latency bound", "%q is not a factor (%s). Write a number followed by x, as in %s.", s, path, example)
				return b, false
			}
			if factor == 0 {
				// 0 is how spec says "no relative bound"; written out it is a mistake.
				d.errorf(path, at, "Invalid latency bound", "%s is 0x, which no revision could meet. Write a factor above 1, as in %s.", path, example)
				return b, false
			}
			if b.Factor != 0 {
				d.errorf(path, at, "Latency bound set twice", "%s has two relative bounds; keep one, as in %s.", path, example)
				return b, false
			}
			b.Factor = factor
			continue
		}
		dur, err := time.ParseDuration(t)
		if err != nil {
			d.errorf(path, at, "Invalid latency bound",
				"%q is neither a factor nor a duration (%s). Write %s; units are ns, us, ms, s, m and h.", s, path, example)
			return b, false
		}
		if dur == 0 {
			d.errorf(path, at, "Invalid latency bound", "%s is %q, which no revision could meet. Write a positive duration, as in %s.", path, s, example)
			return b, false
		}
		if b.Absolute != 0 {
			d.errorf(path, at, "Latency bound set twice", "%s has two absolute bounds; keep one, as in %s.", path, example)
			return b, false
		}
		b.Absolute = dur
	}
	return b, true
}
