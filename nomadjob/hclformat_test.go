package nomadjob

import (
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"
	"github.com/hashicorp/nomad/api"
	"github.com/zclconf/go-cty/cty"
)

func TestFormatHCLValuesReadBack(t *testing.T) {
	// Values a user may put in a driver config or env must come back
	// unchanged when HCL reads them.
	job := mustJob(t)
	user := job.TaskGroups[0].Tasks[0]
	user.Config = map[string]any{
		"image":      "x",
		"args":       []any{`say "hi"`, `back\slash`, "tab\tnew\nline", "${NOMAD_PORT_app}", "literal ${not_nomad} and %{ if }"},
		"ints":       []int{1, 2},
		"logging":    map[string]any{"type": "json-file", "config": []any{map[string]any{"max-size": "10m"}}},
		"privileged": false,
		"ratio":      0.25,
	}
	src, err := FormatHCL(job)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := hclsyntax.ParseConfig(src, "job.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("invalid HCL: %v\n%s", diags, src)
	}
	cfg := findBlock(t, f.Body.(*hclsyntax.Body), "job", "group", "task", "config")
	ctx := &hcl.EvalContext{Variables: map[string]cty.Value{}}
	args, diags := cfg.Attributes["args"].Expr.Value(ctx)
	// ${NOMAD_PORT_app} is left as an interpolation for Nomad (as people
	// write it), so HCL needs the variable to evaluate it here.
	if diags.HasErrors() {
		ctx.Variables["NOMAD_PORT_app"] = cty.StringVal("${NOMAD_PORT_app}")
		args, diags = cfg.Attributes["args"].Expr.Value(ctx)
	}
	if diags.HasErrors() {
		t.Fatalf("args: %v", diags)
	}
	want := []string{`say "hi"`, `back\slash`, "tab\tnew\nline", "${NOMAD_PORT_app}", "literal ${not_nomad} and %{ if }"}
	for i, w := range want {
		if got := args.Index(cty.NumberIntVal(int64(i))).AsString(); got != w {
			t.Errorf("args[%d] = %q, want %q", i, got, w)
		}
	}
	if !strings.Contains(string(src), `max-size = "10m"`) || !strings.Contains(string(src), "ratio      = 0.25") {
		t.Errorf("nested config not written as expected:\n%s", src)
	}
	if _, err := FormatHCL(&api.Job{}); err == nil {
		t.Error("FormatHCL of a job without ID succeeded")
	}
	job.TaskGroups[0].Tasks[0].Config["bad"] = make(chan int)
	if _, err := FormatHCL(job); err == nil || !strings.Contains(err.Error(), "bad") {
		t.Errorf("unwritable value: err = %v", err)
	}
}

func findBlock(t *testing.T, b *hclsyntax.Body, path ...string) *hclsyntax.Body {
	t.Helper()
	for _, typ := range path {
		var next *hclsyntax.Body
		for _, blk := range b.Blocks {
			if blk.Type == typ {
				next = blk.Body
				break
			}
		}
		if next == nil {
			t.Fatalf("no block %q", typ)
		}
		b = next
	}
	return b
}

func TestFormatHCLShowsEveryField(t *testing.T) {
	for _, c := range goldenCases() {
		_, job := compileCase(t, c)
		src, err := FormatHCL(job)
		if err != nil {
			t.Fatal(err)
		}
		s := string(src)
		for _, want := range []string{
			`job "` + *job.ID + `"`, `type        = "service"`, `"serverless.spec-hash"`, "max_parallel = 0",
			`group "app"`, "shutdown_delay", "scaling {", "policy {", "serverless {", "restart {", "reschedule {",
			`port "http"`, `port "admin"`, "K-Network-Probe = [\"queue\"]", `task "user"`, `task "queue-proxy"`,
			`hook    = "prestart"`, "SERVERLESS_INSTANCE", "kill_timeout",
		} {
			if !strings.Contains(s, want) {
				t.Errorf("%s: HCL lacks %q", c.name, want)
			}
		}
	}
}
