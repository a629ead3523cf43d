package nomadjob

import (
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"
)

func TestFailureSummary(t *testing.T) {
	ev := func(typ string, f func(e *api.TaskEvent)) *api.TaskEvent {
		e := &api.TaskEvent{Type: typ}
		if f != nil {
			f(e)
		}
		return e
	}
	for _, c := range []struct {
		name         string
		clientStatus string
		desc         string
		states       map[string]*api.TaskState
		want         []string // substrings; none means ""
		notWant      []string
	}{
		{name: "healthy", clientStatus: "running", states: map[string]*api.TaskState{
			"user": {State: "running", Events: []*api.TaskEvent{ev(api.TaskReceived, nil), ev(api.TaskStarted, nil)}},
		}},
		{name: "image pull", clientStatus: "failed", states: map[string]*api.TaskState{
			"user": {State: "dead", Failed: true, Events: []*api.TaskEvent{ev(api.TaskDriverFailure, func(e *api.TaskEvent) {
				e.DriverError = `Failed to pull "nope:1": manifest unknown`
				e.FailsTask = true
			})}},
			"queue-proxy": {State: "dead", Events: []*api.TaskEvent{ev(api.TaskSiblingFailed, func(e *api.TaskEvent) { e.FailedSibling = "user" })}},
		}, want: []string{"task user: driver failure: Failed to pull", "check the image name"}, notWant: []string{"queue-proxy"}},
		// Nomad 2.0's words when Consul's login gives no token (the
		// alloc runner's consul hook fails every task with them).
		{name: "workload identity without a binding rule", clientStatus: "failed", states: map[string]*api.TaskState{
			"user": {State: "dead", Failed: true, Events: []*api.TaskEvent{ev(api.TaskSetupFailure, func(e *api.TaskEvent) {
				e.DisplayMessage = "failed to setup alloc: pre-run hook \"consul\" failed: 1 error occurred:\n\t* failed to derive Consul token for service hello-00001: Unexpected response code: 403 (rpc error making call: Permission denied)\n\n"
				e.FailsTask = true
			})}},
		}, want: []string{"task user: setup failed: failed to setup alloc", "refused the allocation's workload identity", "nomad-workloads", "no binding rule matched"}},
		{name: "workload identity the auth method refuses", clientStatus: "failed", states: map[string]*api.TaskState{
			"user": {State: "dead", Failed: true, Events: []*api.TaskEvent{ev(api.TaskSetupFailure, func(e *api.TaskEvent) {
				e.DisplayMessage = "failed to setup alloc: pre-run hook \"consul\" failed: failed to derive Consul token for task user: Unexpected response code: 500 (rpc error making call: invalid audience claim)"
				e.FailsTask = true
			})}},
		}, want: []string{"did not accept the JWT", "bound audiences"}},
		{name: "oom", clientStatus: "running", states: map[string]*api.TaskState{
			"user": {State: "running", Restarts: 2, Events: []*api.TaskEvent{
				ev(api.TaskTerminated, func(e *api.TaskEvent) { e.ExitCode = 137; e.Details = map[string]string{"oom_killed": "true"} }),
				ev(api.TaskRestarting, nil), ev(api.TaskStarted, nil),
			}},
		}, want: []string{"task user: killed for running out of memory; raise task.resources.memory, restarted 2 times"}},
		{name: "restarts exceeded", clientStatus: "failed", states: map[string]*api.TaskState{
			"user": {State: "dead", Failed: true, Restarts: 3, Events: []*api.TaskEvent{
				ev(api.TaskTerminated, func(e *api.TaskEvent) { e.ExitCode = 1 }),
				ev(api.TaskNotRestarting, func(e *api.TaskEvent) {
					e.DisplayMessage = "Exceeded allowed attempts 3 in interval 1m0s and mode is \"fail\""
					e.FailsTask = true
				}),
			}},
		}, want: []string{"task user: exited with code 1 (restarts exceeded after 3 restarts)"}},
		{name: "failed to start", clientStatus: "failed", states: map[string]*api.TaskState{
			"queue-proxy": {State: "dead", Failed: true, Events: []*api.TaskEvent{ev(api.TaskDriverFailure, func(e *api.TaskEvent) {
				e.DisplayMessage = "failed to launch command with executor: fork/exec /usr/local/bin/nomad-serverless: no such file or directory"
			})}},
		}, want: []string{"task queue-proxy: driver failure: failed to launch command", "no such file"}},
		{name: "artifact", clientStatus: "failed", states: map[string]*api.TaskState{
			"user": {State: "dead", Failed: true, Events: []*api.TaskEvent{ev(api.TaskArtifactDownloadFailed, func(e *api.TaskEvent) { e.DownloadError = "bad response code: 404" })}},
		}, want: []string{"task user: artifact download failed: bad response code: 404"}},
		{name: "both tasks failed", clientStatus: "failed", states: map[string]*api.TaskState{
			"queue-proxy": {State: "dead", Failed: true, Events: []*api.TaskEvent{ev(api.TaskDriverFailure, func(e *api.TaskEvent) { e.DisplayMessage = "proxy broke" })}},
			"user":        {State: "dead", Failed: true, Events: []*api.TaskEvent{ev(api.TaskTerminated, func(e *api.TaskEvent) { e.ExitCode = 2 })}},
		}, want: []string{"task user: exited with code 2; task queue-proxy: driver failure: proxy broke"}},
		{name: "failed without task events", clientStatus: "failed", desc: "Failed tasks", want: []string{"Failed tasks"}},
		{name: "lost", clientStatus: "lost", want: []string{"allocation lost"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := FailureSummary(c.clientStatus, c.desc, c.states)
			if len(c.want) == 0 {
				if got != "" {
					t.Errorf("summary = %q, want none", got)
				}
				return
			}
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("summary %q lacks %q", got, w)
				}
			}
			for _, w := range c.notWant {
				if strings.Contains(got, w) {
					t.Errorf("summary %q mentions %q: a task stopped for its sibling is noise", got, w)
				}
			}
			if strings.Index(got, "task user") > 0 && strings.Contains(got, "task queue-proxy") && strings.Index(got, "task user") > strings.Index(got, "task queue-proxy") {
				t.Errorf("the user task should come first: %q", got)
			}
		})
	}
}

