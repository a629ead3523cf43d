package e2e

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

// ProdCluster is scenario 26's cluster: a Consul server and a Nomad server
// on ProdServerAddr, and Nodes nodes, each a Consul client agent and a Nomad
// client on ProdNodeAddr(i), every one of them with ACLs (default deny),
// mutual TLS and (Consul) gossip encryption. Its methods are not safe for
// concurrent use.
type ProdCluster struct {
	Dir string
	CA  *CA
	// User is the certificate the harness and the deploy user show the
	// agents (HTTPS with verify_incoming / verify_https_client).
	User TLSFiles
	// ConsulToken and NomadToken are the management tokens.
	ConsulToken, NomadToken string
	Nodes                   int
	procs                   []*devagents.Proc
	links                   []string
}

// ProdClusterOptions say where the agents are and what to tell.
type ProdClusterOptions struct {
	ConsulBin, NomadBin, Dir string
	Nodes                    int
	LogLevel                 string
	ReadyTimeout             time.Duration
	Progress                 io.Writer
	Guard                    *devagents.Guard
	// DockerEndpoint enables the nodes' docker driver with this dockerd.
	DockerEndpoint string
}

// NomadURL and ConsulAddr are the servers' HTTPS APIs, as NOMAD_ADDR and
// CONSUL_HTTP_ADDR (with CONSUL_HTTP_SSL=true) want them.
func (c *ProdCluster) NomadURL() string {
	return fmt.Sprintf("https://%s:%d", ProdServerAddr(), NomadHTTPPort)
}
func (c *ProdCluster) ConsulAddr() string {
	return fmt.Sprintf("%s:%d", ProdServerAddr(), ConsulHTTPSPort)
}

// NomadClient is an API client of the Nomad server over mutual TLS with
// token (the management token when "").
func (c *ProdCluster) NomadClient(token string) (*nomad.Client, error) {
	if token == "" {
		token = c.NomadToken
	}
	cl, err := nomad.NewClient(&nomad.Config{Address: c.NomadURL(), SecretID: token,
		TLSConfig: &nomad.TLSConfig{CACert: c.User.CA, ClientCert: c.User.Cert, ClientKey: c.User.Key}})
	if err != nil {
		return nil, fmt.Errorf("make a Nomad client of %s: %w", c.NomadURL(), err)
	}
	return cl, nil
}

// ConsulClient is an API client of the Consul server over mutual TLS with
// token (the management token when "").
func (c *ProdCluster) ConsulClient(token string) (*consul.Client, error) {
	if token == "" {
		token = c.ConsulToken
	}
	cl, err := consul.NewClient(&consul.Config{Address: c.ConsulAddr(), Scheme: "https", Token: token,
		TLSConfig: consul.TLSConfig{Address: "server.dc1.consul", CAFile: c.User.CA, CertFile: c.User.Cert, KeyFile: c.User.Key}})
	if err != nil {
		return nil, fmt.Errorf("make a Consul client of %s: %w", c.ConsulAddr(), err)
	}
	return cl, nil
}

// Env is what the binary under test and the agents' CLIs need to reach the
// cluster as a user holding nomadToken and consulToken over HTTPS with the
// CA: the variables deploy/README.md tells a reader to set.
func (c *ProdCluster) Env(nomadToken, consulToken string) map[string]string {
	return map[string]string{
		"NOMAD_ADDR": c.NomadURL(), "NOMAD_TOKEN": nomadToken,
		"NOMAD_CACERT": c.User.CA, "NOMAD_CLIENT_CERT": c.User.Cert, "NOMAD_CLIENT_KEY": c.User.Key,
		"CONSUL_HTTP_ADDR": c.ConsulAddr(), "CONSUL_HTTP_SSL": "true", "CONSUL_HTTP_TOKEN": consulToken,
		"CONSUL_CACERT": c.User.CA, "CONSUL_CLIENT_CERT": c.User.Cert, "CONSUL_CLIENT_KEY": c.User.Key,
		"CONSUL_TLS_SERVER_NAME": "server.dc1.consul",
	}
}

