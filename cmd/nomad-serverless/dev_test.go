package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/hclsyntax"

	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/internal/testbin"
)

// The dev tests run dev against fake `consul`, `nomad` and `serve`
// executables: shell scripts on a temporary PATH that re-run this test binary
// as TestDevFakeProcess. A fake serves what dev polls (/v1/status/leader,
// /v1/nodes, /healthz) on the port dev configured it with, and appends what
// happens to it (start with its arguments, stop with the signal) to an
// events file the test reads.

const devFakeRoleEnv = "NOMAD_SERVERLESS_DEV_FAKE_ROLE"

// TestDevFakeProcess is not a test: it is the body of the fake executables,
// and returns at once when the test binary runs normally.
func TestDevFakeProcess(t *testing.T) {
	role := os.Getenv(devFakeRoleEnv)
	if role == "" {
		return
	}
	os.Exit(devFakeMain(role, devArgsAfterDashDash(os.Args)))
}

func devArgsAfterDashDash(args []string) []string {
	for i, a := range args {
		if a == "--" {
			return args[i+1:]
		}
	}
	return nil
}

func devFakeMain(role string, args []string) int {
	events := os.Getenv("DEV_FAKE_EVENTS")
	logEvent := func(format string, a ...any) {
		f, err := os.OpenFile(events, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		if err != nil {
			return
		}
		defer f.Close()
		fmt.Fprintf(f, format+"\n", a...)
	}
	logEvent("start %s pid=%d args=%s", role, os.Getpid(), strings.Join(args, " "))
	if role == "serve" {
		logEvent("env serve NOMAD_ADDR=%s CONSUL_HTTP_ADDR=%s NOMAD_TOKEN=%s", os.Getenv("NOMAD_ADDR"), os.Getenv("CONSUL_HTTP_ADDR"), os.Getenv("NOMAD_TOKEN"))
	}
	if os.Getenv("DEV_FAKE_FAIL") == role {
		fmt.Fprintln(os.Stderr, "boom: the fake "+role+" refuses to start")
		return 3
	}

	var addr string
	switch role {
	case "consul", "nomad":
		flagName := map[string]string{"consul": "-config-file", "nomad": "-config"}[role]
		cfg, err := os.ReadFile(installTestFlag(args, flagName))
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake: read config:", err)
			return 2
		}
		m := regexp.MustCompile(`(?m)^\s*http\s*=\s*(\d+)`).FindSubmatch(cfg)
		if m == nil {
			fmt.Fprintln(os.Stderr, "fake: no http port in config")
			return 2
		}
		addr = "127.0.0.1:" + string(m[1])
	case "serve":
		addr = installTestFlag(args, "-admin-listen")
	}

	start := time.Now()
	leaderDelay, _ := time.ParseDuration(os.Getenv("DEV_FAKE_LEADER_DELAY"))
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/status/leader", func(w http.ResponseWriter, r *http.Request) {
		if time.Since(start) < leaderDelay {
			logEvent("poll %s leader=none", role)
			fmt.Fprint(w, `""`)
			return
		}
		fmt.Fprint(w, `"127.0.0.1:8300"`)
	})
	mux.HandleFunc("/v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, `[{"ID":"fake-node","Status":"ready"}]`)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	})
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake: listen:", err)
		return 2
	}
	go http.Serve(ln, mux)
	fmt.Fprintf(os.Stderr, "fake %s listening on %s\n", role, addr)

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ignore := os.Getenv("DEV_FAKE_IGNORE_INT") == role
	for {
		select {
		case sig := <-sigs:
			logEvent("stop %s signal=%s", role, sig)
			if !ignore {
				return 0
			}
		case <-time.After(2 * time.Minute):
			// A fake never outlives its test, even if the test died.
			logEvent("timeout %s", role)
			return 4
		}
	}
}

// devFakes writes fake consul, nomad and serve executables into a new
// directory and returns it with the events file they append to.
type devFakes struct {
	dir, events string
}

