package devagents

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
)

// ClusterOptions say how to start a dev cluster: one Consul server and one
// Nomad server on 127.0.0.1, and Nodes client nodes, each a Nomad client and
// a Consul agent of its own on an address of its own.
type ClusterOptions struct {
	ConsulBin, NomadBin string
	// IPBin is iproute2's ip, which adds the nodes' addresses to lo; ""
	// looks it up on PATH.
	IPBin string
	// Dir receives loopback.log, server/ and one directory per node
	// (node-1/, ...) with its configurations, data and logs; it must
	// exist.
	Dir string
	// Nodes is the number of client nodes, at least 1.
	Nodes int
	// FirstAddr is the first node's address (DefaultFirstNodeAddr when
	// zero); each next node gets the next address (NodeAddrs).
	FirstAddr netip.Addr
	// Ports are the servers' (as Options.Ports: the ones set are used as
	// given, the zero ones picked free). The nodes' ports are picked free
	// on their own addresses.
	Ports Ports
	// LogLevel is every agent's log_level; "" is INFO. A dev cluster has
	// no ACLs.
	LogLevel string
	// CPUTotalCompute, HeartbeatTTL and HeartbeatGrace are as in
	// ConfigOptions (zero: what the node measures, the short heartbeats).
	CPUTotalCompute              int
	HeartbeatTTL, HeartbeatGrace time.Duration
	// ReadyTimeout bounds each wait; default 90s. Poll is the interval;
	// default 200ms. StopGrace bounds each agent's stop when StartCluster
	// fails half way; default 10s.
	ReadyTimeout, Poll, StopGrace time.Duration
	// Progress receives one line per step; nil says nothing.
	Progress io.Writer
	// Guard, when set, gets every agent and the loopback keeper as they
	// start (Guard.StopFirst).
	Guard *Guard
}

// Cluster is a running dev cluster. Its methods are not safe for
// concurrent use.
type Cluster struct {
	// Agents is the server pair: the Consul server and the Nomad server,
	// their addresses (what NOMAD_ADDR and CONSUL_HTTP_ADDR name) and
	// logs. Its own Stop and Alive see only the servers: use the
	// Cluster's.
	Agents
	Nodes []*Node

	o        ClusterOptions
	env      []string
	loopback *Loopback
	// leftovers are the processes below Nomad clients that were killed
	// or stopped, to be ended by Stop should any still run.
	leftovers []processTree
}

// Node is one client node of a Cluster.
type Node struct {
	// Name is the node's name in Nomad and in Consul ("node-1").
	Name string
	// Addr is the node's own address: its agents listen there, and its
	// allocations' ports that name HostNetwork get it.
	Addr netip.Addr
	// ID is the node's ID in Nomad, known once it registered.
	ID    string
	Ports NodePorts
	// NomadAddr is the Nomad client's HTTP API (http://addr:port);
	// ConsulAddr the node's Consul agent's (addr:port).
	NomadAddr, ConsulAddr string
	// Dir holds the node's configurations, data and logs.
	Dir string
	// Consul and Nomad are the node's agents; after a kill they are the
	// ended processes until RestartNode starts new ones.
	Consul, Nomad *Proc

	consulCfg, nomadCfg       string
	consulKilled, nomadKilled bool
	consulStarts, nomadStarts int
	consulAgent               agentHTTP
}

