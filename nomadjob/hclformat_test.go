package nomadjob

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

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
	src, body := mustFormatHCL(t, job)
	cfg := findBlock(t, body, "job", "group", "task", "config")
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

// mustFormatHCL formats job and parses the result.
func mustFormatHCL(t *testing.T, job *api.Job) ([]byte, *hclsyntax.Body) {
	t.Helper()
	src, err := FormatHCL(job)
	if err != nil {
		t.Fatal(err)
	}
	return src, assertValidHCL(t, src)
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

// kitchenSinkJob sets every kind of field a revision job and the control
// plane's job (cmd/nomad-serverless install) set, and more: spreads with
// targets, a group update with auto_revert, the default workload identity,
// a kill signal and shutdown delay, reserved and dynamic ports, templates,
// artifacts, volumes, check_restart, Connect upstreams, affinities, a check
// header that is not an identifier, meta keys with dots.
func kitchenSinkJob() *api.Job {
	return &api.Job{
		ID: new("sink"), Name: new("sink-name"), Namespace: new("platform"), Region: new("eu"),
		Type: new("service"), Priority: new(70), AllAtOnce: new(false), Datacenters: []string{"dc1", "dc2"},
		NodePool:    new("web"),
		Constraints: []*api.Constraint{{LTarget: "${attr.kernel.name}", RTarget: "linux", Operand: "="}, {LTarget: "${meta.tier}", RTarget: "front"}},
		Affinities:  []*api.Affinity{{LTarget: "${node.datacenter}", RTarget: "dc1", Operand: "=", Weight: new(int8(50))}},
		Update:      &api.UpdateStrategy{MaxParallel: new(0)},
		Meta:        map[string]string{"nomad-serverless.version": "1.2.3", "team": "web"},
		TaskGroups: []*api.TaskGroup{{
			Name: new("control-plane"), Count: new(3), ShutdownDelay: new(5 * time.Second),
			Spreads: []*api.Spread{{Attribute: "${node.unique.id}", Weight: new(int8(100)),
				SpreadTarget: []*api.SpreadTarget{{Value: "dc1", Percent: 70}, {Value: "dc2", Percent: 30}}}},
			Update: &api.UpdateStrategy{MaxParallel: new(1), HealthCheck: new("checks"), MinHealthyTime: new(10 * time.Second),
				HealthyDeadline: new(3 * time.Minute), AutoRevert: new(true)},
			RestartPolicy:    &api.RestartPolicy{Attempts: new(0), Mode: new("fail")},
			ReschedulePolicy: &api.ReschedulePolicy{Unlimited: new(true), Delay: new(5 * time.Second)},
			Volumes:          map[string]*api.VolumeRequest{"data": {Name: "data", Type: "host", Source: "data", ReadOnly: true}},
			Networks: []*api.NetworkResource{{
				Mode:          "bridge",
				ReservedPorts: []api.Port{{Label: "gateway", Value: 8080}, {Label: "admin", Value: 8081, To: 81}},
				DynamicPorts:  []api.Port{{Label: "http"}, {Label: "app", To: 9090}},
			}},
			Services: []*api.Service{{
				Name: "gw", PortLabel: "gateway", Provider: "consul", Tags: []string{"a", "b=c"},
				Meta: map[string]string{"domain": "example.com"},
				Checks: []api.ServiceCheck{{
					Name: "healthz", Type: "http", Path: "/healthz", PortLabel: "admin", Interval: 5 * time.Second, Timeout: 2 * time.Second,
					Header:       map[string][]string{"X-Probe": {"a", "b"}},
					CheckRestart: &api.CheckRestart{Limit: 3, Grace: new(10 * time.Second)},
				}, {
					Type: "http", Path: "/ready", Interval: time.Second, Timeout: time.Second,
					Header: map[string][]string{"x.dotted": {"v"}},
				}},
				Connect: &api.ConsulConnect{SidecarService: &api.ConsulSidecarService{Proxy: &api.ConsulProxy{
					Upstreams: []*api.ConsulUpstream{{DestinationName: "db", LocalBindPort: 5432}},
				}}},
			}},
			Scaling: &api.ScalingPolicy{Min: new(int64(0)), Max: new(int64(10)), Enabled: new(false),
				Policy: map[string]any{"serverless": map[string]any{"target": 100, "window": "1m0s"}, "cooldown": "1m"}},
			Tasks: []*api.Task{{
				Name: "serve", Driver: "docker", User: "nobody", KillTimeout: new(35 * time.Second),
				KillSignal: "SIGTERM", ShutdownDelay: 5 * time.Second, Leader: true,
				Lifecycle: &api.TaskLifecycle{Hook: "prestart", Sidecar: true},
				Config: map[string]any{"image": "x:1", "args": []string{"serve", "-listen", ":${NOMAD_PORT_gateway}"}, "network_mode": "host",
					"labels": map[string]any{"a.b": "c"}, "privileged": false, "ratio": 0.5, "empty": []any{}},
				Env:       map[string]string{"NOMAD_ADDR": "unix://${NOMAD_SECRETS_DIR}/api.sock", "CONSUL_HTTP_ADDR": "127.0.0.1:8500"},
				Resources: &api.Resources{CPU: new(500), MemoryMB: new(256)},
				Artifacts: []*api.TaskArtifact{{GetterSource: new("https://x/y.tgz"), RelativeDest: new("local/"),
					GetterOptions: map[string]string{"checksum": "sha256:00"}}},
				Templates: []*api.Template{{EmbeddedTmpl: new("{{ with nomadVar \"x\" }}T={{ .t }}{{ end }}\n"), DestPath: new("secrets/t.env"),
					Envvars: new(true), ChangeMode: new("restart")}},
				VolumeMounts: []*api.VolumeMount{{Volume: new("data"), Destination: new("/data")}},
				Identity:     &api.WorkloadIdentity{Env: true},
				Identities:   []*api.WorkloadIdentity{{Name: "vault", Audience: []string{"vault.io"}, TTL: time.Hour}},
				Meta:         map[string]string{"owner": "me"},
			}},
		}},
	}
}

// jobCases are every job FormatHCL is held to: the golden revision jobs and
// the kitchen sink.
func jobCases(t *testing.T) map[string]*api.Job {
	out := map[string]*api.Job{"kitchen sink": kitchenSinkJob()}
	for _, c := range goldenCases() {
		_, out[c.name] = compileCase(t, c)
	}
	return out
}

// TestFormatHCLIsFaithful: every field set in each job is in its HCL with
// its value, and the HCL says nothing else (CheckHCL, which FormatHCL runs
// too, is called here on its own so a FormatHCL that skipped it would
// still be caught).
func TestFormatHCLIsFaithful(t *testing.T) {
	for name, job := range jobCases(t) {
		src, err := FormatHCL(job)
		if err != nil {
			t.Errorf("%s: %v", name, err)
			continue
		}
		if err := CheckHCL(job, src); err != nil {
			t.Errorf("%s: %v\n%s", name, err, src)
		}
		for _, want := range []string{
			// Spelled otherwise than the API's tags say.
			`job "` + *job.ID + `" {`, "max_parallel = 0",
		} {
			if !strings.Contains(string(src), want) {
				t.Errorf("%s: HCL lacks %q", name, want)
			}
		}
	}
	src, _ := FormatHCL(kitchenSinkJob())
	for _, want := range []string{
		`name        = "sink-name"`, `port "gateway" {`, "static = 8080", `port "http" {}`,
		"spread {", `target "dc1" {`, "auto_revert      = true", "kill_signal    = \"SIGTERM\"", `shutdown_delay = "5s"`,
		"identity {\n        env = true\n      }", `volume "data" {`, `"a.b" = "c"`, `"x.dotted" = ["v"]`,
		"policy {\n        cooldown = \"1m\"\n\n        serverless {", `args  = ["serve", "-listen", ":${NOMAD_PORT_gateway}"]`,
		`"nomad-serverless.version" = "1.2.3"`, "empty = []",
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("kitchen sink HCL lacks %q:\n%s", want, src)
		}
	}
}

