package nomadjob

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/nomad/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// TaskUsage is the serving task's resource use in one allocation, as the
// Nomad client running it last measured it (every telemetry
// collection_interval, 1 s by default), beside what the task reserved.
type TaskUsage struct {
	AllocID string `json:"alloc_id"`
	// CPUMHz is the CPU the task used, in MHz: Nomad's TotalTicks, its
	// CPU percent of one core times the node's MHz per core, the unit of
	// the reservation. It exceeds the reservation when the driver does
	// not cap the task (raw_exec, docker without cpu_hard_limit).
	CPUMHz float64 `json:"cpu_mhz"`
	// MemoryBytes is the task's memory: its resident set (RSS) where the
	// client measures one, else its cgroup's usage (which also counts the
	// page cache: cgroup v2 clients measure no RSS).
	MemoryBytes uint64 `json:"memory_bytes"`
	// ReservedCPUMHz and ReservedMemoryMB are the task's resources
	// block, as Nomad allocated it.
	ReservedCPUMHz   int `json:"reserved_cpu_mhz"`
	ReservedMemoryMB int `json:"reserved_memory_mb"`
	// At is when the client measured it.
	At time.Time `json:"at"`
}

// Percent is the usage of m (cpu or memory) as a percentage of the
// reservation: Knative's HPA utilization. It fails for another metric and
// for a reservation Nomad did not report.
func (u TaskUsage) Percent(m spec.Metric) (float64, error) {
	switch m {
	case spec.MetricCPU:
		if u.ReservedCPUMHz <= 0 {
			return 0, fmt.Errorf("allocation %s: no reserved cpu to measure use against", u.AllocID)
		}
		return u.CPUMHz / float64(u.ReservedCPUMHz) * 100, nil
	case spec.MetricMemory:
		if u.ReservedMemoryMB <= 0 {
			return 0, fmt.Errorf("allocation %s: no reserved memory to measure use against", u.AllocID)
		}
		return float64(u.MemoryBytes) / float64(u.ReservedMemoryMB<<20) * 100, nil
	}
	return 0, fmt.Errorf("allocation %s: metric %q is not a resource", u.AllocID, m)
}

// reservation is a serving task's resources in one allocation, which never
// change for the allocation's life.
type reservation struct {
	cpuMHz, memoryMB int
	used             time.Time
}

// UsageReader reads the serving task's usage of running allocations for
// the autoscaler of revisions scaled on cpu or memory: one stats read per
// call (Nomad's /v1/client/allocation/:id/stats, which a server forwards to
// the client running the allocation; the token needs read-job in the
// allocation's namespace), and one allocation read the first time it sees
// an allocation, for the reservation, which it keeps while it is used.
// Safe for concurrent use.
type UsageReader struct {
	c   *Client
	now func() time.Time

	mu        sync.Mutex
	reserved  map[string]reservation
	lastSweep time.Time
}

// reservationTTL is how long an allocation's reservation is kept unused:
// an allocation read once a tick is never dropped, a stopped one is soon.
const reservationTTL = 5 * time.Minute

// NewUsageReader returns a UsageReader over c.
func NewUsageReader(c *Client) *UsageReader {
	return &UsageReader{c: c, now: time.Now, reserved: map[string]reservation{}}
}

// ServingUsage reads the serving task's usage (spec.UserTaskName) in
// allocation allocID of revision. A client that has not measured the task
// yet (it has just started) is an error, not a zero: the autoscaler must
// take it as unknown, never as idle.
func (r *UsageReader) ServingUsage(ctx context.Context, revision, allocID string) (TaskUsage, error) {
	c := r.c
	ns := c.namespaceOf(revision)
	op := fmt.Sprintf("read the resource use of revision %s in allocation %s", revision, allocID)
	res, err := r.reservation(ctx, ns, op, allocID)
	if err != nil {
		return TaskUsage{}, err
	}
	stats, err := c.api.Allocations().Stats(&api.Allocation{ID: allocID, Namespace: ns}, c.query(ctx, ns))
	if err != nil {
		return TaskUsage{}, c.wrap(op, ns, capRead, err)
	}
	u, err := usageOf(stats, spec.UserTaskName)
	if err != nil {
		return TaskUsage{}, fmt.Errorf("%s: %w", op, err)
	}
	u.AllocID, u.ReservedCPUMHz, u.ReservedMemoryMB = allocID, res.cpuMHz, res.memoryMB
	return u, nil
}

