//go:build !unix

package tasklog

import "os"

// redirectStderr leaves the process's stderr alone where there is no
// dup2: a writer's own lines still reach the file through File.
func redirectStderr(*os.File) error { return nil }