// TestFormatHCLShowsEveryValue checks FormatHCL without its own field
// mapping: every value set anywhere in a job, found by walking the Go
// structs whatever their tags, appears in the HCL (as a value, or as a
// label for names). A field FormatHCL and CheckHCL both overlooked would
// fail here.
func TestFormatHCLShowsEveryValue(t *testing.T) {
	for name, job := range jobCases(t) {
		src, err := FormatHCL(job)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got, err := flattenHCL(src)
		if err != nil {
			t.Fatal(err)
		}
		have := map[string]int{}
		for path, v := range got {
			have[v]++
			// Labels: `task "user"` is the task's Name.
			for _, l := range strings.Split(path, "[") {
				if q, _, ok := strings.Cut(l, "]"); ok && strings.HasPrefix(q, `"`) {
					have[q]++
				}
			}
		}
		var walk func(v reflect.Value, path string)
		walk = func(v reflect.Value, path string) {
			if !v.IsValid() {
				return
			}
			if d, ok := v.Interface().(time.Duration); ok {
				if d != 0 && have[fmt.Sprintf("%q", d.String())] == 0 {
					t.Errorf("%s: %s = %s is not in the HCL", name, path, d)
				}
				return
			}
			switch v.Kind() {
			case reflect.Pointer, reflect.Interface:
				if !v.IsNil() {
					walk(v.Elem(), path)
				}
			case reflect.Struct:
				for i := 0; i < v.NumField(); i++ {
					if v.Type().Field(i).IsExported() {
						walk(v.Field(i), path+"."+v.Type().Field(i).Name)
					}
				}
			case reflect.Slice, reflect.Array:
				for i := 0; i < v.Len(); i++ {
					walk(v.Index(i), fmt.Sprintf("%s[%d]", path, i))
				}
			case reflect.Map:
				for _, k := range v.MapKeys() {
					walk(v.MapIndex(k), path+"."+k.String())
				}
			case reflect.String:
				if s := v.String(); s != "" && have[fmt.Sprintf("%q", s)] == 0 {
					t.Errorf("%s: %s = %q is not in the HCL", name, path, s)
				}
			case reflect.Bool:
				if v.Bool() && have["true"] == 0 {
					t.Errorf("%s: %s = true is not in the HCL", name, path)
				}
			case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
				if n := v.Int(); n != 0 && have[fmt.Sprint(n)] == 0 {
					t.Errorf("%s: %s = %d is not in the HCL", name, path, n)
				}
			case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
				if n := v.Uint(); n != 0 && have[fmt.Sprint(n)] == 0 {
					t.Errorf("%s: %s = %d is not in the HCL", name, path, n)
				}
			case reflect.Float32, reflect.Float64:
				if f := v.Float(); f != 0 && have[fmt.Sprint(f)] == 0 {
					t.Errorf("%s: %s = %v is not in the HCL", name, path, f)
				}
			}
		}
		walk(reflect.ValueOf(job), "job")
	}
}