// Utilization is the serving task's use of m (cpu or memory) in allocation
// allocID of revision, as a percentage of its reservation: what the
// autoscaler scales revisions with metric cpu or memory on.
func (r *UsageReader) Utilization(ctx context.Context, revision, allocID string, m spec.Metric) (float64, error) {
	if !m.Resource() {
		return 0, fmt.Errorf("read the %s use of revision %s: %q is not a resource metric", m, revision, m)
	}
	u, err := r.ServingUsage(ctx, revision, allocID)
	if err != nil {
		return 0, err
	}
	return u.Percent(m)
}

// reservation is the serving task's reservation in allocID, read from
// Nomad the first time.
func (r *UsageReader) reservation(ctx context.Context, ns, op, allocID string) (reservation, error) {
	now := r.now()
	r.mu.Lock()
	res, ok := r.reserved[allocID]
	if ok {
		res.used = now
		r.reserved[allocID] = res
	}
	r.mu.Unlock()
	if ok {
		return res, nil
	}
	alloc, _, err := r.c.api.Allocations().Info(allocID, r.c.query(ctx, ns))
	if err != nil {
		return reservation{}, r.c.wrap(op+": read the allocation", ns, capRead, err)
	}
	res, err = reservationOf(alloc, spec.UserTaskName)
	if err != nil {
		return reservation{}, fmt.Errorf("%s: %w", op, err)
	}
	res.used = now
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reserved[allocID] = res
	if now.Sub(r.lastSweep) >= reservationTTL {
		r.lastSweep = now
		for id, v := range r.reserved {
			if now.Sub(v.used) > reservationTTL {
				delete(r.reserved, id)
			}
		}
	}
	return res, nil
}

// reservationOf reads a task's reservation from an allocation: its
// AllocatedResources (Nomad 0.11 and later), else the legacy TaskResources.
func reservationOf(a *api.Allocation, task string) (reservation, error) {
	if a == nil {
		return reservation{}, errors.New("no allocation")
	}
	if a.AllocatedResources != nil {
		if t := a.AllocatedResources.Tasks[task]; t != nil {
			return reservation{cpuMHz: int(t.Cpu.CpuShares), memoryMB: int(t.Memory.MemoryMB)}, nil
		}
	}
	if t := a.TaskResources[task]; t != nil && t.CPU != nil && t.MemoryMB != nil {
		return reservation{cpuMHz: *t.CPU, memoryMB: *t.MemoryMB}, nil
	}
	return reservation{}, fmt.Errorf("allocation %s has no task %q with resources", a.ID, task)
}

// usageOf reads a task's usage from an allocation's stats.
func usageOf(s *api.AllocResourceUsage, task string) (TaskUsage, error) {
	if s == nil {
		return TaskUsage{}, errors.New("no stats in Nomad's answer")
	}
	t := s.Tasks[task]
	if t == nil || t.ResourceUsage == nil || t.ResourceUsage.CpuStats == nil || t.ResourceUsage.MemoryStats == nil || t.Timestamp == 0 {
		return TaskUsage{}, fmt.Errorf("the Nomad client has no stats of task %q yet (it measures every telemetry collection_interval)", task)
	}
	cpu, mem := t.ResourceUsage.CpuStats, t.ResourceUsage.MemoryStats
	u := TaskUsage{CPUMHz: cpu.TotalTicks, MemoryBytes: mem.Usage, At: time.Unix(0, t.Timestamp).UTC()}
	if slices.Contains(mem.Measured, "RSS") {
		u.MemoryBytes = mem.RSS
	}
	if u.CPUMHz < 0 {
		return TaskUsage{}, fmt.Errorf("task %q: Nomad reports %v MHz of cpu", task, u.CPUMHz)
	}
	return u, nil
}