// StartCluster adds the nodes' addresses to lo, writes every configuration,
// starts the Consul server, the nodes' Consul agents, the Nomad server and
// the nodes' Nomad clients, and returns once every node is ready in Nomad
// with a healthy raw_exec driver. On error (ctx ending included) it stops
// everything it started and removes the addresses before returning.
func StartCluster(ctx context.Context, o ClusterOptions) (c *Cluster, err error) {
	if o.ConsulBin == "" || o.NomadBin == "" || o.Dir == "" {
		return nil, errors.New("start a dev cluster: ConsulBin, NomadBin and Dir are required")
	}
	if o.Nodes < 1 {
		return nil, fmt.Errorf("start a dev cluster: want at least 1 node, got %d", o.Nodes)
	}
	if !o.FirstAddr.IsValid() {
		o.FirstAddr = DefaultFirstNodeAddr()
	}
	if o.IPBin == "" {
		if o.IPBin, err = exec.LookPath("ip"); err != nil {
			return nil, fmt.Errorf("start a dev cluster: its nodes' addresses are added to lo with ip (iproute2): %w", err)
		}
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
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	addrs, err := NodeAddrs(o.FirstAddr, o.Nodes)
	if err != nil {
		return nil, fmt.Errorf("start a dev cluster: %w", err)
	}
	ports, err := o.Ports.FillFree()
	if err != nil {
		return nil, err
	}
	c = &Cluster{
		Agents: Agents{
			Ports:      ports,
			NomadAddr:  "http://127.0.0.1:" + strconv.Itoa(ports.NomadHTTP),
			ConsulAddr: "127.0.0.1:" + strconv.Itoa(ports.ConsulHTTP),
			progress:   o.Progress,
		},
		o:   o,
		env: ChildEnv(os.Environ()),
	}
	c.ConsulURL = "http://" + c.ConsulAddr
	defer func() {
		if err != nil {
			for _, line := range c.Stop(o.StopGrace) {
				fmt.Fprintln(o.Progress, line)
			}
			c = nil
		}
	}()

	fmt.Fprintf(o.Progress, "Adding the nodes' addresses %s to lo...\n", addrRange(addrs))
	if c.loopback, err = HoldLoopback(o.IPBin, filepath.Join(o.Dir, "loopback.log"), addrs, o.Guard); err != nil {
		return c, fmt.Errorf("start a dev cluster: %w", err)
	}
	if err := c.writeConfigs(addrs); err != nil {
		return c, err
	}

	consul := agentHTTP{base: c.ConsulURL, tokenHeader: "X-Consul-Token"}
	serverDir := filepath.Join(o.Dir, "server")
	if c.Consul, err = c.start("Consul server", o.ConsulBin, []string{"agent", "-dev", "-config-file", filepath.Join(serverDir, "consul.hcl")}, filepath.Join(serverDir, "consul.log"), false); err != nil {
		return c, err
	}
	if err := WaitFor(ctx, c.Consul, "the Consul server at "+c.ConsulURL, o.ReadyTimeout, o.Poll, consul.leaderIs(c.Ports.consulLeader())); err != nil {
		return c, err
	}
	for _, n := range c.Nodes {
		if err := c.startConsulAgent(n); err != nil {
			return c, err
		}
	}
	for _, n := range c.Nodes {
		if err := c.waitConsulAgent(ctx, n); err != nil {
			return c, err
		}
	}

	nomad := agentHTTP{base: c.NomadAddr, tokenHeader: "X-Nomad-Token"}
	if c.Nomad, err = c.start("Nomad server", o.NomadBin, []string{"agent", "-config", filepath.Join(serverDir, "nomad.hcl")}, filepath.Join(serverDir, "nomad.log"), false); err != nil {
		return c, err
	}
	if err := WaitFor(ctx, c.Nomad, "the Nomad server at "+c.NomadAddr, o.ReadyTimeout, o.Poll, nomad.leaderIs(c.Ports.nomadLeader())); err != nil {
		return c, err
	}
	for _, n := range c.Nodes {
		if err := c.startNomadClient(n); err != nil {
			return c, err
		}
	}
	for _, n := range c.Nodes {
		if err := c.waitNomadClient(ctx, n); err != nil {
			return c, err
		}
	}
	return c, nil
}

// writeConfigs picks the nodes' ports and writes every configuration file.
func (c *Cluster) writeConfigs(addrs []netip.Addr) error {
	serverDir := filepath.Join(c.o.Dir, "server")
	if err := os.MkdirAll(serverDir, 0o755); err != nil {
		return fmt.Errorf("start a dev cluster: %w", err)
	}
	co := ConfigOptions{LogLevel: c.o.LogLevel, CPUTotalCompute: c.o.CPUTotalCompute, HeartbeatTTL: c.o.HeartbeatTTL, HeartbeatGrace: c.o.HeartbeatGrace}
	files := map[string]string{
		filepath.Join(serverDir, "consul.hcl"): ClusterConsulServerConfig(c.Ports, co),
		filepath.Join(serverDir, "nomad.hcl"):  ClusterNomadServerConfig(c.Ports, filepath.Join(serverDir, "nomad-data"), co),
	}
	for i, a := range addrs {
		n := &Node{Name: "node-" + strconv.Itoa(i+1), Addr: a, Dir: filepath.Join(c.o.Dir, "node-"+strconv.Itoa(i+1))}
		if err := os.MkdirAll(n.Dir, 0o755); err != nil {
			return fmt.Errorf("start a dev cluster: %w", err)
		}
		if err := fillFreeOn(a.String(), n.Ports.fields()); err != nil {
			return fmt.Errorf("start a dev cluster: ports of %s: %w", n.Name, err)
		}
		lo, hi := DynamicPortRange(i, len(addrs))
		nc := NodeConfig{
			Name: n.Name, Addr: a, Ports: n.Ports,
			ConsulDataDir: filepath.Join(n.Dir, "consul-data"), NomadDataDir: filepath.Join(n.Dir, "nomad-data"),
			ConsulJoin:     "127.0.0.1:" + strconv.Itoa(c.Ports.ConsulSerfLAN),
			NomadServer:    "127.0.0.1:" + strconv.Itoa(c.Ports.NomadRPC),
			ServerRPCPort:  c.Ports.ConsulServer,
			MinDynamicPort: lo, MaxDynamicPort: hi,
		}
		n.NomadAddr = "http://" + net.JoinHostPort(a.String(), strconv.Itoa(n.Ports.NomadHTTP))
		n.ConsulAddr = net.JoinHostPort(a.String(), strconv.Itoa(n.Ports.ConsulHTTP))
		n.consulAgent = agentHTTP{base: "http://" + n.ConsulAddr, tokenHeader: "X-Consul-Token"}
		n.consulCfg, n.nomadCfg = filepath.Join(n.Dir, "consul.hcl"), filepath.Join(n.Dir, "nomad.hcl")
		files[n.consulCfg] = NodeConsulConfig(nc, co)
		files[n.nomadCfg] = NodeNomadConfig(nc, co)
		c.Nodes = append(c.Nodes, n)
	}
	for path, text := range files {
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			return fmt.Errorf("start a dev cluster: write %s: %w", path, err)
		}
	}
	return nil
}

