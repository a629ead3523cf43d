package hcl

import (
	"errors"
	"fmt"
	"math"
	"math/big"
	"strings"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"
)

// workMessage says what happened when a Parse reaches MaxWork; function
// errors carry it too, which is how capDiagnostics recognises them.
const workMessage = "evaluating this file's expressions took more than %d steps (loop iterations, bytes of strings built, elements passed to functions); " +
	"a service file computes small values, so shorten the loops or the values they go over"

// budget is the evaluation work one Parse may still do (MaxWork). Every
// expression of the parse and every function it calls draws on the same
// budget; once it is spent every further step fails at once, so evaluation
// ends within a bounded number of steps whatever the file asks for.
// A budget belongs to one Parse and is not safe for concurrent use.
type budget struct {
	left      int
	exhausted bool
}

func newBudget() *budget { return &budget{left: MaxWork} }

// limitError is an input going past one of the bounds; summary is the
// diagnostic's summary (one of the summary* constants).
type limitError struct {
	summary, msg string
}

func (e *limitError) Error() string { return e.msg }

func limitErrorf(summary, format string, args ...any) error {
	return &limitError{summary: summary, msg: fmt.Sprintf(format, args...)}
}

// The steps charged for the work HCL and cty do, weighted so that a step is
// roughly the same time whatever it stands for (about 0.1 µs here): an
// iteration of a for expression allocates a scope and evaluates its body;
// an element passed to a function or an operator is walked several times
// (marks, type conformance, conversion, the work itself); a byte of a
// string is read once, but numbers read from strings cost the square of
// their length, so bytes are not discounted.
const (
	stepsPerIteration = 16
	stepsPerElement   = 32
)

// spent reports whether the budget has run out. Once it has, expressions
// evaluate to unknown values at once and without a diagnostic of their own:
// the first step past the bound reported it, and a diagnostic per
// remaining loop iteration would itself cost what the bound is there to
// prevent.
func (b *budget) spent() bool { return b.left <= 0 && b.exhausted }

// spend takes n steps.
func (b *budget) spend(n int) error {
	if n > b.left {
		b.left, b.exhausted = 0, true
		return limitErrorf(summaryTooMuchWork, workMessage, MaxWork)
	}
	b.left -= n
	return nil
}

// value charges the steps it takes to look over v and checks v against
// the value bounds (MaxValueElements, MaxValueBytes, MaxValueDepth,
// MaxNumberExponent).
func (b *budget) value(v cty.Value) error {
	if b.spent() {
		return b.spend(1)
	}
	var m measurer
	err := m.walk(v, 0)
	if werr := b.spend(stepsPerElement*m.elements + m.bytes); werr != nil {
		return werr
	}
	return err
}

// values is value for several values taken together, such as the arguments
// of one function call: concat(l, l, l, ...) is as large as all of them.
func (b *budget) values(vs []cty.Value) error {
	if b.spent() {
		return b.spend(1)
	}
	var m measurer
	var err error
	for _, v := range vs {
		if err = m.walk(v, 0); err != nil {
			break
		}
	}
	if werr := b.spend(stepsPerElement*m.elements + m.bytes); werr != nil {
		return werr
	}
	return err
}

// diag turns an error of spend or value into a diagnostic at subject.
func (b *budget) diag(err error, subject hcl2.Range) *hcl2.Diagnostic {
	summary := summaryValueTooLarge
	var le *limitError
	if errors.As(err, &le) {
		summary = le.summary
	}
	msg := err.Error()
	return &hcl2.Diagnostic{
		Severity: hcl2.DiagError,
		Summary:  summary,
		Detail:   strings.ToUpper(msg[:1]) + msg[1:] + ".",
		Subject:  subject.Ptr(),
	}
}

func containsWorkBound(detail string) bool {
	return strings.Contains(detail, "steps (loop iterations")
}

// measurer walks a value as far as the value bounds allow. Parts a value
// shares (a list holding one list twice) count each time they occur, as
// they do for anything that converts or sends the value.
type measurer struct {
	elements, bytes int
}

func (m *measurer) walk(v cty.Value, depth int) error {
	if depth > MaxValueDepth {
		return limitErrorf(summaryValueTooLarge, "the value nests more than %d levels deep; a service file's values need a few", MaxValueDepth)
	}
	m.elements++
	if m.elements > MaxValueElements {
		return limitErrorf(summaryValueTooLarge, "the value has more than %d elements; a service file's lists and maps hold a few dozen", MaxValueElements)
	}
	v, _ = v.Unmark()
	if !v.IsKnown() || v.IsNull() {
		return nil
	}
	ty := v.Type()
	switch {
	case ty == cty.String:
		m.bytes += len(v.AsString())
	case ty == cty.Number:
		return checkNumber(v.AsBigFloat())
	case ty.IsMapType(), ty.IsObjectType(), ty.IsListType(), ty.IsSetType(), ty.IsTupleType():
		keyed := ty.IsMapType() || ty.IsObjectType()
		for it := v.ElementIterator(); it.Next(); {
			k, e := it.Element()
			if keyed {
				m.bytes += len(k.AsString())
			}
			if err := m.walk(e, depth+1); err != nil {
				return err
			}
		}
	}
	if m.bytes > MaxValueBytes {
		return limitErrorf(summaryValueTooLarge, "the value holds more than %d bytes of strings (%d MiB); a service file's strings are short", MaxValueBytes, MaxValueBytes>>20)
	}
	return nil
}

// checkNumber refuses numbers whose binary exponent is beyond
// MaxNumberExponent: writing them out in decimal, which converting to a
// string does, takes time and memory in proportion to the exponent.
func checkNumber(f *big.Float) error {
	if f.Sign() == 0 || f.IsInf() {
		return nil
	}
	if e := f.MantExp(nil); e > MaxNumberExponent || e < -MaxNumberExponent {
		return limitErrorf(summaryNumberTooLarge, "the number %s is beyond what a service file can use (magnitudes from about 1e-1233 to 1e1233)", numberText(f))
	}
	return nil
}

// numberText writes f for a message. Past MaxNumberExponent only the order
// of magnitude is worked out: writing the digits of 1e3000000 takes seconds.
func numberText(f *big.Float) string {
	e := f.MantExp(nil)
	if f.Sign() == 0 || f.IsInf() || (e <= MaxNumberExponent && e >= -MaxNumberExponent) {
		return f.Text('g', 10)
	}
	sign := ""
	if f.Sign() < 0 {
		sign = "-"
	}
	return fmt.Sprintf("%sabout 1e%+d", sign, int(math.Round(float64(e)*math.Log10(2))))
}
