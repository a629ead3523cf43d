package spec

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"
)

// baseService is a valid service with something in every template field, so
// a change to any of them shows in the hash.
func baseService() Service {
	s := NewService("hello")
	t := &s.Template
	t.Region = "eu"
	t.Datacenters = []string{"dc1", "dc2"}
	t.Constraints = []Constraint{{Attribute: "${attr.kernel.name}", Operator: "=", Value: "linux"}}
	t.Task.Driver = "docker"
	t.Task.Config = map[string]any{
		"image": "nginx:1.27",
		"args":  []any{"-g", "daemon off;"},
		"mount": []any{map[string]any{"type": "bind", "source": "a", "target": "b"}},
	}
	t.Task.Env = map[string]string{"A": "1", "B": "2", "C": "3"}
	p := DefaultProbe(ProbeHTTP)
	p.Path = "/healthz"
	t.Readiness = &p
	t.Concurrency = 10
	t.Tags = []string{"x", "y"}
	t.Meta = map[string]string{"team": "a", "tier": "web"}
	return s
}

func TestHashStable(t *testing.T) {
	s := baseService()
	h := s.Template.Hash()
	if !regexp.MustCompile(`^sha256:[0-9a-f]{64}$`).MatchString(h) {
		t.Fatalf("hash %q is not sha256:<64 hex>", h)
	}
	for i := 0; i < 50; i++ {
		again := baseService()
		if got := again.Template.Hash(); got != h {
			t.Fatalf("hash changed between equal templates: %s then %s", h, got)
		}
	}
}

// A template that speaks HTTP/1.1 hashes as it did before Task.Protocol
// existed: redeploying an unchanged file after an upgrade makes no new
// revision.
func TestHashOfHTTP1TemplateHasNoProtocol(t *testing.T) {
	s := baseService()
	b, err := json.Marshal(s.Template)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(b), `"protocol"`) {
		t.Fatalf("an HTTP/1.1 template's canonical form names a protocol: %s", b)
	}
}

// Maps built in a different insertion order (and Go's random map iteration)
// hash the same.
func TestHashIgnoresMapOrder(t *testing.T) {
	build := func(keys []string) Template {
		tp := baseService().Template
		tp.Task.Env = map[string]string{}
		tp.Meta = map[string]string{}
		cfg := map[string]any{}
		nested := map[string]any{}
		for _, k := range keys {
			tp.Task.Env[k] = "v" + k
			tp.Meta[k] = "m" + k
			cfg[k] = k
			nested[k] = []any{k, int64(len(k))}
		}
		cfg["nested"] = nested
		tp.Task.Config = cfg
		return tp
	}
	var keys, reversed []string
	for i := 0; i < 40; i++ {
		keys = append(keys, fmt.Sprintf("K%02d", i))
	}
	for i := len(keys) - 1; i >= 0; i-- {
		reversed = append(reversed, keys[i])
	}
	a, b := build(keys).Hash(), build(reversed).Hash()
	if a != b {
		t.Errorf("insertion order changed the hash: %s vs %s", a, b)
	}
}

func TestHashFollowsTemplate(t *testing.T) {
	changes := map[string]func(s *Service){
		"image":         func(s *Service) { s.Template.Task.Config["image"] = "nginx:1.28" },
		"config nested": func(s *Service) { s.Template.Task.Config["mount"].([]any)[0].(map[string]any)["target"] = "c" },
		"driver":        func(s *Service) { s.Template.Task.Driver = "podman" },
		"env value":     func(s *Service) { s.Template.Task.Env["A"] = "9" },
		"env added":     func(s *Service) { s.Template.Task.Env["D"] = "" },
		"cpu":           func(s *Service) { s.Template.Task.Resources.CPU++ },
		"memory":        func(s *Service) { s.Template.Task.Resources.MemoryMB++ },
		"port":          func(s *Service) { s.Template.Task.Port = 9000 },
		"protocol":      func(s *Service) { s.Template.Task.Protocol = ProtocolH2C },
		"kill timeout":  func(s *Service) { s.Template.Task.KillTimeout = time.Minute },
		"user":          func(s *Service) { s.Template.Task.User = "nobody" },
		"artifact":      func(s *Service) { s.Template.Task.Artifacts = []Artifact{{Source: "x"}} },
		"readiness":     func(s *Service) { s.Template.Readiness.Period = time.Second },
		"no readiness":  func(s *Service) { s.Template.Readiness = nil },
		"liveness":      func(s *Service) { p := DefaultProbe(ProbeTCP); s.Template.Liveness = &p },
		"concurrency":   func(s *Service) { s.Template.Concurrency = 11 },
		"timeout":       func(s *Service) { s.Template.Timeout = time.Minute },
		"resp timeout":  func(s *Service) { s.Template.ResponseStartTimeout = time.Second },
		"idle timeout":  func(s *Service) { s.Template.IdleTimeout = time.Second },
		"network":       func(s *Service) { s.Template.Network.Mode = NetworkBridge },
		"connect":       func(s *Service) { s.Template.Connect = &Connect{} },
		"tags":          func(s *Service) { s.Template.Tags = []string{"y", "x"} },
		"meta":          func(s *Service) { s.Template.Meta["tier"] = "db" },
		"datacenters":   func(s *Service) { s.Template.Datacenters = []string{"dc1"} },
		"region":        func(s *Service) { s.Template.Region = "us" },
		"node pool":     func(s *Service) { s.Template.NodePool = "gpu" },
		"constraint":    func(s *Service) { s.Template.Constraints[0].Value = "darwin" },
	}
	base := baseService()
	seen := map[string]string{base.Template.Hash(): "base"}
	for name, change := range changes {
		s := baseService()
		change(&s)
		h := s.Template.Hash()
		if prev, dup := seen[h]; dup {
			t.Errorf("%s: hash equals that of %s", name, prev)
		}
		seen[h] = name
	}
}

