//go:build !linux

package testbin

import "syscall"

// sysProcAttr starts a process in its own process group (there is no
// parent-death signal outside Linux).
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
