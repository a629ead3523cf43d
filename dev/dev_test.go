package dev

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/test/fakeagents"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The dev tests run dev against fake `consul`, `nomad` and `serve`
// executables (test/fakeagents): this test binary run
// again as TestDevFakeProcess. dev/devagents has the tests of the
// agents' start, waits and stop; these test what dev adds: the banner,
// serve, the -deploy sequence, the -or-demo decision, the order things stop.

// The command's exit codes, which the tests compare as the command would
// exit: dev has said on stderr what went wrong.
const (
	exitOK    = 0
	exitError = 1
)

// exitCode is the command's exit code for what Run or demo returned.
func exitCode(err error) int {
	if err != nil {
		return exitError
	}
	return exitOK
}

// codeError is what a stand-in demonstration returns to make dev exit
// with code.
func codeError(code int) error {
	if code != exitOK {
		return fmt.Errorf("the demonstration failed (exit %d)", code)
	}
	return nil
}

// TestDevFakeProcess is not a test: it is the body of the fake executables,
// and returns at once when the test binary runs normally.
func TestDevFakeProcess(t *testing.T) { fakeagents.RunIfFake() }

func newFakes(t *testing.T, roles []string, env map[string]string) fakeagents.Fakes {
	return fakeagents.New(t, "TestDevFakeProcess", roles, env)
}

var allRoles = []string{"consul", "nomad", "serve"}

// testConfig is a dev session against the fakes, with short bounds.
func testConfig(t *testing.T, f fakeagents.Fakes) Config {
	t.Helper()
	p, err := devagents.Ports{}.FillFree()
	if err != nil {
		t.Fatal(err)
	}
	return Config{
		// Ports nobody else picks: the agents' own ports of a FillFree.
		Listen:         "127.0.0.1:" + strconv.Itoa(p.ConsulDNS),
		AdminListen:    "127.0.0.1:" + strconv.Itoa(p.ConsulServer),
		InternalListen: "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t)),
		Domain:         "localhost",
		ConsulHTTPPort: p.ConsulHTTP,
		NomadHTTPPort:  p.NomadHTTP,
		DataDir:        filepath.Join(t.TempDir(), "data"),
		Executable:     f.Path("serve"),
		ReadyTimeout:   20 * time.Second,
		StopGrace:      5 * time.Second,
		Poll:           20 * time.Millisecond,
	}
}

// session runs Run in the background.
type session struct {
	stdout, stderr *testbin.Buffer
	cancel         context.CancelFunc
	code           chan int
}

