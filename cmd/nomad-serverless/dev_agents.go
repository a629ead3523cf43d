package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// devPorts are the ports of the local Consul and Nomad dev agents. The HTTP
// ports are the well-known ones by default so the nomad and consul CLIs work
// without NOMAD_ADDR; the others are picked free at start, so a dev setup
// never collides with itself on the ports nobody types.
type devPorts struct {
	ConsulHTTP, ConsulDNS, ConsulServer, ConsulSerfLAN, ConsulSerfWAN, ConsulGRPC int
	NomadHTTP, NomadRPC, NomadSerf                                                int
}

// devConsulConfig renders the Consul dev agent's configuration: loopback
// only, every port from p, the UI on.
func devConsulConfig(p devPorts) string {
	return fmt.Sprintf(`# Written by nomad-serverless dev: a single Consul dev agent on loopback.
bind_addr      = "127.0.0.1"
client_addr    = "127.0.0.1"
advertise_addr = "127.0.0.1"
log_level      = "INFO"

ports {
  http     = %d
  dns      = %d
  server   = %d
  serf_lan = %d
  serf_wan = %d
  grpc     = %d
  grpc_tls = -1
}

ui_config {
  enabled = true
}
`, p.ConsulHTTP, p.ConsulDNS, p.ConsulServer, p.ConsulSerfLAN, p.ConsulSerfWAN, p.ConsulGRPC)
}

// devNomadConfig renders the Nomad dev agent's configuration: loopback only,
// data in dataDir, raw_exec enabled (examples/raw-exec.hcl runs this binary
// through it), registering services in the Consul dev agent.
func devNomadConfig(p devPorts, dataDir string) string {
	return fmt.Sprintf(`# Written by nomad-serverless dev: a single Nomad dev agent (server and client) on loopback.
data_dir  = %q
bind_addr = "127.0.0.1"
log_level = "INFO"

ports {
  http = %d
  rpc  = %d
  serf = %d
}

advertise {
  http = "127.0.0.1"
  rpc  = "127.0.0.1"
  serf = "127.0.0.1"
}

consul {
  address      = "127.0.0.1:%d"
  grpc_address = "127.0.0.1:%d"
}

plugin "raw_exec" {
  config {
    enabled = true
  }
}
`, dataDir, p.NomadHTTP, p.NomadRPC, p.NomadSerf, p.ConsulHTTP, p.ConsulGRPC)
}

// devLookPath finds name in the directories of a PATH value, as exec.LookPath
// does with the process's own PATH.
func devLookPath(name, path string) (string, bool) {
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, true
		}
	}
	return "", false
}

// devInstallHelp says which of consul and nomad are missing and where to get
// them.
func devInstallHelp(missing []string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "nomad-serverless dev: %s not on PATH.\n\n", strings.Join(missing, " and ")+map[bool]string{true: " is", false: " are"}[len(missing) == 1])
	b.WriteString("dev runs local Consul and Nomad dev agents, so it needs both binaries. Install:\n")
	for _, m := range missing {
		fmt.Fprintf(&b, "  %-6s https://developer.hashicorp.com/%s/install (a single binary: unzip it into a directory on PATH)\n", m, m)
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

// devProc is one process dev started: an agent or serve. Its output goes to
// a log file (agents) or through a writer (serve). Stop sends SIGINT and
// escalates to SIGKILL after a bound.
type devProc struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{}
	err     error // valid after done is closed
}

// devStart starts path with args in its own process group (so a Ctrl-C at
// the terminal reaches only dev, which stops everything in order). Output
// goes to out, or to logPath when out is nil.
func devStart(name, path string, args, env []string, logPath string, out io.Writer) (*devProc, error) {
	cmd := exec.Command(path, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var logFile *os.File
	if out == nil {
		f, err := os.Create(logPath)
		if err != nil {
			return nil, fmt.Errorf("start %s: log file: %w", name, err)
		}
		logFile = f
		out = f
	}
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		if logFile != nil {
			logFile.Close()
		}
		return nil, fmt.Errorf("start %s (%s): %w", name, path, err)
	}
	p := &devProc{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		if logFile != nil {
			logFile.Close()
		}
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *devProc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// describeExit says how the process ended, with the end of its log.
func (p *devProc) describeExit() string {
	msg := fmt.Sprintf("%s exited: %v", p.name, p.err)
	if p.err == nil {
		msg = p.name + " exited"
	}
	if p.logPath != "" {
		msg += fmt.Sprintf("\nlast lines of %s:\n%s", p.logPath, devTail(p.logPath, 15))
	}
	return msg
}

// stop sends SIGINT (the agents leave and, in dev mode, Nomad stops the
// allocations it runs), waits up to grace, then SIGKILLs. It reports whether
// the process had to be killed.
func (p *devProc) stop(grace time.Duration) (killed bool) {
	if p.exited() {
		return false
	}
	_ = p.cmd.Process.Signal(os.Interrupt)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return false
	case <-t.C:
	}
	// The whole group: a killed agent must not leave its children behind.
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.done
	return true
}

// devTail returns the last n lines of a file ("" if unreadable).
func devTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "  " + strings.Join(lines, "\n  ")
}

// devWaitFor polls check every interval until it returns nil, the process
// exits, ctx ends or timeout passes. The error says which, with the last
// check error.
func devWaitFor(ctx context.Context, p *devProc, what string, timeout, interval time.Duration, check func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last error
	for {
		cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
		last = check(cctx)
		ccancel()
		if last == nil {
			return nil
		}
		select {
		case <-p.done:
			return errors.New(p.describeExit())
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("%s not ready after %s: %v", what, timeout, last)
			}
			return ctx.Err()
		case <-time.After(interval):
		}
	}
}

// devHTTPGet returns the body of a GET that answered 200.
func devHTTPGet(ctx context.Context, url string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return body, nil
}

// devLeaderCheck passes once the agent's /v1/status/leader names a leader
// (Consul and Nomad both answer a quoted address, "" before election).
func devLeaderCheck(baseURL string) func(context.Context) error {
	return func(ctx context.Context) error {
		body, err := devHTTPGet(ctx, baseURL+"/v1/status/leader")
		if err != nil {
			return err
		}
		var leader string
		if err := json.Unmarshal(body, &leader); err != nil {
			return fmt.Errorf("leader answer %q: %w", body, err)
		}
		if leader == "" {
			return errors.New("no leader elected yet")
		}
		return nil
	}
}

// devNomadNodeCheck passes once the Nomad dev agent's client node is ready,
// so a deploy right after dev prints its URLs is placed at once.
func devNomadNodeCheck(baseURL string) func(context.Context) error {
	return func(ctx context.Context) error {
		body, err := devHTTPGet(ctx, baseURL+"/v1/nodes")
		if err != nil {
			return err
		}
		var nodes []struct{ Status string }
		if err := json.Unmarshal(body, &nodes); err != nil {
			return fmt.Errorf("nodes answer: %w", err)
		}
		for _, n := range nodes {
			if n.Status == "ready" {
				return nil
			}
		}
		return fmt.Errorf("no ready client node yet (%d nodes)", len(nodes))
	}
}

// devPortFree reports an error naming the port if something already listens
// on 127.0.0.1:port.
func devPortFree(port int, what string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return fmt.Errorf("port %d (%s) is in use on 127.0.0.1: %v", port, what, err)
	}
	return ln.Close()
}

// devFreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
func devFreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}