// start starts one agent, says so, and registers it with the guard.
func (c *Cluster) start(name, bin string, args []string, logPath string, appendLog bool) (*Proc, error) {
	fmt.Fprintf(c.o.Progress, "Starting the %s (%s, log %s)...\n", name, bin, logPath)
	p, err := StartProc(Command{Name: name, Path: bin, Args: args, Env: c.env, LogPath: logPath, AppendLog: appendLog})
	if err != nil {
		return nil, err
	}
	c.o.Guard.StopFirst(p.Pid(), p.Name)
	return p, nil
}

func (c *Cluster) startConsulAgent(n *Node) (err error) {
	n.Consul, err = c.start("Consul agent of "+n.Name+" ("+n.Addr.String()+")", c.o.ConsulBin,
		[]string{"agent", "-config-file", n.consulCfg}, filepath.Join(n.Dir, "consul.log"), n.consulStarts > 0)
	n.consulStarts++
	n.consulKilled = false
	return err
}

// waitConsulAgent waits until the node's Consul agent has joined and knows
// the leader.
func (c *Cluster) waitConsulAgent(ctx context.Context, n *Node) error {
	return WaitFor(ctx, n.Consul, "the Consul agent of "+n.Name+" at "+n.ConsulAddr, c.o.ReadyTimeout, c.o.Poll, n.consulAgent.leaderIs(c.Ports.consulLeader()))
}

func (c *Cluster) startNomadClient(n *Node) (err error) {
	n.Nomad, err = c.start("Nomad client of "+n.Name+" ("+n.Addr.String()+")", c.o.NomadBin,
		[]string{"agent", "-config", n.nomadCfg}, filepath.Join(n.Dir, "nomad.log"), n.nomadStarts > 0)
	n.nomadStarts++
	n.nomadKilled = false
	return err
}

