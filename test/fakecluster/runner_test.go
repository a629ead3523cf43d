package fakecluster_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// fastOptions shorten the cluster's timings for tests; task output goes to
// out, printed when the test fails.
func fastOptions(t *testing.T) (fakecluster.Options, *testbin.Buffer) {
	out := &testbin.Buffer{}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("task output:\n%s", out.String())
		}
	})
	return fakecluster.Options{
		CheckInterval:     200 * time.Millisecond,
		ShutdownDelay:     300 * time.Millisecond,
		RescheduleDelay:   time.Hour, // no replacement unless a test wants one
		HeartbeatInterval: time.Second,
		TaskOutput:        out,
	}, out
}

func clients(t *testing.T, c *fakecluster.Cluster) (*nomadjob.Client, *consulroute.Client) {
	t.Helper()
	n, err := nomadjob.NewClient(c.Nomad.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	n.SetLogger(quiet)
	cc, err := consulroute.NewClient(c.Consul.ClientConfig(), consulroute.WithReplica("test"), consulroute.WithWaitTime(2*time.Second), consulroute.WithLogger(quiet))
	if err != nil {
		t.Fatal(err)
	}
	return n, cc
}

// testappService is a service running the test app with the real sidecar,
// both from the built binary.
func testappService(bin, name string, env map[string]string) spec.Service {
	s := spec.NewService(name)
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": bin, "args": []string{"testapp"}}
	s.Template.Task.Env = env
	s.Template.Task.KillTimeout = 3 * time.Second
	s.Scaling.Min, s.Scaling.Max, s.Scaling.Initial = 0, 3, 1
	return s
}

func compile(t *testing.T, bin string, svc spec.Service, gen int) *nomadapi.Job {
	t.Helper()
	job, err := nomadjob.Compile(spec.NewRevision(&svc, gen), nomadjob.Options{Sidecar: nomadjob.SidecarOptions{Command: bin}})
	if err != nil {
		t.Fatal(err)
	}
	return job
}

// eventually polls cond every 50ms until it holds or timeout passes.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	testbin.Eventually(t, timeout, 50*time.Millisecond, what, cond)
}

func get(url string, header map[string]string) (int, string, error) {
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		return 0, "", err
	}
	for k, v := range header {
		req.Header.Set(k, v)
	}
	c := &http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// TestRevisionRunsScalesAndStops runs a compiled revision (the real test
// app and the real sidecar) through the real adapters: the allocation runs
// with its ports, the Consul check on the sidecar passes, requests reach the
// app, and scaling to zero deregisters the instance before its processes
// stop.
func TestRevisionRunsScalesAndStops(t *testing.T) {
	bin := testbin.Path(t)
	opts, _ := fastOptions(t)
	c := fakecluster.Start(t, opts)
	nc, cc := clients(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	svc := testappService(bin, "hello", map[string]string{"TESTAPP_NAME": "one"})
	job := compile(t, bin, svc, 1)
	if _, err := nc.Register(ctx, job, 0); err != nil {
		t.Fatal(err)
	}
	var inst consulroute.Instance
	eventually(t, 20*time.Second, "one ready instance in Consul", func() (bool, string) {
		in, err := cc.ReadyInstances(ctx, "hello-00001")
		if err != nil || len(in) != 1 {
			return false, fmt.Sprintf("instances %v, err %v; consul %+v", in, err, c.Consul.Services("hello-00001"))
		}
		inst = in[0]
		return true, ""
	})
	// Consul may list the instance passing before Nomad's client has
	// reported it running (it syncs allocations every 200 ms), as with
	// real agents: wait for what Nomad says.
	var a nomadjob.Allocation
	eventually(t, 5*time.Second, "Nomad reports the allocation running", func() (bool, string) {
		allocs, err := nc.Allocations(ctx, "hello-00001")
		if err != nil || len(allocs) != 1 {
			return false, fmt.Sprintf("allocations %+v, %v", allocs, err)
		}
		a = allocs[0]
		return a.Running, fmt.Sprintf("%+v", a)
	})
	if a.HTTPPort != inst.Port || a.Address != "127.0.0.1" || a.AdminPort == 0 || a.AdminPort != inst.AdminPort {
		t.Fatalf("allocation %+v does not match the Consul instance %+v", a, inst)
	}
	if !strings.HasPrefix(inst.ID, "_nomad-task-"+a.ID+"-group-app-hello-00001-http") {
		t.Fatalf("service ID %q is not Nomad's form for allocation %s", inst.ID, a.ID)
	}
	code, body, err := get("http://"+inst.HostPort()+"/", nil)
	if err != nil || code != http.StatusOK {
		t.Fatalf("request through the sidecar: %d %q %v", code, body, err)
	}

	if err := nc.Scale(ctx, "hello-00001", 0, "test: to zero", map[string]string{"why": "test"}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 20*time.Second, "the instance leaves Consul and the allocation completes", func() (bool, string) {
		in, _ := cc.ReadyInstances(ctx, "hello-00001")
		allocs, _ := nc.Allocations(ctx, "hello-00001")
		done := len(allocs) == 1 && allocs[0].ClientStatus == "complete" && allocs[0].DesiredStatus == "stop"
		return len(in) == 0 && done && len(c.Consul.Services("hello-00001")) == 0, fmt.Sprintf("ready %v allocs %+v", in, allocs)
	})
	if _, _, err := get("http://"+inst.HostPort()+"/", nil); err == nil {
		t.Fatal("the sidecar still answers after the allocation completed")
	}
	evs, err := nc.ScalingEvents(ctx, "hello-00001")
	if err != nil || len(evs) != 1 || evs[0].Message != "test: to zero" || evs[0].Meta["why"] != "test" || evs[0].PreviousCount != 1 || evs[0].Count == nil || *evs[0].Count != 0 {
		t.Fatalf("scaling events %+v, %v", evs, err)
	}
	if err := nc.Scale(ctx, "hello-00001", 4, "too many", nil); !errors.Is(err, nomadjob.ErrOutOfBounds) {
		t.Fatalf("scale above max: %v, want ErrOutOfBounds", err)
	}
}
