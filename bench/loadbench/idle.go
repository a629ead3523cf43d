package main

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// machineCPU is the machine's CPU time since boot, all CPUs together, from
// the first line of /proc/stat: Idle (idle and iowait) of Total.
type machineCPU struct{ Idle, Total time.Duration }

// userHZ is the unit of /proc/stat (USER_HZ, 100 on every Linux port).
const userHZ = 100

// readMachineCPU reads /proc/stat; ok is false where there is none.
func readMachineCPU() (m machineCPU, ok bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return m, false
	}
	return parseMachineCPU(b)
}

// parseMachineCPU reads the "cpu" line of a /proc/stat: user nice system
// idle iowait irq softirq steal (guest time is inside user already).
func parseMachineCPU(b []byte) (m machineCPU, ok bool) {
	line, _, _ := bytes.Cut(b, []byte("\n"))
	f := strings.Fields(string(line))
	if len(f) < 9 || f[0] != "cpu" {
		return m, false
	}
	for i, v := range f[1:9] {
		ticks, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return m, false
		}
		d := time.Duration(ticks) * time.Second / userHZ
		m.Total += d
		if i == 3 || i == 4 {
			m.Idle += d
		}
	}
	return m, m.Total > 0
}

// measureIdle starts counting the machine's idle CPU for s; the function
// it returns stops, once the run is over. A target whose proxy is a
// single thread (one P) can leave CPU idle while it is the bottleneck,
// where one with two threads does not: that share says how much of a
// throughput gap is the thread model (issue 16).
func (s *Series) measureIdle() (stop func()) {
	before, ok := readMachineCPU()
	return func() {
		after, ok2 := readMachineCPU()
		if ok && ok2 && after.Total > before.Total {
			s.Idle += after.Idle - before.Idle
			s.MachineCPU += after.Total - before.Total
		}
	}
}

// idleShare is the share of the machine's CPU that was idle during s's
// runs, 0 if unknown.
func (s *Series) idleShare() float64 {
	if s.MachineCPU <= 0 {
		return 0
	}
	return float64(s.Idle) / float64(s.MachineCPU)
}
