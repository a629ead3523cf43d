package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// integ runs the real binary (CLI commands and `serve`) against a fake
// Nomad and Consul (test/fakecluster).
type integ struct {
	t       *testing.T // the running scenario, for failures
	root    *testing.T // the whole test, for what outlives a scenario
	bin     string
	cluster *fakecluster.Cluster
	dir     string
	tasks   *testbin.Buffer // every task's output, printed when the test fails
	serves  []*serveProc
}

func newInteg(t *testing.T) *integ {
	t.Helper()
	it := &integ{t: t, root: t, bin: testbin.Path(t), dir: t.TempDir(), tasks: &testbin.Buffer{}}
	it.cluster = fakecluster.Start(t, fakecluster.Options{
		CheckInterval:     250 * time.Millisecond,
		ShutdownDelay:     time.Second,
		RescheduleDelay:   2 * time.Second,
		HeartbeatInterval: 2 * time.Second,
		TaskOutput:        it.tasks,
	})
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, s := range it.serves {
			t.Logf("---- output of serve %s (pid %d):\n%s", s.replica, s.proc.PID(), tail(s.proc.Output(), 200))
		}
		t.Logf("---- task output (sidecars and apps):\n%s", tail(it.tasks.String(), 150))
	})
	return it
}

// tail keeps the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = append([]string{fmt.Sprintf("... (%d lines before)", len(lines)-n)}, lines[len(lines)-n:]...)
	}
	return strings.Join(lines, "\n")
}

// env is the environment of every process: the fake agents' addresses,
// nothing inherited that could point elsewhere.
func (it *integ) env() []string {
	var out []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "NOMAD_") || strings.HasPrefix(k, "CONSUL_") {
			continue
		}
		out = append(out, kv)
	}
	for k, v := range it.cluster.Env() {
		out = append(out, k+"="+v)
	}
	return out
}

// cliResult is what a CLI command did.
type cliResult struct {
	args           []string
	stdout, stderr string
	code           int
}

func (r cliResult) String() string {
	return fmt.Sprintf("nomad-serverless %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(r.args, " "), r.code, r.stdout, r.stderr)
}

// cli runs one CLI command, bounded to 90 s.
func (it *integ) cli(args ...string) cliResult {
	it.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, it.bin, args...)
	cmd.Env = it.env()
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.WaitDelay = 5 * time.Second
	err := cmd.Run()
	res := cliResult{args: args, stdout: stdout.String(), stderr: stderr.String()}
	if err != nil && cmd.ProcessState == nil {
		it.t.Fatalf("run nomad-serverless %s: %v", strings.Join(args, " "), err)
	}
	res.code = cmd.ProcessState.ExitCode()
	if ctx.Err() != nil {
		it.t.Fatalf("nomad-serverless %s did not finish within 90s:\n%s", strings.Join(args, " "), res)
	}
	return res
}

// mustCLI runs a command that must exit 0.
func (it *integ) mustCLI(args ...string) cliResult {
	it.t.Helper()
	r := it.cli(args...)
	if r.code != 0 {
		it.t.Fatalf("%s", r)
	}
	return r
}

// cliJSON runs a command with -json and decodes its output.
func (it *integ) cliJSON(v any, args ...string) {
	it.t.Helper()
	r := it.mustCLI(args...)
	if err := json.Unmarshal([]byte(r.stdout), v); err != nil {
		it.t.Fatalf("%s\nis not the JSON expected: %v", r, err)
	}
}

// writeFile writes a service file into the test's directory.
func (it *integ) writeFile(name, content string) string {
	it.t.Helper()
	p := filepath.Join(it.dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		it.t.Fatal(err)
	}
	return p
}

// helloService is the test's service file: the test app named by version,
// at most 10 requests per instance, a tag for catalog-driven proxies,
// scaling tuned to react in seconds.
func (it *integ) helloService(version string) string {
	return fmt.Sprintf(`service "hello" {
  task {
    driver = "raw_exec"
    config {
      command = %q
      args    = ["testapp"]
    }
    env = {
      TESTAPP_NAME = %q
    }
    kill_timeout = "3s"
  }
  concurrency = 10
  tags        = ["traefik.enable=true"]
  scaling {
    min                 = 0
    max                 = 3
    initial             = 1
    target              = 5
    window              = "6s"
    scale_to_zero_grace = "2s"
  }
}
`, it.bin, version)
}

// deploy runs deploy with the sidecar from the built binary.
func (it *integ) deploy(file string) cliResult {
	it.t.Helper()
	return it.cli("deploy", "-sidecar-command", it.bin, "-wait", "60s", file)
}

// deployHello deploys hello.hcl with the test app named version, which
// must make revision gen of hello: deploy reports it registered, ready and
// given all the traffic.
func (it *integ) deployHello(t *testing.T, version string, gen int) {
	t.Helper()
	r := it.deploy(it.writeFile("hello.hcl", it.helloService(version)))
	if r.code != 0 {
		t.Fatalf("%s", r)
	}
	rev := spec.RevisionName("hello", gen)
	for _, want := range []string{fmt.Sprintf("%s: registered (generation %d)", rev, gen), rev + ": ready (1/1 instances passing)", "hello: route published (" + rev + " 100%)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("deploy's output lacks %q:\n%s", want, r)
		}
	}
}

