package e2e

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
)

var (
	requireAgents = flag.Bool("require", false, "fail instead of skipping when no Nomad and Consul are available (make e2e passes it)")
	keepData      = flag.Bool("keep", false, "keep the agents' data and logs even when every test passes")
	rehearse      = flag.Bool("rehearse", false, "run the scenarios against test/fakecluster instead of real agents (make e2e-rehearsal); not an end-to-end pass")
)

// suite is what TestMain set up for the scenarios (nil when they do not run).
// It is the package's one piece of shared state: TestMain is the only place
// that can own agents living across tests.
var suite *Suite

// Suite is the agents the scenarios run against.
type Suite struct {
	Plan Plan
	// NomadAddr and ConsulAddr as NOMAD_ADDR and CONSUL_HTTP_ADDR want them.
	NomadAddr, ConsulAddr string
	// Agents is nil when the suite uses running agents.
	Agents  *devagents.Agents
	Timings *Timings
	// Timelines are the cold-start scenarios' wake timelines, by driver.
	Timelines *TimelineTable
	// Guard gets the processes to stop gracefully (SIGINT) should this
	// binary end before TestMain stops them; nil when unguarded.
	Guard *devagents.Guard
}

// TestMain runs the suite under a guard, first of all (before flags are
// parsed): this binary starts itself again as its child, which runs the
// tests, and waits. Whatever ends the child (a failing or panicking
// scenario, -timeout, SIGINT, SIGTERM, even SIGKILL), the guard then stops
// the agents the child started (SIGINT, then SIGKILL after a grace) and
// kills every process still below it: Nomad's executors and tasks, serve,
// CLI runs. On the normal path TestMain stops the agents itself, as below,
// and the guard finds nothing. See dev/devagents/guard.go.
func TestMain(m *testing.M) {
	os.Exit(devagents.Guarded(devagents.GuardOptions{Name: "e2e guard", Grace: guardStopGrace, Report: os.Stdout}, func(g *devagents.Guard) int {
		flag.Parse()
		return runSuite(m, g)
	}))
}

// guardStopGrace bounds the guard's wait for each agent after SIGINT. On
// real agents Nomad takes about 15 s with an allocation running (the
// group's 5 s shutdown_delay, then the sidecar's drain); Consul a few
// milliseconds. Both fit in the minute `go test` allows after -timeout
// before it kills the guard too (then the guard hurries: see guard.go).
const guardStopGrace = 30 * time.Second

