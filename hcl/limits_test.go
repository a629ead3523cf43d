package hcl

import (
	"bytes"
	"fmt"
	"strings"
	"testing"

	hcl2 "github.com/hashicorp/hcl/v2"
)

// repeatLocals is a locals block of n lines made by line(i), i from 1.
func repeatLocals(n int, line func(i int) string) string {
	var b strings.Builder
	b.WriteString("locals {\n")
	for i := 1; i <= n; i++ {
		b.WriteString(line(i))
	}
	b.WriteString("}\n")
	return b.String()
}

// TestLimits feeds inputs that went past what the parser could bear (the
// first was found by FuzzParse: 15 KiB of control characters took 5 s to
// report) and checks each gets one clear error. Every bound is a count, so
// nothing here is timed: each case would run for minutes, or crash the
// process, without its bound.
func TestLimits(t *testing.T) {
	svc := func(attrs string) string { return "service \"x\" {\n  image = \"i\"\n" + attrs + "\n}\n" }
	cases := []struct {
		name, src, summary, detail string
	}{
		{"control characters (found by FuzzParse)", "$\xd7" + strings.Repeat("\x1b", 15000), summaryNotText, "15001 bytes"},
		{"file too large", svc("  tags = [\"" + strings.Repeat("a", MaxFileBytes) + "\"]"), summaryFileTooLarge, "Split"},
		{"brackets past the stack", "a = " + strings.Repeat("[", 200000), summaryNestedTooDeep, "locals"},
		{"interpolations nested", svc("  namespace = " + strings.Repeat(`"${`, MaxNesting) + "1" + strings.Repeat(`}"`, MaxNesting)), summaryNestedTooDeep, ""},
		{"huge exponent", svc("  tags = [1e3000000]"), summaryNumberTooLarge, "1e+3000000"},
		{"tiny exponent", svc("  tags = [1e-3000000]"), summaryNumberTooLarge, "1e-3000000"},
		{"squaring in locals", repeatLocals(12, func(i int) string { return fmt.Sprintf("  a%d = local.a%d * local.a%d\n", i, i-1, i-1) }) +
			"locals {\n  a0 = 1e10\n}\n" + svc("  tags = [tostring(local.a12)]"), summaryNumberTooLarge, ""},
		{"format width", "service \"x\" {\n  image = format(\"%999999999s\", \"\")\n}\n", "Invalid function argument", "more than 1024"},
		{"indent", "service \"x\" {\n  image = indent(999999999, \"a\\nb\")\n}\n", "Invalid function argument", "at most 1024 spaces"},
		{"nested loops", svc(`  tags = [for a in range(1000): join(",", [for b in range(1000): join(",", [for c in range(1000): "x"])])]`), summaryTooMuchWork, "steps"},
		{"comparing large lists in loops", "locals {\n  l = range(1000)\n}\n" + svc(`  tags = [for i in range(1000): join("", [for j in range(1000): local.l == local.l ? "a" : "b"])]`), summaryTooMuchWork, ""},
		{"doubling lists in locals", repeatLocals(40, func(i int) string { return fmt.Sprintf("  a%d = [local.a%d, local.a%d]\n", i, i-1, i-1) }) +
			"locals {\n  a0 = \"x\"\n}\n" + svc("  tags = flatten(local.a40)"), summaryValueTooLarge, "10000 elements"},
		{"doubling strings in locals", repeatLocals(40, func(i int) string { return fmt.Sprintf("  a%d = \"${local.a%d}${local.a%d}\"\n", i, i-1, i-1) }) +
			"locals {\n  a0 = \"xx\"\n}\n" + svc("  namespace = local.a40"), summaryTooMuchWork, ""},
		{"template of many interpolations", "locals {\n  s = join(\"\", [for i in range(1000): \"" + strings.Repeat("a", 100) + "\"])\n}\n" +
			"service \"x\" {\n  image = \"" + strings.Repeat("${local.s}", 2000) + "\"\n}\n", summaryValueTooLarge, "template"},
		{"replace expanding", "locals {\n  s = join(\"\", [for i in range(1000): \"aaaaaaaaaa\"])\n}\nservice \"x\" {\n  image = replace(local.s, \"a\", local.s)\n}\n", "Invalid function argument", "longer than"},
		{"deep JSON", svc(`  meta = { a = jsonencode(jsondecode("` + strings.Repeat("[", 1000) + strings.Repeat("]", 1000) + `")) }`), "Invalid function argument", "nests more than"},
		{"long number string read as a number", "locals {\n  d = join(\"\", [for i in range(100): \"" + strings.Repeat("7", 100) + "\"])\n}\n" + svc("  concurrency = local.d + 1"), summaryNumberTooLarge, "characters"},
		{"work caught by try", svc(`  namespace = try([for a in range(1000): [for b in range(1000): [for c in range(1000): 1]]], "default")`), summaryTooMuchWork, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, diags := Parse("svc.hcl", []byte(tc.src), Options{})
			if !diags.HasErrors() {
				t.Fatal("accepted")
			}
			d := findDiag(diags, hcl2.DiagError, tc.summary)
			if d == nil {
				t.Fatalf("no %q diagnostic:%s", tc.summary, dump(diags))
			}
			if !strings.Contains(d.Detail, tc.detail) {
				t.Errorf("detail %q lacks %q", d.Detail, tc.detail)
			}
			if len(diags) > MaxDiagnostics+1 {
				t.Errorf("%d diagnostics, more than %d", len(diags), MaxDiagnostics+1)
			}
			var out bytes.Buffer
			if err := f.WriteDiagnostics(&out, diags); err != nil {
				t.Fatal(err)
			}
			// Each diagnostic shows at most a few cut lines and its detail.
			if max := len(diags) * 4 * (maxSnippetLine + 500); out.Len() > max {
				t.Errorf("wrote %d bytes of diagnostics, more than %d", out.Len(), max)
			}
		})
	}
}

