package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"
)

// Agents is a Consul dev agent and a Nomad dev agent the suite started.
type Agents struct {
	Ports AgentPorts
	Dir   string
	// NomadAddr is a URL (http://127.0.0.1:port), ConsulAddr host:port, as
	// NOMAD_ADDR and CONSUL_HTTP_ADDR want them.
	NomadAddr, ConsulAddr string
	// ACL is nil without ACLs; with them its NomadManagementToken is the
	// bootstrap token.
	ACL *ACL

	procs []*agentProc
}

type agentProc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error
}

// StartOptions say which binaries to run, where and how long to wait.
type StartOptions struct {
	NomadBin, ConsulBin string
	// Dir receives configs, data and logs; it must exist.
	Dir string
	// ACL, when not nil, turns ACLs on (see ACL).
	ACL          *ACL
	ReadyTimeout time.Duration
}

// FreePorts picks every agent port free on 127.0.0.1.
func FreePorts() (AgentPorts, error) {
	var p AgentPorts
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	// Hold every listener until all are picked, so no two fields get the
	// same port.
	for _, f := range []*int{&p.ConsulHTTP, &p.ConsulDNS, &p.ConsulServer, &p.ConsulSerfLAN, &p.ConsulSerfWAN, &p.ConsulGRPC, &p.NomadHTTP, &p.NomadRPC, &p.NomadSerf} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return p, fmt.Errorf("pick a free port: %w", err)
		}
		lns = append(lns, ln)
		*f = ln.Addr().(*net.TCPAddr).Port
	}
	return p, nil
}

// StartDevAgents starts Consul, waits for its leader, starts Nomad pointed at
// it, waits for Nomad's leader and a ready client node with raw_exec, and (with
// ACLs) bootstraps Nomad's ACLs. On error everything started is stopped.
func StartDevAgents(ctx context.Context, o StartOptions) (a *Agents, err error) {
	ports, err := FreePorts()
	if err != nil {
		return nil, err
	}
	a = &Agents{
		Ports:      ports,
		Dir:        o.Dir,
		NomadAddr:  "http://127.0.0.1:" + strconv.Itoa(ports.NomadHTTP),
		ConsulAddr: "127.0.0.1:" + strconv.Itoa(ports.ConsulHTTP),
		ACL:        o.ACL,
	}
	defer func() {
		if err != nil {
			a.Stop(10 * time.Second)
		}
	}()
	consulCfg := filepath.Join(o.Dir, "consul.hcl")
	nomadCfg := filepath.Join(o.Dir, "nomad.hcl")
	if err := os.WriteFile(consulCfg, []byte(ConsulConfig(ports, o.ACL)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(nomadCfg, []byte(NomadConfig(ports, filepath.Join(o.Dir, "nomad-data"), o.ACL)), 0o644); err != nil {
		return nil, err
	}

	cp, err := a.start("consul", o.ConsulBin, "agent", "-dev", "-config-file", consulCfg)
	if err != nil {
		return a, err
	}
	consulToken := ""
	if o.ACL != nil {
		consulToken = o.ACL.ConsulManagementToken
	}
	cc, err := consul.NewClient(&consul.Config{Address: a.ConsulAddr, Token: consulToken})
	if err != nil {
		return a, err
	}
	if err := waitAgent(ctx, cp, "Consul leader", o.ReadyTimeout, func() error {
		l, err := cc.Status().Leader()
		if err == nil && l == "" {
			err = errors.New("no leader yet")
		}
		return err
	}); err != nil {
		return a, err
	}

	np, err := a.start("nomad", o.NomadBin, "agent", "-dev", "-config", nomadCfg)
	if err != nil {
		return a, err
	}
	nc, err := nomad.NewClient(&nomad.Config{Address: a.NomadAddr})
	if err != nil {
		return a, err
	}
	if err := waitAgent(ctx, np, "Nomad leader", o.ReadyTimeout, func() error {
		l, err := nc.Status().Leader()
		if err == nil && l == "" {
			err = errors.New("no leader yet")
		}
		return err
	}); err != nil {
		return a, err
	}
	if o.ACL != nil {
		tok, _, err := nc.ACLTokens().Bootstrap(nil)
		if err != nil {
			return a, fmt.Errorf("bootstrap Nomad ACLs: %w", err)
		}
		o.ACL.NomadManagementToken = tok.SecretID
		nc.SetSecretID(tok.SecretID)
	}
	if err := waitAgent(ctx, np, "Nomad client node with raw_exec", o.ReadyTimeout, func() error {
		nodes, _, err := nc.Nodes().List(nil)
		if err != nil {
			return err
		}
		for _, n := range nodes {
			if d := n.Drivers["raw_exec"]; n.Status == "ready" && d != nil && d.Healthy {
				return nil
			}
		}
		return fmt.Errorf("%d nodes, none ready with a healthy raw_exec driver", len(nodes))
	}); err != nil {
		return a, err
	}
	return a, nil
}

func (a *Agents) start(name, bin string, args ...string) (*agentProc, error) {
	logPath := filepath.Join(a.Dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = cleanEnv(os.Environ())
	// Own process group: the test's Ctrl-C does not reach it directly, and a
	// kill takes its children (Nomad's executors) with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s %s: %w", bin, strings.Join(args, " "), err)
	}
	p := &agentProc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	a.procs = append(a.procs, p)
	return p, nil
}

// cleanEnv drops NOMAD_* and CONSUL_* from an environment: a token, CA file
// or namespace meant for another cluster must not reach the dev agents.
func cleanEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "NOMAD_") && !strings.HasPrefix(kv, "CONSUL_") {
			out = append(out, kv)
		}
	}
	return out
}

// waitAgent polls check every 100ms until it passes, the process dies or
// timeout passes.
func waitAgent(ctx context.Context, p *agentProc, what string, timeout time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited while waiting for %s: %v; log %s:\n%s", p.name, what, p.err, p.logPath, tailFile(p.logPath, 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: no %s after %s: %v; log %s:\n%s", p.name, what, timeout, err, p.logPath, tailFile(p.logPath, 20))
		}
	}
}

// Stop stops Nomad (which, in dev mode, stops the allocations it runs) and
// then Consul: SIGINT, then SIGKILL of the process group after grace. It
// returns a line for each agent that had to be killed.
func (a *Agents) Stop(grace time.Duration) []string {
	var killed []string
	for i := len(a.procs) - 1; i >= 0; i-- {
		p := a.procs[i]
		select {
		case <-p.done:
			continue
		default:
		}
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(grace):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			killed = append(killed, fmt.Sprintf("%s ignored SIGINT for %s and was killed", p.name, grace))
		}
	}
	return killed
}

// Alive reports an error for an agent that has exited.
func (a *Agents) Alive() error {
	for _, p := range a.procs {
		select {
		case <-p.done:
			return fmt.Errorf("%s exited: %v; log %s:\n%s", p.name, p.err, p.logPath, tailFile(p.logPath, 20))
		default:
		}
	}
	return nil
}

func tailFile(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
