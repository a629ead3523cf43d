package devagents

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"
)

// Why a guard: a test binary that starts dev agents stops them in TestMain
// after m.Run, and nothing else does. A panic in a test, `go test -timeout`
// (the testing package panics), SIGINT, SIGTERM or SIGKILL end the binary
// before that, and the agents keep running, and with them the processes
// Nomad started: raw_exec tasks run under `nomad executor` processes made to
// survive their agent, so not even a kill of Nomad's process group reaches
// them.
//
// Guarded (Linux) makes the program its own guard: the process the user or
// `go test` started runs the same program again as its only child, with the
// same arguments, and does nothing but wait for it. Everything the child
// starts (agents, executors, tasks, serve, CLI runs) descends from the guard,
// and the guard is a child subreaper, so whatever is orphaned below it (an
// executor whose Nomad died, a process that left its session) becomes its
// child instead of init's. When the child ends, however it ends, the guard
// stops the processes the child registered with StopFirst (SIGINT, a grace
// period, SIGKILL of the process group; last registered first, so Nomad
// goes before the Consul it registers in), then SIGKILLs every process
// still below it until none is left, and exits with the child's code. When
// the child did that itself (the normal path), the guard finds nothing and
// says nothing; if a child that exited 0 left processes behind, the guard
// kills them, names them and exits 1.
//
// The one end it cannot see is a SIGKILL of the guard itself; it runs no
// test code and waits, so that takes a deliberate kill of that very PID.
// Elsewhere than Linux, Guarded runs body directly with a nil *Guard.

// guardEnv is set only in the guarded child: the number of the file
// descriptor of its pipe to the guard.
const guardEnv = "NOMAD_SERVERLESS_GUARD_FD"

// GuardOptions configure the guard process.
type GuardOptions struct {
	// Name starts each line the guard writes ("e2e guard").
	Name string
	// Grace is how long each process registered with StopFirst may take
	// to exit after SIGINT; default 20s. Keep the sum well under a minute:
	// `go test` kills its binary a minute after -timeout.
	Grace time.Duration
	// Report receives the guard's lines; default os.Stderr.
	Report io.Writer
}

func (o GuardOptions) withDefaults() GuardOptions {
	if o.Name == "" {
		o.Name = "guard"
	}
	if o.Grace <= 0 {
		o.Grace = 20 * time.Second
	}
	if o.Report == nil {
		o.Report = os.Stderr
	}
	return o
}

// Guard is the guarded process's link to its guard. A nil *Guard (no
// guard: not Linux, or not running under Guarded) ignores every call.
type Guard struct {
	mu sync.Mutex
	w  io.Writer
}

// StopFirst tells the guard that, should this process end while pid still
// runs, pid is to be stopped gracefully (SIGINT, Grace, then SIGKILL of its
// process group) before everything else is killed. Register processes that
// clean up after themselves on SIGINT: agents (Nomad stops its allocations),
// `dev`. The guard checks that pid is still the process registered (same
// start time) before signalling it.
func (g *Guard) StopFirst(pid int, name string) {
	if g == nil {
		return
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	// The guard reads one registration a line; a name is only for its
	// report.
	name = strings.Join(strings.Fields(name), "_")
	if name == "" {
		name = "process"
	}
	fmt.Fprintf(g.w, "stop-first %d %s\n", pid, name)
}
