package devagents

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/fakeagents"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The tests below start fake `consul` and `nomad` executables (see
// fakeagents): this test binary run again as TestFakeAgentProcess.

// TestFakeAgentProcess is not a test: it is the body of the fakes, and
// returns at once in a normal run.
func TestFakeAgentProcess(t *testing.T) { fakeagents.RunIfFake() }

func fakes(t *testing.T, env map[string]string) fakeagents.Fakes {
	return fakeagents.New(t, "TestFakeAgentProcess", []string{"consul", "nomad"}, env)
}

// options start the fakes with short bounds; progress is read once Start
// or Stop returned.
func options(t *testing.T, f fakeagents.Fakes, progress *bytes.Buffer) Options {
	if progress == nil {
		progress = &bytes.Buffer{}
	}
	return Options{
		ConsulBin: f.Path("consul"), NomadBin: f.Path("nomad"), Dir: t.TempDir(),
		ReadyTimeout: 20 * time.Second, Poll: 20 * time.Millisecond, StopGrace: 5 * time.Second,
		Progress: progress,
	}
}

// start runs Start and registers a Stop.
func start(t *testing.T, o Options) *Agents {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() { a.Stop(5 * time.Second) })
	return a
}

func TestStartWaitsInOrderAndStops(t *testing.T) {
	f := fakes(t, map[string]string{"FAKE_LEADER_POLLS": "2"})
	var progress bytes.Buffer
	o := options(t, f, &progress) // every port picked free
	a := start(t, o)

	if a.NomadAddr != fmt.Sprintf("http://127.0.0.1:%d", a.Ports.NomadHTTP) || a.ConsulAddr != fmt.Sprintf("127.0.0.1:%d", a.Ports.ConsulHTTP) || a.ConsulURL != "http://"+a.ConsulAddr {
		t.Errorf("addresses %q %q %q for ports %+v", a.NomadAddr, a.ConsulAddr, a.ConsulURL, a.Ports)
	}
	joined := strings.Join(f.Lines(t), "\n")
	for _, want := range []string{
		"args=agent -dev -config-file " + filepath.Join(o.Dir, "consul.hcl"),
		"args=agent -dev -config " + filepath.Join(o.Dir, "nomad.hcl"),
		"poll consul leader=none", // it waited for Consul's election
		"poll nomad leader=none",  // and for Nomad's
	} {
		if !strings.Contains(joined, want) {
			t.Errorf("events lack %q:\n%s", want, joined)
		}
	}
	// Nomad starts only once Consul has a leader.
	if got := f.Starts(t); !slices.Equal(got, []string{"consul", "nomad"}) {
		t.Errorf("start order = %v", got)
	}
	lines := f.Lines(t)
	lastConsulPoll := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "start nomad") })
	for _, l := range lines[lastConsulPoll:] {
		if strings.HasPrefix(l, "poll consul") {
			t.Errorf("Nomad started before Consul had a leader:\n%s", joined)
		}
	}
	nomadCfg, _ := os.ReadFile(filepath.Join(o.Dir, "nomad.hcl"))
	if !strings.Contains(string(nomadCfg), fmt.Sprintf(`address      = "127.0.0.1:%d"`, a.Ports.ConsulHTTP)) {
		t.Errorf("Nomad is not pointed at the Consul dev agent:\n%s", nomadCfg)
	}
	if !strings.Contains(progress.String(), "Starting Consul dev agent ("+o.ConsulBin+", log "+filepath.Join(o.Dir, "consul.log")+")") {
		t.Errorf("progress: %s", progress.String())
	}
	if err := a.Alive(); err != nil {
		t.Errorf("Alive: %v", err)
	}

	pids := f.PIDs(t)
	if killed := a.Stop(5 * time.Second); len(killed) != 0 {
		t.Errorf("killed: %v", killed)
	}
	if got := f.Stops(t); !slices.Equal(got, []string{"nomad", "consul"}) {
		t.Errorf("stop order = %v, want nomad, consul", got)
	}
	for _, l := range f.Lines(t) {
		if strings.HasPrefix(l, "stop ") && !strings.HasSuffix(l, "signal=interrupt") {
			t.Errorf("stopped with something else than SIGINT: %s", l)
		}
	}
	fakeagents.AssertGone(t, pids)
	if !strings.Contains(progress.String(), "Stopping nomad...\nStopping consul...\n") {
		t.Errorf("progress: %s", progress.String())
	}
}