// TestTooManyDiagnostics: a file of invalid characters gets MaxDiagnostics
// of them and a count of the rest, each with the part of its long line
// around it.
func TestTooManyDiagnostics(t *testing.T) {
	f, diags := Parse("svc.hcl", []byte(strings.Repeat(`\`, 100000)), Options{})
	if len(diags) != MaxDiagnostics+1 {
		t.Fatalf("%d diagnostics, want %d", len(diags), MaxDiagnostics+1)
	}
	last := diags[len(diags)-1]
	if last.Summary != summaryTooManyErrors || !strings.Contains(last.Detail, "999") {
		t.Errorf("last diagnostic %q: %q", last.Summary, last.Detail)
	}
	var out bytes.Buffer
	if err := f.WriteDiagnostics(&out, diags[:1]); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); !strings.Contains(got, "   1: \\\\\\") || !strings.Contains(got, "…\n") || len(got) > 1000 {
		t.Errorf("diagnostic on a long line:\n%s", got)
	}
}

// TestWithinLimits: what service files do is far inside the bounds.
func TestWithinLimits(t *testing.T) {
	src := repeatLocals(2000, func(i int) string {
		// Declared in reverse order, each after the one it needs: a chain
		// evaluated in one pass, not one local per pass.
		return fmt.Sprintf("  z%04d = local.z%04d + 1\n", 2001-i, 2002-i)
	}) + `locals {
  z2001 = 0
  hosts = [for i in range(100) : format("web-%03d.example.com", i)]
  env   = { for i in range(100) : "K${i}" => upper(format("%-10s|", "v${i}")) }
  big   = 1e300 * 1e300
}
service "x" {
  domains     = slice(local.hosts, 0, 10)
  meta        = local.env
  concurrency = local.z1900 > 0 ? 10 : 1
  tags        = [for h in local.hosts : h if length(regexall("0[.]", h)) > 0]
  task {
    driver = "docker"
    config {
      image = "nginx"
      args  = [jsonencode([[[[[local.big]]]]]), indent(4, "a\nb")]
    }
  }
}
`
	f := mustParse(t, src, Options{})
	s := f.Services[0]
	if len(s.Domains) != 10 || s.Template.Concurrency != 10 || len(s.Template.Tags) != 10 || s.Template.Meta["K7"] != "V7        |" {
		t.Errorf("service %+v", s)
	}
}