func startSession(t *testing.T, c Config, path string) *session {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{stdout: &testbin.Buffer{}, stderr: &testbin.Buffer{}, cancel: cancel, code: make(chan int, 1)}
	e := Env{Stdout: s.stdout, Stderr: s.stderr, Getenv: func(k string) string {
		switch k {
		case "PATH":
			return path
		case "NOMAD_SERVERLESS_SIDECAR_IMAGE":
			// A user's cluster-wide default, which -deploy must hide.
			return "registry.example/nomad-serverless:1"
		}
		return ""
	}}
	go func() { s.code <- exitCode(Run(ctx, e, c)) }()
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
func (s *session) waitOutput(t *testing.T, want string, timeout time.Duration) {
	t.Helper()
	timeout = testbin.Bound(timeout)
	deadline := time.Now().Add(timeout)
	for !strings.Contains(s.stdout.String(), want) {
		select {
		case code := <-s.code:
			s.code <- code
			if strings.Contains(s.stdout.String(), want) {
				return
			}
			t.Fatalf("dev returned %d before printing %q\nstdout:\n%s\nstderr:\n%s", code, want, s.stdout.String(), s.stderr.String())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("dev did not print %q within %s\nstdout:\n%s\nstderr:\n%s", want, timeout, s.stdout.String(), s.stderr.String())
		}
	}
}

func (s *session) wait(t *testing.T, timeout time.Duration) int {
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

func TestDevStartsWaitsAndStopsInOrder(t *testing.T) {
	f := newFakes(t, allRoles, map[string]string{"FAKE_LEADER_POLLS": "2"})
	c := testConfig(t, f)
	s := startSession(t, c, f.Dir)
	s.waitOutput(t, "Ctrl-C stops everything", 30*time.Second)

	out := s.stdout.String()
	for _, want := range []string{
		fmt.Sprintf("Nomad UI    http://127.0.0.1:%d/ui/", c.NomadHTTPPort),
		fmt.Sprintf("Consul UI   http://127.0.0.1:%d/ui/", c.ConsulHTTPPort),
		"Gateway     http://" + c.Listen,
		"Admin API   http://" + c.AdminListen + "/v1/autoscaler/revisions",
		"Internal    http://" + c.InternalListen + "   (every service",
		"Logs        " + filepath.Join(c.DataDir, "consul.log") + ", " + filepath.Join(c.DataDir, "nomad.log"),
		fmt.Sprintf("export NOMAD_ADDR=http://127.0.0.1:%d CONSUL_HTTP_ADDR=127.0.0.1:%d", c.NomadHTTPPort, c.ConsulHTTPPort),
		c.Executable + " deploy -sidecar-command " + c.Executable + " -var binary=" + c.Executable + " examples/raw-exec.hcl",
		"curl -H 'Host: testapp.default.localhost' http://" + c.Listen + "/",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("banner lacks %q:\n%s", want, out)
		}
	}

	joined := strings.Join(f.Lines(t), "\n") + "\n"
	for _, want := range []string{
		"args=serve -listen " + c.Listen + " -admin-listen " + c.AdminListen + " -domain localhost -replica dev -internal-listen " + c.InternalListen,
		fmt.Sprintf("env serve NOMAD_ADDR=http://127.0.0.1:%d CONSUL_HTTP_ADDR=127.0.0.1:%d NOMAD_TOKEN=\n", c.NomadHTTPPort, c.ConsulHTTPPort),
		"poll consul leader=none", // dev waited for the election
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("events lack %q:\n%s", want, joined)
		}
	}
	// serve starts only once Nomad has a node.
	if got := f.Starts(t); !slices.Equal(got, allRoles) {
		t.Errorf("start order = %v", got)
	}

	pids := f.PIDs(t)
	s.cancel() // Ctrl-C
	if code := s.wait(t, 30*time.Second); code != exitOK {
		t.Fatalf("dev after Ctrl-C: exit %d\n%s", code, s.stderr.String())
	}
	if got := f.Stops(t); !slices.Equal(got, []string{"serve", "nomad", "consul"}) {
		t.Errorf("stop order = %v, want serve, nomad, consul", got)
	}
	for _, l := range f.Lines(t) {
		if strings.HasPrefix(l, "stop ") && !strings.HasSuffix(l, "signal=interrupt") {
			t.Errorf("stopped with something else than SIGINT: %s", l)
		}
	}
	fakeagents.AssertGone(t, pids)
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
		f := newFakes(t, tc.have, nil)
		s := startSession(t, testConfig(t, f), f.Dir)
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
		if lines := f.Lines(t); len(lines) != 0 {
			t.Errorf("have %v: started something: %v", tc.have, lines)
		}
	}
}

