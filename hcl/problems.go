package hcl

import (
	"strings"

	hcl2 "github.com/hashicorp/hcl/v2"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Problems turns spec problems of Services[i] (from (*spec.Service).Validate
// or spec.ValidateTrafficRevisions) into error diagnostics located where the
// file sets what each Problem.Path names, or, when the file leaves that
// setting at its default, at the nearest enclosing block that it writes (in
// the end the service block header).
func (f *File) Problems(i int, ps []spec.Problem) hcl2.Diagnostics {
	var ranges map[string]hcl2.Range
	if f != nil && i >= 0 && i < len(f.ranges) {
		ranges = f.ranges[i]
	}
	diags := make(hcl2.Diagnostics, 0, len(ps))
	for _, p := range ps {
		d := &hcl2.Diagnostic{
			Severity: hcl2.DiagError,
			Summary:  strings.TrimSuffix(p.Summary, "."),
			Detail:   p.Detail,
		}
		if r, ok := locate(ranges, p.Path); ok {
			d.Subject = r.Ptr()
		}
		diags = append(diags, d)
	}
	return diags
}

// locate finds the range of path, falling back to ever shorter prefixes:
// "traffic[1].percent" -> "traffic[1]" -> "traffic" -> "" (the service).
func locate(ranges map[string]hcl2.Range, path string) (hcl2.Range, bool) {
	if ranges == nil {
		return hcl2.Range{}, false
	}
	for {
		if r, ok := ranges[path]; ok {
			return r, true
		}
		if path == "" {
			return hcl2.Range{}, false
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			path = ""
		} else {
			path = path[:i]
		}
	}
}