// waitNomadClient waits until the Nomad server lists the node ready with a
// healthy raw_exec driver, and notes its ID.
func (c *Cluster) waitNomadClient(ctx context.Context, n *Node) error {
	nomad := agentHTTP{base: c.NomadAddr, tokenHeader: "X-Nomad-Token"}
	return WaitFor(ctx, n.Nomad, "node "+n.Name+" in the Nomad server at "+c.NomadAddr, c.o.ReadyTimeout, c.o.Poll, func(ctx context.Context) error {
		var nodes []struct {
			ID, Name, Status string
			Drivers          map[string]struct{ Detected, Healthy bool }
		}
		if err := nomad.do(ctx, http.MethodGet, "/v1/nodes", &nodes); err != nil {
			return err
		}
		status := "not registered"
		for _, nd := range nodes {
			if nd.Name != n.Name {
				continue
			}
			d, ok := nd.Drivers["raw_exec"]
			if nd.Status == "ready" && ok && d.Healthy {
				n.ID = nd.ID
				return nil
			}
			status = fmt.Sprintf("%s, raw_exec detected=%v healthy=%v", nd.Status, d.Detected, d.Healthy)
		}
		return fmt.Errorf("%s is %s", n.Name, status)
	})
}

// Node returns the node called name, or nil.
func (c *Cluster) Node(name string) *Node {
	for _, n := range c.Nodes {
		if n.Name == name {
			return n
		}
	}
	return nil
}

// NodeAt returns the node whose address is addr (a node's allocations
// report it as their ports' host IP), or nil.
func (c *Cluster) NodeAt(addr string) *Node {
	for _, n := range c.Nodes {
		if n.Addr.String() == addr {
			return n
		}
	}
	return nil
}

// KillClient kill -9s node n's Nomad client alone, as a crash of that agent
// would: its tasks run on, orphaned, and its Consul agent keeps their checks
// passing, while the server marks the node down after its heartbeat TTL
// (ClusterMinHeartbeatTTL) and replaces its allocations. RestartNode starts
// the client again (it then stops the orphans itself); Stop ends them
// otherwise. It returns when the signal went out (what it does first, a
// look at the processes below the client for Stop, takes a few
// milliseconds).
func (c *Cluster) KillClient(n *Node) (KillWindow, error) {
	if n.Nomad == nil || n.Nomad.Exited() {
		return KillWindow{}, fmt.Errorf("kill the Nomad client of %s: it is not running", n.Name)
	}
	c.leftovers = append(c.leftovers, snapshotTree(n.Nomad.Pid()))
	n.nomadKilled = true
	at := time.Now()
	if err := syscall.Kill(n.Nomad.Pid(), syscall.SIGKILL); err != nil {
		return KillWindow{at, at}, fmt.Errorf("kill the Nomad client of %s (pid %d): %w", n.Name, n.Nomad.Pid(), err)
	}
	<-n.Nomad.Done()
	return KillWindow{at, at}, nil
}

// KillWindow is when a kill happened: From just before the first signal,
// To once every process killed was dead. A request the node was serving at
// any moment in between may have been cut.
type KillWindow struct{ From, To time.Time }

// KillNode kill -9s everything of node n, as if its machine died: its Nomad
// client first (so it reports nothing), then its Consul agent (so only the
// Consul server's failure detection notices), then every process the client
// had started (executors, logmon, tasks), all within a moment. Nomad marks
// the node down after its heartbeat TTL, Consul its checks critical once
// its gossip finds the agent gone. RestartNode brings the node back. It
// returns when the first signal went out and when the last of the
// processes was dead: they are killed one after the other, and a killed
// process takes some milliseconds to die (its sockets close then).
func (c *Cluster) KillNode(n *Node) (KillWindow, error) {
	if n.Nomad == nil || n.Nomad.Exited() || n.Consul == nil || n.Consul.Exited() {
		return KillWindow{}, fmt.Errorf("kill node %s: its agents are not both running", n.Name)
	}
	tree := snapshotTree(n.Nomad.Pid())
	c.leftovers = append(c.leftovers, tree)
	n.nomadKilled, n.consulKilled = true, true
	w := KillWindow{From: time.Now()}
	var errs []error
	for _, p := range []*Proc{n.Nomad, n.Consul} {
		if err := syscall.Kill(p.Pid(), syscall.SIGKILL); err != nil {
			errs = append(errs, fmt.Errorf("kill %s (pid %d): %w", p.Name, p.Pid(), err))
		}
	}
	tree.kill()
	<-n.Nomad.Done()
	<-n.Consul.Done()
	tree.waitGone(10 * time.Second)
	w.To = time.Now()
	if len(errs) > 0 {
		return w, fmt.Errorf("kill node %s: %w", n.Name, errors.Join(errs...))
	}
	return w, nil
}