// -or-demo: without the binaries dev says what is missing in one paragraph
// and runs the demonstration, exiting with its status; with them it runs
// the agents and never the demonstration.
func TestDevOrDemoDecision(t *testing.T) {
	for _, tc := range []struct {
		have     []string
		demoCode int
		want     string
	}{
		{nil, exitOK, "consul and nomad are not on PATH, so ../examples/raw-exec.hcl cannot be deployed onto real Nomad and Consul dev agents."},
		{[]string{"consul"}, exitError, "nomad is not on PATH, so ../examples/raw-exec.hcl cannot be deployed"},
	} {
		f := newFakes(t, tc.have, nil)
		c := testConfig(t, f)
		c.Deploy, c.OrDemo = filepath.Join("..", "examples", "raw-exec.hcl"), true
		var demoRan Config
		c.Demo = func(ctx context.Context, e Env, dc Config) error {
			demoRan = dc
			fmt.Fprintln(e.Stdout, "the demonstration ran")
			return codeError(tc.demoCode)
		}
		s := startSession(t, c, f.Dir)
		if code := s.wait(t, 10*time.Second); code != tc.demoCode {
			t.Errorf("have %v: exit %d, want the demonstration's %d", tc.have, code, tc.demoCode)
		}
		out := s.stdout.String()
		note, rest, _ := strings.Cut(out, "the demonstration ran")
		if !strings.Contains(strings.Join(strings.Fields(note), " "), tc.want) || rest != "\n" || demoRan.Executable != c.Executable || !demoRan.OrDemo {
			t.Errorf("have %v: stdout\n%s", tc.have, out)
		}
		for _, m := range []string{"consul", "nomad"} {
			if link := devagents.InstallURL(m); slices.Contains(tc.have, m) == strings.Contains(note, link) {
				t.Errorf("have %v: link for %s wrong in\n%s", tc.have, m, note)
			}
		}
		if strings.Count(strings.TrimSpace(note), "\n\n") > 0 {
			t.Errorf("the note is not one paragraph:\n%s", note)
		}
		for _, l := range strings.Split(note, "\n") {
			if len(l) > 100 {
				t.Errorf("line longer than 100 columns: %q", l)
			}
		}
		if len(f.Lines(t)) != 0 {
			t.Errorf("have %v: started something: %v", tc.have, f.Lines(t))
		}
	}

	// With both binaries, -or-demo changes nothing.
	f := newFakes(t, allRoles, nil)
	c := testConfig(t, f)
	c.OrDemo = true
	c.Demo = func(context.Context, Env, Config) error {
		t.Error("the demonstration ran although consul and nomad are on PATH")
		return codeError(exitError)
	}
	s := startSession(t, c, f.Dir)
	s.waitOutput(t, "Ctrl-C stops everything", 30*time.Second)
	s.cancel()
	if code := s.wait(t, 30*time.Second); code != exitOK {
		t.Errorf("exit %d", code)
	}
}

// scriptedNomad answers Revisions with a scripted count: the revision
// has one instance for the first `up` calls, then none.
type scriptedNomad struct {
	mu    sync.Mutex
	calls int
	up    int
	err   error
}

func (n *scriptedNomad) Revisions(ctx context.Context, namespace, service string) ([]nomadjob.RevisionStatus, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls++
	if namespace != "default" || service != "testapp" {
		return nil, fmt.Errorf("asked for %s/%s", namespace, service)
	}
	if n.err != nil {
		return nil, n.err
	}
	old := nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: "testapp-00001", Generation: 1}, Desired: 1, Running: 1}
	rev := nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: "testapp-00002", Generation: 2}}
	if n.calls <= n.up {
		rev.Desired, rev.Running = 1, 1
	}
	// An older revision still running does not count.
	return []nomadjob.RevisionStatus{old, rev}, nil
}

// deployCall is what the fake deploy saw.
type deployCall struct {
	args                         []string
	nomadAddr, consulAddr, token string
	sidecarImage                 string
}

