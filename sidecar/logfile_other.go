//go:build !unix

package sidecar

import "os"

// redirectStderr leaves the process's stderr alone where there is no
// dup2: the sidecar's own lines still reach the file through LogFile.
func redirectStderr(*os.File) error { return nil }
