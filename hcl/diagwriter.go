package hcl

import (
	"bytes"
	"fmt"
	"io"
	"sort"
	"strings"
	"unicode/utf8"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/mitchellh/go-wordwrap"
	"github.com/zclconf/go-cty/cty"
)

// maxSnippetLine is the longest source line a diagnostic shows whole; a
// longer one is cut to the part around the subject.
const maxSnippetLine = 1000

// diagWriter writes diagnostics in the format of HCL's text writer (summary;
// where, with the enclosing block; the source lines with the subject
// highlighted; the values of the variables the expression used; the
// detail), reading only the lines each diagnostic shows. HCL's writer reads
// the whole file again for every diagnostic and prints whole lines however
// long, which made a file of invalid characters take seconds to report.
type diagWriter struct {
	w     io.Writer
	files map[string]*hcl2.File
	lines map[string][]int // where each line of a file starts, built on first use
	width uint
	color bool
}

func (dw *diagWriter) write(d *hcl2.Diagnostic) error {
	var color, highlight, reset string
	if dw.color {
		color, highlight, reset = "\x1b[31m", "\x1b[1;4m", "\x1b[0m"
		if d.Severity == hcl2.DiagWarning {
			color = "\x1b[33m"
		}
	}
	severity := "Error"
	if d.Severity == hcl2.DiagWarning {
		severity = "Warning"
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s%s%s: %s\n\n", color, severity, reset, d.Summary)
	if d.Subject != nil {
		dw.snippet(&b, d, highlight, reset)
		dw.values(&b, d)
	}
	if d.Detail != "" {
		detail := d.Detail
		if dw.width != 0 {
			detail = wordwrap.WrapString(detail, dw.width)
		}
		fmt.Fprintf(&b, "%s\n\n", detail)
	}
	if _, err := dw.w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("write failed: %w", err)
	}
	return nil
}

