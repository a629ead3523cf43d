//go:build linux

package fakecluster

import "syscall"

// sysProcAttr puts a task in its own process group (so a kill reaches what
// it started) and has the kernel kill it if the test process dies, so a
// crashed test leaves no task behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