// RestartNode starts whatever of node n does not run (its Consul agent
// first, then its Nomad client) with the same configuration and data, and
// waits until the Consul agent has joined and Nomad lists the node ready.
// Their logs go on after the earlier ones.
func (c *Cluster) RestartNode(ctx context.Context, n *Node) error {
	if n.Consul == nil || n.Consul.Exited() {
		if err := c.startConsulAgent(n); err != nil {
			return fmt.Errorf("restart %s: %w", n.Name, err)
		}
		if err := c.waitConsulAgent(ctx, n); err != nil {
			return fmt.Errorf("restart %s: %w", n.Name, err)
		}
	}
	if n.Nomad == nil || n.Nomad.Exited() {
		if err := c.startNomadClient(n); err != nil {
			return fmt.Errorf("restart %s: %w", n.Name, err)
		}
	}
	if err := c.waitNomadClient(ctx, n); err != nil {
		return fmt.Errorf("restart %s: %w", n.Name, err)
	}
	return nil
}

// RestartConsulAgent restarts node n's Consul agent as an operator's
// `systemctl restart consul` would: SIGTERM (the agent leaves the cluster
// gracefully, leave_on_terminate), a wait of at most grace for it to exit
// (then SIGKILL), and a start with the same configuration and data, which
// loads the services and checks it persisted. It returns when the agent
// has joined again and knows the leader, with the window from the signal
// to then.
func (c *Cluster) RestartConsulAgent(ctx context.Context, n *Node, grace time.Duration) (KillWindow, error) {
	if n.Consul == nil || n.Consul.Exited() {
		return KillWindow{}, fmt.Errorf("restart the Consul agent of %s: it is not running", n.Name)
	}
	w := KillWindow{From: time.Now()}
	n.consulKilled = true
	_ = syscall.Kill(n.Consul.Pid(), syscall.SIGTERM)
	select {
	case <-n.Consul.Done():
	case <-time.After(grace):
		_ = syscall.Kill(-n.Consul.Pid(), syscall.SIGKILL)
		<-n.Consul.Done()
	}
	if err := c.startConsulAgent(n); err != nil {
		return w, fmt.Errorf("restart the Consul agent of %s: %w", n.Name, err)
	}
	if err := c.waitConsulAgent(ctx, n); err != nil {
		return w, fmt.Errorf("restart the Consul agent of %s: %w", n.Name, err)
	}
	w.To = time.Now()
	return w, nil
}

// Alive returns an error describing the first agent that has exited other
// than by KillClient or KillNode.
func (c *Cluster) Alive() error {
	procs := []*Proc{c.Consul, c.Nomad}
	for _, n := range c.Nodes {
		if !n.consulKilled {
			procs = append(procs, n.Consul)
		}
		if !n.nomadKilled {
			procs = append(procs, n.Nomad)
		}
	}
	for _, p := range procs {
		if p != nil && p.Exited() {
			return errors.New(p.Describe())
		}
	}
	return nil
}

