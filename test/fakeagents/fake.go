// Package fakeagents runs fake `consul`, `nomad` and `serve` executables
// for tests of code that starts dev agents (dev/devagents, the dev
// command): shell scripts on a temporary PATH that re-run the test binary,
// which then serves what the caller polls (/v1/status/leader naming itself,
// /v1/nodes, /v1/acl/bootstrap, /healthz, and for serve a gateway answering
// every request) on the ports it was configured with, and appends what happens to
// it (start with its arguments, requests, stop with the signal) to an
// events file the test reads.
//
// Behaviour is set through New's env map:
//
//	FAKE_LEADER_DELAY=300ms  /v1/status/leader answers "" that long after start
//	FAKE_LEADER_POLLS=2      /v1/status/leader answers "" to the first 2 polls
//	                         (a wait for the election, proved on a machine
//	                         of any speed)
//	FAKE_FAIL=<role>         that role prints "boom: ..." and exits 3 at once
//	FAKE_IGNORE_INT=<role>   that role ignores SIGINT (it must be killed)
//	FAKE_NO_RAW_EXEC=1       the Nomad node's raw_exec driver is unhealthy
//	FAKE_EXECUTOR=<role>     that role starts an "executor" in a session of
//	                         its own, which starts a "task"; both ignore
//	                         SIGINT, SIGTERM and SIGHUP and outlive the
//	                         role, as Nomad's executors and raw_exec tasks
//	                         outlive a Nomad agent that dies
package fakeagents

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// roleEnv names the role of a fake; it is set only in the fakes' scripts.
const roleEnv = "NOMAD_SERVERLESS_FAKE_AGENT_ROLE"

// ManagementSecret is what the fake Nomad's /v1/acl/bootstrap answers, and
// then wants in X-Nomad-Token.
const ManagementSecret = "fake-nomad-management-secret"

// GatewayBody is what the fake serve's gateway answers every request with.
const GatewayBody = "ok from the fake gateway\nsecond line\n"

// RunIfFake is the body of the fake executables. Call it from the test
// function whose name is given to New; in a normal test run it returns at
// once, in a fake it runs the fake and exits the process.
func RunIfFake() {
	role := os.Getenv(roleEnv)
	if role == "" {
		return
	}
	var args []string
	for i, a := range os.Args {
		if a == "--" {
			args = os.Args[i+1:]
			break
		}
	}
	os.Exit(fakeMain(role, args))
}

func flagValue(args []string, name string) string {
	for i := 0; i+1 < len(args); i++ {
		if args[i] == name {
			return args[i+1]
		}
	}
	return ""
}

func fakeMain(role string, args []string) int {
	events := os.Getenv("FAKE_EVENTS")
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
	if os.Getenv("FAKE_FAIL") == role {
		fmt.Fprintln(os.Stderr, "boom: the fake "+role+" refuses to start")
		return 3
	}
	switch {
	case role == "executor" || role == "task":
		signal.Ignore(syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP)
		if role == "executor" {
			if err := spawn("task", false); err != nil {
				fmt.Fprintln(os.Stderr, "fake: start task:", err)
				return 2
			}
		}
		// Bounded, should nothing end it.
		time.Sleep(2 * time.Minute)
		logEvent("timeout %s", role)
		return 4
	case os.Getenv("FAKE_EXECUTOR") == role:
		if err := spawn("executor", true); err != nil {
			fmt.Fprintln(os.Stderr, "fake: start executor:", err)
			return 2
		}
	}

	var addrs []string
	var leader string
	acl := false
	switch role {
	case "consul", "nomad":
		cfg, err := os.ReadFile(flagValue(args, map[string]string{"consul": "-config-file", "nomad": "-config"}[role]))
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake: read config:", err)
			return 2
		}
		m := regexp.MustCompile(`(?m)^\s*http\s*=\s*(\d+)`).FindSubmatch(cfg)
		if m == nil {
			fmt.Fprintln(os.Stderr, "fake: no http port in config")
			return 2
		}
		addrs = []string{"127.0.0.1:" + string(m[1])}
		// The leader a single dev agent names is itself: its server RPC
		// port (Consul's ports.server, Nomad's ports.rpc).
		rpc := regexp.MustCompile(map[string]string{"consul": `(?m)^\s*server\s*=\s*(\d+)`, "nomad": `(?m)^\s*rpc\s*=\s*(\d+)`}[role]).FindSubmatch(cfg)
		if rpc == nil {
			fmt.Fprintln(os.Stderr, "fake: no server RPC port in config")
			return 2
		}
		leader = "127.0.0.1:" + string(rpc[1])
		acl = regexp.MustCompile(`(?m)^acl \{\n\s*enabled\s*=\s*true`).Match(cfg)
	case "serve":
		addrs = []string{flagValue(args, "-admin-listen"), flagValue(args, "-listen")}
	}

	start := time.Now()
	leaderDelay, _ := time.ParseDuration(os.Getenv("FAKE_LEADER_DELAY"))
	leaderPolls, _ := strconv.Atoi(os.Getenv("FAKE_LEADER_POLLS"))
	var polls atomic.Int64
	bootstrapped := make(chan struct{}, 1)
	bootstrapped <- struct{}{} // a token to take: bootstrap works once
	mux := http.NewServeMux()
	mux.HandleFunc("/v1/status/leader", func(w http.ResponseWriter, r *http.Request) {
		if time.Since(start) < leaderDelay || polls.Add(1) <= int64(leaderPolls) {
			logEvent("poll %s leader=none", role)
			fmt.Fprint(w, `""`)
			return
		}
		fmt.Fprintf(w, "%q", leader)
	})
	mux.HandleFunc("/v1/acl/bootstrap", func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-bootstrapped:
			logEvent("bootstrap %s", role)
			fmt.Fprintf(w, `{"SecretID":%q}`, ManagementSecret)
		default:
			http.Error(w, "ACL bootstrap already done", http.StatusBadRequest)
		}
	})
	mux.HandleFunc("/v1/nodes", func(w http.ResponseWriter, r *http.Request) {
		if acl && r.Header.Get("X-Nomad-Token") != ManagementSecret {
			http.Error(w, "Permission denied", http.StatusForbidden)
			return
		}
		healthy := os.Getenv("FAKE_NO_RAW_EXEC") == ""
		fmt.Fprintf(w, `[{"ID":"fake-node","Status":"ready","Drivers":{"raw_exec":{"Detected":true,"Healthy":%t},"exec":{"Detected":true,"Healthy":true}}}]`, healthy)
	})
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	})
	if role == "serve" {
		mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
			logEvent("request serve host=%s path=%s", r.Host, r.URL.Path)
			w.Header().Set("Content-Type", "text/plain")
			fmt.Fprint(w, GatewayBody)
		})
	}
	for _, addr := range addrs {
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			fmt.Fprintln(os.Stderr, "fake: listen:", err)
			return 2
		}
		go http.Serve(ln, mux)
		fmt.Fprintf(os.Stderr, "fake %s listening on %s\n", role, addr)
	}

	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	ignore := os.Getenv("FAKE_IGNORE_INT") == role
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