// deployTest sets up a -deploy session of examples/raw-exec.hcl against
// the fakes, with a deploy that prints what the real one prints and exits
// with code.
func deployTest(t *testing.T, code int, nomad *scriptedNomad) (Config, fakeagents.Fakes, chan deployCall) {
	// dev points its own process at the agents it started; the test
	// process gets its environment back afterwards.
	for _, kv := range os.Environ() {
		if name, value, _ := strings.Cut(kv, "="); devagents.ClusterVar(name) {
			t.Setenv(name, value)
		}
	}
	t.Setenv("NOMAD_ADDR", "http://nomad.elsewhere.example:4646")
	t.Setenv("CONSUL_HTTP_ADDR", "consul.elsewhere.example:8500")
	t.Setenv("NOMAD_TOKEN", "token-of-another-cluster")

	f := newFakes(t, allRoles, nil)
	c := testConfig(t, f)
	c.Deploy = filepath.Join("..", "examples", "raw-exec.hcl")
	calls := make(chan deployCall, 1)
	c.RunDeploy = func(ctx context.Context, e Env, args []string) int {
		calls <- deployCall{args: args, nomadAddr: os.Getenv("NOMAD_ADDR"), consulAddr: os.Getenv("CONSUL_HTTP_ADDR"), token: os.Getenv("NOMAD_TOKEN"),
			sidecarImage: e.Getenv("NOMAD_SERVERLESS_SIDECAR_IMAGE")}
		if code != exitOK {
			fmt.Fprintln(e.Stderr, "Error: revision testapp-00002 failed to start: allocation 1234abcd: exec failed")
			return code
		}
		fmt.Fprintln(e.Stdout, "testapp-00002: registered (generation 2)")
		fmt.Fprintln(e.Stdout, "testapp-00002: ready (1/1 instances passing) in 1.2s")
		return exitOK
	}
	c.Revisions = func() (RevisionSource, error) { return nomad, nil }
	return c, f, calls
}

func TestDevDeploySequence(t *testing.T) {
	nomad := &scriptedNomad{up: 3}
	c, f, calls := deployTest(t, exitOK, nomad)
	s := startSession(t, c, f.Dir)
	s.waitOutput(t, "Ctrl-C stops everything.\n", 30*time.Second)

	call := <-calls
	if want := []string{"-sidecar-command", c.Executable, "-var", "binary=" + c.Executable, c.Deploy}; !slices.Equal(call.args, want) {
		t.Errorf("deploy args = %q, want %q", call.args, want)
	}
	if call.nomadAddr != fmt.Sprintf("http://127.0.0.1:%d", c.NomadHTTPPort) || call.consulAddr != fmt.Sprintf("127.0.0.1:%d", c.ConsulHTTPPort) || call.token != "" {
		t.Errorf("deploy ran with NOMAD_ADDR=%q CONSUL_HTTP_ADDR=%q NOMAD_TOKEN=%q; want the dev agents and no token", call.nomadAddr, call.consulAddr, call.token)
	}
	if call.sidecarImage != "" {
		t.Errorf("deploy saw NOMAD_SERVERLESS_SIDECAR_IMAGE=%q beside -sidecar-command", call.sidecarImage)
	}

	out := s.stdout.String()
	t.Logf("dev's output:\n%s", out)
	host, gw := "testapp.default.localhost", "http://"+c.Listen
	steps := []string{
		"nomad-serverless dev is running",
		"Deploying " + c.Deploy + ":\n  $ nomad-serverless deploy -sidecar-command " + c.Executable,
		"  testapp-00002: ready (1/1 instances passing) in 1.2s\n",
		"testapp is at http://" + host + "/\n  $ curl -H 'Host: " + host + "' " + gw + "/\n",
		"Request through the gateway: 200 OK \"ok from the fake gateway\"\n",
		"Waiting for testapp-00002 to scale to zero (no requests for its 6s window, then its 5s grace; at most 1m11s)...",
		"  testapp-00002: 1 desired, 1 running",
		"  testapp-00002: 0 desired, 0 running",
		"testapp-00002 is at zero after ",
		"Request at zero woke it: 200 OK \"ok from the fake gateway\"; first byte after ",
		"Still running: curl -H 'Host: " + host + "' " + gw + "/",
	}
	at := 0
	for _, step := range steps {
		i := strings.Index(out[at:], step)
		if i < 0 {
			t.Fatalf("output lacks %q after offset %d:\n%s", step, at, out)
		}
		at += i + len(step)
	}
	if m := regexp.MustCompile(`first byte after \d+(\.\d+)?(ms|µs|s) `).FindStringSubmatch(out); m == nil || strings.Contains(out, "first byte after 0s") {
		t.Errorf("the wake's first byte is not timed (0s or no unit):\n%s", out)
	}
	if strings.Contains(out, "In another terminal:\n  export NOMAD_ADDR") && strings.Contains(out, " deploy -sidecar-command "+c.Executable+" -var binary="+c.Executable+" examples/raw-exec.hcl\n  curl") {
		t.Errorf("with -deploy the banner still tells to deploy by hand:\n%s", out)
	}
	// Two requests reached the gateway (serve), both for the service's host.
	var requests []string
	for _, l := range f.Lines(t) {
		if strings.HasPrefix(l, "request serve") {
			requests = append(requests, l)
		}
	}
	if want := "request serve host=" + host + " path=/"; len(requests) != 2 || requests[0] != want || requests[1] != want {
		t.Errorf("requests through the gateway = %q", requests)
	}

	pids := f.PIDs(t)
	s.cancel()
	if code := s.wait(t, 30*time.Second); code != exitOK {
		t.Fatalf("exit %d after Ctrl-C\n%s", code, s.stderr.String())
	}
	if got := f.Stops(t); !slices.Equal(got, []string{"serve", "nomad", "consul"}) {
		t.Errorf("stop order = %v", got)
	}
	fakeagents.AssertGone(t, pids)
}

