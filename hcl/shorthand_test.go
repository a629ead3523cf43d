package hcl

import (
	"reflect"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// TestImageShorthand: beside image, a service takes the task settings a
// docker user sets first, and means the same as the long form.
func TestImageShorthand(t *testing.T) {
	short := mustParse(t, `service "web" {
  image = "ghcr.io/acme/web:1"
  port  = 3000
  args  = ["--listen", "0.0.0.0"]
  env = {
    GREETING = "hi"
  }
  resources {
    cpu    = 200
    memory = 256
  }
  readiness {
    http {
      path = "/healthz"
      port = 3000
    }
  }
}
`, Options{}).Services[0]
	long := mustParse(t, `service "web" {
  task {
    driver = "docker"
    config {
      image = "ghcr.io/acme/web:1"
      args  = ["--listen", "0.0.0.0"]
    }
    port = 3000
    env {
      GREETING = "hi"
    }
    resources {
      cpu    = 200
      memory = 256
    }
  }
  readiness {
    http {
      path = "/healthz"
    }
    port = 3000
  }
}
`, Options{}).Services[0]
	if !reflect.DeepEqual(short, long) {
		t.Errorf("shorthand\n%+v\nlong form\n%+v", short, long)
	}
	if short.Template.Hash() != long.Template.Hash() {
		t.Error("the shorthand and the long form are different revisions")
	}
	if short.Template.Task.Port != 3000 || short.Template.Readiness.Port != 3000 {
		t.Errorf("ports %d %d", short.Template.Task.Port, short.Template.Readiness.Port)
	}

	// The example, on lines.
	s := mustParse(t, "service \"web\" {\n  image = \"nginx\"\n  port = 8080\n}\n", Options{}).Services[0]
	if s.Template.Task.Port != 8080 || s.Template.Task.Driver != "docker" {
		t.Errorf("task %+v", s.Template.Task)
	}
	// protocol goes beside port; "http1" is the default and no protocol.
	s = mustParse(t, "service \"grpc\" {\n  image = \"acme/grpc\"\n  port = 50051\n  protocol = \"h2c\"\n}\n", Options{}).Services[0]
	if s.Template.Task.Protocol != spec.ProtocolH2C {
		t.Errorf("protocol %q, want h2c", s.Template.Task.Protocol)
	}
	plain := mustParse(t, "service \"web\" {\n  image = \"nginx\"\n  port = 8080\n}\n", Options{}).Services[0]
	http1 := mustParse(t, "service \"web\" {\n  image = \"nginx\"\n  port = 8080\n  protocol = \"http1\"\n}\n", Options{}).Services[0]
	if plain.Template.Hash() != http1.Template.Hash() {
		t.Error("writing the default protocol made another revision")
	}
	// env may be a block too, and probe ports sit in tcp and grpc blocks.
	s = mustParse(t, "service \"web\" {\n  image = \"nginx\"\n  port = 80\n  env {\n    A = \"1\"\n  }\n  liveness {\n    tcp {\n      port = 80\n    }\n  }\n}\n", Options{}).Services[0]
	if s.Template.Task.Env["A"] != "1" || s.Template.Liveness.Port != 80 || s.Template.Liveness.Type != spec.ProbeTCP {
		t.Errorf("template %+v", s.Template)
	}
}

// TestImageShorthandErrors: a task setting outside a task block says where
// it goes.
func TestImageShorthandErrors(t *testing.T) {
	runDiagCases(t, []diagCase{
		{name: "port beside a task block", src: "service \"hello\" {\n  »port = 8080\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n  }\n}\n",
			summary: "Task setting outside the task block", detail: "task block on line 3: move it there, as in task { port = 8080 }"},
		{name: "resources beside a task block", src: "service \"hello\" {\n  task {\n    driver = \"exec\"\n    config {\n      command = \"/bin/app\"\n    }\n  }\n  »resources {\n    cpu = 10\n  }\n}\n",
			summary: "Task setting outside the task block", detail: "resources { cpu = 100"},
		{name: "port without image", src: "service \"hello\" {\n  »port = 8080\n}\n", summary: "Task setting without image", detail: "Add image, or write a task block: task { port = 8080 }"},
		{name: "env without image", src: "service \"hello\" {\n  »env = { A = \"1\" }\n  concurrency = 1\n}\n", summary: "Task setting without image", detail: "task { env"},
		{name: "shorthand port validated", src: docker("  port = »70000"), summary: "port is 70000"},
		{name: "shorthand cpu validated", src: docker("  resources {\n    cpu = »0\n  }"), summary: "cpu is 0 MHz"},
		{name: "shorthand env validated", src: docker("  env = { »PORT = \"1\" }"), summary: "PORT is set by nomad-serverless"},
		{name: "shorthand args type", src: docker("  args = »\"--x\""), summary: "Incorrect attribute value type", detail: "list of strings"},
		{name: "probe port twice", src: docker("  readiness {\n    http {\n      path = \"/\"\n      »port = 8080\n    }\n    port = 8080\n  }"), summary: "Probe port set twice", detail: "keep one"},
		{name: "probe port in block validated", src: docker("  readiness {\n    tcp {\n      port = »-1\n    }\n  }"), summary: "port is -1"},
	})
}
