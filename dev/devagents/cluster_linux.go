//go:build linux

package devagents

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// processTree is the processes below an agent at one moment, each known by
// its PID and start time, so that a later kill reaches the very process
// seen and never one that reused its PID.
type processTree []procStat

// snapshotTree lists the live processes below pid (Nomad's executors,
// logmon and tasks below a Nomad client).
func snapshotTree(pid int) processTree { return descendants(pid) }

// kill SIGKILLs every process of the tree that still runs, and returns how
// many it signalled.
func (t processTree) kill() int {
	n := 0
	for _, p := range t {
		st, ok := readStat(p.pid)
		if !ok || st.start != p.start || st.state == "Z" {
			continue
		}
		if syscall.Kill(p.pid, syscall.SIGKILL) == nil {
			n++
		}
	}
	return n
}

// waitGone waits until no process of the tree runs any more (gone, or a
// zombie: its sockets are closed by then), or timeout passes. A process
// dies some milliseconds after its SIGKILL, more on a busy machine.
func (t processTree) waitGone(timeout time.Duration) {
	deadline := time.Now().Add(timeout)
	for _, p := range t {
		for time.Now().Before(deadline) {
			st, ok := readStat(p.pid)
			if !ok || st.start != p.start || st.state == "Z" || st.state == "X" {
				break
			}
			time.Sleep(time.Millisecond)
		}
	}
}

// unmountBelow detaches every mount below dir. A Nomad client mounts a
// tmpfs on each task's secrets/ and private/ directories and unmounts them
// when it destroys the allocation; a client that was killed, or stopped
// before it collected its allocations, leaves them mounted, and the
// directory could then not be removed.
func unmountBelow(dir string) ([]string, error) {
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		dir = real
	}
	prefix := filepath.Clean(dir) + string(filepath.Separator)
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("unmount below %s: %w", dir, err)
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 5 {
			continue
		}
		if mp := unescapeMountPath(fields[4]); strings.HasPrefix(mp, prefix) {
			points = append(points, mp)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("unmount below %s: read mountinfo: %w", dir, err)
	}
	// Deepest first, so a mount inside another goes before it.
	sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	var done []string
	var errs []string
	for _, mp := range points {
		if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", mp, err))
			continue
		}
		done = append(done, mp)
	}
	if len(errs) > 0 {
		return done, fmt.Errorf("unmount below %s: %s", dir, strings.Join(errs, "; "))
	}
	return done, nil
}

// unescapeMountPath undoes mountinfo's octal escapes (\040 is a space).
func unescapeMountPath(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
