package devagents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Options say which binaries to run, where, on which ports and how long to
// wait for them.
type Options struct {
	ConsulBin, NomadBin string
	// Dir receives consul.hcl, nomad.hcl, nomad-data/, consul.log and
	// nomad.log; it must exist.
	Dir string
	// Ports: the ones set are used as given (check them with PortFree
	// first to say which is taken), the zero ones are picked free.
	Ports  Ports
	Config ConfigOptions
	// ReadyTimeout bounds each wait (Consul's leader, Nomad's leader, a
	// ready node); default 90s. Poll is the interval; default 200ms.
	ReadyTimeout, Poll time.Duration
	// StopGrace is how long each agent may take to stop after SIGINT when
	// Start fails half way; default 10s.
	StopGrace time.Duration
	// Progress receives one line per step ("Starting Consul dev
	// agent..."); nil says nothing.
	Progress io.Writer
	// Guard, when set, gets each agent right after it starts
	// (Guard.StopFirst), so that it is stopped gracefully even if the
	// caller ends without calling Stop.
	Guard *Guard
}

// Agents is a running Consul dev agent and Nomad dev agent.
type Agents struct {
	Ports Ports
	// NomadAddr is a URL (http://127.0.0.1:port) and ConsulAddr host:port,
	// as NOMAD_ADDR and CONSUL_HTTP_ADDR want them; ConsulURL is
	// http://ConsulAddr.
	NomadAddr, ConsulAddr, ConsulURL string
	// ACL is Options.Config.ACL, with NomadManagementToken filled.
	ACL *ACL
	// Consul and Nomad are the agents' processes.
	Consul, Nomad *Proc

	progress io.Writer
	dir      string // Options.Dir, for what Nomad leaves mounted below it
}

// Start writes the configurations, starts Consul, waits for its leader,
// starts Nomad pointed at it, waits for Nomad's leader, bootstraps Nomad's
// ACLs (with Config.ACL) and waits for a ready client node with a healthy
// raw_exec driver. On error (ctx ending included) it stops what it started
// before returning.
func Start(ctx context.Context, o Options) (a *Agents, err error) {
	if o.ConsulBin == "" || o.NomadBin == "" || o.Dir == "" {
		return nil, errors.New("start dev agents: ConsulBin, NomadBin and Dir are required")
	}
	if o.ReadyTimeout <= 0 {
		o.ReadyTimeout = 90 * time.Second
	}
	if o.Poll <= 0 {
		o.Poll = 200 * time.Millisecond
	}
	if o.StopGrace <= 0 {
		o.StopGrace = 10 * time.Second
	}
	progress := o.Progress
	if progress == nil {
		progress = io.Discard
	}
	ports, err := o.Ports.FillFree()
	if err != nil {
		return nil, err
	}
	a = &Agents{
		Ports:      ports,
		NomadAddr:  "http://127.0.0.1:" + strconv.Itoa(ports.NomadHTTP),
		ConsulAddr: "127.0.0.1:" + strconv.Itoa(ports.ConsulHTTP),
		ACL:        o.Config.ACL,
		progress:   progress,
		dir:        o.Dir,
	}
	a.ConsulURL = "http://" + a.ConsulAddr
	defer func() {
		if err != nil {
			a.Stop(o.StopGrace)
			a = nil
		}
	}()

	consulCfg := filepath.Join(o.Dir, "consul.hcl")
	nomadCfg := filepath.Join(o.Dir, "nomad.hcl")
	if err := os.WriteFile(consulCfg, []byte(ConsulConfig(ports, o.Config)), 0o644); err != nil {
		return a, fmt.Errorf("write %s: %w", consulCfg, err)
	}
	if err := os.WriteFile(nomadCfg, []byte(NomadConfig(ports, filepath.Join(o.Dir, "nomad-data"), o.Config)), 0o644); err != nil {
		return a, fmt.Errorf("write %s: %w", nomadCfg, err)
	}
	consul := agentHTTP{base: a.ConsulURL, tokenHeader: "X-Consul-Token"}
	nomad := agentHTTP{base: a.NomadAddr, tokenHeader: "X-Nomad-Token"}
	if a.ACL != nil {
		consul.token = a.ACL.ConsulManagementToken
	}

	env := ChildEnv(os.Environ())
	consulLog := filepath.Join(o.Dir, "consul.log")
	fmt.Fprintf(progress, "Starting Consul dev agent (%s, log %s)...\n", o.ConsulBin, consulLog)
	if a.Consul, err = StartProc(Command{Name: "consul", Path: o.ConsulBin, Args: []string{"agent", "-dev", "-config-file", consulCfg}, Env: env, LogPath: consulLog}); err != nil {
		return a, err
	}
	o.Guard.StopFirst(a.Consul.Pid(), a.Consul.Name)
	if err := WaitFor(ctx, a.Consul, "Consul at "+a.ConsulURL, o.ReadyTimeout, o.Poll, consul.leaderIs(ports.consulLeader())); err != nil {
		return a, err
	}

	nomadLog := filepath.Join(o.Dir, "nomad.log")
	fmt.Fprintf(progress, "Starting Nomad dev agent (%s, log %s)...\n", o.NomadBin, nomadLog)
	if a.Nomad, err = StartProc(Command{Name: "nomad", Path: o.NomadBin, Args: []string{"agent", "-dev", "-config", nomadCfg}, Env: env, LogPath: nomadLog}); err != nil {
		return a, err
	}
	o.Guard.StopFirst(a.Nomad.Pid(), a.Nomad.Name)
	what := "Nomad at " + a.NomadAddr
	if err := WaitFor(ctx, a.Nomad, what, o.ReadyTimeout, o.Poll, nomad.leaderIs(ports.nomadLeader())); err != nil {
		return a, err
	}
	if a.ACL != nil {
		if a.ACL.NomadManagementToken, err = nomad.bootstrapACL(ctx); err != nil {
			return a, fmt.Errorf("bootstrap Nomad's ACLs at %s: %w", a.NomadAddr, err)
		}
		nomad.token = a.ACL.NomadManagementToken
	}
	if err := WaitFor(ctx, a.Nomad, what, o.ReadyTimeout, o.Poll, nomad.rawExecNodeCheck); err != nil {
		return a, err
	}
	return a, nil
}