func TestAllocPortsFallbacks(t *testing.T) {
	nets := []*api.NetworkResource{{IP: "10.0.0.5", DynamicPorts: []api.Port{{Label: "http", Value: 21000}, {Label: "app", Value: 21001}, {Label: "admin", Value: 21002}}}}
	// Only the shared networks (no Ports list).
	addr, h, a := allocPorts(&api.AllocatedResources{Shared: api.AllocatedSharedResources{Networks: nets}}, nil)
	if addr != "10.0.0.5" || h != 21000 || a != 21002 {
		t.Errorf("shared networks: %s %d %d", addr, h, a)
	}
	// Only the legacy resources.
	addr, h, a = allocPorts(nil, &api.Resources{Networks: nets})
	if addr != "10.0.0.5" || h != 21000 || a != 21002 {
		t.Errorf("legacy resources: %s %d %d", addr, h, a)
	}
	if addr, h, a = allocPorts(nil, nil); addr != "" || h != 0 || a != 0 {
		t.Errorf("nothing: %s %d %d", addr, h, a)
	}
}

func TestServiceAllocID(t *testing.T) {
	for id, want := range map[string]string{
		"_nomad-task-7aeda235-1b1e-8b5c-0b3a-6d0c4d4e3f11-group-app-hello-00001-http":  "7aeda235-1b1e-8b5c-0b3a-6d0c4d4e3f11",
		"_nomad-task-7aeda235-1b1e-8b5c-0b3a-6d0c4d4e3f11":                             "",
		"hello-00001-activator-r1":                                                     "",
		"_nomad-task-short-group-app-x-http":                                           "",
		"_nomad-task-7aeda2351b1e8b5c0b3a6d0c4d4e3f1100000-group-app-hello-00001-http": "",
	} {
		got, ok := ServiceAllocID(id)
		if got != want || ok != (want != "") {
			t.Errorf("ServiceAllocID(%q) = %q, %v; want %q", id, got, ok, want)
		}
	}
}
