package hcl

import (
	"flag"

	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// fuzzDeadline is how long one input may take while fuzzing. Inputs take
// well under a millisecond and the bounds in limits.go keep the worst near
// a second, so an input past it is a new way to stall the parser. Go's
// fuzzer has no per-input timeout of its own: without this a stalled input
// shows only as an exec rate of 0/sec. Seed inputs under plain go test are
// not timed (no timed assertions): the bounds are tested by counts in
// TestLimits.
const fuzzDeadline = 3 * time.Second

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
		"$\xd7" + strings.Repeat("\x1b", 300), // found by this target: one diagnostic per byte, each rereading the file
		"locals {\n  a = [for i in range(10): [for j in range(10): \"${i}${j}\"]]\n  b = local.a == local.a ? 1e30 * 1e30 : 0\n}\nservice \"x\" {\n  image = \"i\"\n  tags = flatten(local.a)\n}\n",
		"service \"x\" {\n  image = \"i\"\n  port = 80\n  env = { A = \"1\" }\n  resources {\n    cpu = 50\n  }\n}\n",
	} {
		f.Add([]byte(s))
	}
	fuzzing := false
	if fl := flag.Lookup("test.fuzz"); fl != nil {
		fuzzing = fl.Value.String() != ""
	}
	f.Fuzz(func(t *testing.T, src []byte) {
		if !fuzzing {
			checkParse(t, src)
			return
		}
		done := make(chan struct{})
		go func() {
			defer close(done)
			checkParse(t, src)
		}()
		select {
		case <-done:
		case <-time.After(fuzzDeadline):
			t.Fatalf("Parse and WriteDiagnostics took longer than %s on this input (%d bytes):\n%q", fuzzDeadline, len(src), src)
		}
	})
}

// checkParse is one input of FuzzParse. It reports with t.Errorf only, so it
// can run on another goroutine.
func checkParse(t *testing.T, src []byte) {
	file, diags := Parse("fuzz.hcl", src, Options{Vars: map[string]string{"x": "1"}})
	if file == nil {
		t.Error("nil File")
		return
	}
	if len(diags) > MaxDiagnostics+1 {
		t.Errorf("%d diagnostics, more than %d", len(diags), MaxDiagnostics+1)
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
}
