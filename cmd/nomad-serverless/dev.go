package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
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

const devUsage = `Usage: nomad-serverless dev [options]

Start a local Consul dev agent, a Nomad dev agent (raw_exec enabled) and the
control plane (serve), print their URLs, and stop everything on Ctrl-C.
-deploy FILE also deploys the file's services onto them, sends a request,
waits for the revision to scale to zero and wakes it with another.
Needs consul and nomad on PATH; -demo runs a demonstration without them, and
-or-demo runs that demonstration when they are missing (make demo does).
-nodes N runs a cluster instead: one Nomad server and N client nodes, each
with its own loopback address (127.0.0.2, ...) and Consul agent (Linux, as
root: the addresses are added to lo and removed at the end).

Options:
`

// devConfig is one dev session's settings. runDev fills it from flags; tests
// fill it directly (fake agents on PATH, a fake serve, short bounds, hooks).
type devConfig struct {
	Listen, AdminListen, Domain   string
	ConsulHTTPPort, NomadHTTPPort int
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

	// hooks replace what dev calls out to; zero values are the real ones.
	hooks devHooks
}

func runDev(ctx context.Context, e *env, args []string) int {
	fs := newFlagSet(e, "dev", devUsage)
	c := devConfig{ReadyTimeout: 90 * time.Second, StopGrace: 30 * time.Second, Poll: 200 * time.Millisecond}
	var demo bool
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "gateway address")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:8081", "admin API address (health, metrics, autoscaler state)")
	fs.StringVar(&c.Domain, "domain", "localhost", "domain of service hosts: <service>.<namespace>.<domain>")
	fs.IntVar(&c.ConsulHTTPPort, "consul-port", 8500, "HTTP port of the Consul dev agent")
	fs.IntVar(&c.NomadHTTPPort, "nomad-port", 4646, "HTTP port of the Nomad dev agent")
	fs.StringVar(&c.DataDir, "data-dir", "", "directory for the agents' configuration, data and logs (default: a temporary directory, removed at exit)")
	fs.StringVar(&c.Deploy, "deploy", "", "once everything runs, deploy this service `file` (with -sidecar-command and -var binary set to this binary), send a request, wait for it to scale to zero and wake it")
	fs.BoolVar(&c.OrDemo, "or-demo", false, "when consul or nomad is not on PATH, say what is missing and run the -demo demonstration instead of failing")
	fs.IntVar(&c.Nodes, "nodes", 0, "run a cluster instead of one dev agent: a Nomad server and `N` client nodes, each with its own loopback address (127.0.0.2, ...) and Consul agent (Linux, as root)")
	fs.BoolVar(&demo, "demo", false, "without Nomad and Consul: run the gateway, activator, autoscaler and real sidecar+app processes locally and narrate a wake from zero, a burst and the way back to zero")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if c.Nodes < 0 {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: -nodes %d: want 0 (one dev agent) or more\n", c.Nodes)
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: unexpected argument %q (dev takes only options; a file to deploy goes after -deploy)\n", fs.Arg(0))
		return exitUsage
	}
	if c.Deploy != "" {
		if _, err := os.Stat(c.Deploy); err != nil {
			fmt.Fprintf(e.stderr, "nomad-serverless dev: -deploy: %v\n", err)
			return exitUsage
		}
	}
	if demo {
		return runDevDemo(ctx, e, c)
	}
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: cannot find this binary to run serve: %v\n", err)
		return exitError
	}
	c.Executable = exe
	return devRun(ctx, e, c)
}

// devMissing lists which of consul and nomad are not on path.
func devMissing(path string) []string {
	var missing []string
	for _, name := range []string{"consul", "nomad"} {
		if _, ok := devagents.LookPath(name, path); !ok {
			missing = append(missing, name)
		}
	}
	return missing
}

