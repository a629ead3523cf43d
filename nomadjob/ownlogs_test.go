package nomadjob

import (
	"slices"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Which tasks start through run-task, with Nomad's log collection off, and
// which keep Nomad's: only raw_exec tasks, beside a queue-proxy run from a
// path on the node, that have not turned their logs off themselves.
func TestWriteOwnLogsOnlyWhereOurBinaryIsOnTheNode(t *testing.T) {
	withInit := func(driver string) spec.Service {
		s := rawExecBinary()
		s.Template.SideTasks = []spec.SideTask{{
			Name: "migrate", Driver: driver, Config: map[string]any{"command": "local/migrate"},
			Lifecycle: &spec.Lifecycle{Hook: "prestart"},
		}}
		return s
	}
	docker := dockerWebApp()
	for _, c := range []struct {
		name string
		svc  spec.Service
		opts Options
		// wrapped are the tasks that run through run-task.
		wrapped []string
	}{
		{"raw_exec app and init step, raw_exec proxy", withInit("raw_exec"), testOptions(), []string{spec.UserTaskName, "migrate"}},
		{"an exec init step keeps Nomad's logs (a chroot without our binary)", withInit("exec"), testOptions(), []string{spec.UserTaskName}},
		{"docker app", docker, testOptions(), nil},
		{"proxy from an image: no path to our binary on the node", withInit("raw_exec"), Options{Sidecar: SidecarOptions{Image: "nomad-serverless:1"}}, nil},
		{"proxy as an artifact", withInit("raw_exec"), Options{Sidecar: SidecarOptions{ArtifactURL: "https://example.com/ns.tar.gz", ArtifactDriver: "raw_exec"}}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			job, err := Compile(spec.NewRevision(&c.svc, 1), c.opts)
			if err != nil {
				t.Fatal(err)
			}
			var wrapped []string
			for _, task := range job.TaskGroups[0].Tasks {
				own := task.LogConfig != nil && task.LogConfig.Disabled != nil && *task.LogConfig.Disabled
				args, _ := task.Config["args"].([]string)
				runTask := len(args) > 0 && args[0] == RunTaskArg
				if task.Name == spec.SidecarTaskName {
					if runTask {
						t.Errorf("the queue-proxy runs through run-task: %v", args)
					}
					continue
				}
				if own != runTask {
					t.Errorf("task %s: logs disabled %v but through run-task %v: its output would be lost", task.Name, own, runTask)
				}
				if runTask {
					wrapped = append(wrapped, task.Name)
				}
			}
			if !slices.Equal(wrapped, c.wrapped) {
				t.Errorf("through run-task: %v, want %v", wrapped, c.wrapped)
			}
		})
	}
}

func TestWriteOwnLogsKeepsTheCommandAndItsArgs(t *testing.T) {
	o := testOptions()
	task := &api.Task{Driver: "raw_exec", Config: map[string]any{
		"command": "/opt/report/bin/report", "args": []any{"serve", "--port", "${NOMAD_PORT_app}"}, "oom_score_adj": 100,
	}}
	writeOwnLogs(task, o)
	if task.Config["command"] != o.Sidecar.Command {
		t.Errorf("command %v, want the queue-proxy's binary %s", task.Config["command"], o.Sidecar.Command)
	}
	want := []string{RunTaskArg, "--", "/opt/report/bin/report", "serve", "--port", "${NOMAD_PORT_app}"}
	if got, _ := task.Config["args"].([]string); !slices.Equal(got, want) {
		t.Errorf("args %q, want %q", got, want)
	}
	if task.Config["oom_score_adj"] != 100 {
		t.Errorf("the rest of the driver config is lost: %v", task.Config)
	}

	// A task that turned its logs off, or whose config is not a plain
	// command, is left as written.
	off := &api.Task{Driver: "raw_exec", Config: map[string]any{"command": "x"}, LogConfig: &api.LogConfig{Disabled: new(true)}}
	writeOwnLogs(off, o)
	odd := &api.Task{Driver: "raw_exec", Config: map[string]any{"command": "x", "args": "not a list"}}
	writeOwnLogs(odd, o)
	for _, task := range []*api.Task{off, odd} {
		if task.Config["command"] != "x" {
			t.Errorf("task %v rewritten", task.Config)
		}
	}
}
