//go:build unix

package tasklog

import (
	"os"

	"golang.org/x/sys/unix"
)

// redirectStderr makes f the process's file descriptor 2, where the Go
// runtime writes a panic's trace.
func redirectStderr(f *os.File) error {
	return unix.Dup2(int(f.Fd()), 2)
}