// devRun is a dev session: agents, serve, banner, the -deploy sequence,
// wait, orderly stop. Without consul or nomad it runs the demonstration
// (OrDemo) or says where to get them.
func devRun(ctx context.Context, e *env, c devConfig) (code int) {
	// serve's output and dev's own messages share the terminal from
	// several goroutines.
	e = &env{stdout: &devLockedWriter{w: e.stdout}, stderr: &devLockedWriter{w: e.stderr}, getenv: e.getenv}
	h := c.hooks.withDefaults()
	fail := func(format string, a ...any) int {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: "+format+"\n", a...)
		return exitError
	}

	if missing := devMissing(e.getenv("PATH")); len(missing) > 0 {
		if c.OrDemo {
			fmt.Fprint(e.stdout, devFallbackNote(missing, c.Deploy))
			return h.demo(ctx, e, c)
		}
		fmt.Fprint(e.stderr, devInstallHelp(missing))
		return exitError
	}

	gwPort, err := devListenPort(c.Listen)
	if err != nil {
		return fail("-listen %q: %v", c.Listen, err)
	}
	adminPort, err := devListenPort(c.AdminListen)
	if err != nil {
		return fail("-admin-listen %q: %v", c.AdminListen, err)
	}
	for _, chk := range []struct {
		port       int
		what, hint string
	}{
		{c.ConsulHTTPPort, "Consul HTTP", "another Consul agent? stop it or pass -consul-port"},
		{c.NomadHTTPPort, "Nomad HTTP", "another Nomad agent? stop it or pass -nomad-port"},
		{gwPort, "gateway", "pass -listen 127.0.0.1:<port>"},
		{adminPort, "admin API", "pass -admin-listen 127.0.0.1:<port>"},
	} {
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
			if code == exitOK {
				os.RemoveAll(dir)
				return
			}
			fmt.Fprintf(e.stderr, "The agents' configuration, data and logs are kept in %s.\n", dir)
		}()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("-data-dir: %v", err)
	}

	consulBin, _ := devagents.LookPath("consul", e.getenv("PATH"))
	nomadBin, _ := devagents.LookPath("nomad", e.getenv("PATH"))
	var agents *devagents.Agents
	var cluster *devagents.Cluster
	if c.Nodes > 0 {
		cluster, err = devStartCluster(ctx, e, c, dir, consulBin, nomadBin)
		if err == nil {
			agents = &cluster.Agents
		}
	} else {
		agents, err = devagents.Start(ctx, devagents.Options{
			ConsulBin: consulBin, NomadBin: nomadBin, Dir: dir,
			Ports:        devagents.Ports{ConsulHTTP: c.ConsulHTTPPort, NomadHTTP: c.NomadHTTPPort},
			ReadyTimeout: c.ReadyTimeout, Poll: c.Poll, StopGrace: c.StopGrace,
			Progress: e.stderr,
		})
	}
	if err != nil {
		return devInterrupted(ctx, e, err)
	}
	// Everything is stopped on the way out, newest first: serve (once
	// started), then Nomad (its allocations), then Consul (where they
	// register).
	var serve *devagents.Proc
	defer func() {
		var lines []string
		if cluster != nil {
			lines = append(devagents.StopAll(e.stderr, c.StopGrace, serve), cluster.Stop(c.StopGrace)...)
		} else {
			lines = devagents.StopAll(e.stderr, c.StopGrace, serve, agents.Nomad, agents.Consul)
		}
		for _, k := range lines {
			fmt.Fprintln(e.stderr, k)
		}
	}()

	fmt.Fprintln(e.stderr, "Starting the control plane (nomad-serverless serve)...")
	serve, err = devagents.StartProc(devagents.Command{
		Name: "serve", Path: c.Executable,
		Args: []string{"serve", "-listen", c.Listen, "-admin-listen", c.AdminListen, "-domain", c.Domain, "-replica", "dev"},
		Env:  append(devagents.ChildEnv(os.Environ()), "NOMAD_ADDR="+agents.NomadAddr, "CONSUL_HTTP_ADDR="+agents.ConsulAddr),
		// serve's logs are told apart from dev's own messages.
		Output: &devPrefixWriter{prefix: "serve | ", w: e.stderr},
	})
	if err != nil {
		return fail("%v", err)
	}
	adminURL := "http://" + devDialAddr(c.AdminListen)
	if err := devagents.WaitFor(ctx, serve, "serve at "+adminURL, c.ReadyTimeout, c.Poll, func(ctx context.Context) error {
		return devGetOK(ctx, adminURL+"/healthz")
	}); err != nil {
		return devInterrupted(ctx, e, err)
	}

	devBanner(e.stdout, c, agents)
	// A node agent's end (nil, which never fires, without a cluster).
	var nodeExit <-chan *devagents.Proc
	if cluster != nil {
		devClusterBanner(e.stdout, cluster)
		nodeExit = devFirstExit(devNodeProcs(cluster))
	}
	if c.Deploy != "" {
		if code := devDeploy(ctx, e, c, h, agents); code != exitOK {
			return code
		}
	}

	// Run until Ctrl-C or until something we started dies.
	select {
	case <-ctx.Done():
		fmt.Fprintln(e.stderr, "\nInterrupted: stopping everything dev started.")
		return exitOK
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

// devInterrupted reports a failed start: Ctrl-C during start-up is a normal
// way out, anything else an error.
func devInterrupted(ctx context.Context, e *env, err error) int {
	if ctx.Err() != nil {
		fmt.Fprintln(e.stderr, "\nInterrupted during start-up: stopping everything dev started.")
		return exitOK
	}
	fmt.Fprintf(e.stderr, "nomad-serverless dev: %v\n", err)
	return exitError
}

// devBanner prints where everything is and, without -deploy, what to type
// next.
func devBanner(w io.Writer, c devConfig, a *devagents.Agents) {
	gw := "http://" + devDialAddr(c.Listen)
	fmt.Fprintf(w, `
nomad-serverless dev is running. Ctrl-C stops everything it started.

  Nomad UI    %[1]s/ui/
  Consul UI   %[2]s/ui/
  Gateway     %[3]s   (Host: <service>.<namespace>.%[4]s)
  Admin API   %[5]s/v1/autoscaler/revisions
  Logs        %[6]s

In another terminal:
  export NOMAD_ADDR=%[1]s CONSUL_HTTP_ADDR=%[7]s
`, a.NomadAddr, a.ConsulURL, gw, c.Domain, "http://"+devDialAddr(c.AdminListen),
		a.Consul.LogPath+", "+a.Nomad.LogPath, a.ConsulAddr)
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

// devInstallHelp says which of consul and nomad are missing and where to get
// them.
func devInstallHelp(missing []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nomad-serverless dev: %s not on PATH.\n\n", devJoinMissing(missing))
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

// devFallbackNote is the paragraph -or-demo prints before the
// demonstration: what is missing, where to get it, what runs instead.
func devFallbackNote(missing []string, deploy string) string {
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
		devJoinMissing(missing), what, strings.Join(missing, " and "), strings.Join(urls, " and "))
	return devWrap(text, 100) + "\n\n"
}

// devWrap breaks text into lines of at most width columns at spaces (a
// longer word stays whole).
func devWrap(text string, width int) string {
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

// devJoinMissing is "consul is", "nomad is" or "consul and nomad are".
func devJoinMissing(missing []string) string {
	if len(missing) == 1 {
		return missing[0] + " is"
	}
	return strings.Join(missing, " and ") + " are"
}

// devListenPort returns the port of a listen address.
func devListenPort(addr string) (int, error) {
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

// devDialAddr turns a listen address into one to dial (":8080" and
// "0.0.0.0:8080" listen everywhere; dial loopback).
func devDialAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// devPrefixWriter writes each complete line with a prefix, so serve's logs
// are told apart from dev's own messages on one terminal.
type devPrefixWriter struct {
	mu     sync.Mutex
	prefix string
	w      io.Writer
	buf    []byte
}

func (p *devPrefixWriter) Write(b []byte) (int, error) {
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

// devLockedWriter serializes writes from several goroutines.
type devLockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *devLockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}
