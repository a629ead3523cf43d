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
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

const devUsage = `Usage: nomad-serverless dev [options]

Start a local Consul dev agent, a Nomad dev agent (raw_exec enabled) and the
control plane (serve), print their URLs and how to deploy an example, and
stop everything on Ctrl-C. Needs consul and nomad on PATH; -demo runs a
demonstration without them.

Options:
`

// devConfig is one dev session's settings. runDev fills it from flags; tests
// fill it directly (fake agents on PATH, a fake serve, short bounds).
type devConfig struct {
	Listen, AdminListen, Domain   string
	ConsulHTTPPort, NomadHTTPPort int
	// DataDir holds the agents' configs, data and logs; empty makes a
	// temporary one that is removed at the end.
	DataDir string
	// Executable runs `serve` (this binary).
	Executable string

	// Bounds: how long each agent and serve may take to become ready, and
	// how long each may take to stop after SIGINT before it is killed.
	ReadyTimeout time.Duration
	StopGrace    time.Duration
	Poll         time.Duration
}

func runDev(ctx context.Context, e *env, args []string) int {
	fs := flag.NewFlagSet("dev", flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprint(e.stderr, devUsage)
		fs.PrintDefaults()
	}
	c := devConfig{ReadyTimeout: 90 * time.Second, StopGrace: 30 * time.Second, Poll: 200 * time.Millisecond}
	var demo bool
	fs.StringVar(&c.Listen, "listen", "127.0.0.1:8080", "gateway address")
	fs.StringVar(&c.AdminListen, "admin-listen", "127.0.0.1:8081", "admin API address (health, metrics, autoscaler state)")
	fs.StringVar(&c.Domain, "domain", "localhost", "domain of service hosts: <service>.<namespace>.<domain>")
	fs.IntVar(&c.ConsulHTTPPort, "consul-port", 8500, "HTTP port of the Consul dev agent")
	fs.IntVar(&c.NomadHTTPPort, "nomad-port", 4646, "HTTP port of the Nomad dev agent")
	fs.StringVar(&c.DataDir, "data-dir", "", "directory for the agents' configuration, data and logs (default: a temporary directory, removed at exit)")
	fs.BoolVar(&demo, "demo", false, "without Nomad and Consul: run the gateway, activator, autoscaler and real sidecar+app processes locally and narrate a wake from zero, a burst and the way back to zero")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: unexpected argument %q (dev takes only options)\n", fs.Arg(0))
		return exitUsage
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

// devRun is a dev session: agents, serve, banner, wait, orderly stop.
func devRun(ctx context.Context, e *env, c devConfig) (code int) {
	// serve's output and dev's own messages share stderr from several
	// goroutines.
	e = &env{stdout: &devLockedWriter{w: e.stdout}, stderr: &devLockedWriter{w: e.stderr}, getenv: e.getenv}
	fail := func(format string, a ...any) int {
		fmt.Fprintf(e.stderr, "nomad-serverless dev: "+format+"\n", a...)
		return exitError
	}

	var missing []string
	bins := map[string]string{}
	for _, name := range []string{"consul", "nomad"} {
		p, ok := devLookPath(name, e.getenv("PATH"))
		if !ok {
			missing = append(missing, name)
		}
		bins[name] = p
	}
	if len(missing) > 0 {
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
		if err := devPortFree(chk.port, chk.what); err != nil {
			return fail("%v (%s)", err, chk.hint)
		}
	}
	ports := devPorts{ConsulHTTP: c.ConsulHTTPPort, NomadHTTP: c.NomadHTTPPort}
	for _, p := range []*int{&ports.ConsulDNS, &ports.ConsulServer, &ports.ConsulSerfLAN, &ports.ConsulSerfWAN, &ports.ConsulGRPC, &ports.NomadRPC, &ports.NomadSerf} {
		if *p, err = devFreePort(); err != nil {
			return fail("%v", err)
		}
	}

	dir := c.DataDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "nomad-serverless-dev-"); err != nil {
			return fail("make a data directory: %v", err)
		}
		defer os.RemoveAll(dir)
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail("-data-dir: %v", err)
	}
	consulCfg := filepath.Join(dir, "consul.hcl")
	nomadCfg := filepath.Join(dir, "nomad.hcl")
	if err := os.WriteFile(consulCfg, []byte(devConsulConfig(ports)), 0o644); err != nil {
		return fail("write %s: %v", consulCfg, err)
	}
	if err := os.WriteFile(nomadCfg, []byte(devNomadConfig(ports, filepath.Join(dir, "nomad-data"))), 0o644); err != nil {
		return fail("write %s: %v", nomadCfg, err)
	}

	// Every process started is stopped on the way out, newest first: serve
	// before Nomad (its allocations) before Consul (where they register).
	var started []*devProc
	defer func() {
		for i := len(started) - 1; i >= 0; i-- {
			p := started[i]
			if p.exited() {
				continue
			}
			fmt.Fprintf(e.stderr, "Stopping %s...\n", p.name)
			if p.stop(c.StopGrace) {
				fmt.Fprintf(e.stderr, "%s did not stop within %s after SIGINT; killed it.\n", p.name, c.StopGrace)
			}
		}
	}()

	baseEnv := devChildEnv(os.Environ())
	consulURL := "http://127.0.0.1:" + strconv.Itoa(ports.ConsulHTTP)
	nomadURL := "http://127.0.0.1:" + strconv.Itoa(ports.NomadHTTP)

	fmt.Fprintf(e.stderr, "Starting Consul dev agent (%s, log %s)...\n", bins["consul"], filepath.Join(dir, "consul.log"))
	consul, err := devStart("consul", bins["consul"], []string{"agent", "-dev", "-config-file", consulCfg}, baseEnv, filepath.Join(dir, "consul.log"), nil)
	if err != nil {
		return fail("%v", err)
	}
	started = append(started, consul)
	if err := devWaitFor(ctx, consul, "Consul at "+consulURL, c.ReadyTimeout, c.Poll, devLeaderCheck(consulURL)); err != nil {
		return devInterrupted(ctx, e, err)
	}

	fmt.Fprintf(e.stderr, "Starting Nomad dev agent (%s, log %s)...\n", bins["nomad"], filepath.Join(dir, "nomad.log"))
	nomad, err := devStart("nomad", bins["nomad"], []string{"agent", "-dev", "-config", nomadCfg}, baseEnv, filepath.Join(dir, "nomad.log"), nil)
	if err != nil {
		return fail("%v", err)
	}
	started = append(started, nomad)
	for _, chk := range []func(context.Context) error{devLeaderCheck(nomadURL), devNomadNodeCheck(nomadURL)} {
		if err := devWaitFor(ctx, nomad, "Nomad at "+nomadURL, c.ReadyTimeout, c.Poll, chk); err != nil {
			return devInterrupted(ctx, e, err)
		}
	}

	fmt.Fprintln(e.stderr, "Starting the control plane (nomad-serverless serve)...")
	serveEnv := append(baseEnv, "NOMAD_ADDR="+nomadURL, "CONSUL_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(ports.ConsulHTTP))
	serveOut := &devPrefixWriter{prefix: "serve | ", w: e.stderr}
	serve, err := devStart("serve", c.Executable, []string{
		"serve", "-listen", c.Listen, "-admin-listen", c.AdminListen, "-domain", c.Domain, "-replica", "dev",
	}, serveEnv, "", serveOut)
	if err != nil {
		return fail("%v", err)
	}
	started = append(started, serve)
	adminURL := "http://" + devDialAddr(c.AdminListen)
	if err := devWaitFor(ctx, serve, "serve at "+adminURL, c.ReadyTimeout, c.Poll, func(ctx context.Context) error {
		_, err := devHTTPGet(ctx, adminURL+"/healthz")
		return err
	}); err != nil {
		return devInterrupted(ctx, e, err)
	}

	devBanner(e.stdout, c, nomadURL, consulURL, dir)

	// Run until Ctrl-C or until something we started dies.
	cases := make(chan *devProc, len(started))
	for _, p := range started {
		go func(p *devProc) {
			select {
			case <-p.done:
				cases <- p
			case <-ctx.Done():
			}
		}(p)
	}
	select {
	case <-ctx.Done():
		fmt.Fprintln(e.stderr, "\nInterrupted: stopping everything dev started.")
		return exitOK
	case p := <-cases:
		return fail("%s; stopping the rest.", p.describeExit())
	}
}

