//go:build !linux

package fakecluster

import (
	"errors"
	"syscall"
	"time"
)

// sysProcAttr puts a task in its own process group so a kill reaches what
// it started.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}

// procUsage is not measured off Linux: the stats endpoint lists no task.
func procUsage(int) (time.Duration, uint64, error) {
	return 0, 0, errors.New("process usage is read from /proc, on Linux only")
}

func cpuMHzPerCore() float64 { return 1000 }
