package nomadjob

import (
	"testing"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// A raw_exec queue-proxy writes its own log, and Nomad collects none of
// it; docker and exec sidecars cannot (Nomad 2.0 mounts the logs directory
// read-only into them), so Nomad keeps collecting theirs.
func TestSidecarWritesItsOwnLogOnlyUnderRawExec(t *testing.T) {
	svc := spec.NewService("hello")
	svc.Template.Task.Driver = "raw_exec"
	svc.Template.Task.Config = map[string]any{"command": "/bin/app"}
	rev := spec.NewRevision(&svc, 1)
	for _, c := range []struct {
		name    string
		sidecar SidecarOptions
		ownLog  bool
	}{
		{"command (raw_exec)", SidecarOptions{Command: "/usr/local/bin/nomad-serverless"}, true},
		{"artifact with raw_exec", SidecarOptions{ArtifactURL: "https://example.com/ns.tgz", ArtifactDriver: "raw_exec"}, true},
		{"artifact with exec", SidecarOptions{ArtifactURL: "https://example.com/ns.tgz"}, false},
		{"image (docker)", SidecarOptions{Image: "nomad-serverless:1"}, false},
	} {
		job, err := Compile(rev, Options{Sidecar: c.sidecar})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		var found bool
		for _, task := range job.TaskGroups[0].Tasks {
			if task.Name != spec.SidecarTaskName {
				continue
			}
			found = true
			disabled := task.LogConfig != nil && task.LogConfig.Disabled != nil && *task.LogConfig.Disabled
			file, hasFile := task.Env[spec.EnvSidecarLogFile]
			if disabled != c.ownLog || hasFile != c.ownLog {
				t.Errorf("%s (driver %s): logs disabled %v, %s %q; want both %v", c.name, task.Driver, disabled, spec.EnvSidecarLogFile, file, c.ownLog)
			}
			if c.ownLog && file != "${NOMAD_ALLOC_DIR}/logs/queue-proxy.stderr" {
				t.Errorf("%s: log file %q", c.name, file)
			}
		}
		if !found {
			t.Fatalf("%s: no queue-proxy task", c.name)
		}
	}
}
