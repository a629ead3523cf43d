package nomadjob

import (
	"fmt"

	"github.com/hashicorp/nomad/api"
)

// RunTaskArg is the subcommand of the queue-proxy's binary that runs a
// raw_exec task's command and writes its output where Nomad's logmon
// would have (tasklog.Run): `<sidecar command> run-task -- <command>
// <args>...`.
const RunTaskArg = "run-task"

// writeOwnLogs makes a raw_exec task of the revision (the app, an init
// step, a sidecar task) start through RunTaskArg, with Nomad's log
// collection off, when the queue-proxy itself runs under raw_exec from a
// path on the node (Options.Sidecar.Command): that path is known to hold
// our binary on every node that runs the revision.
//
// Why: Nomad starts a logmon process (a copy of the whole nomad binary)
// for every task whose logs it collects, before the task starts. On the
// path of a wake it is the app's longest step: 110 ms of a raw_exec app's
// start on a Nomad 2.0.5 client, while the queue-proxy, which already
// writes its own log, started 90 ms before the app (docs/design-notes.md,
// "Who writes a task's logs"). The files are the ones logmon writes, with
// its default bounds, so `nomad alloc logs`, Nomad's logs API and
// `nomad-serverless logs` read them unchanged; signals and the exit go
// through (tasklog.Run). Other drivers keep Nomad's collection: docker and
// podman log through their own logger, and exec runs in a chroot without
// our binary.
//
// A task without a string command is left to Nomad, which will say
// what is wrong with it.
func writeOwnLogs(task *api.Task, o Options) {
	if task.Driver != "raw_exec" || o.Sidecar.Command == "" {
		return
	}
	if lc := task.LogConfig; lc != nil && lc.Disabled != nil && *lc.Disabled {
		return
	}
	command, ok := task.Config["command"].(string)
	if !ok || command == "" {
		return
	}
	args := []string{RunTaskArg, "--", command}
	switch list := task.Config["args"].(type) {
	case []string:
		args = append(args, list...)
	case []any:
		for _, a := range list {
			args = append(args, fmt.Sprint(a))
		}
	case nil:
	default:
		return
	}
	cfg := cloneConfig(task.Config)
	cfg["command"], cfg["args"] = o.Sidecar.Command, args
	task.Config = cfg
	task.LogConfig = &api.LogConfig{Disabled: new(true)}
}
