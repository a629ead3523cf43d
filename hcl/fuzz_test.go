package hcl

import (
	"io"
	"os"
	"path/filepath"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// FuzzParse feeds arbitrary files to Parse: it must never panic or hang, and
// whatever it accepts must be a deployable service (valid, hashable).
func FuzzParse(f *testing.F) {
	examples, _ := filepath.Glob("../examples/*.hcl")
	for _, p := range examples {
		if src, err := os.ReadFile(p); err == nil {
			f.Add(src)
		}
	}
	for _, s := range []string{
		"",
		"service \"x\" {}",
		"service \"x\" {\n  image = \"nginx\"\n  timeout = \"30 s\"\n}\n",
		"service \"x\" {\n  image = var.nope\n}\n",
		"variable \"v\" {\n  type = list(number)\n  default = [1]\n}\nservice \"x\" {\n  image = \"i\"\n  tags = var.v\n}\n",
		"locals {\n  a = local.b\n  b = local.a\n}\n",
		"service \"x\" {\n  task {\n    driver = \"raw_exec\"\n    config {\n      command = \"${NOMAD_TASK_DIR}/x\"\n      args = [\"${attr.a.b}\", \"${meta[\\\"k\\\"]}\", \"${env.HOME}\"]\n      m {\n        n \"l\" {\n          v = 1e300\n        }\n      }\n    }\n  }\n}\n",
		"service \"x\" {\n  image = \"i\"\n  traffic {\n    latest = true\n    percent = 1e30\n  }\n}\n",
		"service \"x\" {\n  image = format(\"%999999d\", 1)\n}\n",
		"service \"x\" {\n  readiness {\n    http {\n      headers = { a = [1] }\n    }\n    tcp {}\n  }\n}\n",
		"service \"x\" {\n  image = \"i\"\n  meta = { (var.x) = 1 }\n}\n",
		"service \"x\" {\n  image = \"i\"\n  scaling {\n    min = -9223372036854775809\n    target = -1e-400\n  }\n}\n",
		"service \"x\" { image = \"i\" }\nservice \"x\" { image = \"j\" }\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		file, diags := Parse("fuzz.hcl", src, Options{Vars: map[string]string{"x": "1"}})
		if file == nil {
			t.Fatal("nil File")
		}
		for _, d := range diags {
			if d.Subject != nil && d.Subject.Filename == "" {
				t.Errorf("diagnostic %q has a subject without a file name", d.Summary)
			}
		}
		if err := file.WriteDiagnostics(io.Discard, diags); err != nil {
			t.Errorf("WriteDiagnostics: %v", err)
		}
		for i := range file.Services {
			s := &file.Services[i]
			file.Problems(i, []spec.Problem{{Path: "task.env.X"}, {Path: "traffic[9].percent"}, {Path: "x]["}})
			if diags.HasErrors() {
				continue
			}
			if ps := s.Validate(); len(ps) > 0 {
				t.Errorf("accepted an invalid service %q: %v", s.Name, ps)
			}
			_ = s.Template.Hash() // panics on values JSON cannot carry
		}
	})
}
