//go:build unix && !linux

package tasklog

import "syscall"

// childAttr is nothing where there is no parent-death signal: the
// command shares this process's group, which Nomad kills whole.
func childAttr() *syscall.SysProcAttr { return nil }