// agentDir is an agent's directory below the cluster's: short, because
// Nomad makes each task's API socket below its data_dir
// (d/alloc/<alloc ID>/<task>/secrets/api.sock) and a unix socket's path
// has 108 bytes at most. kind is "c" (Consul) or "n" (Nomad); node 0 is
// the server.
func agentDir(kind string, i int) string {
	if i == 0 {
		return kind + "s"
	}
	return fmt.Sprintf("%s%d", kind, i)
}

// IssueClient is a client certificate of the cluster's CA for cn (a
// control plane, a user), written in the cluster's tls directory.
func (c *ProdCluster) IssueClient(cn string) (TLSFiles, error) {
	l, err := c.CA.Issue(cn, []string{cn}, nil)
	if err != nil {
		return TLSFiles{}, err
	}
	return c.CA.Write(filepath.Join(c.Dir, "tls"), cn, l)
}

// StartProdCluster makes the CA and the certificates, writes every
// configuration, starts the agents, bootstraps Nomad's ACLs and returns once
// every node is ready in Nomad. On error it stops what it started.
func StartProdCluster(ctx context.Context, o ProdClusterOptions) (c *ProdCluster, err error) {
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = 90 * time.Second
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	started := &ProdCluster{Dir: o.Dir, Nodes: o.Nodes}
	c = started
	defer func() {
		// Not c: a failing return sets it to nil.
		if err != nil {
			started.Stop(10 * time.Second)
		}
	}()
	if c.CA, err = NewCA("nomad-serverless e2e 26 CA"); err != nil {
		return nil, err
	}
	tlsDir := filepath.Join(o.Dir, "tls")
	if err := os.MkdirAll(tlsDir, 0o755); err != nil {
		return nil, fmt.Errorf("start the production cluster: %w", err)
	}
	issue := func(name, cn string, addr string) (TLSFiles, error) {
		dns := []string{cn, "localhost"}
		ips := []net.IP{net.ParseIP("127.0.0.1")}
		if addr != "" {
			ips = append(ips, net.ParseIP(addr))
		}
		l, err := c.CA.Issue(cn, dns, ips)
		if err != nil {
			return TLSFiles{}, err
		}
		return c.CA.Write(tlsDir, name, l)
	}
	if c.User, err = issue("user", "user", ""); err != nil {
		return nil, err
	}
	key, err := GossipKey()
	if err != nil {
		return nil, err
	}
	if c.ConsulToken, err = randomUUID(); err != nil {
		return nil, err
	}
	env := devagents.ChildEnv(os.Environ())

	start := func(name, bin, cfg, dir string) (*devagents.Proc, error) {
		fmt.Fprintf(o.Progress, "Starting %s (log %s)...\n", name, filepath.Join(dir, "agent.log"))
		// Consul's flag is -config-file, Nomad's -config.
		flag := "-config-file"
		if bin == o.NomadBin {
			flag = "-config"
		}
		p, err := devagents.StartProc(devagents.Command{Name: name, Path: bin, Args: []string{"agent", flag, cfg}, Env: env, LogPath: filepath.Join(dir, "agent.log")})
		if err != nil {
			return nil, fmt.Errorf("start %s: %w", name, err)
		}
		o.Guard.StopFirst(p.Pid(), p.Name)
		c.procs = append(c.procs, p)
		return p, nil
	}
	writeCfg := func(dir, body string) (string, error) {
		if err := os.MkdirAll(filepath.Join(dir, "d"), 0o755); err != nil {
			return "", fmt.Errorf("write %s: %w", dir, err)
		}
		p := filepath.Join(dir, "agent.hcl")
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return "", fmt.Errorf("write %s: %w", p, err)
		}
		return p, nil
	}

	// Consul first: the server, then each node's agent.
	cc, err := c.ConsulClient("")
	if err != nil {
		return nil, err
	}
	for i := 0; i <= o.Nodes; i++ {
		name, addr, cn := "server", ProdServerAddr(), "server.dc1.consul"
		if i > 0 {
			name, addr, cn = fmt.Sprintf("node-%d", i), ProdNodeAddr(i), "client.dc1.consul"
		}
		dir := filepath.Join(o.Dir, agentDir("c", i))
		tf, err := issue("consul-"+name, cn, addr)
		if err != nil {
			return nil, err
		}
		cfg, err := writeCfg(dir, ProdConsulConfig{Name: name, Addr: addr, DataDir: filepath.Join(dir, "d"), Server: i == 0, JoinAddr: ProdServerAddr(),
			TLS: tf, GossipKey: key, ManagementToken: c.ConsulToken, AgentToken: c.ConsulToken, LogLevel: o.LogLevel}.Render())
		if err != nil {
			return nil, err
		}
		p, err := start("Consul "+name+" ("+addr+")", o.ConsulBin, cfg, dir)
		if err != nil {
			return nil, err
		}
		if err := devagents.WaitFor(ctx, p, "Consul "+name, o.ReadyTimeout, 200*time.Millisecond, func(ctx context.Context) error {
			if i == 0 {
				l, err := cc.Status().Leader()
				if err == nil && l == "" {
					err = errors.New("no leader yet")
				}
				return err
			}
			ms, err := cc.Agent().Members(false)
			if err != nil {
				return err
			}
			for _, m := range ms {
				if m.Name == name && m.Status == 1 {
					return nil
				}
			}
			return fmt.Errorf("%s not a live member yet", name)
		}); err != nil {
			return nil, fmt.Errorf("start the production cluster: %w", err)
		}
	}

	// Each node's own interface, holding its address alone: a veth pair
	// (no dummy module here), whose peer stays unaddressed.
	for i := 1; i <= o.Nodes; i++ {
		if err := c.addInterface(NodeInterface(i), ProdNodeAddr(i)); err != nil {
			return nil, fmt.Errorf("start the production cluster: %w", err)
		}
	}

	// Then Nomad: the server (bootstrapped), then each node's client.
	for i := 0; i <= o.Nodes; i++ {
		name, addr, cn := "server", ProdServerAddr(), "server.global.nomad"
		if i > 0 {
			name, addr, cn = fmt.Sprintf("node-%d", i), ProdNodeAddr(i), "client.global.nomad"
		}
		dir := filepath.Join(o.Dir, agentDir("n", i))
		tf, err := issue("nomad-"+name, cn, addr)
		if err != nil {
			return nil, err
		}
		ctf, err := issue("nomad-"+name+"-to-consul", "nomad-"+name, addr)
		if err != nil {
			return nil, err
		}
		nc := ProdNomadConfig{Name: name, Addr: addr, DataDir: filepath.Join(dir, "d"), Server: i == 0, ServerAddr: ProdServerAddr(),
			TLS: tf, ConsulAddr: addr, ConsulToken: c.ConsulToken, ConsulTLS: ctf, LogLevel: o.LogLevel}
		if i > 0 {
			nc.NetworkInterface, nc.DockerEndpoint = NodeInterface(i), o.DockerEndpoint
			nc.MinDynamicPort, nc.MaxDynamicPort = NodeDynamicPorts(i)
		}
		cfg, err := writeCfg(dir, nc.Render())
		if err != nil {
			return nil, err
		}
		p, err := start("Nomad "+name+" ("+addr+")", o.NomadBin, cfg, dir)
		if err != nil {
			return nil, err
		}
		if i == 0 {
			anon, err := c.NomadClient("anonymous")
			if err != nil {
				return nil, err
			}
			if err := devagents.WaitFor(ctx, p, "Nomad server", o.ReadyTimeout, 200*time.Millisecond, func(context.Context) error {
				tok, _, err := anon.ACLTokens().Bootstrap(nil)
				if err != nil {
					return err
				}
				c.NomadToken = tok.SecretID
				return nil
			}); err != nil {
				return nil, fmt.Errorf("start the production cluster: bootstrap Nomad's ACLs: %w", err)
			}
			continue
		}
		api, err := c.NomadClient("")
		if err != nil {
			return nil, err
		}
		if err := devagents.WaitFor(ctx, p, "Nomad "+name, o.ReadyTimeout, 200*time.Millisecond, func(context.Context) error {
			ns, _, err := api.Nodes().List(nil)
			if err != nil {
				return err
			}
			for _, n := range ns {
				if n.Name == name && n.Status == "ready" {
					return nil
				}
			}
			return fmt.Errorf("%s not ready yet", name)
		}); err != nil {
			return nil, fmt.Errorf("start the production cluster: %w", err)
		}
	}
	return c, nil
}

