package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nomad-serverless/nomad-serverless/install"
	"github.com/nomad-serverless/nomad-serverless/rollout"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

func runLogs(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "logs", `Usage: nomad-serverless logs [options] <service>

Follows the logs of every running instance of a service through Nomad's
allocation logs API (as nomad alloc logs -f), interleaved line by line and
prefixed with the allocation ID: the serving task's stdout unless -stderr,
-sidecar or -task say otherwise. New instances are followed as they start. A revision
at zero has no instance and so no logs; logs says so and does not wake it.
Needs the read-logs capability in the namespace (NOMAD_TOKEN).

`)
	namespace := fs.String("namespace", namespaceFlagDefault(e.getenv), "the service's namespace")
	revision := fs.String("revision", "", "follow only this `revision` (default: every revision with instances)")
	sidecar := fs.Bool("sidecar", false, "the queue-proxy sidecar's log instead of the serving task's")
	named := fs.String("task", "", "the named `task`'s log instead of the serving task's (a task \"migrate\" {} of the service)")
	stderr := fs.Bool("stderr", false, "stderr instead of stdout")
	since := fs.Duration("since", time.Minute, fmt.Sprintf("start with what running instances logged in the last `duration` (whole log files, at most %d KiB each; at most %s; 0: only new lines)", rollout.LogsMaxHistory>>10, rollout.LogsMaxSince))
	follow := fs.Bool("follow", true, "keep following; with -follow=false print what is there and exit")
	service, ok := serviceArg(fs, args)
	if !ok {
		return exitUsage
	}
	if *since < 0 || *since > rollout.LogsMaxSince {
		fmt.Fprintf(e.stderr, "nomad-serverless logs: -since %s is out of range: use 0 to %s (Nomad keeps only the last few log files of an instance anyway)\n", *since, rollout.LogsMaxSince)
		return exitUsage
	}
	n, err := newNomad(install.PolicyDeploy)
	if err != nil {
		return errorLine(e, "logs", err)
	}
	task := spec.UserTaskName
	switch {
	case *sidecar && *named != "":
		fmt.Fprintln(e.stderr, "nomad-serverless logs: -sidecar and -task name two tasks; give one")
		return exitUsage
	case *sidecar:
		task = spec.SidecarTaskName
	case *named != "":
		task = *named
	}
	l := &rollout.Logs{
		Src: n, Out: e.stdout, Msg: e.stderr,
		Namespace: *namespace, Service: service, Revision: *revision,
		Task: task, Stderr: *stderr, Since: *since, Follow: *follow,
		Now: time.Now, Wait: rollout.SleepOrDone(rollout.LogsPoll),
	}
	if l.Run(ctx) != nil {
		return exitError
	}
	return exitOK
}
