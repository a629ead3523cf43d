package main

import (
	"context"
	"fmt"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/tasklog"
)

// runRunTask runs a raw_exec task's command for Nomad and writes its
// output where Nomad's logmon would have (tasklog.Run): the compiled job
// starts such a task as `nomad-serverless run-task -- COMMAND [ARGS...]`
// with Nomad's log collection off (nomadjob.RunTaskArg). It ends as the
// command ends, passing every signal on; ctx is not used, since SIGTERM
// is the command's to act on.
func runRunTask(_ context.Context, e *env, args []string) int {
	if len(args) > 0 && args[0] == "--" {
		args = args[1:]
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "-help" || args[0] == "--help" {
		fmt.Fprintln(e.stderr, "Usage: nomad-serverless "+nomadjob.RunTaskArg+" -- COMMAND [ARGS...]")
		fmt.Fprintln(e.stderr)
		fmt.Fprintln(e.stderr, "Runs COMMAND as Nomad's raw_exec would, with its stdout and stderr written to")
		fmt.Fprintln(e.stderr, "$NOMAD_ALLOC_DIR/logs/$NOMAD_TASK_NAME.stdout.N and .stderr.N (10 files of 10 MiB each),")
		fmt.Fprintln(e.stderr, "where Nomad's own log collection would write them. Nomad starts it.")
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	t, err := tasklog.TaskFromEnv(e.getenv, args[0], args[1:])
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless %s: %v\n", nomadjob.RunTaskArg, err)
		return exitUsage
	}
	return tasklog.Run(t)
}
