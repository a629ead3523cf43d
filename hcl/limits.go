package hcl

import (
	"fmt"
	"unicode/utf8"

	hcl2 "github.com/hashicorp/hcl/v2"
)

// The bounds one Parse works within, so that validating a file nobody has
// reviewed (in CI, in a review bot) costs at most about a second and a few
// hundred MiB whatever the file holds. Every bound is far above what a service
// file needs: the examples are a few KiB, build values of a few dozen
// elements and nest a handful of levels.
const (
	// MaxFileBytes bounds a service file and each -var-file. HCL's lexer
	// allocates several hundred bytes per token, so the file size is what
	// bounds the memory of parsing.
	MaxFileBytes = 256 << 10
	// MaxNesting bounds how deeply brackets, braces, parentheses and
	// interpolations nest. HCL's parser is recursive descent: half a MiB of
	// "[" overflows the goroutine stack, which kills the process.
	MaxNesting = 64
	// MaxDiagnostics bounds what Parse reports. HCL reports every invalid
	// character on its own, and its diagnostic writer rereads the whole
	// file for each diagnostic, so 15 KiB of control characters took 5 s to
	// print.
	MaxDiagnostics = 100
	// MaxValueElements, MaxValueBytes and MaxValueDepth bound every value an
	// expression builds (a list, map, object or string, counting shared
	// parts each time they occur), so that converting, comparing, hashing or
	// sending a value costs little.
	MaxValueElements = 10_000
	MaxValueBytes    = 1 << 20
	MaxValueDepth    = 64
	// MaxNumberExponent bounds the binary exponent of numbers: 1e3000000
	// took 3 s to turn into a string, and squaring in locals reaches any
	// exponent in a few steps. 4096 is about 1e1233, far beyond any number
	// Nomad takes.
	MaxNumberExponent = 4096
	// MaxFormatWidth bounds the width and precision in format verbs and the
	// count of indent(): format("%999999999s", "") asks for a GiB.
	MaxFormatWidth = 1024
	// MaxWork bounds the evaluation steps of one Parse: loop iterations,
	// string bytes built, and elements passed to and returned by functions.
	// Nested for expressions multiply; this is where they stop.
	MaxWork = 4_000_000
)

// limitSummary* are the summaries of diagnostics about the bounds above, so
// callers and tests can tell them apart from errors in the service itself.
const (
	summaryFileTooLarge   = "Service file too large"
	summaryNotText        = "Not a service file"
	summaryNestedTooDeep  = "Nesting too deep"
	summaryTooManyErrors  = "Too many errors"
	summaryTooMuchWork    = "Expressions take too long to evaluate"
	summaryValueTooLarge  = "Value too large"
	summaryNumberTooLarge = "Number too large"
)

// checkSource refuses, before HCL sees it, a source that is too large, is
// not text, or nests too deeply. It reads src once and allocates nothing
// that grows with it.
func checkSource(filename string, src []byte) hcl2.Diagnostics {
	start := hcl2.Range{Filename: filename, Start: hcl2.InitialPos, End: hcl2.InitialPos}
	if len(src) > MaxFileBytes {
		return hcl2.Diagnostics{{
			Severity: hcl2.DiagError,
			Summary:  summaryFileTooLarge,
			Detail: fmt.Sprintf("%s is %d bytes; service files are limited to %d bytes (%d KiB), so that checking a file costs little whoever wrote it. "+
				"Split the services into several files, or move large template data into a file the task fetches with artifact or template { source = ... }.",
				filename, len(src), MaxFileBytes, MaxFileBytes>>10),
			Subject: &start,
		}}
	}
	if d := checkText(filename, src); d != nil {
		return hcl2.Diagnostics{d}
	}
	if d := checkNesting(filename, src); d != nil {
		return hcl2.Diagnostics{d}
	}
	return nil
}

// checkText refuses a source with more invalid bytes (control characters
// other than tab, newline and carriage return, or bytes that are not UTF-8)
// than MaxDiagnostics: that is a binary or mis-encoded file, and HCL would
// report each byte on its own.
func checkText(filename string, src []byte) *hcl2.Diagnostic {
	bad, first := 0, -1
	for i := 0; i < len(src); {
		r, size := utf8.DecodeRune(src[i:])
		if (r == utf8.RuneError && size <= 1) || (r < 0x20 && r != '\t' && r != '\n' && r != '\r') || r == 0x7f {
			if first < 0 {
				first = i
			}
			bad++
		}
		i += size
	}
	if bad <= MaxDiagnostics {
		return nil
	}
	at := posAt(filename, src, first)
	return &hcl2.Diagnostic{
		Severity: hcl2.DiagError,
		Summary:  summaryNotText,
		Detail: fmt.Sprintf("%s has %d bytes that are control characters or not UTF-8, the first at line %d, column %d. "+
			"A service file is UTF-8 text: check that this is the file you meant and that your editor saves UTF-8.",
			filename, bad, at.Start.Line, at.Start.Column),
		Subject: &at,
	}
}

