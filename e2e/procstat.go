package e2e

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// ProcSample is what /proc says of a process at one moment.
type ProcSample struct {
	At time.Time
	// CPU is user plus system time used so far.
	CPU time.Duration
	// RSS is the resident set size in bytes.
	RSS int64
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat's times: 100 on
// every Linux architecture Go supports.
const clockTicks = 100

// SampleProc reads a process's CPU time and RSS.
func SampleProc(pid int) (ProcSample, error) {
	s := ProcSample{At: time.Now()}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return s, err
	}
	if s.CPU, err = parseStatCPU(string(stat)); err != nil {
		return s, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return s, err
	}
	if s.RSS, err = parseStatusRSS(string(status)); err != nil {
		return s, fmt.Errorf("/proc/%d/status: %w", pid, err)
	}
	return s, nil
}

// parseStatCPU reads utime+stime from a /proc/<pid>/stat line. The command
// name (field 2) may hold spaces and parentheses, so fields are counted
// from the last ')'.
func parseStatCPU(stat string) (time.Duration, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", stat)
	}
	f := strings.Fields(stat[i+1:])
	// After the name: state (3) ... utime (14), stime (15).
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat line %q", stat)
	}
	var ticks int64
	for _, s := range f[11:13] {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cpu time %q: %w", s, err)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / clockTicks, nil
}

// parseStatusRSS reads VmRSS from /proc/<pid>/status, in bytes.
func parseStatusRSS(status string) (int64, error) {
	for line := range strings.Lines(status) {
		rest, ok := strings.CutPrefix(line, "VmRSS:")
		if !ok {
			continue
		}
		f := strings.Fields(rest)
		if len(f) != 2 || f[1] != "kB" {
			return 0, fmt.Errorf("VmRSS line %q", line)
		}
		kb, err := strconv.ParseInt(f[0], 10, 64)
		return kb * 1024, err
	}
	return 0, fmt.Errorf("no VmRSS line")
}

// CPUShare is the share of one core a process used between two samples.
func CPUShare(a, b ProcSample) float64 {
	wall := b.At.Sub(a.At)
	if wall <= 0 {
		return 0
	}
	return float64(b.CPU-a.CPU) / float64(wall)
}

// ConnectionsTo counts a process's established TCP connections to a local
// port (its connections to Consul's HTTP API, each a request or a blocking
// query in flight or an idle keep-alive), from its socket descriptors and
// /proc/net/tcp{,6}.
func ConnectionsTo(pid, port int) (int, error) {
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return 0, err
	}
	inodes := map[string]bool{}
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join(fmt.Sprintf("/proc/%d/fd", pid), fd.Name()))
		if err != nil {
			continue
		}
		if in, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(in, "]")] = true
		}
	}
	n := 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(table)
		if err != nil {
			continue
		}
		m, err := countTCP(f, inodes, port)
		f.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", table, err)
		}
		n += m
	}
	return n, nil
}

// countTCP counts the established entries of a /proc/net/tcp table whose
// inode is in inodes and whose remote port is port.
func countTCP(f *os.File, inodes map[string]bool, port int) (int, error) {
	sc := bufio.NewScanner(f)
	n := 0
	for first := true; sc.Scan(); first = false {
		if first {
			continue // header
		}
		f := strings.Fields(sc.Text())
		// sl local rem st tx:rx tr:when retrnsmt uid timeout inode
		if len(f) < 10 {
			continue
		}
		_, rport, ok := strings.Cut(f[2], ":")
		if !ok {
			continue
		}
		p, err := strconv.ParseInt(rport, 16, 32)
		if err != nil {
			return 0, fmt.Errorf("remote port %q: %w", rport, err)
		}
		const established = "01"
		if int(p) == port && f[3] == established && inodes[f[9]] {
			n++
		}
	}
	return n, sc.Err()
}
