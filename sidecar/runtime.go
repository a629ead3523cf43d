package sidecar

import "runtime"

// MaxProcs is the most Ps (GOMAXPROCS) a sidecar process runs with by
// default.
//
// Go gives a process one P per core of the node (or of its cgroup CPU limit,
// which Nomad sets only with cpu_hard_limit). The sidecar is one of many
// per-instance proxies on a shared node, and each P costs it whether or not
// it is busy: idle Ps are woken to look for work and go back to sleep (CPU
// the node's other tasks could use), and each keeps its own memory caches
// (RSS). Two Ps already let it use more than one core, which a single
// instance's traffic does not need: at 15,000 small requests per second the
// sidecar uses 0.7 of a core (make bench-sidecar).
//
// Measured with the loadbench on 2 cores, a sidecar given 8 Ps (an 8-core
// node's default) used 27% more CPU per request at 32 connections (57 against
// 45 us) and 12% more at one (110 against 98 us), and 1.7 MiB more peak RSS
// (20.6 MiB: over the 20 MiB target); one P used no less CPU than two at one
// connection and lost 11% of the throughput at 32, so the limit is two, not
// one.
const MaxProcs = 2

// SetRuntimeDefaults caps GOMAXPROCS at MaxProcs, unless the environment
// sets GOMAXPROCS (getenv reads it). The sidecar command calls it first
// thing. It returns the GOMAXPROCS in effect.
func SetRuntimeDefaults(getenv func(string) string) int {
	if getenv("GOMAXPROCS") == "" && runtime.GOMAXPROCS(0) > MaxProcs {
		runtime.GOMAXPROCS(MaxProcs)
	}
	return runtime.GOMAXPROCS(0)
}
