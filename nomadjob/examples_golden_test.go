package nomadjob

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// TestExamplesGolden compiles every service of every examples/*.hcl file
// (as generation 1, with the golden options) and compares it with
// testdata/golden/examples/<file>-<service>.{json,hcl}.
func TestExamplesGolden(t *testing.T) {
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(root, "examples", "*.hcl"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no examples/*.hcl found")
	}
	for _, path := range files {
		base := strings.TrimSuffix(filepath.Base(path), ".hcl")
		t.Run(base, func(t *testing.T) {
			f, diags := hcl.ParseFile(path, hcl.Options{})
			if diags.HasErrors() {
				t.Fatalf("%s does not parse: %v", path, diags)
			}
			if len(f.Services) == 0 {
				t.Fatalf("%s declares no service", path)
			}
			for _, svc := range f.Services {
				rev := spec.NewRevision(&svc, 1)
				job, err := Compile(rev, testOptions())
				if err != nil {
					t.Fatalf("%s: service %s: %v", path, svc.Name, err)
				}
				checkGoldenJob(t, filepath.Join("testdata", "golden", "examples", base+"-"+svc.Name), job)
			}
		})
	}
}
