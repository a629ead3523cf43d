//go:build !unix

package tasklog

import (
	"fmt"
	"os"
)

// Run is Unix's alone: the compiled job runs a task through it only under
// raw_exec on a Linux client.
func Run(t Task) int {
	fmt.Fprintf(os.Stderr, "nomad-serverless run-task: not supported on this system; run %s directly\n", t.Command)
	return 126
}
