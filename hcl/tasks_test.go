package hcl

import (
	"reflect"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A service of three apps from a Nomad shop: a migration before the app, a
// helper beside it, clean-up after it, a host volume and a scratch disk.
const realAppSrc = `
service "api" {
  task {
    driver = "raw_exec"
    config { command = "/bin/api" }
    volume_mount {
      volume      = "data"
      destination = "/srv/data"
      read_only   = true
    }
  }
  task "migrate" {
    driver = "raw_exec"
    config {
      command = "/bin/migrate"
      args    = ["up"]
    }
    lifecycle { hook = "prestart" }
    resources {
      cpu    = 50
      memory = 64
    }
  }
  task "vault-agent" {
    driver = "docker"
    config { image = "hashicorp/vault:1.15" }
    env = { VAULT_ADDR = "https://vault:8200" }
    lifecycle {
      hook    = "prestart"
      sidecar = true
    }
    template {
      data        = "token"
      destination = "secrets/token"
    }
  }
  task "ship-logs" {
    driver       = "docker"
    config { image = "fluent/fluent-bit:3" }
    kill_timeout = "10s"
    lifecycle {
      hook    = "poststart"
      sidecar = true
    }
  }
  task "cleanup" {
    driver = "raw_exec"
    config { command = "/bin/cleanup" }
    lifecycle { hook = "poststop" }
  }
  volume "data" {
    type      = "host"
    source    = "api-data"
    read_only = true
  }
  volume "db" {
    type            = "csi"
    source          = "db"
    access_mode     = "single-node-writer"
    attachment_mode = "file-system"
    per_alloc       = true
  }
  ephemeral_disk {
    size    = 500
    sticky  = true
    migrate = true
  }
}
`

func TestParseSideTasksVolumesDisk(t *testing.T) {
	f, diags := Parse("api.hcl", []byte(realAppSrc), Options{})
	if diags.HasErrors() {
		t.Fatalf("parse:%s", dump(diags))
	}
	tm := f.Services[0].Template
	if tm.Task.Driver != "raw_exec" || tm.Task.Port != spec.DefaultAppPort {
		t.Errorf("serving task: %+v", tm.Task)
	}
	if want := []spec.VolumeMount{{Volume: "data", Destination: "/srv/data", ReadOnly: true}}; !reflect.DeepEqual(tm.Task.VolumeMounts, want) {
		t.Errorf("serving mounts %+v, want %+v", tm.Task.VolumeMounts, want)
	}
	want := []spec.SideTask{
		{Name: "migrate", Driver: "raw_exec", Config: map[string]any{"command": "/bin/migrate", "args": []any{"up"}},
			Resources: spec.Resources{CPU: 50, MemoryMB: 64}, KillTimeout: spec.DefaultSideKillTimeout,
			Lifecycle: &spec.Lifecycle{Hook: spec.HookPrestart}},
		{Name: "vault-agent", Driver: "docker", Config: map[string]any{"image": "hashicorp/vault:1.15"},
			Env:       map[string]string{"VAULT_ADDR": "https://vault:8200"},
			Resources: spec.Resources{CPU: spec.DefaultCPU, MemoryMB: spec.DefaultMemoryMB}, KillTimeout: spec.DefaultSideKillTimeout,
			Templates: []spec.TaskTemplate{{Data: "token", Destination: "secrets/token"}},
			Lifecycle: &spec.Lifecycle{Hook: spec.HookPrestart, Sidecar: true}},
		{Name: "ship-logs", Driver: "docker", Config: map[string]any{"image": "fluent/fluent-bit:3"},
			Resources: spec.Resources{CPU: spec.DefaultCPU, MemoryMB: spec.DefaultMemoryMB}, KillTimeout: 10 * time.Second,
			Lifecycle: &spec.Lifecycle{Hook: spec.HookPoststart, Sidecar: true}},
		{Name: "cleanup", Driver: "raw_exec", Config: map[string]any{"command": "/bin/cleanup"},
			Resources: spec.Resources{CPU: spec.DefaultCPU, MemoryMB: spec.DefaultMemoryMB}, KillTimeout: spec.DefaultSideKillTimeout,
			Lifecycle: &spec.Lifecycle{Hook: spec.HookPoststop}},
	}
	if !reflect.DeepEqual(tm.SideTasks, want) {
		t.Errorf("side tasks\n got %+v\nwant %+v", tm.SideTasks, want)
	}
	if !tm.SideTasks[0].InitStep() || tm.SideTasks[1].InitStep() {
		t.Error("only the prestart task that is not a sidecar is an init step")
	}
	wantVols := []spec.Volume{
		{Name: "data", Type: "host", Source: "api-data", ReadOnly: true},
		{Name: "db", Type: "csi", Source: "db", AccessMode: spec.AccessSingleNodeWriter, AttachmentMode: spec.AttachFileSystem, PerAlloc: true},
	}
	if !reflect.DeepEqual(tm.Volumes, wantVols) {
		t.Errorf("volumes\n got %+v\nwant %+v", tm.Volumes, wantVols)
	}
	if want := (&spec.EphemeralDisk{SizeMB: 500, Sticky: true, Migrate: true}); !reflect.DeepEqual(tm.EphemeralDisk, want) {
		t.Errorf("ephemeral disk %+v, want %+v", tm.EphemeralDisk, want)
	}
}

// The image shorthand keeps working beside named tasks, and takes a
// volume_mount of its own.
func TestImageShorthandWithSideTasks(t *testing.T) {
	src := `
service "web" {
  image = "nginx:1.27"
  port  = 80
  volume_mount {
    volume      = "www"
    destination = "/usr/share/nginx/html"
  }
  task "fetch" {
    driver = "docker"
    config { image = "busybox" }
    lifecycle { hook = "prestart" }
    volume_mount {
      volume      = "www"
      destination = "/out"
    }
  }
  volume "www" {
    type   = "host"
    source = "www"
  }
}
`
	f, diags := Parse("web.hcl", []byte(src), Options{})
	if diags.HasErrors() {
		t.Fatalf("parse:%s", dump(diags))
	}
	tm := f.Services[0].Template
	if tm.Task.Driver != "docker" || tm.Task.Port != 80 || len(tm.Task.VolumeMounts) != 1 || tm.Task.VolumeMounts[0].Destination != "/usr/share/nginx/html" {
		t.Errorf("serving task %+v", tm.Task)
	}
	if len(tm.SideTasks) != 1 || tm.SideTasks[0].VolumeMounts[0].Destination != "/out" {
		t.Errorf("side tasks %+v", tm.SideTasks)
	}
}

// Templates written before side tasks, volumes and disks existed keep their
// identity: a deploy after an upgrade makes no new revision. The hashes are
// those the parser of commit de3761c~1 gave the same files.
func TestNewFieldsKeepOldHashes(t *testing.T) {
	for _, tc := range []struct{ src, hash string }{
		{"service \"a\" {\n  image = \"nginx\"\n}\n", "sha256:51f6353fe509d436c1baa3940c3fedc6deb8096965fa900d3f97b8b556bbf24f"},
		{"service \"b\" {\n  task {\n    driver = \"raw_exec\"\n    config { command = \"/bin/app\" }\n    env = { A = \"1\" }\n  }\n  readiness {\n    http { path = \"/ready\" }\n  }\n}\n",
			"sha256:44c81109dc1c6c768274e4ed1713cf61fbc4f44d1efa923f819307e2020d9612"},
	} {
		f, diags := Parse("a.hcl", []byte(tc.src), Options{})
		if diags.HasErrors() {
			t.Fatalf("parse:%s", dump(diags))
		}
		if h := f.Services[0].Template.Hash(); h != tc.hash {
			t.Errorf("%s: hash %s, want %s as before", f.Services[0].Name, h, tc.hash)
		}
	}
}

func TestSideTaskDiagnostics(t *testing.T) {
	raw := func(body string) string {
		return "service \"api\" {\n  task {\n    driver = \"raw_exec\"\n    config { command = \"/bin/api\" }\n    port = 8080\n  }\n" + body + "\n}\n"
	}
	runDiagCases(t, []diagCase{
		{name: "two tasks with port", src: raw("  task \"db\" {\n    driver = \"raw_exec\"\n    config { command = \"x\" }\n    »port = 5432\n  }"),
			summary: "Two tasks with port", detail: "Exactly one task serves traffic"},
		{name: "serving task with lifecycle", src: "service \"api\" {\n  task {\n    driver = \"raw_exec\"\n    config { command = \"/bin/api\" }\n    »lifecycle { hook = \"prestart\" }\n  }\n}\n",
			summary: "The serving task has a lifecycle", detail: "named task"},
		{name: "volume_mount of an undeclared volume", src: raw("  task \"m\" {\n    driver = \"raw_exec\"\n    config { command = \"x\" }\n    volume_mount {\n      volume = »\"nope\"\n      destination = \"/d\"\n    }\n  }"),
			summary: `volume_mount of undeclared volume "nope"`, detail: `volume "nope"`},
		{name: "serving task mounts an undeclared volume", src: "service \"api\" {\n  image = \"nginx\"\n  volume_mount {\n    volume = »\"data\"\n    destination = \"/d\"\n  }\n}\n",
			summary: `volume_mount of undeclared volume "data"`},
		{name: "csi single writer that scales", src: raw("  volume \"db\" {\n    type = \"csi\"\n    source = \"db\"\n    access_mode = »\"single-node-writer\"\n    attachment_mode = \"file-system\"\n  }\n  scaling { max = 3 }"),
			summary: `CSI volume "db" is single-node-writer, and the service's scaling max is 3`, detail: "per_alloc = true"},
		{name: "csi single writer unbounded", src: raw("  volume \"db\" {\n    type = \"csi\"\n    source = \"db\"\n    access_mode = »\"single-node-writer\"\n    attachment_mode = \"file-system\"\n  }"),
			summary: "max is unbounded"},
		{name: "bad hook", src: raw("  task \"m\" {\n    driver = \"raw_exec\"\n    config { command = \"x\" }\n    lifecycle { hook = »\"before\" }\n  }"),
			summary: `lifecycle hook "before" is not one Nomad knows`},
		{name: "poststop sidecar", src: raw("  task \"m\" {\n    driver = \"raw_exec\"\n    config { command = \"x\" }\n    lifecycle {\n      hook = \"poststop\"\n      sidecar = »true\n    }\n  }"),
			summary: "poststop sidecar"},
		{name: "reserved task name", src: raw("  task »\"queue-proxy\" {\n    driver = \"raw_exec\"\n    config { command = \"x\" }\n  }"),
			summary: `task name "queue-proxy" is taken`},
		{name: "duplicate task", src: raw("  task \"m\" {\n    driver = \"raw_exec\"\n    config { command = \"x\" }\n  }\n  task »\"m\" {\n    driver = \"raw_exec\"\n    config { command = \"y\" }\n  }"),
			summary: "Duplicate task"},
		{name: "side task without command", src: raw("  task \"m\" {\n    driver = »\"raw_exec\"\n  }"),
			summary: "the raw_exec driver needs a command"},
		{name: "side task memory", src: raw("  task \"m\" {\n    driver = \"raw_exec\"\n    config { command = \"x\" }\n    resources { memory = »5 }\n  }"),
			summary: "memory is 5 MiB"},
		{name: "host volume per_alloc", src: raw("  volume \"d\" {\n    type = \"host\"\n    source = \"d\"\n    per_alloc = »true\n  }"),
			summary: "per_alloc is set on a host volume"},
		{name: "volume type", src: raw("  volume \"d\" {\n    type = »\"nfs\"\n    source = \"d\"\n  }"),
			summary: `volume type "nfs" is not one Nomad knows`},
		{name: "ephemeral disk", src: raw("  ephemeral_disk { size = »5 }"), summary: "ephemeral_disk size is 5 MB"},
	})
}