// Scaling, traffic, domains and namespace live outside the template: they
// change in place and never make a new revision.
func TestHashIgnoresScalingTrafficAndVisibility(t *testing.T) {
	base := baseService()
	want := NewRevision(&base, 1).SpecHash
	changes := map[string]func(s *Service){
		"scaling": func(s *Service) {
			s.Scaling.Min, s.Scaling.Max, s.Scaling.Target, s.Scaling.Window = 2, 9, 7, time.Minute*5
		},
		"traffic": func(s *Service) {
			s.Traffic = []TrafficTarget{{Revision: "hello-00001", Percent: 50}, {Latest: true, Percent: 50, Tag: "next"}}
		},
		"domains":   func(s *Service) { s.Domains = []string{"example.com"} },
		"namespace": func(s *Service) { s.Namespace = "other" },
		// Visibility only changes the route: never a new revision.
		"visibility internal": func(s *Service) { s.Visibility = VisibilityInternal },
		"visibility unset":    func(s *Service) { s.Visibility = "" },
	}
	for name, change := range changes {
		s := baseService()
		change(&s)
		r := NewRevision(&s, 7)
		if r.SpecHash != want {
			t.Errorf("%s changed the spec hash", name)
		}
		if r.Name() != "hello-00007" || r.Scaling != s.Scaling {
			t.Errorf("%s: revision %s scaling %+v", name, r.Name(), r.Scaling)
		}
	}
}

func TestRevisionName(t *testing.T) {
	for _, tc := range []struct {
		service string
		gen     int
		want    string
	}{
		{"hello", 1, "hello-00001"},
		{"hello", 42, "hello-00042"},
		{"my-app-2", 12345, "my-app-2-12345"},
		{"a", MaxGeneration, "a-99999"},
	} {
		name := RevisionName(tc.service, tc.gen)
		if name != tc.want {
			t.Errorf("RevisionName(%q, %d) = %q, want %q", tc.service, tc.gen, name, tc.want)
		}
		svc, gen, ok := ParseRevisionName(name)
		if !ok || svc != tc.service || gen != tc.gen {
			t.Errorf("ParseRevisionName(%q) = %q, %d, %v", name, svc, gen, ok)
		}
		if r := (Revision{Service: tc.service, Generation: tc.gen}); r.Name() != tc.want {
			t.Errorf("Revision.Name() = %q", r.Name())
		}
	}
}

func TestParseRevisionNameRejects(t *testing.T) {
	for _, name := range []string{
		"",
		"hello",
		"hello-",
		"hello-1",
		"hello-0001",
		"hello-000001",
		"hello-00000", // generations start at 1
		"hello-abcde",
		"hello-0001a",
		"-00001", // no service
		"hello_00001",
		"hello-0-001",
		"hello-+0001", // strconv.Atoi would take the sign
		"hello- 0001",
	} {
		if svc, gen, ok := ParseRevisionName(name); ok {
			t.Errorf("ParseRevisionName(%q) = %q, %d, true; want not a revision name", name, svc, gen)
		}
	}
}

// A valid service name never parses as a revision name, so the two cannot
// collide in Consul.
func TestServiceNamesAreNotRevisionNames(t *testing.T) {
	for _, name := range []string{"hello", "a-1", "api-v2", "x-0001", "x-000001"} {
		if ValidateName(name) != nil {
			t.Fatalf("%q should be a valid name", name)
		}
		if _, _, ok := ParseRevisionName(name); ok {
			t.Errorf("valid service name %q parses as a revision name", name)
		}
	}
	if ValidateName("hello-00001") == nil {
		t.Error("a revision-like service name is accepted")
	}
}
