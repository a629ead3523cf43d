package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// validateRun runs `validate args...` in process with the given environment.
func validateRun(t *testing.T, getenv map[string]string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(k string) string { return getenv[k] }}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = run(ctx, e, append([]string{"validate"}, args...))
	return code, out.String(), errb.String()
}

func validateWrite(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestValidateExamples(t *testing.T) {
	examples, err := filepath.Glob("../../examples/*.hcl")
	if err != nil || len(examples) < 4 {
		t.Fatalf("examples: %v %v", examples, err)
	}
	code, stdout, stderr := validateRun(t, nil, examples...)
	if code != exitOK || stderr != "" {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, stdout, stderr)
	}
	line := regexp.MustCompile(`^\S+\.hcl: service "[a-z0-9-]+" \(namespace "default", spec [0-9a-f]{12}\) is valid$`)
	lines := strings.Split(strings.TrimSpace(stdout), "\n")
	for _, l := range lines {
		if !line.MatchString(l) {
			t.Errorf("summary line %q", l)
		}
	}
	for _, name := range []string{`"hello"`, `"testapp"`, `"api"`, `"worker"`, `"whoami"`} {
		if !strings.Contains(stdout, "service "+name) {
			t.Errorf("no line for service %s:\n%s", name, stdout)
		}
	}
}

func TestValidateInvalidFile(t *testing.T) {
	dir := t.TempDir()
	bad := validateWrite(t, dir, "bad.hcl", "service \"hello\" {\n  image = \"nginx\"\n  scaling {\n    min = 5\n    max = 3\n  }\n  timeout = \"30 s\"\n}\n")
	code, stdout, stderr := validateRun(t, nil, bad)
	if code != exitError {
		t.Fatalf("exit %d, want %d", code, exitError)
	}
	if stdout != "" {
		t.Errorf("stdout for an invalid file: %q", stdout)
	}
	for _, want := range []string{
		"Error: min 5 is greater than max 3", "on " + bad + " line 4, in service \"hello\":", "Lower min or raise max.",
		"Error: Invalid duration", "line 7", `"30s"`,
	} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr lacks %q:\n%s", want, stderr)
		}
	}

	// One valid and one invalid file: the valid one is summarised, the run fails.
	code, stdout, _ = validateRun(t, nil, "../../examples/hello.hcl", bad)
	if code != exitError || !strings.Contains(stdout, `service "hello"`) {
		t.Errorf("mixed files: exit %d stdout %q", code, stdout)
	}

	// A file that cannot be read.
	code, _, stderr = validateRun(t, nil, filepath.Join(dir, "missing.hcl"))
	if code != exitError || !strings.Contains(stderr, "Failed to read file") || !strings.Contains(stderr, "missing.hcl") {
		t.Errorf("missing file: exit %d\n%s", code, stderr)
	}
}

func TestValidateJSON(t *testing.T) {
	dir := t.TempDir()
	bad := validateWrite(t, dir, "bad.hcl", "service \"hello\" {\n  image = \"nginx\"\n  traffic {\n    latest = true\n    percent = 90\n  }\n}\n")
	type pos struct{ Line, Column int }
	var out struct {
		Valid    bool
		Services []struct {
			File, Name, Namespace string
			SpecHash              string `json:"spec_hash"`
		}
		Diagnostics []struct {
			Severity, Summary, Detail string
			Range                     *struct {
				Filename   string
				Start, End pos
			}
		}
	}

	code, stdout, stderr := validateRun(t, nil, "-json", bad)
	if code != exitError || stderr != "" {
		t.Fatalf("exit %d stderr %q", code, stderr)
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, stdout)
	}
	if out.Valid || len(out.Services) != 0 || len(out.Diagnostics) != 1 {
		t.Fatalf("result %+v", out)
	}
	d := out.Diagnostics[0]
	if d.Severity != "error" || !strings.Contains(d.Summary, "add up to 90") || d.Detail == "" || d.Range == nil ||
		d.Range.Filename != bad || d.Range.Start != (pos{3, 3}) {
		t.Errorf("diagnostic %+v range %+v", d, d.Range)
	}

	out.Services, out.Diagnostics = nil, nil
	code, stdout, _ = validateRun(t, nil, "../../examples/probes.hcl", "-json")
	if code != exitOK {
		t.Fatalf("exit %d\n%s", code, stdout)
	}
	if err := json.Unmarshal([]byte(stdout), &out); err != nil {
		t.Fatal(err)
	}
	if !out.Valid || len(out.Services) != 2 || out.Services[0].Name != "api" || out.Services[1].Name != "worker" ||
		!strings.HasPrefix(out.Services[0].SpecHash, "sha256:") || out.Services[0].Namespace != "default" ||
		len(out.Diagnostics) != 0 || !strings.Contains(stdout, `"diagnostics": []`) {
		t.Errorf("result %+v\n%s", out, stdout)
	}
}