func runSuite(m *testing.M, g *devagents.Guard) int {
	plan := Decide(os.Getenv, exec.LookPath)
	if *rehearse {
		plan = Plan{Mode: Rehearse}
	}
	switch plan.Mode {
	case Skip, Misconfigured:
		// The helpers' unit tests still run; the scenarios do not, and the
		// one line below says so.
		if err := flag.Set("test.skip", "^TestE2E"); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: cannot skip the scenarios:", err)
			return 1
		}
		code := m.Run()
		fmt.Println(plan.SkipLine())
		if code == 0 && (plan.Mode == Misconfigured || *requireAgents) {
			code = 1
		}
		return code
	}

	s := &Suite{Plan: plan, Timings: &Timings{}, Timelines: &TimelineTable{}, Guard: g}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var dir string
	var fake *fakecluster.Cluster
	switch plan.Mode {
	case UseRunning:
		s.NomadAddr, s.ConsulAddr = plan.NomadAddr, plan.ConsulAddr
		if err := reachable(ctx); err != nil {
			fmt.Printf("e2e: FAILED: NOMAD_ADDR=%s CONSUL_HTTP_ADDR=%s: %v\n", s.NomadAddr, s.ConsulAddr, err)
			return 1
		}
		fmt.Printf("e2e: using running agents: NOMAD_ADDR=%s CONSUL_HTTP_ADDR=%s\n", s.NomadAddr, s.ConsulAddr)
	case StartAgents:
		var err error
		if dir, err = os.MkdirTemp("", "nomad-serverless-e2e-"); err != nil {
			fmt.Println("e2e: FAILED:", err)
			return 1
		}
		// The binary's own runs of the agents (dev, the scenarios that
		// start a cluster) look on PATH: put the plan's pair first there.
		if err := pathFirst(filepath.Join(dir, "bin"), map[string]string{"nomad": plan.NomadBin, "consul": plan.ConsulBin}); err != nil {
			fmt.Println("e2e: FAILED:", err)
			return 1
		}
		fmt.Printf("e2e: starting Consul (%s) and Nomad (%s) dev agents in %s\n", plan.ConsulBin, plan.NomadBin, dir)
		start := time.Now()
		s.Agents, err = devagents.Start(ctx, s.agentOptions(dir, nil))
		if err != nil {
			fmt.Println("e2e: FAILED: start agents:", err)
			fmt.Println("e2e: agent logs kept in", dir)
			return 1
		}
		s.NomadAddr, s.ConsulAddr = s.Agents.NomadAddr, s.Agents.ConsulAddr
		// From here on the suite is like a user with running agents: API
		// clients (DefaultConfig) and the binary's subprocesses read the
		// addresses, and no stray token or namespace, from the environment.
		if err := devagents.PointProcessAt(s.NomadAddr, s.ConsulAddr); err != nil {
			fmt.Println("e2e: FAILED:", err)
			s.Agents.Stop(agentStopGrace)
			return 1
		}
		s.Timings.Add("0 setup", "start Consul and Nomad dev agents", time.Since(start))
		fmt.Printf("e2e: agents ready in %s: NOMAD_ADDR=%s CONSUL_HTTP_ADDR=%s\n", time.Since(start).Round(time.Millisecond), s.NomadAddr, s.ConsulAddr)
	case Rehearse:
		var err error
		if dir, err = os.MkdirTemp("", "nomad-serverless-e2e-rehearsal-"); err != nil {
			fmt.Println("e2e: FAILED:", err)
			return 1
		}
		if fake, err = fakecluster.New(fakecluster.Options{DataDir: dir}); err != nil {
			fmt.Println("e2e: FAILED: start the fake cluster:", err)
			return 1
		}
		s.NomadAddr, s.ConsulAddr = fake.Nomad.Addr(), fake.Consul.Addr()
		if err := devagents.PointProcessAt(s.NomadAddr, s.ConsulAddr); err != nil {
			fmt.Println("e2e: FAILED:", err)
			fake.Close()
			return 1
		}
		fmt.Printf("e2e: REHEARSAL against test/fakecluster (NOMAD_ADDR=%s CONSUL_HTTP_ADDR=%s), not real Nomad and Consul: a pass here is not an end-to-end pass\n", s.NomadAddr, s.ConsulAddr)
	}

	suite = s
	code := m.Run()
	suite = nil

	fmt.Println()
	if fake != nil {
		fmt.Println("e2e timings of a REHEARSAL on test/fakecluster (not Nomad's scheduling or Consul's checks; for the suite, not for the targets):")
	} else {
		fmt.Println("e2e timings (one machine's clocks; first byte targets: raw_exec <= 150ms, docker <= 400ms, median of 10 wakes):")
	}
	fmt.Print(FormatTable(s.Timings.Rows()))
	fmt.Print(s.Timelines.Format())

	if fake != nil {
		fake.Close()
		fmt.Println("e2e: that was a REHEARSAL against test/fakecluster, not real Nomad and Consul")
		if code != 0 || *keepData {
			fmt.Println("e2e: allocation logs kept in", dir)
		} else {
			os.RemoveAll(dir)
		}
	}
	if s.Agents != nil {
		for _, k := range s.Agents.Stop(agentStopGrace) {
			fmt.Println("e2e:", k)
			code = max(code, 1)
		}
		if code != 0 || *keepData {
			fmt.Println("e2e: agent data and logs kept in", dir)
		} else {
			os.RemoveAll(dir)
		}
	}
	return code
}

// agentStopGrace is how long an agent may take to stop after SIGINT; Nomad
// stops its allocations first.
const agentStopGrace = 45 * time.Second

// agentOptions are the suite's agents: DEBUG logs in dir, generous
// bounds, ACLs when acl is set, registered with the guard.
func (s *Suite) agentOptions(dir string, acl *devagents.ACL) devagents.Options {
	return devagents.Options{
		NomadBin: s.Plan.NomadBin, ConsulBin: s.Plan.ConsulBin, Dir: dir,
		Config:       devagents.ConfigOptions{LogLevel: agentLogLevel(), ACL: acl, CPUTotalCompute: scaleRunCompute()},
		ReadyTimeout: 2 * time.Minute,
		StopGrace:    agentStopGrace,
		Guard:        s.Guard,
	}
}

// reachable checks that the agents NOMAD_ADDR and CONSUL_HTTP_ADDR (with
// their tokens and TLS settings) name answer and have a leader.
func reachable(ctx context.Context) error {
	nc, err := nomad.NewClient(nomad.DefaultConfig())
	if err != nil {
		return err
	}
	cc, err := consul.NewClient(consul.DefaultConfig())
	if err != nil {
		return err
	}
	for ctx.Err() == nil {
		nl, nerr := nc.Status().Leader()
		cl, cerr := cc.Status().Leader()
		if nerr == nil && cerr == nil && nl != "" && cl != "" {
			return nil
		}
		if err = errors.Join(nerr, cerr); err == nil {
			err = errors.New("no leader yet")
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	return fmt.Errorf("agents not ready: %w", err)
}

// pathFirst links each name in dir to its binary and puts dir first on
// this process's PATH, which the binaries the suite runs inherit.
func pathFirst(dir string, bins map[string]string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("put the agents first on PATH: %w", err)
	}
	for name, bin := range bins {
		if err := os.Symlink(bin, filepath.Join(dir, name)); err != nil {
			return fmt.Errorf("put the agents first on PATH: %w", err)
		}
	}
	return os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}
