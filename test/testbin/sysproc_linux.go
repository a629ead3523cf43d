//go:build linux

package testbin

import "syscall"

// sysProcAttr starts a process in its own process group, with SIGTERM from
// the kernel when the test process dies: a test binary that panics or hits
// -timeout runs no cleanup, and a serve it started would run on. SIGTERM,
// not SIGKILL, so that what it started goes too (`dev` stops its agents on
// SIGTERM; serve and the sidecar drain). (Pdeathsig follows the thread that
// started the process; Go ends a thread only when a goroutine locked to it
// returns, which no test here does.)
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
