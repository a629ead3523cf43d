package dev

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

// Config is one dev session's settings. The command fills it from flags;
// tests fill it directly (fake agents on PATH, a fake serve, short bounds,
// hooks).
type Config struct {
	Listen, AdminListen, Domain   string
	ConsulHTTPPort, NomadHTTPPort int

	// InternalListen is serve's -internal-listen, where internal services
	// (visibility = "internal") are served too; "" opens none.
	InternalListen string

	// DataDir holds the agents' configs, data and logs; empty makes a
	// temporary one that is removed at the end (kept when dev fails).
	DataDir string
	// Executable runs `serve` (this binary); -deploy uses it as the
	// sidecar and as the file's `binary` variable.
	Executable string
	// Deploy is a service file to deploy once everything runs ("": none).
	Deploy string
	// OrDemo runs the demonstration instead of failing when consul or
	// nomad is not on PATH.
	OrDemo bool
	// Nodes, when above 0, runs a dev cluster of that many client nodes
	// (devagents.StartCluster) instead of one dev agent; the ports above
	// are then the servers'.
	Nodes int

	// Bounds: how long each agent and serve may take to become ready, and
	// how long each may take to stop after SIGINT before it is killed.
	ReadyTimeout time.Duration
	StopGrace    time.Duration
	Poll         time.Duration
	// ZeroWait bounds the wait for the deployed revision to scale to zero;
	// 0 is its stable window + scale-to-zero grace + a minute.
	ZeroWait time.Duration

	// RunDeploy runs `nomad-serverless deploy` with args in process and
	// returns its exit code; -deploy needs it.
	RunDeploy func(ctx context.Context, e Env, args []string) int
	// Revisions returns a Nomad reader; it is called after the process
	// environment points at the dev agents. -deploy needs it.
	Revisions func() (RevisionSource, error)
	// Demo runs the demonstration (-or-demo without the agents); nil is
	// RunDemo.
	Demo func(ctx context.Context, e Env, c Config) error
}

// Env is what a dev session may touch of the outside world: where it
// prints, and the environment it reads (PATH, above all).
type Env struct {
	Stdout, Stderr io.Writer
	Getenv         func(string) string
}

// missingBinaries lists which of consul and nomad are not on path.
func missingBinaries(path string) []string {
	var missing []string
	for _, name := range []string{"consul", "nomad"} {
		if _, ok := devagents.LookPath(name, path); !ok {
			missing = append(missing, name)
		}
	}
	return missing
}