// serveProc is one running `serve`.
type serveProc struct {
	replica string
	proc    *testbin.Proc
	listen  string
	admin   string
}

// startServe starts a control-plane replica and waits until its admin API
// answers /healthz.
func (it *integ) startServe(replica string) *serveProc {
	it.t.Helper()
	return it.startServeOn(replica, "127.0.0.1:"+strconv.Itoa(testbin.FreePort(it.t)))
}

// startServeOn is startServe with the gateway on listen and more flags.
func (it *integ) startServeOn(replica, listen string, extra ...string) *serveProc {
	it.t.Helper()
	s := &serveProc{replica: replica, listen: listen, admin: "127.0.0.1:" + strconv.Itoa(testbin.FreePort(it.t))}
	env := map[string]string{}
	for k, v := range it.cluster.Env() {
		env[k] = v
	}
	for _, k := range []string{"NOMAD_TOKEN", "NOMAD_NAMESPACE", "CONSUL_HTTP_TOKEN", "NOMAD_REGION"} {
		env[k] = ""
	}
	// The process outlives the scenario that starts it.
	s.proc = testbin.Start(it.root, it.bin, append([]string{"serve", "-listen", s.listen, "-admin-listen", s.admin,
		"-replica", replica, "-tick", "250ms"}, extra...), env)
	it.serves = append(it.serves, s)
	eventually(it.t, 20*time.Second, "serve "+replica+" answers "+activator.HealthPath, func() (bool, string) {
		select {
		case <-s.proc.Done():
			it.t.Fatalf("serve %s exited:\n%s", replica, s.proc.Output())
		default:
		}
		code, _, err := httpGet("http://"+s.admin+activator.HealthPath, "", nil)
		return err == nil && code == http.StatusOK, fmt.Sprintf("code %d err %v", code, err)
	})
	return s
}

// stop ends serve with SIGTERM and waits for it.
func (s *serveProc) stop(t *testing.T) {
	t.Helper()
	if code := s.proc.Stop(t); code != 0 {
		t.Errorf("serve %s exited %d after SIGTERM, want 0:\n%s", s.replica, code, tail(s.proc.Output(), 50))
	}
}

// reply is one request's outcome.
type reply struct {
	code int
	app  string // X-Testapp-Name
	body string
	err  error
}

func (r reply) ok() bool { return r.err == nil && r.code == http.StatusOK }

func (r reply) String() string {
	if r.err != nil {
		return "error: " + r.err.Error()
	}
	return fmt.Sprintf("%d app=%q body=%q", r.code, r.app, strings.TrimSpace(r.body))
}

var integClient = &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// request sends GET path through a gateway with the Host of a service
// (tag "" for the plain host).
func (s *serveProc) request(service, tag, path string) reply {
	host := service + ".default." + activator.DefaultDomain
	if tag != "" {
		host = tag + "-" + host
	}
	req, err := http.NewRequest(http.MethodGet, "http://"+s.listen+path, nil)
	if err != nil {
		return reply{err: err}
	}
	req.Host = host
	resp, err := integClient.Do(req)
	if err != nil {
		return reply{err: err}
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	return reply{code: resp.StatusCode, app: resp.Header.Get("X-Testapp-Name"), body: string(b)}
}

// adminJSON decodes one of serve's admin endpoints.
func (s *serveProc) adminJSON(path string, v any) error {
	code, body, err := httpGet("http://"+s.admin+path, "", nil)
	if err != nil {
		return err
	}
	if code != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, code, body)
	}
	return json.Unmarshal([]byte(body), v)
}

func httpGet(url, host string, header map[string]string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	if host != "" {
		req.Host = host
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), nil
}

// eventually polls cond every 100 ms until it holds; after timeout it fails
// the test with what cond last said.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testbin.Eventually(t, timeout, 100*time.Millisecond, what, cond)
}

// load sends requests from a few workers until stopped and remembers every
// failure and which apps answered.
type load struct {
	stopCh   chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex
	sent     int
	failures []string
	apps     map[string]int
}

func startLoad(s *serveProc, service string, workers int) *load {
	l := &load{stopCh: make(chan struct{}), apps: map[string]int{}}
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for {
				select {
				case <-l.stopCh:
					return
				default:
				}
				r := s.request(service, "", "/")
				l.mu.Lock()
				l.sent++
				if !r.ok() {
					l.failures = append(l.failures, r.String())
				} else {
					l.apps[r.app]++
				}
				l.mu.Unlock()
				time.Sleep(20 * time.Millisecond)
			}
		}()
	}
	return l
}

func (l *load) stop() {
	close(l.stopCh)
	l.wg.Wait()
}

func (l *load) snapshot() (sent int, failures []string, apps map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	apps = map[string]int{}
	for k, v := range l.apps {
		apps[k] = v
	}
	return l.sent, append([]string(nil), l.failures...), apps
}
