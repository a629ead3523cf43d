package hcl

import (
	"strings"
	"testing"

	hcl2 "github.com/hashicorp/hcl/v2"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// marker marks, in a test's source, where the diagnostic must point. It is
// removed before parsing; its line and column are the expected position.
const marker = "»"

func splitMarker(t *testing.T, src string) (string, int, int) {
	t.Helper()
	i := strings.Index(src, marker)
	if i < 0 || strings.Count(src, marker) != 1 {
		t.Fatalf("source needs exactly one %s marker", marker)
	}
	before := src[:i]
	line := strings.Count(before, "\n") + 1
	col := len([]rune(before[strings.LastIndex(before, "\n")+1:])) + 1
	return before + src[i+len(marker):], line, col
}

// findDiag returns the first diagnostic of severity sev whose summary
// contains summary.
func findDiag(diags hcl2.Diagnostics, sev hcl2.DiagnosticSeverity, summary string) *hcl2.Diagnostic {
	for _, d := range diags {
		if d.Severity == sev && strings.Contains(d.Summary, summary) {
			return d
		}
	}
	return nil
}

func dump(diags hcl2.Diagnostics) string {
	var b strings.Builder
	for _, d := range diags {
		b.WriteString("\n  ")
		if d.Subject != nil {
			b.WriteString(d.Subject.String() + ": ")
		}
		b.WriteString(d.Summary + " -- " + d.Detail)
	}
	return b.String()
}

type diagCase struct {
	name    string
	src     string // with one marker
	summary string // substring of the summary
	detail  string // substring of the detail, optional
	opts    Options
	warning bool // the diagnostic is a warning and the file still parses
}

func runDiagCases(t *testing.T, cases []diagCase) {
	t.Helper()
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src, line, col := splitMarker(t, tc.src)
			_, diags := Parse("svc.hcl", []byte(src), tc.opts)
			sev := hcl2.DiagError
			if tc.warning {
				sev = hcl2.DiagWarning
				if diags.HasErrors() {
					t.Fatalf("want only warnings, got errors:%s", dump(diags))
				}
			} else if !diags.HasErrors() {
				t.Fatalf("want an error %q, got none:%s", tc.summary, dump(diags))
			}
			d := findDiag(diags, sev, tc.summary)
			if d == nil {
				t.Fatalf("no diagnostic with summary %q:%s", tc.summary, dump(diags))
			}
			if tc.detail != "" && !strings.Contains(d.Detail, tc.detail) {
				t.Errorf("detail %q does not contain %q", d.Detail, tc.detail)
			}
			if d.Detail == "" && !strings.Contains(tc.summary, "exactly one of data and source") {
				t.Errorf("diagnostic %q has no detail saying how to fix it", d.Summary)
			}
			if d.Subject == nil {
				t.Fatalf("diagnostic %q has no position", d.Summary)
			}
			got := d.Subject.Start
			if d.Subject.Filename != "svc.hcl" || got.Line != line || got.Column != col {
				t.Errorf("diagnostic %q at %s:%d:%d, want svc.hcl:%d:%d", d.Summary, d.Subject.Filename, got.Line, got.Column, line, col)
			}
		})
	}
}

// docker wraps service settings in a valid service "hello" with a docker task.
func docker(settings string) string {
	return "service \"hello\" {\n  image = \"nginx\"\n" + settings + "\n}\n"
}