// snippet writes where d is and the lines its subject and context cover.
func (dw *diagWriter) snippet(b *bytes.Buffer, d *hcl2.Diagnostic, highlight, reset string) {
	subject := *d.Subject
	file := dw.files[subject.Filename]
	if file == nil || file.Bytes == nil {
		fmt.Fprintf(b, "  on %s line %d:\n  (source code not available)\n\n", subject.Filename, subject.Start.Line)
		return
	}
	src := file.Bytes
	context := ""
	if cs, ok := file.Nav.(interface{ ContextString(int) string }); ok {
		if s := cs.ContextString(subject.Start.Byte); s != "" {
			context = ", in " + s
		}
	}
	fmt.Fprintf(b, "  on %s line %d%s:\n", subject.Filename, subject.Start.Line, context)

	snip := subject
	if d.Context != nil {
		snip = hcl2.RangeOver(snip, *d.Context)
	}
	hl := subject
	if hl.Empty() { // an empty range is shown as one character
		hl.End.Byte++
	}
	starts := dw.lineStarts(subject.Filename, src)
	first := sort.Search(len(starts), func(i int) bool { return starts[i] > snip.Start.Byte }) - 1
	for i := max(first, 0); i < len(starts) && starts[i] <= max(snip.End.Byte-1, snip.Start.Byte); i++ {
		start, end := starts[i], len(src)
		if i+1 < len(starts) {
			end = starts[i+1] - 1 // without the newline
		}
		if end > start && src[end-1] == '\r' {
			end--
		}
		from, to := start, end
		if end-start > maxSnippetLine {
			// Show the part of a long line around the subject.
			at := min(max(hl.Start.Byte, start), end)
			from, to = max(at-60, start), min(at+60, end)
		}
		hs, he := min(max(hl.Start.Byte, from), to), min(max(hl.End.Byte, from), to)
		fmt.Fprintf(b, "%4d: ", i+1)
		if from > start {
			b.WriteString("…")
		}
		b.WriteString(printable(src[from:hs]))
		if he > hs {
			b.WriteString(highlight + printable(src[hs:he]) + reset)
		}
		b.WriteString(printable(src[he:to]))
		if to < end {
			b.WriteString("…")
		}
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
}

// lineStarts returns the byte offset where each line of src starts.
func (dw *diagWriter) lineStarts(name string, src []byte) []int {
	if s, ok := dw.lines[name]; ok {
		return s
	}
	s := []int{0}
	for i, c := range src {
		if c == '\n' {
			s = append(s, i+1)
		}
	}
	dw.lines[name] = s
	return s
}

// printable keeps the terminal safe from what a file holds: control
// characters and bytes that are not UTF-8 are shown as U+FFFD.
func printable(p []byte) string {
	return strings.Map(func(r rune) rune {
		if (r < 0x20 && r != '\t') || r == 0x7f {
			return utf8.RuneError
		}
		return r
	}, strings.ToValidUTF8(string(p), string(utf8.RuneError)))
}

// values writes the values of the variables d's expression refers to, as
// HCL does: "with var.image as "nginx"".
func (dw *diagWriter) values(b *bytes.Buffer, d *hcl2.Diagnostic) {
	if d.Expression == nil || d.EvalContext == nil {
		return
	}
	var stmts []string
	seen := map[string]bool{}
	for _, tr := range d.Expression.Variables() {
		v, diags := tr.TraverseAbs(d.EvalContext)
		name := traversalString(tr)
		if diags.HasErrors() || seen[name] || !v.IsKnown() || v.IsMarked() {
			continue
		}
		seen[name] = true
		if v.IsNull() {
			stmts = append(stmts, name+" set to null")
		} else {
			stmts = append(stmts, name+" as "+valueString(v))
		}
	}
	sort.Strings(stmts)
	for i, s := range stmts {
		if i == 0 {
			b.WriteString("with ")
		} else {
			b.WriteString("     ")
		}
		b.WriteString(s)
		if i == len(stmts)-1 {
			b.WriteString(".\n\n")
		} else {
			b.WriteString(",\n")
		}
	}
}

func traversalString(tr hcl2.Traversal) string {
	var b strings.Builder
	for _, step := range tr {
		switch s := step.(type) {
		case hcl2.TraverseRoot:
			b.WriteString(s.Name)
		case hcl2.TraverseAttr:
			b.WriteString("." + s.Name)
		case hcl2.TraverseIndex:
			if s.Key.Type().IsPrimitiveType() {
				b.WriteString("[" + valueString(s.Key) + "]")
			} else {
				b.WriteString("[...]")
			}
		}
	}
	return b.String()
}

// valueString is a value in a few words; strings are cut at 200 bytes.
func valueString(v cty.Value) string {
	ty := v.Type()
	switch {
	case v.IsNull():
		return "null"
	case !v.IsKnown():
		return "(not yet known)"
	case ty == cty.Bool:
		if v.True() {
			return "true"
		}
		return "false"
	case ty == cty.Number:
		return numberText(v.AsBigFloat())
	case ty == cty.String:
		s := v.AsString()
		if len(s) > 200 {
			return fmt.Sprintf("%q… (%d bytes)", strings.ToValidUTF8(s[:200], ""), len(s))
		}
		return fmt.Sprintf("%q", s)
	case ty.IsCollectionType() || ty.IsTupleType():
		switch n := v.LengthInt(); n {
		case 0:
			return "empty " + ty.FriendlyName()
		case 1:
			return ty.FriendlyName() + " with 1 element"
		default:
			return fmt.Sprintf("%s with %d elements", ty.FriendlyName(), n)
		}
	case ty.IsObjectType():
		switch n := len(ty.AttributeTypes()); n {
		case 0:
			return "object with no attributes"
		case 1:
			for k := range ty.AttributeTypes() {
				return fmt.Sprintf("object with 1 attribute %q", k)
			}
		default:
			return fmt.Sprintf("object with %d attributes", n)
		}
	}
	return ty.FriendlyName()
}
