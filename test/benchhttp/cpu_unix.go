//go:build unix

package benchhttp

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user and system) the process used so far.
// A benchmark that reports it per operation measures what its work costs
// the machine, which a shared machine's wall-clock times blur.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
