package nomadjob

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

// The allocation stats recorded from real agents (test/fixtures/testdata/
// allocstats, record.py): a revision-shaped job whose user task burns one
// core with 100 MHz and 64 MiB reserved, on raw_exec (driver "") or docker.
func allocStatsFixtures(t *testing.T, version, driver string) (read, stats, unknown fixtures.Exchange, allocID string) {
	t.Helper()
	dir := "allocstats/nomad-" + version + "/"
	if driver == "docker" {
		read = fixtures.Load(t, dir+"083-allocation-read-reserved-docker.json")
		stats = fixtures.Load(t, dir+"084-allocation-stats-docker.json")
	} else {
		read = fixtures.Load(t, dir+"080-allocation-read-reserved.json")
		stats = fixtures.Load(t, dir+"081-allocation-stats.json")
	}
	unknown = fixtures.Load(t, dir+"082-allocation-stats-unknown.json")
	allocID = strings.TrimPrefix(read.Request.Path, "/v1/allocation/")
	return read, stats, unknown, allocID
}

func TestUsageReaderRecorded(t *testing.T) {
	for _, tc := range []struct {
		version, driver string
		// What the recorded answers hold: TotalTicks of the user task
		// (MHz) and its RSS. Nomad 1.6's raw_exec counts its executor
		// process (about 63 MiB) among the task's processes; 2.0 does
		// not. docker measures the cgroup's Usage too (page cache
		// included), and RSS is what is read.
		cpuMHz float64
		rss    uint64
		cpuPct float64
		memPct float64
	}{
		{"1.6", "raw_exec", 2174.9613549432306, 71229440, 2174.9613549432306, 71229440.0 / (64 << 20) * 100},
		{"2.0", "raw_exec", 2271.1458078758915, 5300224, 2271.1458078758915, 5300224.0 / (64 << 20) * 100},
		{"1.6", "docker", 2310.359568, 655360, 2310.359568, 655360.0 / (64 << 20) * 100},
		{"2.0", "docker", 2320.8048409000003, 585728, 2320.8048409000003, 585728.0 / (64 << 20) * 100},
	} {
		t.Run("nomad "+tc.version+" "+tc.driver, func(t *testing.T) {
			read, stats, unknown, allocID := allocStatsFixtures(t, tc.version, tc.driver)
			c, r := newTestClient(t, read, stats, unknown)
			ur := NewUsageReader(c)
			ctx := testCtx(t)

			u, err := ur.ServingUsage(ctx, "cpu-00001", allocID)
			if err != nil {
				t.Fatal(err)
			}
			if u.AllocID != allocID || u.CPUMHz != tc.cpuMHz || u.MemoryBytes != tc.rss || u.ReservedCPUMHz != 100 || u.ReservedMemoryMB != 64 || u.At.IsZero() {
				t.Errorf("usage %+v, want %v MHz, RSS %d, reserved 100 MHz and 64 MiB, a measuring time", u, tc.cpuMHz, tc.rss)
			}
			for m, want := range map[spec.Metric]float64{spec.MetricCPU: tc.cpuPct, spec.MetricMemory: tc.memPct} {
				got, err := u.Percent(m)
				if err != nil || math.Abs(got-want) > 1e-9 {
					t.Errorf("%s: %v%% (%v), want %v%%", m, got, err, want)
				}
			}

			// The reservation is read once per allocation: the second
			// read is the stats alone (the replay answers each
			// exchange once).
			r.Add(stats)
			pct, err := ur.Utilization(ctx, "cpu-00001", allocID, spec.MetricCPU)
			if err != nil || math.Abs(pct-tc.cpuPct) > 1e-9 {
				t.Errorf("utilization %v (%v), want %v", pct, err, tc.cpuPct)
			}
			var reads, statReads int
			for _, rec := range r.Received() {
				switch rec.Path {
				case read.Request.Path:
					reads++
				case stats.Request.Path:
					statReads++
				}
			}
			if reads != 1 || statReads != 2 {
				t.Errorf("%d allocation reads and %d stats reads, want 1 and 2", reads, statReads)
			}
			assertNamespace(t, r, "default")
		})
	}
}

// An allocation Nomad does not know (garbage-collected between the catalog
// and the read) is ErrNotFound, with the revision and allocation named.
func TestUsageReaderUnknownAllocation(t *testing.T) {
	for _, version := range []string{"1.6", "2.0"} {
		t.Run("nomad "+version, func(t *testing.T) {
			read, _, unknown, _ := allocStatsFixtures(t, version, "")
			const gone = "00000000-0000-0000-0000-000000000000"
			// The reservation is known; the stats are not there.
			read.Request.Path = "/v1/allocation/" + gone
			c, _ := newTestClient(t, read, unknown)
			_, err := NewUsageReader(c).Utilization(testCtx(t), "cpu-00001", gone, spec.MetricCPU)
			if !errors.Is(err, ErrNotFound) || !strings.Contains(err.Error(), "cpu-00001") || !strings.Contains(err.Error(), gone) {
				t.Fatalf("err %v, want ErrNotFound naming the revision and the allocation", err)
			}
		})
	}
}

// A client that has not measured the serving task yet answers without it
// (or with a zero timestamp): unknown, never 0%.
func TestUsageReaderNoStatsYet(t *testing.T) {
	read, stats, _, allocID := allocStatsFixtures(t, "2.0", "")
	stats.Response.Body = []byte(`{"ResourceUsage": null, "Tasks": {}, "Timestamp": 0}`)
	c, _ := newTestClient(t, read, stats)
	if _, err := NewUsageReader(c).Utilization(testCtx(t), "cpu-00001", allocID, spec.MetricCPU); err == nil || !strings.Contains(err.Error(), `no stats of task "user" yet`) {
		t.Fatalf("err %v, want no stats of the user task yet", err)
	}
}

func TestTaskUsagePercentRefuses(t *testing.T) {
	u := TaskUsage{AllocID: "a", CPUMHz: 50, MemoryBytes: 1 << 20}
	for _, m := range []spec.Metric{spec.MetricCPU, spec.MetricMemory, spec.MetricConcurrency} {
		if _, err := u.Percent(m); err == nil {
			t.Errorf("%s without a reservation (or not a resource): no error", m)
		}
	}
	u.ReservedCPUMHz, u.ReservedMemoryMB = 200, 4
	if p, err := u.Percent(spec.MetricCPU); err != nil || p != 25 {
		t.Errorf("cpu %v (%v), want 25", p, err)
	}
	if p, err := u.Percent(spec.MetricMemory); err != nil || p != 25 {
		t.Errorf("memory %v (%v), want 25", p, err)
	}
}

// reservationOf reads the legacy TaskResources where AllocatedResources is
// missing (allocations older than Nomad 0.11), and refuses an allocation
// without the task.
func TestReservationOf(t *testing.T) {
	cpu, mem := 300, 128
	legacy := &api.Allocation{ID: "a", TaskResources: map[string]*api.Resources{spec.UserTaskName: {CPU: &cpu, MemoryMB: &mem}}}
	if r, err := reservationOf(legacy, spec.UserTaskName); err != nil || r.cpuMHz != 300 || r.memoryMB != 128 {
		t.Errorf("legacy: %+v (%v), want 300 MHz and 128 MiB", r, err)
	}
	for name, a := range map[string]*api.Allocation{
		"nil":     nil,
		"no task": {ID: "b", AllocatedResources: &api.AllocatedResources{Tasks: map[string]*api.AllocatedTaskResources{"other": {}}}},
	} {
		if _, err := reservationOf(a, spec.UserTaskName); err == nil {
			t.Errorf("%s: no error", name)
		}
	}
}