func TestDevDeployFailures(t *testing.T) {
	t.Run("deploy fails", func(t *testing.T) {
		c, f, _ := deployTest(t, exitError, &scriptedNomad{})
		s := startSession(t, c, f.Dir)
		if code := s.wait(t, 30*time.Second); code != exitError {
			t.Fatalf("exit %d, want %d", code, exitError)
		}
		msg := s.stderr.String()
		for _, want := range []string{"  Error: revision testapp-00002 failed to start", "deploy of " + c.Deploy + " failed (exit 1", "Stopping serve"} {
			if !strings.Contains(msg, want) {
				t.Errorf("stderr lacks %q:\n%s", want, msg)
			}
		}
		if got := f.Stops(t); !slices.Equal(got, []string{"serve", "nomad", "consul"}) {
			t.Errorf("stop order = %v", got)
		}
		if f.Has(t, "request serve") {
			t.Errorf("requests sent after a failed deploy")
		}
	})
	for _, tc := range []struct {
		name  string
		nomad *scriptedNomad
		want  string
	}{
		{"never reaches zero", &scriptedNomad{up: 1 << 30},
			"testapp-00002 did not scale to zero within 300ms (last seen: 1 desired, 1 running); see `nomad job scaling-events testapp-00002`"},
		{"Nomad unreadable", &scriptedNomad{err: errors.New("list revisions: connection refused")},
			"testapp did not scale to zero within 300ms (last error: list revisions: connection refused)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, f, _ := deployTest(t, exitOK, tc.nomad)
			c.ZeroWait = 300 * time.Millisecond
			s := startSession(t, c, f.Dir)
			if code := s.wait(t, 30*time.Second); code != exitError {
				t.Fatalf("exit %d, want %d", code, exitError)
			}
			if msg := s.stderr.String(); !strings.Contains(msg, tc.want) {
				t.Errorf("stderr lacks %q:\n%s", tc.want, msg)
			}
			if got := f.Stops(t); !slices.Equal(got, []string{"serve", "nomad", "consul"}) {
				t.Errorf("stop order = %v", got)
			}
		})
	}
}