// Run is a dev session: agents, serve, banner, the -deploy sequence,
// wait, orderly stop. Without consul or nomad it runs the demonstration
// (OrDemo) or says where to get them. It says what goes wrong on Stderr as
// it happens (before the messages of what it stops on the way out) and
// returns that error; nil is a session that ended normally, by Ctrl-C
// (ctx) included.
func Run(ctx context.Context, e Env, c Config) (err error) {
	// serve's output and dev's own messages share the terminal from
	// several goroutines.
	e = Env{Stdout: &lockedWriter{w: e.Stdout}, Stderr: &lockedWriter{w: e.Stderr}, Getenv: e.Getenv}
	if c.Demo == nil {
		c.Demo = RunDemo
	}
	fail := func(format string, a ...any) error {
		return say(e, "nomad-serverless dev: ", format, a...)
	}

	if missing := missingBinaries(e.Getenv("PATH")); len(missing) > 0 {
		if c.OrDemo {
			fmt.Fprint(e.Stdout, fallbackNote(missing, c.Deploy))
			return c.Demo(ctx, e, c)
		}
		fmt.Fprint(e.Stderr, installHelp(missing))
		return fmt.Errorf("%s not on PATH", joinMissing(missing))
	}
	if c.Deploy != "" && (c.RunDeploy == nil || c.Revisions == nil) {
		return fail("Config.RunDeploy and Config.Revisions are required with Deploy")
	}

	gwPort, err := listenPort(c.Listen)
	if err != nil {
		return fail("-listen %q: %v", c.Listen, err)
	}
	adminPort, err := listenPort(c.AdminListen)
	if err != nil {
		return fail("-admin-listen %q: %v", c.AdminListen, err)
	}
	internalPort := 0
	if c.InternalListen != "" {
		if internalPort, err = listenPort(c.InternalListen); err != nil {
			return fail("-internal-listen %q: %v", c.InternalListen, err)
		}
	}
	for _, chk := range []struct {
		port       int
		what, hint string
	}{
		{c.ConsulHTTPPort, "Consul HTTP", "another Consul agent? stop it or pass -consul-port"},
		{c.NomadHTTPPort, "Nomad HTTP", "another Nomad agent? stop it or pass -nomad-port"},
		{gwPort, "gateway", "pass -listen 127.0.0.1:<port>"},
		{adminPort, "admin API", "pass -admin-listen 127.0.0.1:<port>"},
		{internalPort, "internal listener", "pass -internal-listen 127.0.0.1:<port>"},
	} {
		if chk.port == 0 {
			continue // no internal listener
		}
		if err := devagents.PortFree(chk.port, chk.what); err != nil {
			return fail("%v (%s)", err, chk.hint)
		}
	}

	dir := c.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "nomad-serverless-dev-"); err != nil {
			return fail("make a data directory: %v", err)
		}
		defer func() {
			if err == nil {
				os.RemoveAll(dir)
				return
			}
			fmt.Fprintf(e.Stderr, "The agents' configuration, data and logs are kept in %s.\n", dir)
		}()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("-data-dir: %v", err)
	}

	consulBin, _ := devagents.LookPath("consul", e.Getenv("PATH"))
	nomadBin, _ := devagents.LookPath("nomad", e.Getenv("PATH"))
	var agents *devagents.Agents
	var cluster *devagents.Cluster
	if c.Nodes > 0 {
		cluster, err = startCluster(ctx, e, c, dir, consulBin, nomadBin)
		if err == nil {
			agents = &cluster.Agents
		}
	} else {
		agents, err = devagents.Start(ctx, devagents.Options{
			ConsulBin: consulBin, NomadBin: nomadBin, Dir: dir,
			Ports:        devagents.Ports{ConsulHTTP: c.ConsulHTTPPort, NomadHTTP: c.NomadHTTPPort},
			ReadyTimeout: c.ReadyTimeout, Poll: c.Poll, StopGrace: c.StopGrace,
			Progress: e.Stderr,
		})
	}
	if err != nil {
		return sayInterrupted(ctx, e, err)
	}
	// Everything is stopped on the way out, newest first: serve (once
	// started), then Nomad (its allocations), then Consul (where they
	// register).
	var serve *devagents.Proc
	defer func() {
		var lines []string
		if cluster != nil {
			lines = append(devagents.StopAll(e.Stderr, c.StopGrace, serve), cluster.Stop(c.StopGrace)...)
		} else {
			lines = devagents.StopAll(e.Stderr, c.StopGrace, serve, agents.Nomad, agents.Consul)
		}
		for _, k := range lines {
			fmt.Fprintln(e.Stderr, k)
		}
	}()

	fmt.Fprintln(e.Stderr, "Starting the control plane (nomad-serverless serve)...")
	serveArgs := []string{"serve", "-listen", c.Listen, "-admin-listen", c.AdminListen, "-domain", c.Domain, "-replica", "dev"}
	if c.InternalListen != "" {
		serveArgs = append(serveArgs, "-internal-listen", c.InternalListen)
	}
	serve, err = devagents.StartProc(devagents.Command{
		Name: "serve", Path: c.Executable,
		Args: serveArgs,
		Env:  append(devagents.ChildEnv(os.Environ()), "NOMAD_ADDR="+agents.NomadAddr, "CONSUL_HTTP_ADDR="+agents.ConsulAddr),
		// serve's logs are told apart from dev's own messages.
		Output: &prefixWriter{prefix: "serve | ", w: e.Stderr},
	})
	if err != nil {
		return fail("%v", err)
	}
	adminURL := "http://" + dialAddr(c.AdminListen)
	if err := devagents.WaitFor(ctx, serve, "serve at "+adminURL, c.ReadyTimeout, c.Poll, func(ctx context.Context) error {
		return getOK(ctx, adminURL+"/healthz")
	}); err != nil {
		return sayInterrupted(ctx, e, err)
	}

	banner(e.Stdout, c, agents)
	// A node agent's end (nil, which never fires, without a cluster).
	var nodeExit <-chan *devagents.Proc
	if cluster != nil {
		clusterBanner(e.Stdout, cluster)
		nodeExit = firstExit(nodeProcs(cluster))
	}
	if c.Deploy != "" {
		if err := deploy(ctx, e, c, agents); err != nil {
			return err
		}
	}

	// Run until Ctrl-C or until something we started dies.
	select {
	case <-ctx.Done():
		fmt.Fprintln(e.Stderr, "\nInterrupted: stopping everything dev started.")
		return nil
	case <-serve.Done():
		return fail("%s; stopping the rest.", serve.Describe())
	case <-agents.Consul.Done():
		return fail("%s; stopping the rest.", agents.Consul.Describe())
	case <-agents.Nomad.Done():
		return fail("%s; stopping the rest.", agents.Nomad.Describe())
	case p := <-nodeExit:
		return fail("%s; stopping the rest.", p.Describe())
	}
}