// PurgeJobs stops every job, waits up to timeout until no allocation
// runs, then purges them: unlike a dev agent, a Nomad client that stops leaves
// its tasks running (so an agent's restart does not stop the cluster's
// work), and the scenario must leave nothing behind.
func (c *ProdCluster) PurgeJobs(timeout time.Duration) error {
	nc, err := c.NomadClient("")
	if err != nil {
		return err
	}
	q := &nomad.QueryOptions{Namespace: "*"}
	jobs, _, err := nc.Jobs().List(q)
	if err != nil {
		return fmt.Errorf("purge the scenario's jobs: list: %w", err)
	}
	// Stopped, not purged: a purged job's allocations leave the server's
	// state before the clients have stopped them, and the wait below
	// would see nothing running while the tasks still run.
	for _, j := range jobs {
		if _, _, err := nc.Jobs().Deregister(j.ID, false, &nomad.WriteOptions{Namespace: j.Namespace}); err != nil {
			return fmt.Errorf("stop job %s: %w", j.ID, err)
		}
	}
	deadline := time.Now().Add(timeout)
	for {
		allocs, _, err := nc.Allocations().List(q)
		if err != nil {
			return fmt.Errorf("purge the scenario's jobs: list allocations: %w", err)
		}
		var running []string
		for _, a := range allocs {
			if a.ClientStatus == nomad.AllocClientStatusRunning || a.ClientStatus == nomad.AllocClientStatusPending {
				running = append(running, a.JobID+"/"+a.ID[:8])
			}
		}
		if len(running) == 0 {
			for _, j := range jobs {
				_, _, _ = nc.Jobs().Deregister(j.ID, true, &nomad.WriteOptions{Namespace: j.Namespace})
			}
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("purge the scenario's jobs: still running after %s: %v", timeout, running)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// Stop stops every agent, clients before servers, and returns one line per
// agent that had to be killed.
func (c *ProdCluster) Stop(grace time.Duration) []string {
	var out []string
	// Nomad's plugin processes (executors, logmon) outlive a client
	// that stops, even for allocations that ended.
	var left []devagents.Leftovers
	for _, p := range c.procs {
		if !p.Exited() {
			left = append(left, devagents.SnapshotLeftovers(p.Pid()))
		}
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		if c.procs[i].Stop(grace) {
			out = append(out, c.procs[i].Name+" did not stop in "+grace.String()+": killed")
		}
	}
	for _, l := range left {
		l.Kill(grace)
	}
	c.procs = nil
	for _, l := range c.links {
		if out2, err := exec.Command("ip", "link", "del", l).CombinedOutput(); err != nil {
			out = append(out, fmt.Sprintf("remove interface %s: %v: %s", l, err, strings.TrimSpace(string(out2))))
		}
	}
	c.links = nil
	return out
}

// addInterface makes a veth pair name/name+"p", puts addr/32 on name and
// brings both up; Stop removes it. One left by an earlier run that died is
// removed first.
func (c *ProdCluster) addInterface(name, addr string) error {
	_ = exec.Command("ip", "link", "del", name).Run()
	for _, args := range [][]string{
		{"link", "add", name, "type", "veth", "peer", "name", name + "p"},
		{"addr", "add", addr + "/32", "dev", name},
		{"link", "set", name, "up"},
		{"link", "set", name + "p", "up"},
	} {
		out, err := exec.Command("ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %s: %w: %s (the scenario makes one interface per node and needs root)", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
		}
		if args[0] == "link" && args[1] == "add" {
			c.links = append(c.links, name)
		}
	}
	return nil
}

// randomUUID is a random UUID (version 4), the form Consul wants its
// tokens in.
func randomUUID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("make a UUID: %w", err)
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:]), nil
}