func TestValidateVariables(t *testing.T) {
	dir := t.TempDir()
	svc := validateWrite(t, dir, "svc.hcl", `
variable "max" {
  type = number
}
service "hello" {
  image = "nginx"
  scaling {
    min = 2
    max = var.max
  }
}
`)
	good := validateWrite(t, dir, "good.hcl", "max = 5\n")
	low := validateWrite(t, dir, "low.hcl", "max = 1\n")

	for _, tc := range []struct {
		name   string
		env    map[string]string
		args   []string
		code   int
		stderr string
	}{
		{"no value", nil, []string{svc}, exitError, "No value for required variable"},
		{"-var", nil, []string{"-var", "max=5", svc}, exitOK, ""},
		{"-var after the file", nil, []string{svc, "-var", "max=5"}, exitOK, ""},
		{"-var too low", nil, []string{"-var", "max=1", svc}, exitError, "min 2 is greater than max 1"},
		{"-var wrong type", nil, []string{"-var", "max=lots", svc}, exitError, "Invalid value for variable"},
		{"-var-file", nil, []string{"-var-file", good, svc}, exitOK, ""},
		{"later -var-file wins", nil, []string{"-var-file", good, "-var-file", low, svc}, exitError, "greater than max 1"},
		{"-var beats -var-file", nil, []string{"-var-file", low, "-var", "max=3", svc}, exitOK, ""},
		{"environment", map[string]string{"NOMAD_SERVERLESS_VAR_max": "4"}, []string{svc}, exitOK, ""},
		{"-var-file beats environment", map[string]string{"NOMAD_SERVERLESS_VAR_max": "4"}, []string{"-var-file", low, svc}, exitError, "greater than max 1"},
		{"undeclared -var warns", nil, []string{"-var", "max=5", "-var", "mx=1", svc}, exitOK, `Did you mean "max"?`},
		{"missing -var-file", nil, []string{"-var-file", filepath.Join(dir, "nope.hcl"), "-var", "max=5", svc}, exitError, "nope.hcl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, _, stderr := validateRun(t, tc.env, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.stderr) {
				t.Errorf("exit %d (want %d), stderr (want %q):\n%s", code, tc.code, tc.stderr, stderr)
			}
		})
	}
}

func TestValidateDuplicateAcrossFiles(t *testing.T) {
	dir := t.TempDir()
	a := validateWrite(t, dir, "a.hcl", "service \"hello\" {\n  image = \"a\"\n}\n")
	b := validateWrite(t, dir, "b.hcl", "service \"other\" {\n  image = \"b\"\n}\n\nservice \"hello\" {\n  image = \"b\"\n}\n")
	code, _, stderr := validateRun(t, nil, a, b)
	if code != exitError || !strings.Contains(stderr, `service "hello" is also declared in `+a) || !strings.Contains(stderr, "on "+b+" line 5") {
		t.Errorf("exit %d\n%s", code, stderr)
	}
}

func TestValidateUsage(t *testing.T) {
	for _, tc := range []struct {
		name   string
		args   []string
		code   int
		stderr string
	}{
		{"no file", nil, exitUsage, "no service file given"},
		{"unknown flag", []string{"-bogus", "x.hcl"}, exitUsage, "flag provided but not defined: -bogus"},
		{"-var without =", []string{"-var", "max", "x.hcl"}, exitUsage, "want name=value"},
		{"-var without name", []string{"-var", "=1", "x.hcl"}, exitUsage, "want name=value"},
		{"-var missing value", []string{"x.hcl", "-var"}, exitUsage, "flag needs an argument"},
		{"help", []string{"-h"}, exitOK, "Usage: nomad-serverless validate"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, stdout, stderr := validateRun(t, nil, tc.args...)
			if code != tc.code || !strings.Contains(stderr, tc.stderr) || stdout != "" {
				t.Errorf("exit %d (want %d), stdout %q, stderr (want %q):\n%s", code, tc.code, stdout, tc.stderr, stderr)
			}
		})
	}
	// Everything after -- is a file, even if it looks like a flag.
	code, _, stderr := validateRun(t, nil, "--", "-json")
	if code != exitError || !strings.Contains(stderr, "Failed to read file") {
		t.Errorf("-- -json: exit %d\n%s", code, stderr)
	}
}