func TestStartFailingAgentStopsTheRest(t *testing.T) {
	f := fakes(t, map[string]string{"FAKE_FAIL": "nomad"})
	var progress bytes.Buffer
	o := options(t, f, &progress)
	a, err := Start(context.Background(), o)
	if err == nil || a != nil {
		t.Fatalf("Start with a failing Nomad: %v", err)
	}
	for _, want := range []string{"nomad exited: exit status 3", "last lines of " + filepath.Join(o.Dir, "nomad.log"), "boom: the fake nomad refuses to start"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if got := f.Stops(t); !slices.Equal(got, []string{"consul"}) {
		t.Errorf("stops = %v, want consul stopped", got)
	}
	if !strings.Contains(progress.String(), "Stopping consul...") {
		t.Errorf("progress: %s", progress.String())
	}
	fakeagents.AssertGone(t, f.PIDs(t))
}

// TestStartRefusesAnotherClustersAgent: the port picked for our Nomad's HTTP
// was taken by another cluster's agent before ours bound it (a parallel
// test, another dev cluster). That agent answers every check; ours dies of
// "address already in use". Start must not call it ready.
func TestStartRefusesAnotherClustersAgent(t *testing.T) {
	squatter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/v1/status/leader":
			fmt.Fprint(w, `"127.0.0.1:1"`) // some other cluster's server
		case "/v1/nodes":
			fmt.Fprint(w, `[{"ID":"theirs","Status":"ready","Drivers":{"raw_exec":{"Detected":true,"Healthy":true}}}]`)
		default:
			http.NotFound(w, r)
		}
	}))
	defer squatter.Close()
	port := squatter.Listener.Addr().(*net.TCPAddr).Port
	f := fakes(t, nil)
	o := options(t, f, nil)
	o.Ports.NomadHTTP = port
	a, err := Start(context.Background(), o)
	if err == nil || a != nil {
		a.Stop(5 * time.Second)
		t.Fatalf("Start with another cluster's agent on Nomad's port: ready, want an error")
	}
	// Our fake exits at its failed listen; if the check still runs when
	// the exit is seen, the error is the exit with the fake's log.
	if !strings.Contains(err.Error(), "address already in use") && !strings.Contains(err.Error(), "another cluster's agent") {
		t.Errorf("error says neither why our agent died nor who answered:\n%v", err)
	}
	fakeagents.AssertGone(t, f.PIDs(t))
}

func TestLeaderIs(t *testing.T) {
	var answer string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, answer) }))
	defer srv.Close()
	check := agentHTTP{base: srv.URL}.leaderIs("127.0.0.1:4647")
	for _, tc := range []struct{ answer, wantErr string }{
		{`""`, "no leader elected yet"},
		{`"127.0.0.1:4647"`, ""},
		{`"127.0.0.1:4747"`, "answers with leader 127.0.0.1:4747, not 127.0.0.1:4647: another cluster's agent listens on this port"},
		{`not json`, "answer"},
	} {
		answer = tc.answer
		err := check(context.Background())
		if (err == nil) != (tc.wantErr == "") || err != nil && !strings.Contains(err.Error(), tc.wantErr) {
			t.Errorf("leader %s: error %v, want %q", tc.answer, err, tc.wantErr)
		}
	}
}

func TestStopKillsWhatIgnoresSIGINT(t *testing.T) {
	f := fakes(t, map[string]string{"FAKE_IGNORE_INT": "nomad"})
	a := start(t, options(t, f, nil))
	pids := f.PIDs(t)
	// Grace enough for Consul, which stops at SIGINT, on a busy machine.
	grace := testbin.Bound(3 * time.Second)
	killed := a.Stop(grace)
	if !slices.Equal(killed, []string{"nomad did not stop within " + grace.String() + " after SIGINT; killed it."}) {
		t.Errorf("killed = %q", killed)
	}
	if got := f.Stops(t); !slices.Equal(got, []string{"nomad", "consul"}) {
		t.Errorf("stops = %v", got)
	}
	fakeagents.AssertGone(t, pids)
}

