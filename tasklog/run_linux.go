package tasklog

import "syscall"

// childAttr makes the command die with this process: were this process
// killed alone (SIGKILL, the OOM killer), an app left running would hold
// its port with no one to stop it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
