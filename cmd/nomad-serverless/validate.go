package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strings"

	hcl2 "github.com/hashicorp/hcl/v2"

	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

const validateUsage = `Usage: nomad-serverless validate [options] file.hcl [file.hcl...]

Check service files without touching the cluster: syntax, variables, types and
every rule a deploy would enforce (except that revisions named in traffic
exist). Prints one line per valid service, or each problem with its file, line
and column. Exits 0 when every file is valid, 1 when one is not, 2 on a usage
error.

Variables are set, lowest precedence first, by their default, by
NOMAD_SERVERLESS_VAR_<name>, by -var-file files in order, and by -var.

Options:
`

// validateJSON is the -json output.
type validateJSON struct {
	Valid       bool                 `json:"valid"`
	Services    []validateService    `json:"services"`
	Diagnostics []validateDiagnostic `json:"diagnostics"`
}

type validateService struct {
	File      string `json:"file"`
	Name      string `json:"name"`
	Namespace string `json:"namespace"`
	SpecHash  string `json:"spec_hash"`
}

type validateDiagnostic struct {
	Severity string         `json:"severity"`
	Summary  string         `json:"summary"`
	Detail   string         `json:"detail,omitempty"`
	Range    *validateRange `json:"range,omitempty"`
}

type validateRange struct {
	Filename string      `json:"filename"`
	Start    validatePos `json:"start"`
	End      validatePos `json:"end"`
}

type validatePos struct {
	Line   int `json:"line"`
	Column int `json:"column"`
	Byte   int `json:"byte"`
}

func runValidate(_ context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "validate", validateUsage)
	vf := addVarFlags(fs)
	asJSON := fs.Bool("json", false, "print the result as JSON on stdout")
	paths, err := parseFlagsAnywhere(fs, args)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		return exitUsage
	}
	if len(paths) == 0 {
		fmt.Fprintln(e.stderr, "nomad-serverless validate: no service file given")
		fmt.Fprintln(e.stderr)
		fs.Usage()
		return exitUsage
	}

	opts := vf.Options(e.getenv)
	out := validateJSON{Valid: true, Services: []validateService{}, Diagnostics: []validateDiagnostic{}}
	var lines []string
	declared := map[string]string{} // service name -> where it is declared
	for _, path := range paths {
		f, diags := svchcl.ParseFile(path, opts)
		// Service names are global (they name Consul services and routes),
		// so two files declaring one name cannot both be deployed.
		for i, s := range f.Services {
			if prev, dup := declared[s.Name]; dup {
				diags = append(diags, f.Problems(i, []spec.Problem{{
					Path:    "name",
					Summary: fmt.Sprintf("service %q is also declared in %s.", s.Name, prev),
					Detail:  "Service names are unique across the files you deploy together; rename one.",
				}})...)
				continue
			}
			declared[s.Name] = path
		}
		if diags.HasErrors() {
			out.Valid = false
		} else {
			for _, s := range f.Services {
				hash := s.Template.Hash()
				out.Services = append(out.Services, validateService{File: path, Name: s.Name, Namespace: s.Namespace, SpecHash: hash})
				lines = append(lines, fmt.Sprintf("%s: service %q (namespace %q, spec %s) is valid", path, s.Name, s.Namespace, shortHash(hash)))
			}
		}
		if *asJSON {
			for _, d := range diags {
				out.Diagnostics = append(out.Diagnostics, jsonDiagnostic(d))
			}
		} else if len(diags) > 0 {
			if err := f.WriteDiagnostics(e.stderr, diags); err != nil {
				fmt.Fprintf(e.stderr, "nomad-serverless validate: write diagnostics: %v\n", err)
			}
		}
	}

	if *asJSON {
		if err := writeJSON(e.stdout, out); err != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless validate: %v\n", err)
			return exitError
		}
	} else {
		for _, l := range lines {
			fmt.Fprintln(e.stdout, l)
		}
	}
	if !out.Valid {
		if !*asJSON {
			fmt.Fprintln(e.stderr, "nomad-serverless validate: invalid service file; nothing was checked against the cluster")
		}
		return exitError
	}
	return exitOK
}

// shortHash is the first 12 hex digits of a "sha256:..." spec hash.
func shortHash(h string) string {
	h = strings.TrimPrefix(h, "sha256:")
	if len(h) > 12 {
		h = h[:12]
	}
	return h
}

func jsonDiagnostic(d *hcl2.Diagnostic) validateDiagnostic {
	sev := "error"
	if d.Severity == hcl2.DiagWarning {
		sev = "warning"
	}
	out := validateDiagnostic{Severity: sev, Summary: d.Summary, Detail: d.Detail}
	if r := d.Subject; r != nil {
		out.Range = &validateRange{
			Filename: r.Filename,
			Start:    validatePos{Line: r.Start.Line, Column: r.Start.Column, Byte: r.Start.Byte},
			End:      validatePos{Line: r.End.Line, Column: r.End.Column, Byte: r.End.Byte},
		}
	}
	return out
}