func TestStartBounds(t *testing.T) {
	// The fakes start, listen and answer well within it on a busy
	// machine; what they never do is what the timeout ends.
	readyTimeout := testbin.Bound(5 * time.Second)
	t.Run("no leader within the timeout", func(t *testing.T) {
		t.Parallel()
		f := fakes(t, map[string]string{"FAKE_LEADER_DELAY": "1h"})
		o := options(t, f, nil)
		o.ReadyTimeout = readyTimeout
		_, err := Start(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "Consul at http://127.0.0.1:") || !strings.Contains(err.Error(), "not ready after "+readyTimeout.String()+": no leader elected yet") {
			t.Errorf("err = %v", err)
		}
		if got := f.Stops(t); !slices.Equal(got, []string{"consul"}) {
			t.Errorf("stops = %v", got)
		}
	})
	t.Run("no raw_exec driver", func(t *testing.T) {
		t.Parallel()
		f := fakes(t, map[string]string{"FAKE_NO_RAW_EXEC": "1"})
		o := options(t, f, nil)
		o.ReadyTimeout = readyTimeout
		_, err := Start(context.Background(), o)
		if err == nil || !strings.Contains(err.Error(), "none ready with a healthy raw_exec driver") {
			t.Errorf("err = %v", err)
		}
		if got := f.Stops(t); !slices.Equal(got, []string{"nomad", "consul"}) {
			t.Errorf("stops = %v", got)
		}
	})
	t.Run("context ends while waiting", func(t *testing.T) {
		f := fakes(t, map[string]string{"FAKE_LEADER_DELAY": "1h"})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel() // also when the wait below fails
		done := make(chan error, 1)
		o := options(t, f, nil) // its progress is written by Start's goroutine alone
		go func() {
			_, err := Start(ctx, o)
			done <- err
		}()
		testbin.Eventually(t, 20*time.Second, 20*time.Millisecond, "Start polls Consul", func() (bool, string) {
			return f.Has(t, "poll consul"), strings.Join(f.Lines(t), "; ")
		})
		cancel()
		select {
		case err := <-done:
			if err != context.Canceled {
				t.Errorf("err = %v, want context.Canceled", err)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("Start did not return after its context ended")
		}
		fakeagents.AssertGone(t, f.PIDs(t))
	})
}

func TestStartWithACL(t *testing.T) {
	f := fakes(t, nil)
	o := options(t, f, nil)
	o.Config.ACL = &ACL{ConsulManagementToken: "c0ffee00-0000-4000-8000-000000000001"}
	// The fake Nomad answers /v1/nodes only with the bootstrapped token, so
	// Start returning means it bootstrapped and then used it.
	a := start(t, o)
	if a.ACL.NomadManagementToken != fakeagents.ManagementSecret {
		t.Errorf("management token %q", a.ACL.NomadManagementToken)
	}
	if !f.Has(t, "bootstrap nomad") {
		t.Errorf("no bootstrap: %v", f.Lines(t))
	}
	cfg, _ := os.ReadFile(filepath.Join(o.Dir, "consul.hcl"))
	if !strings.Contains(string(cfg), `initial_management = "c0ffee00-0000-4000-8000-000000000001"`) {
		t.Errorf("consul config without ACLs:\n%s", cfg)
	}
}

func TestAliveReportsAnExitedAgent(t *testing.T) {
	f := fakes(t, nil)
	a := start(t, options(t, f, nil))
	if err := syscall.Kill(a.Nomad.Pid(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-a.Nomad.Done()
	err := a.Alive()
	if err == nil || !strings.Contains(err.Error(), "nomad exited: signal: killed") || !strings.Contains(err.Error(), "nomad.log") {
		t.Errorf("Alive = %v", err)
	}
}