// sayInterrupted reports a failed start: Ctrl-C during start-up is a normal
// way out (nil), anything else an error.
func sayInterrupted(ctx context.Context, e Env, err error) error {
	if ctx.Err() != nil {
		fmt.Fprintln(e.Stderr, "\nInterrupted during start-up: stopping everything dev started.")
		return nil
	}
	fmt.Fprintf(e.Stderr, "nomad-serverless dev: %v\n", err)
	return err
}

// say prints prefix and the message on e.Stderr and returns the message as
// an error.
func say(e Env, prefix, format string, a ...any) error {
	err := fmt.Errorf(format, a...)
	fmt.Fprintf(e.Stderr, "%s%v\n", prefix, err)
	return err
}

// banner prints where everything is and, without -deploy, what to type
// next.
func banner(w io.Writer, c Config, a *devagents.Agents) {
	gw := "http://" + dialAddr(c.Listen)
	fmt.Fprintf(w, `
nomad-serverless dev is running. Ctrl-C stops everything it started.

  Nomad UI    %[1]s/ui/
  Consul UI   %[2]s/ui/
  Gateway     %[3]s   (Host: <service>.<namespace>.%[4]s)
%[8]s  Admin API   %[5]s/v1/autoscaler/revisions
  Logs        %[6]s

In another terminal:
  export NOMAD_ADDR=%[1]s CONSUL_HTTP_ADDR=%[7]s
`, a.NomadAddr, a.ConsulURL, gw, c.Domain, "http://"+dialAddr(c.AdminListen),
		a.Consul.LogPath+", "+a.Nomad.LogPath, a.ConsulAddr, internalLine(c))
	if c.Deploy != "" {
		fmt.Fprintln(w)
		return
	}
	host := "testapp.default." + c.Domain
	fmt.Fprintf(w, `  %[1]s deploy -sidecar-command %[1]s -var binary=%[1]s examples/raw-exec.hcl
  curl -H 'Host: %[2]s' %[3]s/
  %[1]s status testapp

After a few seconds without requests the revision scales to zero
(nomad job scaling-events testapp-00001); the next curl wakes it.
`, c.Executable, host, gw)
}

