package main

import (
	"os"
	"strconv"
	"syscall"
	"time"
)

// A peer proxy is several processes: nginx forks workers, and /proc stat of
// its master counts none of their CPU, nor would stopping the master alone
// stop them if it were killed. These helpers treat the process group
// (startProc puts every child in its own) as the unit.

// groupCPUTime is the CPU time used by the live members of process group
// pgid.
func groupCPUTime(pgid int) (time.Duration, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return 0, err
	}
	var total time.Duration
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			// Exited since the listing.
			continue
		}
		g, cpu, err := parseStat(b)
		if err != nil || g != pgid {
			continue
		}
		total += cpu
	}
	return total, nil
}

// stopGroup stops the leader as stop does, then kills whatever is left of
// its group (workers orphaned by a leader that had to be killed).
func (p *proc) stopGroup(timeout time.Duration) {
	p.stop(timeout)
	// ESRCH when the group is already gone, which is the normal case.
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
}

// groupAlive reports whether any process of group pgid still exists.
func groupAlive(pgid int) bool {
	return syscall.Kill(-pgid, 0) == nil
}

// procCPU reads p's own CPU time (a single process: the app, a sidecar, a
// gateway); 0 once it is gone.
func procCPU(p *proc) func() time.Duration {
	return func() time.Duration {
		d, _ := cpuTime(p.pid())
		return d
	}
}
