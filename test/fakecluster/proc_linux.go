//go:build linux

package fakecluster

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// sysProcAttr puts a task in its own process group (so a kill reaches what
// it started) and has the kernel kill it if the test process dies, so a
// crashed test leaves no task behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}

// procUsage is the CPU time (user and system) and resident memory of a
// task's processes: the process group its process leads (a runner starts
// every task in one), as raw_exec counts the task's process tree.
func procUsage(pid int) (cpu time.Duration, rss uint64, err error) {
	cpu, rss, pgid, err := procStat(pid)
	if err != nil {
		return 0, 0, err
	}
	if pgid != pid {
		return cpu, rss, nil
	}
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return cpu, rss, nil
	}
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil || p == pid {
			continue
		}
		if c, r, g, err := procStat(p); err == nil && g == pid {
			cpu, rss = cpu+c, rss+r
		}
	}
	return cpu, rss, nil
}

// procStat is one process's CPU time, resident memory and process group,
// from /proc/<pid>/stat and statm.
func procStat(pid int) (cpu time.Duration, rss uint64, pgid int, err error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	// The command is in parentheses and may hold spaces: fields count
	// from the last ')'. pgrp is field 5, utime and stime 14 and 15.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	f := strings.Fields(string(stat[i+1:]))
	if len(f) < 13 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	pgid, err0 := strconv.Atoi(f[2])
	utime, err1 := strconv.ParseUint(f[11], 10, 64)
	stime, err2 := strconv.ParseUint(f[12], 10, 64)
	if err := errors.Join(err0, err1, err2); err != nil {
		return 0, 0, 0, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	const clkTck = 100 // USER_HZ on every Linux the tests run on
	cpu = time.Duration(utime+stime) * time.Second / clkTck
	statm, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, 0, 0, err
	}
	m := strings.Fields(string(statm))
	if len(m) < 2 {
		return 0, 0, 0, fmt.Errorf("/proc/%d/statm: %q", pid, statm)
	}
	pages, err := strconv.ParseUint(m[1], 10, 64)
	if err != nil {
		return 0, 0, 0, fmt.Errorf("/proc/%d/statm: %w", pid, err)
	}
	return cpu, pages * uint64(os.Getpagesize()), pgid, nil
}

// cpuMHzPerCore is the first core's clock from /proc/cpuinfo, what Nomad's
// cpu fingerprint divides its total compute by; 1000 when it says none.
func cpuMHzPerCore() float64 {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 1000
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "cpu MHz" {
			if mhz, err := strconv.ParseFloat(strings.TrimSpace(v), 64); err == nil && mhz > 0 {
				return mhz
			}
		}
	}
	return 1000
}