func TestDevDeclaresVar(t *testing.T) {
	dir := t.TempDir()
	with := filepath.Join(dir, "with.hcl")
	os.WriteFile(with, []byte("variable \"binary\" {\n  default = \"x\"\n}\nservice \"a\" {}\n"), 0o644)
	without := filepath.Join(dir, "without.hcl")
	os.WriteFile(without, []byte("variable \"image\" {}\nservice \"binary\" {}\n"), 0o644)
	if !declaresVar(with, "binary") || declaresVar(without, "binary") || declaresVar(filepath.Join(dir, "none.hcl"), "binary") {
		t.Errorf("declaresVar wrong")
	}
}

func TestDevAgentFailingAtStartStopsTheRest(t *testing.T) {
	f := newFakes(t, allRoles, map[string]string{"FAKE_FAIL": "nomad"})
	c := testConfig(t, f)
	s := startSession(t, c, f.Dir)
	if code := s.wait(t, 30*time.Second); code != exitError {
		t.Fatalf("exit %d, want %d", code, exitError)
	}
	msg := s.stderr.String()
	for _, want := range []string{"nomad exited: exit status 3", filepath.Join(c.DataDir, "nomad.log"), "boom: the fake nomad refuses to start", "Stopping consul"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if got := f.Stops(t); !slices.Equal(got, []string{"consul"}) {
		t.Errorf("stops = %v, want consul stopped", got)
	}
	if f.Has(t, "start serve") {
		t.Errorf("serve started although Nomad failed")
	}
	fakeagents.AssertGone(t, f.PIDs(t))
}

func TestDevKillsWhatIgnoresSIGINT(t *testing.T) {
	f := newFakes(t, allRoles, map[string]string{"FAKE_IGNORE_INT": "serve"})
	c := testConfig(t, f)
	c.StopGrace = 500 * time.Millisecond
	s := startSession(t, c, f.Dir)
	s.waitOutput(t, "Ctrl-C stops everything", 30*time.Second)
	pids := f.PIDs(t)
	s.cancel()
	if code := s.wait(t, 30*time.Second); code != exitOK {
		t.Fatalf("exit %d", code)
	}
	if !strings.Contains(s.stderr.String(), "serve did not stop within 500ms after SIGINT; killed it.") {
		t.Errorf("no word of the kill:\n%s", s.stderr.String())
	}
	if got := f.Stops(t); !slices.Equal(got, []string{"serve", "nomad", "consul"}) {
		t.Errorf("stops = %v", got)
	}
	fakeagents.AssertGone(t, pids)
}

func TestDevStartup(t *testing.T) {
	t.Run("Ctrl-C while waiting", func(t *testing.T) {
		f := newFakes(t, allRoles, map[string]string{"FAKE_LEADER_DELAY": "1h"})
		c := testConfig(t, f)
		c.DataDir = "" // a temporary one, removed at the end
		s := startSession(t, c, f.Dir)
		testbin.Eventually(t, 20*time.Second, 20*time.Millisecond, "dev polls Consul", func() (bool, string) {
			return f.Has(t, "poll consul"), s.stderr.String()
		})
		var dir string
		if m := regexp.MustCompile(`log (\S+)/consul\.log\)`).FindStringSubmatch(s.stderr.String()); m != nil {
			dir = m[1]
		}
		s.cancel()
		if code := s.wait(t, 20*time.Second); code != exitOK {
			t.Fatalf("exit %d", code)
		}
		if !strings.Contains(s.stderr.String(), "Interrupted during start-up") {
			t.Errorf("stderr:\n%s", s.stderr.String())
		}
		fakeagents.AssertGone(t, f.PIDs(t))
		if _, err := os.Stat(dir); dir == "" || !errors.Is(err, os.ErrNotExist) {
			t.Errorf("temporary data directory %q not removed: %v", dir, err)
		}
	})
	t.Run("a failed start keeps the temporary logs", func(t *testing.T) {
		f := newFakes(t, allRoles, map[string]string{"FAKE_FAIL": "consul"})
		c := testConfig(t, f)
		c.DataDir = ""
		s := startSession(t, c, f.Dir)
		if code := s.wait(t, 20*time.Second); code != exitError {
			t.Fatalf("exit %d", code)
		}
		m := regexp.MustCompile(`kept in (\S+)\.\n`).FindStringSubmatch(s.stderr.String())
		if m == nil {
			t.Fatalf("no word of the kept logs:\n%s", s.stderr.String())
		}
		defer os.RemoveAll(m[1])
		if b, err := os.ReadFile(filepath.Join(m[1], "consul.log")); err != nil || !strings.Contains(string(b), "boom") {
			t.Errorf("consul.log kept: %q %v", b, err)
		}
	})
	t.Run("port in use", func(t *testing.T) {
		f := newFakes(t, allRoles, nil)
		c := testConfig(t, f)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(c.ConsulHTTPPort))
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		s := startSession(t, c, f.Dir)
		if code := s.wait(t, 10*time.Second); code != exitError {
			t.Fatalf("exit %d", code)
		}
		if want := fmt.Sprintf("port %d (Consul HTTP) is in use", c.ConsulHTTPPort); !strings.Contains(s.stderr.String(), want) {
			t.Errorf("stderr lacks %q:\n%s", want, s.stderr.String())
		}
		if len(f.Lines(t)) != 0 {
			t.Errorf("started something: %v", f.Lines(t))
		}
	})
}