// internalLine is the banner's line for the internal listener ("" without
// one).
func internalLine(c Config) string {
	if c.InternalListen == "" {
		return ""
	}
	return fmt.Sprintf("  Internal    http://%s   (every service, visibility = \"internal\" ones too)\n", dialAddr(c.InternalListen))
}

// installHelp says which of consul and nomad are missing and where to get
// them.
func installHelp(missing []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nomad-serverless dev: %s not on PATH.\n\n", joinMissing(missing))
	b.WriteString("dev runs local Consul and Nomad dev agents, so it needs both binaries. Install:\n")
	for _, m := range missing {
		fmt.Fprintf(&b, "  %-6s %s (a single binary: unzip it into a directory on PATH)\n", m, devagents.InstallURL(m))
	}
	b.WriteString("or on Debian/Ubuntu, from HashiCorp's apt repository:\n")
	b.WriteString("  wget -O- https://apt.releases.hashicorp.com/gpg | sudo gpg --dearmor -o /usr/share/keyrings/hashicorp-archive-keyring.gpg\n")
	b.WriteString("  echo \"deb [signed-by=/usr/share/keyrings/hashicorp-archive-keyring.gpg] https://apt.releases.hashicorp.com $(lsb_release -cs) main\" | sudo tee /etc/apt/sources.list.d/hashicorp.list\n")
	fmt.Fprintf(&b, "  sudo apt-get update && sudo apt-get install %s\n", strings.Join(missing, " "))
	b.WriteString("(macOS: brew tap hashicorp/tap && brew install hashicorp/tap/nomad hashicorp/tap/consul)\n\n")
	b.WriteString("Without them, 'nomad-serverless dev -demo' runs the gateway, activator, autoscaler and real\n")
	b.WriteString("sidecar and app processes on this machine, with no Nomad or Consul.\n")
	return b.String()
}

// fallbackNote is the paragraph -or-demo prints before the
// demonstration: what is missing, where to get it, what runs instead.
func fallbackNote(missing []string, deploy string) string {
	what := "dev agents cannot run"
	if deploy != "" {
		what = deploy + " cannot be deployed onto real Nomad and Consul dev agents"
	}
	var urls []string
	for _, m := range missing {
		urls = append(urls, devagents.InstallURL(m))
	}
	text := fmt.Sprintf("%s not on PATH, so %s. Get %s from %s (a single binary each, to put on PATH; "+
		"'nomad-serverless dev' shows the apt and brew commands) and run this again. "+
		"Meanwhile, here is the local demonstration (nomad-serverless dev -demo):",
		joinMissing(missing), what, strings.Join(missing, " and "), strings.Join(urls, " and "))
	return wrap(text, 100) + "\n\n"
}

// wrap breaks text into lines of at most width columns at spaces (a
// longer word stays whole).
func wrap(text string, width int) string {
	var b strings.Builder
	col := 0
	for _, w := range strings.Fields(text) {
		switch {
		case col == 0:
		case col+1+len(w) > width:
			b.WriteByte('\n')
			col = 0
		default:
			b.WriteByte(' ')
			col++
		}
		b.WriteString(w)
		col += len(w)
	}
	return b.String()
}

// joinMissing is "consul is", "nomad is" or "consul and nomad are".
func joinMissing(missing []string) string {
	if len(missing) == 1 {
		return missing[0] + " is"
	}
	return strings.Join(missing, " and ") + " are"
}

// listenPort returns the port of a listen address.
func listenPort(addr string) (int, error) {
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(port)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("want a port from 1 to 65535, got %q", port)
	}
	return n, nil
}

// dialAddr turns a listen address into one to dial (":8080" and
// "0.0.0.0:8080" listen everywhere; dial loopback).
func dialAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// prefixWriter writes each complete line with a prefix, so serve's logs
// are told apart from dev's own messages on one terminal.
type prefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	buf    []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		if _, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i]); err != nil {
			return len(b), err
		}
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

// lockedWriter serializes writes from several goroutines.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
