//go:build !linux

package fakecluster

import "syscall"

// sysProcAttr puts a task in its own process group so a kill reaches what
// it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