// TestCheckHCLFindsDifferences: CheckHCL names what is missing, what
// differs and what is extra, and FormatHCL refuses a job with a field a
// jobspec has no place for.
func TestCheckHCLFindsDifferences(t *testing.T) {
	job := kitchenSinkJob()
	src, err := FormatHCL(job)
	if err != nil {
		t.Fatal(err)
	}
	text := string(src)
	for _, tc := range []struct {
		name, from, to, want string
	}{
		{"a line dropped", "      kill_signal    = \"SIGTERM\"\n", "",
			`job["sink"].group["control-plane"].task["serve"].kill_signal = "SIGTERM" is set in the job but missing from the HCL`},
		{"a block dropped", "      identity {\n        env = true\n      }\n", "",
			`job["sink"].group["control-plane"].task["serve"].identity#0.env = true is set in the job but missing from the HCL`},
		{"a value changed", "static = 8080", "static = 8088",
			`job["sink"].group["control-plane"].network#0.port["gateway"].static is 8080 in the job but 8088 in the HCL`},
		{"a duration changed", `min_healthy_time = "10s"`, `min_healthy_time = "10m"`,
			`update#0.min_healthy_time is "10s" in the job but "10m" in the HCL`},
		{"something extra", "    count          = 3\n", "    count = 3\n    stop_after_client_disconnect = \"1m\"\n",
			`job["sink"].group["control-plane"].stop_after_client_disconnect = "1m" is in the HCL but not set in the job`},
		{"an interpolation escaped", `":${NOMAD_PORT_gateway}"`, `":$${NOMAD_PORT_gateway}"`, ""},
	} {
		changed := strings.Replace(text, tc.from, tc.to, 1)
		if changed == text {
			t.Fatalf("%s: %q not in the HCL:\n%s", tc.name, tc.from, text)
		}
		err := CheckHCL(job, []byte(changed))
		switch {
		case tc.want == "" && err != nil:
			// $${ reads as the same literal ${: no difference.
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err = %v, want it to say %q", tc.name, err, tc.want)
		}
	}
	if err := CheckHCL(job, []byte("job \"sink\" {")); err == nil || !strings.Contains(err.Error(), "does not parse") {
		t.Errorf("unparsable HCL: %v", err)
	}

	job.Stop = new(true) // set by the server, never in a jobspec
	if _, err := FormatHCL(job); err == nil || !strings.Contains(err.Error(), "job.Stop: set, but a jobspec has no place for it") {
		t.Errorf("FormatHCL of a job with Stop set: %v", err)
	}
}

// TestFormatHCLRoundTripsEveryCase parses each output with hclsyntax and
// finds the blocks a jobspec is made of where Nomad looks for them.
func TestFormatHCLRoundTripsEveryCase(t *testing.T) {
	for name, job := range jobCases(t) {
		_, body := mustFormatHCL(t, job)
		if len(body.Blocks) != 1 || body.Blocks[0].Type != "job" || !slices.Equal(body.Blocks[0].Labels, []string{*job.ID}) {
			t.Fatalf("%s: want one job %q block", name, *job.ID)
		}
		for _, g := range job.TaskGroups {
			for _, task := range g.Tasks {
				var found bool
				for _, gb := range body.Blocks[0].Body.Blocks {
					for _, tb := range gb.Body.Blocks {
						found = found || gb.Type == "group" && gb.Labels[0] == *g.Name && tb.Type == "task" && tb.Labels[0] == task.Name
					}
				}
				if !found {
					t.Errorf("%s: no block group %q > task %q", name, *g.Name, task.Name)
				}
			}
		}
	}
}
