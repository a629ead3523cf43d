package hcl

import (
	"fmt"
	"io"
	"maps"
	"os"
	"sort"
	"strings"

	hcl2 "github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclparse"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Options are the values a file's variables take from outside it.
type Options struct {
	// Vars are -var name=value flags: raw strings converted to each
	// variable's declared type (lists, maps and objects written in HCL
	// syntax).
	Vars map[string]string
	// VarFiles are -var-file paths: HCL files of name = value lines.
	VarFiles []string
	// Getenv looks up NOMAD_SERVERLESS_VAR_<name> for each declared
	// variable; nil reads no environment.
	Getenv func(string) string
}

// File is a parsed service file. Services hold every service block the file
// declares, in order, with defaults filled in. The File also keeps the source
// (and that of any -var-file) so diagnostics can show snippets.
type File struct {
	Services []spec.Service

	parser *hclparse.Parser
	// rejected is a source refused before parsing (limits.go), kept so
	// its diagnostic can show where.
	rejected     *hcl2.File
	rejectedName string
	// ranges[i] maps spec.Problem paths of Services[i] ("scaling.min",
	// "traffic[1].percent") to where the file sets them; "" is the service
	// block header.
	ranges []map[string]hcl2.Range
}

var topSchema = &hcl2.BodySchema{
	Blocks: []hcl2.BlockHeaderSchema{
		{Type: "variable", LabelNames: []string{"name"}},
		{Type: "locals"},
		{Type: "service", LabelNames: []string{"name"}},
	},
}

// ParseFile reads and parses the file at path; see Parse. The returned File
// is never nil, so its WriteDiagnostics can print the diagnostics.
func ParseFile(path string, opts Options) (*File, hcl2.Diagnostics) {
	src, err := os.ReadFile(path)
	if err != nil {
		return &File{parser: hclparse.NewParser()}, hcl2.Diagnostics{{
			Severity: hcl2.DiagError,
			Summary:  "Failed to read file",
			Detail:   fmt.Sprintf("Cannot read the service file: %s.", err),
		}}
	}
	return Parse(path, src, opts)
}

// Parse parses src (named filename in diagnostics) and validates every
// service in it with (*spec.Service).Validate. Any error diagnostic means
// the file must not be deployed, even when other services in it are fine.
// The returned File is never nil; its Services hold what could be decoded.
//
// Parse works within the bounds in limits.go whatever src holds: a file
// that goes past one gets an error diagnostic saying which, and at most
// MaxDiagnostics diagnostics are returned.
func Parse(filename string, src []byte, opts Options) (*File, hcl2.Diagnostics) {
	p := hclparse.NewParser()
	f := &File{parser: p}
	if diags := checkSource(filename, src); diags.HasErrors() {
		f.rejected, f.rejectedName = &hcl2.File{Bytes: src}, filename
		return f, diags
	}
	file, diags := p.ParseHCL(src, filename)
	if diags.HasErrors() {
		return f, capDiagnostics(diags)
	}
	work := newBudget()
	if body, ok := file.Body.(*hclsyntax.Body); ok {
		instrumentFile(body, work)
	}
	content, d := file.Body.Content(topSchema)
	diags = append(diags, d...)
	ctx, d := buildContext(p, filename, content, opts, work)
	diags = append(diags, d...)
	if d.HasErrors() {
		// Services would only repeat errors about the values they use.
		sortDiagnostics(diags)
		return f, capDiagnostics(diags)
	}

	services := content.Blocks.OfType("service")
	if len(services) == 0 && !diags.HasErrors() {
		start := hcl2.Range{Filename: filename, Start: hcl2.InitialPos, End: hcl2.InitialPos}
		diags = append(diags, &hcl2.Diagnostic{
			Severity: hcl2.DiagError,
			Summary:  "No service in file",
			Detail:   "A service file declares at least one block such as service \"hello\" { image = \"nginx:1.27\" }.",
			Subject:  &start,
		})
	}
	seen := map[string]*hcl2.Block{}
	for _, b := range services {
		name := b.Labels[0]
		if first, dup := seen[name]; dup {
			diags = append(diags, &hcl2.Diagnostic{
				Severity: hcl2.DiagError,
				Summary:  "Duplicate service",
				Detail: fmt.Sprintf("Service %q is already declared on line %d. Service names are unique (they name the Consul services and routes); rename one.",
					name, first.DefRange.Start.Line),
				Subject: b.LabelRanges[0].Ptr(),
			})
			continue
		}
		seen[name] = b
		dec := newDecoder(ctx, work)
		svc := dec.decodeService(b)
		diags = append(diags, dec.diags...)
		f.Services = append(f.Services, svc)
		f.ranges = append(f.ranges, dec.ranges)
		// Every problem at once, except those about settings that failed
		// to decode: their defaults stayed in place and would only echo
		// the error already reported.
		var ps []spec.Problem
		for _, p := range svc.Validate() {
			if !dec.failedNear(p.Path) {
				ps = append(ps, p)
			}
		}
		diags = append(diags, f.Problems(len(f.Services)-1, ps)...)
	}
	if work.spent() && !reportsWork(diags) {
		// The diagnostic of the step past the bound was caught (by try or
		// can); the file still did too much.
		diags = append(diags, &hcl2.Diagnostic{Severity: hcl2.DiagError, Summary: summaryTooMuchWork,
			Detail: strings.ToUpper(workMessage[:1]) + fmt.Sprintf(workMessage[1:], MaxWork) + "."})
	}
	sortDiagnostics(diags)
	return f, capDiagnostics(diags)
}

// reportsWork reports whether diags say that the work bound was reached.
func reportsWork(diags hcl2.Diagnostics) bool {
	for _, d := range diags {
		if d.Summary == summaryTooMuchWork || containsWorkBound(d.Detail) {
			return true
		}
	}
	return false
}

// instrumentFile instruments what a file evaluates (see instrumentBody):
// locals, service blocks and variable defaults. A variable's type stays as
// written: it is read as syntax, not evaluated.
func instrumentFile(body *hclsyntax.Body, b *budget) {
	for _, blk := range body.Blocks {
		if blk.Type != "variable" {
			instrumentBody(blk.Body, b)
			continue
		}
		for name, a := range blk.Body.Attributes {
			if name != "type" {
				a.Expr = instrument(a.Expr, b)
			}
		}
	}
}

// sortDiagnostics orders diagnostics by file position (those without a
// position first), so output reads top to bottom like the file.
func sortDiagnostics(diags hcl2.Diagnostics) {
	sort.SliceStable(diags, func(i, j int) bool {
		a, b := diags[i].Subject, diags[j].Subject
		switch {
		case a == nil || b == nil:
			return a == nil && b != nil
		case a.Filename != b.Filename:
			return a.Filename < b.Filename
		}
		return a.Start.Byte < b.Start.Byte
	})
}

// WriteDiagnostics prints diags in HCL's format: summary, file:line, the
// source snippet with the subject underlined, and the detail. Colour and
// wrapping are used only when w is a terminal (and NO_COLOR is unset). It
// reads only the lines each diagnostic shows, and cuts a line longer than
// maxSnippetLine to the part around the subject.
func (f *File) WriteDiagnostics(w io.Writer, diags hcl2.Diagnostics) error {
	dw := &diagWriter{w: w, files: map[string]*hcl2.File{}, lines: map[string][]int{}}
	if f != nil && f.parser != nil {
		maps.Copy(dw.files, f.parser.Files())
	}
	if f != nil && f.rejected != nil {
		dw.files[f.rejectedName] = f.rejected
	}
	if isTerminal(w) {
		dw.color, dw.width = os.Getenv("NO_COLOR") == "", 100
	}
	for _, d := range diags {
		if d == nil {
			continue
		}
		if err := dw.write(d); err != nil {
			return err
		}
	}
	return nil
}

func isTerminal(w io.Writer) bool {
	file, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := file.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