func TestDevHelpers(t *testing.T) {
	var out bytes.Buffer
	w := &prefixWriter{prefix: "serve | ", w: &out}
	w.Write([]byte("one\ntw"))
	w.Write([]byte("o\n"))
	w.Write([]byte("partial"))
	if got := out.String(); got != "serve | one\nserve | two\n" {
		t.Errorf("prefixed = %q", got)
	}
	for in, want := range map[string]string{":8080": "127.0.0.1:8080", "0.0.0.0:80": "127.0.0.1:80", "10.0.0.1:81": "10.0.0.1:81"} {
		if got := dialAddr(in); got != want {
			t.Errorf("dialAddr(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := listenPort("127.0.0.1:http"); err == nil {
		t.Errorf("listenPort accepted a named port")
	}
	if got := wrap("aa bb cc "+strings.Repeat("x", 12)+" dd", 8); got != "aa bb cc\n"+strings.Repeat("x", 12)+"\ndd" {
		t.Errorf("wrap = %q", got)
	}
}

// The banner tells newcomers to curl testapp.default.<domain>: that is the
// service examples/raw-exec.hcl declares.
func TestDevBannerMatchesTheExample(t *testing.T) {
	f, diags := svchcl.ParseFile(filepath.Join("..", "examples", "raw-exec.hcl"), svchcl.Options{Vars: map[string]string{"binary": "/usr/local/bin/nomad-serverless"}})
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
		Example:       filepath.Join("..", "examples", "raw-exec.hcl"),
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
	c := Config{Listen: "127.0.0.1:0", Domain: "localhost", Executable: bin}
	var out, errb testbin.Buffer
	e := Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	code := exitCode(demo(context.Background(), e, c, demoTestSettings()))
	text := out.String()
	if code != exitOK {
		t.Fatalf("demo: exit %d\nstdout:\n%s\nstderr:\n%s", code, text, errb.String())
	}
	for _, want := range []string{
		"consul, nomad not on PATH",
		"Service \"testapp\" from ../examples/raw-exec.hcl: revision testapp-00001",
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
	c := Config{Listen: "127.0.0.1:0", Domain: "localhost", Executable: bin}
	var out, errb testbin.Buffer
	e := Env{Stdout: &out, Stderr: &errb, Getenv: func(string) string { return "" }}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // also when the wait below fails
	done := make(chan int, 1)
	go func() { done <- exitCode(demo(ctx, e, c, demoTestSettings())) }()
	testbin.Eventually(t, 30*time.Second, 20*time.Millisecond, "the demo's burst", func() (bool, string) {
		return strings.Contains(out.String(), "Burst:"), out.String()
	})
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
