package localcluster

import "syscall"

// sysProcAttr makes the kernel kill a child if this process dies, so a
// crashed test leaves no app or sidecar behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
