package fakecluster

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/hashicorp/nomad/api"
)

// What raw_exec reports as measured (allocstats fixtures 081).
var (
	statsMeasuredCPU    = []string{"System Mode", "User Mode", "Percent"}
	statsMeasuredMemory = []string{"RSS", "Swap"}
)

// statsInterval is how often a task's processes are measured anew (Nomad
// client's telemetry collection_interval); between two measures the last
// one is answered.
const statsInterval = time.Second

// cpuSample is a task process's CPU time when last measured.
type cpuSample struct {
	pid     int
	cpu     time.Duration
	at      time.Time
	percent float64
}

// allocStats answers GET /v1/client/allocation/{id}/stats as a raw_exec
// client does (allocstats fixtures 081, 082): per running task, its
// process's CPU (Percent of one core since the last measure, 0 at the
// first; TotalTicks that times the node's MHz per core) and RSS, of the
// process group the task's process leads, summed for the allocation, with
// no index headers. Pids lists the task's leading process alone.
func (n *Nomad) allocStats(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	now := time.Now()
	n.mu.Lock()
	a, ok := n.allocs[id]
	var pids map[string]int
	if ok {
		pids = make(map[string]int, len(a.pids))
		for task, pid := range a.pids {
			pids[task] = pid
		}
	}
	n.mu.Unlock()
	if !ok {
		writeText(w, nil, http.StatusNotFound, fmt.Sprintf("Unknown allocation %q", id))
		return
	}
	out := api.AllocResourceUsage{
		ResourceUsage: &api.ResourceUsage{CpuStats: &api.CpuStats{Measured: statsMeasuredCPU}, MemoryStats: &api.MemoryStats{Measured: statsMeasuredMemory}},
		Tasks:         map[string]*api.TaskResourceUsage{},
		Timestamp:     now.UnixNano(),
	}
	mhz := cpuMHzPerCore()
	for task, pid := range pids {
		cpu, rss, err := procUsage(pid)
		if err != nil {
			continue // exited in between: no stats for it, as a client has none
		}
		percent := n.cpuPercent(id, task, pid, cpu, now)
		ru := &api.ResourceUsage{
			CpuStats:    &api.CpuStats{Percent: percent, TotalTicks: percent / 100 * mhz, Measured: statsMeasuredCPU},
			MemoryStats: &api.MemoryStats{RSS: rss, Measured: statsMeasuredMemory},
		}
		out.Tasks[task] = &api.TaskResourceUsage{ResourceUsage: ru, Timestamp: now.UnixNano(), Pids: map[string]*api.ResourceUsage{strconv.Itoa(pid): ru}}
		out.ResourceUsage.CpuStats.Percent += percent
		out.ResourceUsage.CpuStats.TotalTicks += ru.CpuStats.TotalTicks
		out.ResourceUsage.MemoryStats.RSS += rss
	}
	writeJSON(w, nil, out)
}

// cpuPercent is the CPU a task's process used since its last measure, in
// percent of one core: 0 for a process measured the first time, the last
// value within statsInterval of the last measure.
func (n *Nomad) cpuPercent(allocID, task string, pid int, cpu time.Duration, now time.Time) float64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	a, ok := n.allocs[allocID]
	if !ok {
		return 0
	}
	if a.cpu == nil {
		a.cpu = map[string]cpuSample{}
	}
	last, seen := a.cpu[task]
	switch {
	case !seen || last.pid != pid:
		a.cpu[task] = cpuSample{pid: pid, cpu: cpu, at: now}
		return 0
	case now.Sub(last.at) < statsInterval:
		return last.percent
	}
	p := max(float64(cpu-last.cpu)/float64(now.Sub(last.at))*100, 0)
	a.cpu[task] = cpuSample{pid: pid, cpu: cpu, at: now, percent: p}
	return p
}