// devInterrupted reports a failed wait: Ctrl-C during start-up is a normal
// way out, anything else an error.
func devInterrupted(ctx context.Context, e *env, err error) int {
	if ctx.Err() != nil {
		fmt.Fprintln(e.stderr, "\nInterrupted during start-up: stopping everything dev started.")
		return exitOK
	}
	fmt.Fprintf(e.stderr, "nomad-serverless dev: %v\n", err)
	return exitError
}

// devBanner prints where everything is and what to type next.
func devBanner(w io.Writer, c devConfig, nomadURL, consulURL, dir string) {
	gw := "http://" + devDialAddr(c.Listen)
	host := "testapp.default." + c.Domain
	fmt.Fprintf(w, `
nomad-serverless dev is running. Ctrl-C stops everything it started.

  Nomad UI    %[1]s/ui/
  Consul UI   %[2]s/ui/
  Gateway     %[3]s   (Host: <service>.<namespace>.%[4]s)
  Admin API   %[5]s/v1/autoscaler/revisions
  Logs        %[6]s

In another terminal:
  export NOMAD_ADDR=%[1]s CONSUL_HTTP_ADDR=%[7]s
  %[8]s deploy -sidecar-command %[8]s -var binary=%[8]s examples/raw-exec.hcl
  curl -H 'Host: %[9]s' %[3]s/
  %[8]s status testapp

After a few seconds without requests the revision scales to zero
(nomad job scaling-events testapp-00001); the next curl wakes it.
`, nomadURL, consulURL, gw, c.Domain, "http://"+devDialAddr(c.AdminListen),
		filepath.Join(dir, "consul.log")+", "+filepath.Join(dir, "nomad.log"),
		strings.TrimPrefix(consulURL, "http://"), c.Executable, host)
}

// devChildEnv is the environment of the processes dev starts: the user's,
// without NOMAD_* and CONSUL_* settings that point at another cluster (a
// token, namespace or CA file of theirs would break the dev agents).
func devChildEnv(environ []string) []string {
	out := make([]string, 0, len(environ))
	for _, kv := range environ {
		if strings.HasPrefix(kv, "NOMAD_") || strings.HasPrefix(kv, "CONSUL_") {
			continue
		}
		out = append(out, kv)
	}
	return out
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