// Stop stops Nomad (which, in dev mode, stops the allocations it runs) and
// then Consul with StopAll, saying so on Options.Progress, and unmounts
// what Nomad left mounted below Options.Dir: from Nomad 1.7 on a dev
// agent leaves each allocation's secrets tmpfs mounted when it exits,
// and Dir could not be removed.
//
// It also kills what Nomad left running below it: a Nomad 2.0 dev agent
// that exits does not always stop its allocations first (e2e scenario 10
// left a revision's sidecar and app running after the agent's exit, the
// job purged a moment before), and `dev` must leave nothing behind.
func (a *Agents) Stop(grace time.Duration) []string {
	var tree processTree
	if a.Nomad != nil && !a.Nomad.Exited() {
		tree = snapshotTree(a.Nomad.Pid())
	}
	notes := StopAll(a.progress, grace, a.Nomad, a.Consul)
	if n := tree.kill(); n > 0 {
		tree.waitGone(grace)
		fmt.Fprintf(a.progress, "Killed %d processes Nomad left running.\n", n)
	}
	if a.dir != "" {
		if _, err := unmountBelow(a.dir); err != nil {
			notes = append(notes, err.Error())
		}
	}
	return notes
}

// StopAll stops each process in turn with Proc.Stop(grace), skipping nil
// and ended ones, and says "Stopping <name>..." on w before each. It
// returns a line for each process that ignored SIGINT and was killed.
func StopAll(w io.Writer, grace time.Duration, procs ...*Proc) []string {
	var killed []string
	for _, p := range procs {
		if p == nil || p.Exited() {
			continue
		}
		fmt.Fprintf(w, "Stopping %s...\n", p.Name)
		if p.Stop(grace) {
			killed = append(killed, fmt.Sprintf("%s did not stop within %s after SIGINT; killed it.", p.Name, grace))
		}
	}
	return killed
}

// Alive returns an error describing the first agent that has exited.
func (a *Agents) Alive() error {
	for _, p := range []*Proc{a.Consul, a.Nomad} {
		if p != nil && p.Exited() {
			return errors.New(p.Describe())
		}
	}
	return nil
}

// Leftovers are the processes below an agent at one moment (a Nomad
// client's executors, logmon and tasks), for a caller that runs its own
// agents: a Nomad client that stops leaves them running on purpose (it
// reattaches to them when it starts again), so whoever stops the agent
// for good kills them.
type Leftovers struct{ tree processTree }

// SnapshotLeftovers lists the live processes below pid.
func SnapshotLeftovers(pid int) Leftovers { return Leftovers{snapshotTree(pid)} }

// Kill SIGKILLs those of them still running, waits up to grace for them to
// be gone, and returns how many it signalled.
func (l Leftovers) Kill(grace time.Duration) int {
	n := l.tree.kill()
	if n > 0 {
		l.tree.waitGone(grace)
	}
	return n
}
