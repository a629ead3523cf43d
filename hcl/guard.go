package hcl

import (
	"math/big"
	"regexp"
	"strings"

	"github.com/zclconf/go-cty/cty"
	"github.com/zclconf/go-cty/cty/function"
)

// guard returns f drawing on b: the arguments are charged and checked
// before f runs (with pre, the checks particular to f, such as format
// widths), and its result after. The checks run in the type step, which
// comes first: some functions (jsondecode) already do their work there.
func guard(f function.Function, b *budget, pre func(args []cty.Value) error) function.Function {
	return function.New(&function.Spec{
		Description: f.Description(),
		Params:      f.Params(),
		VarParam:    f.VarParam(),
		Type: func(args []cty.Value) (cty.Type, error) {
			if b.spent() {
				return cty.DynamicPseudoType, nil // see budget.spent
			}
			if err := b.values(args); err != nil {
				return cty.NilType, err
			}
			if pre != nil && allKnown(args) {
				if err := pre(args); err != nil {
					return cty.NilType, err
				}
			}
			return f.ReturnTypeForValues(args)
		},
		Impl: func(args []cty.Value, _ cty.Type) (cty.Value, error) {
			if b.spent() {
				return cty.DynamicVal, nil
			}
			v, err := f.Call(args)
			if err != nil {
				return v, err
			}
			if err := b.value(v); err != nil {
				return cty.NilVal, err
			}
			return v, nil
		},
	})
}

func allKnown(args []cty.Value) bool {
	for _, a := range args {
		if !a.IsWhollyKnown() || a.IsNull() {
			return false
		}
	}
	return true
}

// preCheck is what the function name is checked for before it runs: the
// arguments that make its result, or its work, much larger than the
// arguments themselves. nil means nothing beyond the arguments' size.
func preCheck(name string) func(args []cty.Value) error {
	switch name {
	case "format", "formatlist":
		return checkFormat
	case "indent":
		return checkIndent
	case "join":
		return checkJoin
	case "replace":
		return checkReplace
	case "regex_replace":
		return checkRegexReplace
	case "jsondecode":
		return checkJSONNesting
	case "parseint", "tonumber":
		return checkNumberString
	}
	return nil
}

// formatVerb finds the widths and precisions of format verbs ("%-10s",
// "%08.3f", "%[2]5d").
var formatVerb = regexp.MustCompile(`%[-+# 0]*(?:\[\d+\])?(\d*)(?:\.(\d*))?`)

func checkFormat(args []cty.Value) error {
	spec, ok := str(args[0])
	if !ok {
		return nil
	}
	for _, m := range formatVerb.FindAllStringSubmatch(strings.ReplaceAll(spec, "%%", ""), -1) {
		for _, n := range m[1:] {
			if len(n) > 4 || (n != "" && atoi(n) > MaxFormatWidth) {
				return function.NewArgErrorf(0, "the width or precision %s in %q is more than %d; pad with a shorter width", n, m[0], MaxFormatWidth)
			}
		}
	}
	return nil
}

func checkIndent(args []cty.Value) error {
	n, ok := smallInt(args[0])
	if !ok {
		return nil // not a count of spaces: indent says so itself
	}
	s, _ := str(args[1])
	if n > MaxFormatWidth {
		return function.NewArgErrorf(0, "indent takes at most %d spaces", MaxFormatWidth)
	}
	if n*strings.Count(s, "\n") > MaxValueBytes {
		return function.NewArgErrorf(1, "indenting %d lines by %d spaces makes a string longer than %d bytes", strings.Count(s, "\n"), n, MaxValueBytes)
	}
	return nil
}

// checkJoin bounds the separator's share of the result, which the
// arguments' own size does not: join(local.long, a_long_list).
func checkJoin(args []cty.Value) error {
	sep, _ := str(args[0])
	n := 0
	for _, l := range args[1:] {
		if l.CanIterateElements() {
			n += l.LengthInt()
		}
	}
	if len(sep)*n > MaxValueBytes {
		return function.NewArgErrorf(0, "joining %d strings with a %d-byte separator makes a string longer than %d bytes", n, len(sep), MaxValueBytes)
	}
	return nil
}

func checkReplace(args []cty.Value) error {
	s, _ := str(args[0])
	sub, _ := str(args[1])
	repl, _ := str(args[2])
	n := len(s) + 1 // a regular expression may match everywhere
	if !(len(sub) > 1 && sub[0] == '/' && sub[len(sub)-1] == '/') {
		n = strings.Count(s, sub)
	}
	return replacedSize(len(s), n, len(repl))
}

func checkRegexReplace(args []cty.Value) error {
	s, _ := str(args[0])
	repl, _ := str(args[2])
	return replacedSize(len(s), len(s)+1, len(repl))
}

func replacedSize(size, matches, repl int) error {
	if matches*repl > MaxValueBytes || size+matches*repl > MaxValueBytes {
		return function.NewArgErrorf(2, "replacing up to %d matches with %d bytes each makes a string longer than %d bytes", matches, repl, MaxValueBytes)
	}
	return nil
}

// checkJSONNesting bounds how deeply the JSON nests: decoding it recurses
// once per level.
func checkJSONNesting(args []cty.Value) error {
	s, _ := str(args[0])
	depth, inString := 0, false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case inString && c == '\\':
			i++
		case c == '"':
			inString = !inString
		case inString:
		case c == '[' || c == '{':
			if depth++; depth > MaxValueDepth {
				return function.NewArgErrorf(0, "the JSON nests more than %d levels deep", MaxValueDepth)
			}
		case c == ']' || c == '}':
			depth--
		}
	}
	return nil
}

// checkNumberString bounds the digits of a number given as a string: reading
// decimal digits takes time that grows with the square of their count.
func checkNumberString(args []cty.Value) error {
	if s, ok := str(args[0]); ok && len(s) > 2*MaxNumberExponent {
		return function.NewArgErrorf(0, "a number written with %d characters is beyond what a service file can use", len(s))
	}
	return nil
}

func str(v cty.Value) (string, bool) {
	v, _ = v.UnmarkDeep()
	if v.Type() != cty.String || !v.IsKnown() || v.IsNull() {
		return "", false
	}
	return v.AsString(), true
}

func smallInt(v cty.Value) (int, bool) {
	v, _ = v.UnmarkDeep()
	if v.Type() != cty.Number || !v.IsKnown() || v.IsNull() {
		return 0, false
	}
	f := v.AsBigFloat()
	if !f.IsInt() || f.Sign() < 0 {
		return 0, false
	}
	if f.Cmp(big.NewFloat(1<<30)) > 0 {
		return 1 << 30, true
	}
	i, _ := f.Int64()
	return int(i), true
}

func atoi(s string) int {
	n := 0
	for _, c := range s {
		n = n*10 + int(c-'0')
	}
	return n
}