// TestValidationRules covers every rule of (*spec.Service).Validate: the
// message comes from spec, the position from the file.
func TestValidationRules(t *testing.T) {
	runDiagCases(t, []diagCase{
		// Names.
		{name: "name not allowed", src: "service »\"Bad_Name\" {\n  image = \"nginx\"\n}\n", summary: `service name "Bad_Name" is not allowed`},
		{name: "name empty", src: "service »\"\" {\n  image = \"nginx\"\n}\n", summary: "service name is empty"},
		{name: "name too long", src: "service »\"" + strings.Repeat("a", 58) + "\" {\n  image = \"nginx\"\n}\n", summary: "is 58 characters long"},
		{name: "name like a revision", src: "service »\"hello-00001\" {\n  image = \"nginx\"\n}\n", summary: "ends like a revision name"},
		{name: "name reserved", src: "service »\"nomad-serverless-x\" {\n  image = \"nginx\"\n}\n", summary: "reserved prefix"},
		{name: "name in second service", src: docker("") + "service »\"Nope\" {\n  image = \"nginx\"\n}\n", summary: `service name "Nope"`},
		{name: "namespace", src: docker(`  namespace = »"Prod"`), summary: `namespace "Prod" is not allowed`},

		// Placement.
		{name: "datacenters empty", src: docker(`  datacenters = »[]`), summary: "datacenters is empty"},
		{name: "constraint attribute", src: docker("  »constraint {\n    operator = \"=\"\n    value = \"linux\"\n  }"), summary: "constraint has no attribute"},

		// Task.
		{name: "no task", src: "»service \"hello\" {\n  concurrency = 1\n}\n", summary: "the service has no task to run"},
		{name: "docker without image", src: "service \"hello\" {\n  task {\n    driver = \"docker\"\n    »config {\n      args = []\n    }\n  }\n}\n", summary: "the docker driver needs an image"},
		{name: "docker without config", src: "service \"hello\" {\n  task {\n    driver = »\"docker\"\n  }\n}\n", summary: "the docker driver needs an image"},
		{name: "image shorthand empty", src: docker("") + "service \"two\" {\n  image = »\"\"\n}\n", summary: "the docker driver needs an image"},
		{name: "raw_exec without command", src: "service \"hello\" {\n  task {\n    driver = \"raw_exec\"\n    »config {\n      args = [\"x\"]\n    }\n  }\n}\n", summary: "the raw_exec driver needs a command"},
		{name: "cpu", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    resources {\n      cpu = »0\n    }\n  }\n}\n", summary: "cpu is 0 MHz"},
		{name: "memory", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    resources {\n      memory = »5\n    }\n  }\n}\n", summary: "memory is 5 MiB"},
		{name: "task port", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    port = »70000\n  }\n}\n", summary: "port is 70000"},
		{name: "task protocol", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    protocol = »\"h2\"\n  }\n}\n", summary: `protocol "h2" is not one the sidecar speaks`},
		{name: "protocol in shorthand", src: docker(`  protocol = »"grpc"`), summary: `protocol "grpc" is not one the sidecar speaks`},
		{name: "kill_timeout", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    kill_timeout = »\"500ms\"\n  }\n}\n", summary: "kill_timeout is 500ms"},
		{name: "env name in map", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    env = { OK = \"1\", »\"1BAD\" = \"x\" }\n  }\n}\n", summary: `"1BAD" is not an environment variable name`},
		{name: "env reserved in block", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    env {\n      »PORT = \"80\"\n    }\n  }\n}\n", summary: "PORT is set by nomad-serverless"},
		{name: "artifact source", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    »artifact {\n      destination = \"local\"\n    }\n  }\n}\n", summary: "artifact has no source"},
		{name: "template destination", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    »template {\n      data = \"x\"\n    }\n  }\n}\n", summary: "template has no destination"},
		{name: "template data and source", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n    template {\n      data = \"x\"\n      destination = \"local/a\"\n    }\n    »template {\n      data = \"x\"\n      source = \"y\"\n      destination = \"local/b\"\n    }\n  }\n}\n", summary: "exactly one of data and source"},

		// Probes.
		{name: "probe path", src: docker("  readiness {\n    http {\n      path = »\"healthz\"\n    }\n  }"), summary: `path "healthz" does not start with '/'`},
		{name: "probe port", src: docker("  readiness {\n    tcp {}\n    port = »-1\n  }"), summary: "port is -1"},
		{name: "probe initial_delay", src: docker("  liveness {\n    tcp {}\n    initial_delay = »\"-1s\"\n  }"), summary: "initial_delay is -1s"},
		{name: "probe period", src: docker("  liveness {\n    tcp {}\n    period = »\"-1s\"\n  }"), summary: "period is -1s"},
		{name: "probe port unreachable in a published container", src: docker("  readiness {\n    tcp {}\n    port = »9090\n  }"), summary: "readiness probes port 9090, but only the app's port 8080", detail: "bridge"},
		{name: "probe timeout zero", src: docker("  readiness {\n    tcp {}\n    timeout = »\"0s\"\n  }"), summary: "timeout is 0s"},
		{name: "probe timeout over period", src: docker("  readiness {\n    tcp {}\n    period = \"1s\"\n    timeout = »\"2s\"\n  }"), summary: "timeout 2s is longer than period 1s"},
		{name: "liveness default period vs timeout", src: docker("  liveness {\n    tcp {}\n    timeout = »\"11s\"\n  }"), summary: "timeout 11s is longer than period 10s"},
		{name: "probe success_threshold", src: docker("  readiness {\n    tcp {}\n    success_threshold = »0\n  }"), summary: "success_threshold is 0"},
		{name: "probe failure_threshold", src: docker("  liveness {\n    grpc {\n      service = \"x\"\n    }\n    failure_threshold = »0\n  }"), summary: "failure_threshold is 0"},

		// Request handling.
		{name: "concurrency", src: docker(`  concurrency = »-1`), summary: "concurrency is -1"},
		{name: "timeout", src: docker(`  timeout = »"0s"`), summary: "timeout is 0s"},
		{name: "response_start_timeout", src: docker(`  response_start_timeout = »"10m"`), summary: "response_start_timeout is 10m0s"},
		{name: "idle_timeout", src: docker(`  idle_timeout = »"-1s"`), summary: "idle_timeout is -1s"},

		// Network and mesh.
		{name: "network mode", src: docker("  network {\n    mode = »\"overlay\"\n  }"), summary: `network mode "overlay" is not supported`},
		{name: "connect needs bridge", src: docker("  »connect {\n    upstream {\n      destination = \"db\"\n      local_bind_port = 5432\n    }\n  }"), summary: "connect needs bridge networking"},
		{name: "upstream destination", src: docker("  network {\n    mode = \"bridge\"\n  }\n  connect {\n    »upstream {\n      local_bind_port = 5432\n    }\n  }"), summary: "upstream has no destination"},
		{name: "upstream port", src: docker("  network {\n    mode = \"bridge\"\n  }\n  connect {\n    upstream {\n      destination = \"db\"\n      local_bind_port = »0\n    }\n  }"), summary: "local_bind_port is 0"},
		{name: "upstream port twice", src: docker("  network {\n    mode = \"bridge\"\n  }\n  connect {\n    upstream {\n      destination = \"db\"\n      local_bind_port = 8000\n    }\n    upstream {\n      destination = \"cache\"\n      local_bind_port = »8000\n    }\n  }"), summary: "local_bind_port 8000 is used twice"},

		// Catalog.
		{name: "tag empty", src: docker(`  tags = ["a", »""]`), summary: "tag is empty"},
		{name: "tag reserved", src: docker(`  tags = [»"activator"]`), summary: `tag "activator" is reserved`},
		{name: "meta key", src: docker(`  meta = { »"a b" = "x" }`), summary: `meta key "a b" is not allowed by Consul`},
		{name: "meta key with a dot", src: docker(`  meta = { ok = "1", »"a.b" = "x" }`), summary: `meta key "a.b" is not allowed by Consul`},
		{name: "meta key reserved in block", src: docker("  meta {\n    »service = \"x\"\n  }"), summary: `meta key "service" is reserved`},
		{name: "domain", src: docker(`  domains = ["ok.example.com", »"Not A Host"]`), summary: `domain "Not A Host" is not a host name`},

		// Scaling.
		{name: "min negative", src: docker("  scaling {\n    min = »-1\n  }"), summary: "min is -1"},
		{name: "max negative", src: docker("  scaling {\n    max = »-1\n  }"), summary: "max is -1"},
		{name: "min over max", src: docker("  scaling {\n    min = »5\n    max = 3\n  }"), summary: "min 5 is greater than max 3"},
		{name: "initial negative", src: docker("  scaling {\n    initial = »-1\n  }"), summary: "initial is -1"},
		{name: "initial over max", src: docker("  scaling {\n    max = 3\n    initial = »4\n  }"), summary: "initial 4 is greater than max 3"},
		{name: "metric", src: docker("  scaling {\n    metric = »\"gpu\"\n  }"), summary: `metric "gpu" is not supported`},
		{name: "cpu with min 0", src: docker("  scaling {\n    metric = \"cpu\"\n    min = »0\n  }"), summary: `min is 0, and a service scaled on cpu cannot scale to zero`},
		{name: "memory target over 100", src: docker("  scaling {\n    metric = \"memory\"\n    target = »120\n  }"), summary: `target is 120 with metric "memory"`},
		{name: "visibility", src: docker(`  visibility = »"private"`), summary: `visibility "private" is not one the gateway knows`},
		{name: "target", src: docker("  scaling {\n    target = »0\n  }"), summary: "target is 0"},
		{name: "utilization", src: docker("  scaling {\n    utilization = »101\n  }"), summary: "utilization is 101"},
		{name: "window", src: docker("  scaling {\n    window = »\"5s\"\n  }"), summary: "window is 5s"},
		{name: "panic_window_percentage", src: docker("  scaling {\n    panic_window_percentage = »0\n  }"), summary: "panic_window_percentage is 0"},
		{name: "panic_threshold_percentage", src: docker("  scaling {\n    panic_threshold_percentage = »100\n  }"), summary: "panic_threshold_percentage is 100"},
		{name: "scale_to_zero_grace", src: docker("  scaling {\n    scale_to_zero_grace = »\"-1s\"\n  }"), summary: "scale_to_zero_grace is -1s"},
		{name: "scale_down_delay", src: docker("  scaling {\n    scale_down_delay = »\"2h\"\n  }"), summary: "scale_down_delay is 2h0m0s"},
		{name: "burst_capacity", src: docker("  scaling {\n    burst_capacity = »-2\n  }"), summary: "burst_capacity is -2"},
		{name: "activation_scale", src: docker("  scaling {\n    activation_scale = »0\n  }"), summary: "activation_scale is 0"},
		{name: "activation_scale over max", src: docker("  scaling {\n    max = 2\n    activation_scale = »3\n  }"), summary: "activation_scale 3 is greater than max 2"},
		{name: "max_scale_up_rate", src: docker("  scaling {\n    max_scale_up_rate = »1\n  }"), summary: "max_scale_up_rate is 1"},
		{name: "max_scale_down_rate", src: docker("  scaling {\n    max_scale_down_rate = »0.5\n  }"), summary: "max_scale_down_rate is 0.5"},

		// Traffic.
		{name: "traffic neither", src: docker("  »traffic {\n    percent = 100\n  }"), summary: "traffic target needs exactly one of revision and latest"},
		{name: "traffic both", src: docker("  »traffic {\n    revision = \"hello-00001\"\n    latest = true\n    percent = 100\n  }"), summary: "traffic target needs exactly one of revision and latest"},
		{name: "traffic revision of another service", src: docker("  traffic {\n    revision = »\"other-00001\"\n    percent = 100\n  }"), summary: `"other-00001" is not a revision of "hello"`},
		{name: "traffic percent", src: docker("  traffic {\n    latest = true\n    percent = »101\n  }"), summary: "percent is 101"},
		{name: "traffic sum", src: docker("  »traffic {\n    revision = \"hello-00001\"\n    percent = 50\n  }\n  traffic {\n    latest = true\n    percent = 40\n  }"), summary: "traffic percentages add up to 90"},
		{name: "traffic tag", src: docker("  traffic {\n    latest = true\n    percent = 100\n    tag = »\"Bad_Tag\"\n  }"), summary: `tag "Bad_Tag" is not allowed`},
		{name: "traffic tag twice", src: docker("  traffic {\n    latest = true\n    percent = 100\n    tag = \"a\"\n  }\n  traffic {\n    revision = \"hello-00001\"\n    tag = »\"a\"\n  }"), summary: `tag "a" is also used by traffic[0]`},
		{name: "traffic neither percent nor tag", src: docker("  traffic {\n    latest = true\n    percent = 100\n  }\n  »traffic {\n    revision = \"hello-00001\"\n  }"), summary: "traffic target has neither percent nor tag"},
	})
}

// TestLanguageErrors covers what the HCL layer itself reports: syntax,
// unknown names, types, durations, variables.
func TestLanguageErrors(t *testing.T) {
	runDiagCases(t, []diagCase{
		{name: "syntax", src: "service \"hello\" {\n  image = »}\n", summary: "Invalid expression"},
		{name: "unknown attribute", src: "service \"hello\" {\n  »imagee = \"x\"\n}\n", summary: "Unsupported argument", detail: `Did you mean "image"?`},
		{name: "unknown block", src: docker("  »scalling {\n    min = 1\n  }"), summary: "Unsupported block type", detail: `Did you mean "scaling"?`},
		{name: "unknown scaling attribute", src: docker("  scaling {\n    »maxx = 3\n  }"), summary: "Unsupported argument", detail: `Did you mean "max"?`},
		{name: "unknown top-level block", src: "»servce \"hello\" {\n}\n", summary: "Unsupported block type", detail: `Did you mean "service"?`},
		{name: "block written as attribute", src: "service \"hello\" {\n  task {\n    driver = \"docker\"\n    »config = { image = \"x\" }\n  }\n}\n", summary: "Unsupported argument", detail: `block of type "config"`},
		{name: "missing driver", src: "service \"hello\" {\n  task »{\n    config {\n      image = \"x\"\n    }\n  }\n}\n", summary: "Missing required argument", detail: `"driver"`},
		{name: "task label", src: "service \"hello\" {\n  task »\"web\" {\n    driver = \"docker\"\n  }\n}\n", summary: "the service has no serving task, only named ones"},
		{name: "service without label", src: "service »{\n  image = \"x\"\n}\n", summary: "Missing name for service"},
		{name: "duplicate task", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n  }\n  »task {\n    driver = \"exec\"\n  }\n}\n", summary: "Duplicate task block", detail: "line 2"},
		{name: "duplicate scaling", src: docker("  scaling {\n    min = 1\n  }\n  »scaling {\n    max = 1\n  }"), summary: "Duplicate scaling block"},
		{name: "image and task", src: "service \"hello\" {\n  »image = \"nginx\"\n  task {\n    driver = \"docker\"\n  }\n}\n", summary: "Both image and task are set"},
		{name: "duplicate service", src: docker("") + "service »\"hello\" {\n  image = \"x\"\n}\n", summary: "Duplicate service", detail: "line 1"},
		{name: "no service", src: "»variable \"x\" {\n  default = 1\n}\n", summary: "No service in file"},

		// Durations.
		{name: "duration with space", src: docker(`  timeout = »"30 s"`), summary: "Invalid duration", detail: `timeout = "30s"`},
		{name: "duration bare number", src: docker(`  timeout = »30`), summary: "Invalid duration", detail: "bare number"},
		{name: "duration string without unit", src: docker(`  idle_timeout = »"30"`), summary: "Invalid duration", detail: "units are ns, us, ms, s, m and h"},
		{name: "duration in scaling", src: docker("  scaling {\n    window = »\"1 minute\"\n  }"), summary: "Invalid duration", detail: `window = "30s"`},
		{name: "duration in probe", src: docker("  readiness {\n    tcp {}\n    period = »\"fast\"\n  }"), summary: "Invalid duration"},
		{name: "duration list", src: docker(`  timeout = »["30s"]`), summary: "Incorrect attribute value type", detail: "duration string"},

		// Types.
		{name: "int from word", src: docker(`  concurrency = »"ten"`), summary: "Incorrect attribute value type", detail: "whole number"},
		{name: "int fractional", src: docker(`  concurrency = »1.5`), summary: "Whole number required"},
		{name: "string from list", src: docker(`  namespace = »["a"]`), summary: "Incorrect attribute value type", detail: "must be a string"},
		{name: "list from string", src: docker(`  tags = »"a,b"`), summary: "Incorrect attribute value type", detail: "list of strings"},
		{name: "list element", src: docker(`  tags = ["a", »["b"]]`), summary: "Incorrect attribute value type", detail: "element 1"},
		{name: "bool", src: docker("  traffic {\n    latest = »\"yes\"\n    percent = 100\n  }"), summary: "Incorrect attribute value type", detail: "true or false"},
		{name: "map from string", src: docker(`  meta = »"a=b"`), summary: "Incorrect attribute value type", detail: "map of strings"},
		{name: "map value", src: docker(`  meta = { »a = ["x"] }`), summary: "Incorrect attribute value type", detail: `"a"`},
		{name: "float from bool", src: docker("  scaling {\n    target = »true\n  }"), summary: "Incorrect attribute value type", detail: "a number"},
		{name: "number too large", src: docker("  scaling {\n    target = »1e400\n  }"), summary: "Number out of range"},
		{name: "config number too large", src: "service \"hello\" {\n  task {\n    driver = \"docker\"\n    config {\n      image = \"x\"\n      n = »1e400\n    }\n  }\n}\n", summary: "Unsupported config value"},
		{name: "config attribute and block", src: "service \"hello\" {\n  task {\n    driver = \"docker\"\n    config {\n      image = \"x\"\n      mount = []\n      »mount {\n        type = \"bind\"\n      }\n    }\n  }\n}\n", summary: "Attribute and block of the same name"},

		// Probes.
		{name: "probe without type", src: docker("  »readiness {\n    period = \"1s\"\n  }"), summary: "Missing probe type", detail: "http, tcp, grpc or exec"},
		{name: "probe with two types", src: docker("  readiness {\n    http {\n      path = \"/\"\n    }\n    »tcp {}\n  }"), summary: "More than one probe type", detail: "line 4"},
		{name: "exec probe without command", src: docker("  liveness {\n    exec »{\n    }\n  }"), summary: "Missing required argument", detail: `"command"`},
		{name: "probe type as attribute", src: docker("  readiness {\n    »type = \"http\"\n    http {\n      path = \"/\"\n    }\n  }"), summary: "Unsupported argument"},

		// Variables, locals, functions.
		{name: "undeclared variable", src: "variable \"image\" {\n  default = \"nginx\"\n}\nservice \"hello\" {\n  image = »var.imge\n}\n", summary: "Undeclared variable", detail: `Did you mean "image"?`},
		{name: "undeclared local", src: "locals {\n  image = \"nginx\"\n}\nservice \"hello\" {\n  image = »local.img\n}\n", summary: "Undeclared local value", detail: `Did you mean "image"?`},
		{name: "undeclared variable in local", src: "locals {\n  image = »var.nope\n}\nservice \"hello\" {\n  image = local.image\n}\n", summary: "Undeclared variable"},
		{name: "unknown root", src: docker(`  namespace = »vars.ns`), summary: "Unknown variable", detail: `"var"`},
		{name: "circular locals", src: "locals {\n  »a = local.b\n  b = local.a\n}\nservice \"hello\" {\n  image = local.a\n}\n", summary: "Circular reference between locals"},
		{name: "duplicate local", src: "locals {\n  a = 1\n}\nlocals {\n  »a = 2\n}\nservice \"hello\" {\n  image = \"x\"\n}\n", summary: "Duplicate local value"},
		{name: "missing variable value", src: "»variable \"image\" {\n  type = string\n}\nservice \"hello\" {\n  image = var.image\n}\n", summary: "No value for required variable", detail: "NOMAD_SERVERLESS_VAR_image"},
		{name: "duplicate variable", src: "variable \"a\" {\n  default = 1\n}\nvariable »\"a\" {\n  default = 2\n}\n" + docker(""), summary: "Duplicate variable"},
		{name: "default of wrong type", src: "variable \"n\" {\n  type = number\n  default = »\"many\"\n}\n" + docker(""), summary: "Invalid default value for variable"},
		{name: "bad type expression", src: "variable \"n\" {\n  type = »strng\n}\n" + docker(""), summary: "Invalid type specification"},
		{name: "unknown variable attribute", src: "variable \"n\" {\n  »defualt = 1\n}\n" + docker(""), summary: "Unsupported argument", detail: `Did you mean "default"?`},
		{name: "-var of wrong type", src: "»variable \"n\" {\n  type = number\n  default = 1\n}\n" + docker("  concurrency = var.n"), summary: "Invalid value for variable", detail: "-var n", opts: Options{Vars: map[string]string{"n": "many"}}},
		{name: "-var list syntax", src: "»variable \"dcs\" {\n  type = list(string)\n}\n" + docker("  datacenters = var.dcs"), summary: "Invalid value for variable", detail: `["a", "b"]`, opts: Options{Vars: map[string]string{"dcs": "[dc1"}}},
		{name: "env var of wrong type", src: "»variable \"n\" {\n  type = bool\n  default = true\n}\n" + docker(""), summary: "Invalid value for variable", detail: "NOMAD_SERVERLESS_VAR_n",
			opts: Options{Getenv: func(k string) string {
				if k == "NOMAD_SERVERLESS_VAR_n" {
					return "perhaps"
				}
				return ""
			}}},
		{name: "env function", src: docker(`  namespace = »env("NS")`), summary: "Call to unknown function", detail: "NOMAD_SERVERLESS_VAR_"},
		{name: "function error", src: docker(`  namespace = lower(1, »2)`), summary: "Too many function arguments"},
		{name: "template of an object", src: docker(`  namespace = "x-${»{a = 1}}"`), summary: "Invalid template interpolation value"},
	})
}

// TestProblemsFallback checks the positions of problems whose path the file
// does not set: they point at the nearest block it writes.
func TestProblemsFallback(t *testing.T) {
	src := "service \"hello\" {\n  image = \"nginx\"\n  scaling {\n    min = 1\n  }\n  traffic {\n    latest = true\n    percent = 100\n  }\n}\n"
	f, diags := Parse("svc.hcl", []byte(src), Options{})
	if diags.HasErrors() {
		t.Fatalf("unexpected errors:%s", dump(diags))
	}
	cases := []struct {
		path      string
		line, col int
	}{
		{"scaling.min", 4, 11},
		{"scaling.window", 3, 3},          // not set: the scaling block
		{"traffic[0].revision", 6, 3},     // not set: the traffic block
		{"traffic[5].percent", 6, 3},      // no such block: the first traffic block
		{"readiness.path", 1, 1},          // no readiness block: the service header
		{"task", 2, 3},                    // the image shorthand
		{"task.config", 2, 11},            // the image shorthand's value
		{"name", 1, 9},                    // the label
		{"meta.anything.with.dots", 1, 1}, // nothing: the service header
		{"", 1, 1},                        // the service itself
		{"task.resources.cpu", 2, 3},      // the image shorthand is the task
		{"traffic", 6, 3},                 // the first traffic block
		{"connect.upstream[0].destination", 1, 1},
	}
	for _, tc := range cases {
		ds := f.Problems(0, []spec.Problem{{Path: tc.path, Summary: "x is wrong.", Detail: "Fix x."}})
		if len(ds) != 1 || ds[0].Subject == nil {
			t.Fatalf("%s: want one located diagnostic, got %v", tc.path, ds)
		}
		got := ds[0].Subject.Start
		if got.Line != tc.line || got.Column != tc.col || ds[0].Subject.Filename != "svc.hcl" {
			t.Errorf("%s: at %d:%d, want %d:%d", tc.path, got.Line, got.Column, tc.line, tc.col)
		}
		if ds[0].Summary != "x is wrong" || ds[0].Detail != "Fix x." || ds[0].Severity != hcl2.DiagError {
			t.Errorf("%s: diagnostic %+v", tc.path, ds[0])
		}
	}
	// Out of range service index: still a diagnostic, without position.
	if ds := f.Problems(3, []spec.Problem{{Path: "name", Summary: "s."}}); len(ds) != 1 || ds[0].Subject != nil {
		t.Errorf("Problems(3, ...) = %v", ds)
	}
	var nilFile *File
	if ds := nilFile.Problems(0, []spec.Problem{{Path: "name", Summary: "s."}}); len(ds) != 1 {
		t.Errorf("nil File Problems = %v", ds)
	}
}