// checkNesting scans src as HCL's lexer would (strings, heredocs, comments
// and interpolations) and reports the first place where more than
// MaxNesting brackets, braces, parentheses or interpolations are open.
func checkNesting(filename string, src []byte) *hcl2.Diagnostic {
	// Each open level is what closes it: ')' ']' '}' for brackets, '}' for
	// an interpolation (whose close returns to the string or heredoc
	// around it), '"' for a quoted string, 'h' for a heredoc.
	var stack [MaxNesting + 1]byte
	depth := 0
	var heredoc []byte // the marker of the heredoc being read
	push := func(c byte, i int) *hcl2.Diagnostic {
		if depth == len(stack) {
			at := posAt(filename, src, i)
			return &hcl2.Diagnostic{
				Severity: hcl2.DiagError,
				Summary:  summaryNestedTooDeep,
				Detail: fmt.Sprintf("Brackets, braces, parentheses, strings and interpolations are open more than %d levels deep here. "+
					"A service file needs a few; move parts of the expression into locals.", MaxNesting),
				Subject: &at,
			}
		}
		stack[depth] = c
		depth++
		return nil
	}
	top := func() byte {
		if depth == 0 {
			return 0
		}
		return stack[depth-1]
	}
	for i := 0; i < len(src); i++ {
		c := src[i]
		switch top() {
		case '"': // inside a quoted string
			switch {
			case c == '\\':
				i++
			case c == '"' || c == '\n':
				depth--
			case (c == '$' || c == '%') && i+1 < len(src) && src[i+1] == '{' && (i == 0 || src[i-1] != c): // $${ and %%{ are literal
				i++
				if d := push('}', i); d != nil {
					return d
				}
			}
			continue
		case 'h': // inside a heredoc: a line holding only the marker ends it
			if c == '\n' {
				j := i + 1
				for j < len(src) && (src[j] == ' ' || src[j] == '\t') {
					j++
				}
				k := j + len(heredoc)
				if k <= len(src) && string(src[j:k]) == string(heredoc) && (k == len(src) || src[k] == '\n' || src[k] == '\r') {
					depth--
					i = k - 1
				}
				continue
			}
			if (c == '$' || c == '%') && i+1 < len(src) && src[i+1] == '{' && (i == 0 || src[i-1] != c) {
				i++
				if d := push('}', i); d != nil {
					return d
				}
			}
			continue
		}
		switch c {
		case '#':
			i = skipLine(src, i)
		case '/':
			if i+1 < len(src) && src[i+1] == '/' {
				i = skipLine(src, i)
			} else if i+1 < len(src) && src[i+1] == '*' {
				end := indexFrom(src, i+2, "*/")
				if end < 0 {
					return nil // HCL reports the unterminated comment
				}
				i = end + 1
			}
		case '"':
			if d := push('"', i); d != nil {
				return d
			}
		case '<':
			if m, next, ok := heredocMarker(src, i); ok {
				heredoc = m
				if d := push('h', i); d != nil {
					return d
				}
				i = next - 1
			}
		case '(':
			if d := push(')', i); d != nil {
				return d
			}
		case '[':
			if d := push(']', i); d != nil {
				return d
			}
		case '{':
			if d := push('}', i); d != nil {
				return d
			}
		case ')', ']', '}':
			if depth > 0 && top() == c {
				depth--
			}
		}
	}
	return nil
}

// heredocMarker reads "<<EOF" or "<<-EOF" followed by a newline at src[i]
// and returns the marker and the index just past the newline.
func heredocMarker(src []byte, i int) ([]byte, int, bool) {
	if i+2 >= len(src) || src[i+1] != '<' {
		return nil, 0, false
	}
	j := i + 2
	if src[j] == '-' {
		j++
	}
	k := j
	for k < len(src) && (src[k] == '_' || src[k] == '-' || src[k] >= 'a' && src[k] <= 'z' || src[k] >= 'A' && src[k] <= 'Z' || src[k] >= '0' && src[k] <= '9') {
		k++
	}
	if k == j {
		return nil, 0, false
	}
	m := src[j:k]
	if k < len(src) && src[k] == '\r' {
		k++
	}
	if k >= len(src) || src[k] != '\n' {
		return nil, 0, false
	}
	return m, k + 1, true
}

func skipLine(src []byte, i int) int {
	for i < len(src) && src[i] != '\n' {
		i++
	}
	return i
}

func indexFrom(src []byte, i int, s string) int {
	for ; i+len(s) <= len(src); i++ {
		if string(src[i:i+len(s)]) == s {
			return i
		}
	}
	return -1
}

// posAt is the one-character range at byte offset off of src.
func posAt(filename string, src []byte, off int) hcl2.Range {
	p := hcl2.Pos{Line: 1, Column: 1}
	for i := 0; i < off && i < len(src); {
		_, size := utf8.DecodeRune(src[i:])
		if src[i] == '\n' {
			p.Line++
			p.Column = 1
		} else {
			p.Column++
		}
		i += size
	}
	p.Byte = off
	end := p
	end.Byte++
	end.Column++
	return hcl2.Range{Filename: filename, Start: p, End: end}
}

// capDiagnostics keeps the first MaxDiagnostics diagnostics (already in
// file order), says how many more there were, and keeps only the first of
// the diagnostics about the work bound, which every expression evaluated
// after the bound was reached repeats.
func capDiagnostics(diags hcl2.Diagnostics) hcl2.Diagnostics {
	out := diags[:0:0]
	workSeen := false
	for _, d := range diags {
		if d.Summary == summaryTooMuchWork || (d.Summary == "Error in function call" && containsWorkBound(d.Detail)) {
			if workSeen {
				continue
			}
			workSeen = true
		}
		out = append(out, d)
	}
	if len(out) <= MaxDiagnostics {
		return out
	}
	errs := 0
	for _, d := range out[MaxDiagnostics:] {
		if d.Severity == hcl2.DiagError {
			errs++
		}
	}
	more := len(out) - MaxDiagnostics
	out = append(out[:MaxDiagnostics:MaxDiagnostics], &hcl2.Diagnostic{
		Severity: hcl2.DiagError,
		Summary:  summaryTooManyErrors,
		Detail: fmt.Sprintf("%d more diagnostics (%d of them errors) are not shown. Fix the ones above and check the file again.",
			more, errs),
	})
	return out
}