// Stop stops the cluster and leaves nothing of it behind: it drains every
// live node (Nomad stops their allocations, as a dev agent does on its
// way out; at most grace), stops the Nomad clients, the Nomad server, the
// nodes' Consul agents and the Consul server (each StopAll with grace),
// kills what the Nomad clients left running (the orphans of a killed
// client, allocations a drain did not stop in time), unmounts what they
// left mounted below Dir, and removes the nodes' addresses. It returns a
// line for each thing that did not go as it should.
func (c *Cluster) Stop(grace time.Duration) []string {
	var notes []string
	notes = append(notes, c.drain(grace)...)
	var clients, consuls []*Proc
	for _, n := range c.Nodes {
		if n.Nomad != nil && !n.Nomad.Exited() {
			c.leftovers = append(c.leftovers, snapshotTree(n.Nomad.Pid()))
		}
		clients = append(clients, n.Nomad)
		consuls = append(consuls, n.Consul)
	}
	// Each kind at once: a Consul client's graceful leave alone takes
	// about 4 s.
	notes = append(notes, stopTogether(c.o.Progress, grace, clients...)...)
	notes = append(notes, StopAll(c.o.Progress, grace, c.Nomad)...)
	notes = append(notes, stopTogether(c.o.Progress, grace, consuls...)...)
	notes = append(notes, StopAll(c.o.Progress, grace, c.Consul)...)
	killed := 0
	for _, t := range c.leftovers {
		killed += t.kill()
	}
	c.leftovers = nil
	if killed > 0 {
		notes = append(notes, fmt.Sprintf("Killed %d processes the nodes' Nomad clients left running.", killed))
	}
	if _, err := unmountBelow(c.o.Dir); err != nil {
		notes = append(notes, err.Error())
	}
	if c.loopback != nil {
		fmt.Fprintf(c.o.Progress, "Removing the nodes' addresses %s from lo...\n", addrRange(c.loopback.Addrs()))
		if err := c.loopback.Release(grace); err != nil {
			notes = append(notes, err.Error())
		}
	}
	return notes
}

// stopTogether is StopAll with every process stopped at once.
func stopTogether(w io.Writer, grace time.Duration, procs ...*Proc) []string {
	var mu sync.Mutex
	var wg sync.WaitGroup
	var killed []string
	for _, p := range procs {
		if p == nil || p.Exited() {
			continue
		}
		fmt.Fprintf(w, "Stopping %s...\n", p.Name)
		wg.Add(1)
		go func() {
			defer wg.Done()
			if p.Stop(grace) {
				mu.Lock()
				killed = append(killed, fmt.Sprintf("%s did not stop within %s after SIGINT; killed it.", p.Name, grace))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return killed
}

// drain has Nomad stop the allocations of every node whose client runs (a
// drain with a deadline in the past, as `nomad node drain -force`), and
// waits up to grace until none runs. A Nomad client that is not in dev mode
// leaves its tasks running when it stops, for its next start to take
// them back.
func (c *Cluster) drain(grace time.Duration) []string {
	if c.Nomad == nil || c.Nomad.Exited() {
		return nil
	}
	nomad := agentHTTP{base: c.NomadAddr, tokenHeader: "X-Nomad-Token"}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	var nodes []*Node
	var notes []string
	for _, n := range c.Nodes {
		if n.ID == "" || n.Nomad == nil || n.Nomad.Exited() {
			continue
		}
		fmt.Fprintf(c.o.Progress, "Draining %s (Nomad stops its allocations)...\n", n.Name)
		body := map[string]any{"DrainSpec": map[string]any{"Deadline": -time.Second}, "MarkEligible": false}
		if err := nomad.send(ctx, http.MethodPost, "/v1/node/"+n.ID+"/drain", body, &struct{}{}); err != nil {
			notes = append(notes, fmt.Sprintf("Drain %s: %v", n.Name, err))
			continue
		}
		nodes = append(nodes, n)
	}
	for _, n := range nodes {
		var live int
		err := WaitFor(ctx, n.Nomad, "the allocations of "+n.Name+" to stop", grace, c.o.Poll, func(ctx context.Context) error {
			var allocs []struct{ ClientStatus string }
			if err := nomad.do(ctx, http.MethodGet, "/v1/node/"+n.ID+"/allocations", &allocs); err != nil {
				return err
			}
			live = 0
			for _, a := range allocs {
				if a.ClientStatus == "running" || a.ClientStatus == "pending" {
					live++
				}
			}
			if live > 0 {
				return fmt.Errorf("%d allocations still running", live)
			}
			return nil
		})
		switch {
		case err == nil:
		case live > 0:
			notes = append(notes, fmt.Sprintf("Drain %s: %d allocations still running after %s; stopping it anyway.", n.Name, live, grace))
		default:
			notes = append(notes, fmt.Sprintf("Drain %s: %s", n.Name, firstLine(err.Error())))
		}
	}
	return notes
}

// addrRange is "127.0.0.2" or "127.0.0.2-127.0.0.4".
func addrRange(addrs []netip.Addr) string {
	switch len(addrs) {
	case 0:
		return "(none)"
	case 1:
		return addrs[0].String()
	}
	return addrs[0].String() + "-" + addrs[len(addrs)-1].String()
}