func newDevFakes(t *testing.T, roles []string, env map[string]string) devFakes {
	t.Helper()
	dir := t.TempDir()
	f := devFakes{dir: dir, events: filepath.Join(dir, "events")}
	var exports strings.Builder
	for k, v := range env {
		fmt.Fprintf(&exports, "export %s=%q\n", k, v)
	}
	for _, role := range roles {
		script := fmt.Sprintf("#!/bin/sh\n%sexport DEV_FAKE_EVENTS=%q %s=%s\nexec %q -test.run='^TestDevFakeProcess$' -- \"$@\"\n",
			exports.String(), f.events, devFakeRoleEnv, role, os.Args[0])
		if err := os.WriteFile(filepath.Join(dir, role), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func (f devFakes) lines(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(f.events)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// pids returns the PID of every fake that started.
func (f devFakes) pids(t *testing.T) map[string]int {
	out := map[string]int{}
	for _, l := range f.lines(t) {
		var role string
		var pid int
		if n, _ := fmt.Sscanf(l, "start %s pid=%d", &role, &pid); n == 2 {
			out[role] = pid
		}
	}
	return out
}

// stops returns the roles in the order they logged a stop.
func (f devFakes) stops(t *testing.T) []string {
	var out []string
	for _, l := range f.lines(t) {
		if fields := strings.Fields(l); len(fields) > 1 && fields[0] == "stop" {
			out = append(out, fields[1])
		}
	}
	return out
}

// devSyncBuffer is a bytes.Buffer safe for the test and dev's goroutines.
type devSyncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *devSyncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *devSyncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func devTestFreePort(t *testing.T) int {
	t.Helper()
	p, err := devFreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// devTestConfig is a dev session against the fakes, with short bounds.
func devTestConfig(t *testing.T, f devFakes) devConfig {
	return devConfig{
		Listen:         "127.0.0.1:" + strconv.Itoa(devTestFreePort(t)),
		AdminListen:    "127.0.0.1:" + strconv.Itoa(devTestFreePort(t)),
		Domain:         "localhost",
		ConsulHTTPPort: devTestFreePort(t),
		NomadHTTPPort:  devTestFreePort(t),
		DataDir:        filepath.Join(t.TempDir(), "data"),
		Executable:     filepath.Join(f.dir, "serve"),
		ReadyTimeout:   20 * time.Second,
		StopGrace:      5 * time.Second,
		Poll:           20 * time.Millisecond,
	}
}

// devSession runs devRun in the background.
type devSession struct {
	stdout, stderr *devSyncBuffer
	cancel         context.CancelFunc
	code           chan int
}

func startDevSession(t *testing.T, c devConfig, path string) *devSession {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &devSession{stdout: &devSyncBuffer{}, stderr: &devSyncBuffer{}, cancel: cancel, code: make(chan int, 1)}
	e := &env{stdout: s.stdout, stderr: s.stderr, getenv: func(k string) string {
		if k == "PATH" {
			return path
		}
		return ""
	}}
	go func() { s.code <- devRun(ctx, e, c) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.code:
		case <-time.After(30 * time.Second):
			t.Errorf("dev did not return within 30s of its context ending")
		}
	})
	return s
}

// waitOutput waits until stdout contains want, failing if dev returns first.
func (s *devSession) waitOutput(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !strings.Contains(s.stdout.String(), want) {
		select {
		case code := <-s.code:
			s.code <- code
			t.Fatalf("dev returned %d before printing %q\nstderr:\n%s", code, want, s.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev did not print %q within %s\nstdout:\n%s\nstderr:\n%s", want, timeout, s.stdout.String(), s.stderr.String())
		}
	}
}

func (s *devSession) wait(t *testing.T, timeout time.Duration) int {
	t.Helper()
	select {
	case code := <-s.code:
		s.code <- code // for the cleanup
		return code
	case <-time.After(timeout):
		t.Fatalf("dev did not return within %s\nstderr:\n%s", timeout, s.stderr.String())
		return -1
	}
}

func devAssertGone(t *testing.T, pids map[string]int) {
	t.Helper()
	for role, pid := range pids {
		// The fakes are dev's children: once dev reaped them, signal 0
		// reports ESRCH.
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists after dev returned (kill 0: %v)", role, pid, err)
		}
	}
}

func TestDevStartsWaitsAndStopsInOrder(t *testing.T) {
	f := newDevFakes(t, []string{"consul", "nomad", "serve"}, map[string]string{"DEV_FAKE_LEADER_DELAY": "300ms"})
	c := devTestConfig(t, f)
	s := startDevSession(t, c, f.dir)
	s.waitOutput(t, "Ctrl-C stops everything", 30*time.Second)

	out := s.stdout.String()
	for _, want := range []string{
		fmt.Sprintf("Nomad UI    http://127.0.0.1:%d/ui/", c.NomadHTTPPort),
		fmt.Sprintf("Consul UI   http://127.0.0.1:%d/ui/", c.ConsulHTTPPort),
		"Gateway     http://" + c.Listen,
		"Admin API   http://" + c.AdminListen + "/v1/autoscaler/revisions",
		fmt.Sprintf("export NOMAD_ADDR=http://127.0.0.1:%d CONSUL_HTTP_ADDR=127.0.0.1:%d", c.NomadHTTPPort, c.ConsulHTTPPort),
		c.Executable + " deploy -sidecar-command " + c.Executable + " -var binary=" + c.Executable + " examples/raw-exec.hcl",
		"curl -H 'Host: testapp.default.localhost' http://" + c.Listen + "/",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("banner lacks %q:\n%s", want, out)
		}
	}

	lines := f.lines(t)
	joined := strings.Join(lines, "\n")
	for _, want := range []string{
		"args=agent -dev -config-file " + filepath.Join(c.DataDir, "consul.hcl"),
		"args=agent -dev -config " + filepath.Join(c.DataDir, "nomad.hcl"),
		"args=serve -listen " + c.Listen + " -admin-listen " + c.AdminListen + " -domain localhost -replica dev",
		fmt.Sprintf("env serve NOMAD_ADDR=http://127.0.0.1:%d CONSUL_HTTP_ADDR=127.0.0.1:%d NOMAD_TOKEN=\n", c.NomadHTTPPort, c.ConsulHTTPPort),
		"poll consul leader=none", // dev waited for the election
	} {
		if !strings.Contains(joined+"\n", want) {
			t.Errorf("events lack %q:\n%s", want, joined)
		}
	}
	// Nomad starts only once Consul has a leader, serve only once Nomad has.
	var order []string
	for _, l := range lines {
		if strings.HasPrefix(l, "start ") {
			order = append(order, strings.Fields(l)[1])
		}
	}
	if !slices.Equal(order, []string{"consul", "nomad", "serve"}) {
		t.Errorf("start order = %v", order)
	}
	nomadCfg, _ := os.ReadFile(filepath.Join(c.DataDir, "nomad.hcl"))
	if !strings.Contains(string(nomadCfg), fmt.Sprintf(`address      = "127.0.0.1:%d"`, c.ConsulHTTPPort)) {
		t.Errorf("Nomad is not pointed at the Consul dev agent:\n%s", nomadCfg)
	}

	pids := f.pids(t)
	s.cancel() // Ctrl-C
	if code := s.wait(t, 30*time.Second); code != exitOK {
		t.Fatalf("dev after Ctrl-C: exit %d\n%s", code, s.stderr.String())
	}
	if got := f.stops(t); !slices.Equal(got, []string{"serve", "nomad", "consul"}) {
		t.Errorf("stop order = %v, want serve, nomad, consul", got)
	}
	for _, l := range f.lines(t) {
		if strings.HasPrefix(l, "stop ") && !strings.HasSuffix(l, "signal=interrupt") {
			t.Errorf("stopped with something else than SIGINT: %s", l)
		}
	}
	devAssertGone(t, pids)
	if !strings.Contains(s.stderr.String(), "serve | fake serve listening on "+c.AdminListen) {
		t.Errorf("serve's output is not shown with its prefix:\n%s", s.stderr.String())
	}
}

func TestDevMissingBinaries(t *testing.T) {
	for _, tc := range []struct {
		have    []string
		missing string
		absent  string
	}{
		{nil, "consul and nomad are not on PATH", ""},
		{[]string{"consul"}, "nomad is not on PATH", "developer.hashicorp.com/consul/install"},
		{[]string{"nomad"}, "consul is not on PATH", "developer.hashicorp.com/nomad/install"},
	} {
		f := newDevFakes(t, tc.have, nil)
		s := startDevSession(t, devTestConfig(t, f), f.dir)
		if code := s.wait(t, 10*time.Second); code != exitError {
			t.Errorf("have %v: exit %d, want %d", tc.have, code, exitError)
		}
		msg := s.stderr.String()
		if !strings.Contains(msg, tc.missing) {
			t.Errorf("have %v: message lacks %q:\n%s", tc.have, tc.missing, msg)
		}
		for _, want := range []string{"apt.releases.hashicorp.com", "-demo"} {
			if !strings.Contains(msg, want) {
				t.Errorf("have %v: message lacks %q", tc.have, want)
			}
		}
		for _, m := range []string{"consul", "nomad"} {
			if !slices.Contains(tc.have, m) && !strings.Contains(msg, "developer.hashicorp.com/"+m+"/install") {
				t.Errorf("have %v: no download link for %s", tc.have, m)
			}
		}
		if tc.absent != "" && strings.Contains(msg, tc.absent) {
			t.Errorf("have %v: message tells to install what is there (%s)", tc.have, tc.absent)
		}
		if lines := f.lines(t); len(lines) != 0 {
			t.Errorf("have %v: started something: %v", tc.have, lines)
		}
	}
}

func TestDevAgentFailingAtStartStopsTheRest(t *testing.T) {
	f := newDevFakes(t, []string{"consul", "nomad", "serve"}, map[string]string{"DEV_FAKE_FAIL": "nomad"})
	c := devTestConfig(t, f)
	s := startDevSession(t, c, f.dir)
	if code := s.wait(t, 30*time.Second); code != exitError {
		t.Fatalf("exit %d, want %d", code, exitError)
	}
	msg := s.stderr.String()
	for _, want := range []string{"nomad exited: exit status 3", filepath.Join(c.DataDir, "nomad.log"), "boom: the fake nomad refuses to start", "Stopping consul"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if got := f.stops(t); !slices.Equal(got, []string{"consul"}) {
		t.Errorf("stops = %v, want consul stopped", got)
	}
	if strings.Contains(strings.Join(f.lines(t), "\n"), "start serve") {
		t.Errorf("serve started although Nomad failed")
	}
	devAssertGone(t, f.pids(t))
}

func TestDevKillsWhatIgnoresSIGINT(t *testing.T) {
	f := newDevFakes(t, []string{"consul", "nomad", "serve"}, map[string]string{"DEV_FAKE_IGNORE_INT": "serve"})
	c := devTestConfig(t, f)
	c.StopGrace = 500 * time.Millisecond
	s := startDevSession(t, c, f.dir)
	s.waitOutput(t, "Ctrl-C stops everything", 30*time.Second)
	pids := f.pids(t)
	s.cancel()
	if code := s.wait(t, 30*time.Second); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(s.stderr.String(), "serve did not stop within 500ms after SIGINT; killed it.") {
		t.Errorf("no word of the kill:\n%s", s.stderr.String())
	}
	if got := f.stops(t); !slices.Equal(got, []string{"serve", "nomad", "consul"}) {
		t.Errorf("stops = %v", got)
	}
	devAssertGone(t, pids)
}

func TestDevStartupBounds(t *testing.T) {
	t.Run("no leader within the timeout", func(t *testing.T) {
		f := newDevFakes(t, []string{"consul", "nomad", "serve"}, map[string]string{"DEV_FAKE_LEADER_DELAY": "1h"})
		c := devTestConfig(t, f)
		c.ReadyTimeout = 500 * time.Millisecond
		s := startDevSession(t, c, f.dir)
		if code := s.wait(t, 20*time.Second); code != exitError {
			t.Fatalf("exit %d", code)
		}
		if msg := s.stderr.String(); !strings.Contains(msg, "Consul at http://127.0.0.1:") || !strings.Contains(msg, "not ready after 500ms: no leader elected yet") {
			t.Errorf("message:\n%s", msg)
		}
		if got := f.stops(t); !slices.Equal(got, []string{"consul"}) {
			t.Errorf("stops = %v", got)
		}
	})
	t.Run("Ctrl-C while waiting", func(t *testing.T) {
		f := newDevFakes(t, []string{"consul", "nomad", "serve"}, map[string]string{"DEV_FAKE_LEADER_DELAY": "1h"})
		s := startDevSession(t, devTestConfig(t, f), f.dir)
		deadline := time.Now().Add(20 * time.Second)
		for !strings.Contains(strings.Join(f.lines(t), "\n"), "poll consul") && time.Now().Before(deadline) {
			time.Sleep(20 * time.Millisecond)
		}
		s.cancel()
		if code := s.wait(t, 20*time.Second); code != exitOK {
			t.Fatalf("exit %d", code)
		}
		if !strings.Contains(s.stderr.String(), "Interrupted during start-up") {
			t.Errorf("stderr:\n%s", s.stderr.String())
		}
		devAssertGone(t, f.pids(t))
	})
	t.Run("port in use", func(t *testing.T) {
		f := newDevFakes(t, []string{"consul", "nomad", "serve"}, nil)
		c := devTestConfig(t, f)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(c.ConsulHTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		s := startDevSession(t, c, f.dir)
		if code := s.wait(t, 10*time.Second); code != exitError {
			t.Fatalf("exit %d", code)
		}
		if want := fmt.Sprintf("port %d (Consul HTTP) is in use", c.ConsulHTTPPort); !strings.Contains(s.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, s.stderr.String())
		}
		if len(f.lines(t)) != 0 {
			t.Errorf("started something: %v", f.lines(t))
		}
	})
}

func TestDevFlags(t *testing.T) {
	var out, errb bytes.Buffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	if code := run(context.Background(), e, []string{"dev", "extra"}); code != exitUsage || !strings.Contains(errb.String(), "unexpected argument") {
		t.Errorf("dev extra: exit %d, %s", code, errb.String())
	}
	errb.Reset()
	if code := run(context.Background(), e, []string{"dev", "-h"}); code != exitOK || !strings.Contains(errb.String(), "-demo") {
		t.Errorf("dev -h: exit %d, %s", code, errb.String())
	}
}

// devHCLAttrs parses an agent config and returns its top-level and nested
// attribute values as "block.name" -> value (as the agents would read them).
func devHCLAttrs(t *testing.T, src string) map[string]string {
	t.Helper()
	f, diags := hclsyntax.ParseConfig([]byte(src), "agent.hcl", hcl.InitialPos)
	if diags.HasErrors() {
		t.Fatalf("config does not parse: %v\n%s", diags, src)
	}
	out := map[string]string{}
	var walk func(prefix string, b *hclsyntax.Body)
	walk = func(prefix string, b *hclsyntax.Body) {
		for name, a := range b.Attributes {
			v, d := a.Expr.Value(nil)
			if d.HasErrors() {
				t.Fatalf("%s%s: %v", prefix, name, d)
			}
			switch {
			case v.Type().FriendlyName() == "string":
				out[prefix+name] = v.AsString()
			case v.Type().FriendlyName() == "number":
				out[prefix+name] = v.AsBigFloat().Text('f', -1)
			case v.Type().FriendlyName() == "bool":
				out[prefix+name] = strconv.FormatBool(v.True())
			}
		}
		for _, blk := range b.Blocks {
			walk(prefix+strings.Join(append([]string{blk.Type}, blk.Labels...), ".")+".", blk.Body)
		}
	}
	walk("", f.Body.(*hclsyntax.Body))
	return out
}

func TestDevAgentConfigs(t *testing.T) {
	p := devPorts{ConsulHTTP: 18500, ConsulDNS: 18600, ConsulServer: 18300, ConsulSerfLAN: 18301, ConsulSerfWAN: 18302, ConsulGRPC: 18502,
		NomadHTTP: 14646, NomadRPC: 14647, NomadSerf: 14648}
	consul := devHCLAttrs(t, devConsulConfig(p))
	for k, want := range map[string]string{
		"bind_addr": "127.0.0.1", "client_addr": "127.0.0.1", "advertise_addr": "127.0.0.1",
		"ports.http": "18500", "ports.dns": "18600", "ports.server": "18300", "ports.serf_lan": "18301",
		"ports.serf_wan": "18302", "ports.grpc": "18502", "ports.grpc_tls": "-1", "ui_config.enabled": "true",
	} {
		if consul[k] != want {
			t.Errorf("consul %s = %q, want %q", k, consul[k], want)
		}
	}
	nomad := devHCLAttrs(t, devNomadConfig(p, "/tmp/x y/nomad-data"))
	for k, want := range map[string]string{
		"data_dir": "/tmp/x y/nomad-data", "bind_addr": "127.0.0.1",
		"ports.http": "14646", "ports.rpc": "14647", "ports.serf": "14648",
		"advertise.http": "127.0.0.1", "advertise.rpc": "127.0.0.1", "advertise.serf": "127.0.0.1",
		"consul.address": "127.0.0.1:18500", "consul.grpc_address": "127.0.0.1:18502",
		"plugin.raw_exec.config.enabled": "true",
	} {
		if nomad[k] != want {
			t.Errorf("nomad %s = %q, want %q", k, nomad[k], want)
		}
	}
}

func TestDevLookPath(t *testing.T) {
	a, b := t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(a, "nomad"), []byte("not executable"), 0o644)
	os.Mkdir(filepath.Join(a, "consul"), 0o755)
	os.WriteFile(filepath.Join(b, "nomad"), []byte("#!/bin/sh\n"), 0o755)
	path := a + string(os.PathListSeparator) + b
	if p, ok := devLookPath("nomad", path); !ok || p != filepath.Join(b, "nomad") {
		t.Errorf("nomad: %q %v, want the executable in the second directory", p, ok)
	}
	if p, ok := devLookPath("consul", path); ok {
		t.Errorf("consul: found directory %q", p)
	}
}

func TestDevHelpers(t *testing.T) {
	var out bytes.Buffer
	w := &devPrefixWriter{prefix: "serve | ", w: &out}
	w.Write([]byte("one\ntw"))
	w.Write([]byte("o\n"))
	w.Write([]byte("partial"))
	if got := out.String(); got != "serve | one\nserve | two\n" {
		t.Errorf("prefixed = %q", got)
	}
	env := devChildEnv([]string{"PATH=/bin", "NOMAD_TOKEN=x", "CONSUL_HTTP_TOKEN=y", "NOMAD_NAMESPACE=prod", "HOME=/h"})
	if !slices.Equal(env, []string{"PATH=/bin", "HOME=/h"}) {
		t.Errorf("child env = %v", env)
	}
	for in, want := range map[string]string{":8080": "127.0.0.1:8080", "0.0.0.0:80": "127.0.0.1:80", "10.0.0.1:81": "10.0.0.1:81"} {
		if got := devDialAddr(in); got != want {
			t.Errorf("devDialAddr(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := devListenPort("127.0.0.1:http"); err == nil {
		t.Errorf("devListenPort accepted a named port")
	}
}

// The banner tells newcomers to curl testapp.default.<domain>: that is the
// service examples/raw-exec.hcl declares.
func TestDevBannerMatchesTheExample(t *testing.T) {
	f, diags := svchcl.ParseFile(filepath.Join("..", "..", "examples", "raw-exec.hcl"), svchcl.Options{Vars: map[string]string{"binary": "/usr/local/bin/nomad-serverless"}})
	if diags.HasErrors() {
		t.Fatalf("examples/raw-exec.hcl: %v", diags)
	}
	if len(f.Services) != 1 || f.Services[0].Name != "testapp" || f.Services[0].Namespace != "default" {
		t.Fatalf("examples/raw-exec.hcl declares %+v, the banner says testapp.default", f.Services)
	}
	if d := f.Services[0].Template.Task.Driver; d != "raw_exec" {
		t.Errorf("examples/raw-exec.hcl uses driver %q; dev's Nomad enables raw_exec only", d)
	}
}

// demoTestSettings run the demonstration fast: short windows and ticks, a
// small burst.
func demoTestSettings() demoSettings {
	return demoSettings{
		Example:       filepath.Join("..", "..", "examples", "raw-exec.hcl"),
		Window:        2 * time.Second,
		Grace:         time.Second,
		Tick:          250 * time.Millisecond,
		CheckInterval: 200 * time.Millisecond,
		Workers:       12,
		Work:          100 * time.Millisecond,
		Hold:          3 * time.Second,
		Deadline:      60 * time.Second,
	}
}

// demoProcesses lists live processes running bin (Linux /proc).
func demoProcesses(t *testing.T, bin string) []string {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Skip("no /proc to look for leftover processes")
	}
	var out []string
	for _, en := range entries {
		if _, err := strconv.Atoi(en.Name()); err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", en.Name(), "cmdline"))
		if err != nil || !strings.HasPrefix(string(cmd), bin+"\x00") {
			continue
		}
		if st, _ := os.ReadFile(filepath.Join("/proc", en.Name(), "stat")); strings.Contains(string(st), ") Z ") {
			continue // a zombie is already dead
		}
		out = append(out, en.Name()+": "+strings.ReplaceAll(string(cmd), "\x00", " "))
	}
	return out
}

func TestDevDemoWakesScalesAndReturnsToZero(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sidecar and app processes")
	}
	bin := testbin.Path(t)
	c := devConfig{Listen: "127.0.0.1:0", Domain: "localhost", Executable: bin}
	var out, errb devSyncBuffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	code := devDemo(context.Background(), e, c, demoTestSettings())
	text := out.String()
	if code != exitOK {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", code, text, errb.String())
	}
	for _, want := range []string{
		"consul, nomad not on PATH",
		"Service \"testapp\" from ../../examples/raw-exec.hcl: revision testapp-00001",
		"is at zero: 0 instances running",
		"Answered 200 by testapp-00001",
		"scale 0 -> 1: ",
		"Back to zero: 0 instances, 1 wake(s) from zero in all.",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("demo output lacks %q:\n%s", want, text)
		}
	}
	// Every stage of the cold start was measured, in order.
	var last float64 = -1
	for _, stage := range []string{"request in", "scale call", "allocation running", "first probe passing", "first byte"} {
		m := regexp.MustCompile(`(?m)^\s+` + regexp.QuoteMeta(stage) + `.*?\s(\d+)ms$`).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("cold start stage %q not measured:\n%s", stage, text)
			continue
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		if v < last {
			t.Errorf("stage %q at %vms is before the previous stage (%vms)", stage, v, last)
		}
		last = v
	}
	// The burst scaled up above one instance and nothing failed.
	up := regexp.MustCompile(`scale 1 -> (\d+)`).FindStringSubmatch(text)
	if up == nil {
		t.Errorf("the burst did not scale the revision up from 1:\n%s", text)
	}
	if m := regexp.MustCompile(`Burst over: (\d+) requests answered, (\d+) failed`).FindStringSubmatch(text); m == nil || m[1] == "0" || m[2] != "0" {
		t.Errorf("burst summary %v:\n%s", m, text)
	}
	if left := demoProcesses(t, bin); len(left) > 0 {
		t.Errorf("processes left after the demo:\n%s", strings.Join(left, "\n"))
	}
}

func TestDevDemoStopsOnCtrlC(t *testing.T) {
	if testing.Short() {
		t.Skip("runs real sidecar and app processes")
	}
	bin := testbin.Path(t)
	c := devConfig{Listen: "127.0.0.1:0", Domain: "localhost", Executable: bin}
	var out, errb devSyncBuffer
	e := &env{stdout: &out, stderr: &errb, getenv: func(string) string { return "" }}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() { done <- devDemo(ctx, e, c, demoTestSettings()) }()
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(out.String(), "Burst:") && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK || !strings.Contains(out.String(), "Interrupted.") {
			t.Errorf("exit %d after Ctrl-C:\n%s\n%s", code, out.String(), errb.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("demo did not stop within 30s of Ctrl-C:\n%s", out.String())
	}
	if left := demoProcesses(t, bin); len(left) > 0 {
		t.Errorf("processes left after Ctrl-C:\n%s", strings.Join(left, "\n"))
	}
}
