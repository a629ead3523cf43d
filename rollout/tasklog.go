package rollout

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// Bounds of the log a failed deploy shows: the last failedLogLines lines
// of the failed task's stderr, read from at most failedLogBytes before its
// end and within failedLogWait.
const (
	failedLogLines = 10
	failedLogBytes = 8 << 10
	failedLogWait  = 5 * time.Second
)

// TaskLogs reads a task's log (nomadjob.Client.Logs).
type TaskLogs interface {
	Logs(ctx context.Context, revision string, req nomadjob.LogRequest, fn func([]byte) error) error
}

// failedTaskLog is the end of the stderr of the task that failed a
// revision's allocation (an init step that exited non-zero, the app that
// crashed), indented under a line that names it: what a person reads first
// when a deploy fails. "" when no task failed or its log cannot be read;
// the failure itself is said either way.
func failedTaskLog(ctx context.Context, logs TaskLogs, revision string, allocs []nomadjob.Allocation) string {
	for _, a := range allocs {
		if a.FailedTask == "" {
			continue
		}
		ctx, cancel := context.WithTimeout(ctx, failedLogWait)
		var buf bytes.Buffer
		err := logs.Logs(ctx, revision, nomadjob.LogRequest{
			Alloc: a.ID, Task: a.FailedTask, Stderr: true,
			// Since the allocation was made: every log file of it.
			Since: a.Created.Add(-time.Minute), MaxHistory: failedLogBytes,
		}, func(b []byte) error {
			buf.Write(b)
			return nil
		})
		cancel()
		lines := lastLines(buf.String(), failedLogLines)
		if err != nil && len(lines) == 0 {
			return fmt.Sprintf("\n  (the stderr of task %s could not be read: %v)", a.FailedTask, err)
		}
		if len(lines) == 0 {
			return fmt.Sprintf("\n  task %s wrote nothing to stderr; see `nomad alloc logs %s %s`", a.FailedTask, shortID(a.ID), a.FailedTask)
		}
		return fmt.Sprintf("\n  last lines of task %s's stderr (allocation %s):\n    %s", a.FailedTask, shortID(a.ID), strings.Join(lines, "\n    "))
	}
	return ""
}

// lastLines is the last n non-empty lines of s.
func lastLines(s string, n int) []string {
	var out []string
	for _, l := range strings.Split(strings.TrimRight(s, "\n"), "\n") {
		if l = strings.TrimRight(l, "\r"); strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	if len(out) > n {
		out = out[len(out)-n:]
	}
	return out
}
