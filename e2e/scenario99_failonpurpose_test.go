package e2e

import (
	"context"
	"flag"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
)

var failOnPurpose = flag.String("fail-on-purpose", "", "make scenario 99 end the run with the agents, serve and an instance running: fail, panic, hang (until -timeout) or kill (SIGKILL of this binary); the guard must leave no process behind")

// Scenario 99 (only with -args -fail-on-purpose=MODE): the proof that an
// abrupt end leaves nothing behind. It deploys a service with one instance
// (an allocation running the app and our sidecar under Nomad's executors)
// behind a running serve, then ends the way MODE says: a failure (TestMain's
// normal path stops the agents), a panic or a hang until -timeout (the
// testing package panics; no cleanup and no TestMain code runs) or a
// SIGKILL of this test binary (nothing of it runs). In the last three the
// guard stops the agents and kills what is left. After the run, nothing of
// nomad, consul or nomad-serverless may be running:
//
//	go test -count=1 -v -timeout 3m ./e2e/ -run TestE2E99 -args -require -fail-on-purpose=hang
//	ps -eo pid,ppid,cmd | grep -E 'nomad|consul|nomad-serverless'
//
// Named 99 so that it runs after every other scenario.
func TestE2E99FailOnPurpose(t *testing.T) {
	mode := *failOnPurpose
	switch mode {
	case "":
		t.Skip("scenario 99 fails on purpose only with -args -fail-on-purpose=fail|panic|hang|kill")
	case "fail", "panic", "hang", "kill":
	default:
		t.Fatalf("-fail-on-purpose=%q: want fail, panic, hang or kill", mode)
	}
	h := newHarness(t, "99 fail on purpose")
	const svc = "e2e-fail-on-purpose"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-99", "", "")
	s := testService(svc)
	s.Scaling.Min = 1 // an instance runs when the run ends
	h.deploy(h.writeServices("fail.hcl", s))
	alloc := h.waitRunning(rev, 1, 30*time.Second)[0].ID
	if o := g.request(svc, "", "/", NewClient(1)).Do(context.Background()); !o.OK() {
		t.Fatalf("request through the gateway: %s", o.Describe())
	}

	// For the record: what runs below the guard (or this binary) now.
	root := os.Getpid()
	if h.s.Guard != nil {
		root = os.Getppid()
	}
	t.Logf("ending on purpose (%s) with allocation %s of %s running; the processes below pid %d:\n  %s",
		mode, alloc, rev, root, strings.Join(devagents.DescribeDescendants(root), "\n  "))

	switch mode {
	case "fail":
		t.Fatal("failing on purpose (-fail-on-purpose=fail)")
	case "panic":
		panic("panicking on purpose (-fail-on-purpose=panic)")
	case "hang":
		t.Log("hanging on purpose (-fail-on-purpose=hang) until -timeout")
		for {
			time.Sleep(time.Hour)
		}
	case "kill":
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		time.Sleep(time.Minute) // the signal is on its way
	}
}