// spawn starts this fake's executable again as role, in a new session if
// asked (out of reach of a kill of its parent's process group), and leaves
// it running.
func spawn(role string, session bool) error {
	// os.Args[1] is -test.run (see New); the role after -- names it in ps.
	cmd := exec.Command(os.Args[0], os.Args[1], "--", role)
	cmd.Env = append(os.Environ(), roleEnv+"="+role) // the last one wins
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: session}
	return cmd.Start()
}

// Fakes is a directory of fake executables (put it on PATH) and the events
// file they append to.
type Fakes struct {
	Dir, Events string
}

// New writes fake executables for roles ("consul", "nomad", "serve") into a
// new temporary directory. Each re-runs this test binary with -test.run
// selecting testName, a test that calls RunIfFake.
func New(t testing.TB, testName string, roles []string, env map[string]string) Fakes {
	t.Helper()
	dir := t.TempDir()
	f := Fakes{Dir: dir, Events: filepath.Join(dir, "events")}
	var exports strings.Builder
	for k, v := range env {
		fmt.Fprintf(&exports, "export %s=%q\n", k, v)
	}
	for _, role := range roles {
		// GORACE: a race-enabled test binary otherwise sleeps a second
		// before it exits, which would look like a slow stop.
		script := fmt.Sprintf("#!/bin/sh\n%sexport FAKE_EVENTS=%q %s=%s GORACE=atexit_sleep_ms=0\nexec %q -test.run='^%s$' -- \"$@\"\n",
			exports.String(), f.Events, roleEnv, role, os.Args[0], testName)
		if err := os.WriteFile(filepath.Join(dir, role), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

// Path is the fake executable of a role.
func (f Fakes) Path(role string) string { return filepath.Join(f.Dir, role) }

// Lines are the events so far.
func (f Fakes) Lines(t testing.TB) []string {
	t.Helper()
	b, err := os.ReadFile(f.Events)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// Has reports whether some event line contains s.
func (f Fakes) Has(t testing.TB, s string) bool {
	t.Helper()
	return slices.ContainsFunc(f.Lines(t), func(l string) bool { return strings.Contains(l, s) })
}

// PIDs returns the PID of every fake that started, by role.
func (f Fakes) PIDs(t testing.TB) map[string]int {
	t.Helper()
	out := map[string]int{}
	for _, l := range f.Lines(t) {
		var role string
		var pid int
		if n, _ := fmt.Sscanf(l, "start %s pid=%d", &role, &pid); n == 2 {
			out[role] = pid
		}
	}
	return out
}

// Starts returns the roles in the order they started.
func (f Fakes) Starts(t testing.TB) []string { return f.roles(t, "start") }

// Stops returns the roles in the order they logged a stop.
func (f Fakes) Stops(t testing.TB) []string { return f.roles(t, "stop") }

func (f Fakes) roles(t testing.TB, event string) []string {
	t.Helper()
	var out []string
	for _, l := range f.Lines(t) {
		if fields := strings.Fields(l); len(fields) > 1 && fields[0] == event {
			out = append(out, fields[1])
		}
	}
	return out
}

// AssertGone fails the test for every PID that still exists. The fakes are
// children of the code under test: once it reaped them, signal 0 reports
// ESRCH.
func AssertGone(t testing.TB, pids map[string]int) {
	t.Helper()
	for role, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("%s (pid %d) still exists (kill 0: %v)", role, pid, err)
		}
	}
}
