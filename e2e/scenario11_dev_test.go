package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// Scenario 11: what `make demo` runs when nomad and consul are on PATH:
// `dev -deploy examples/raw-exec.hcl` starts its own Consul and Nomad dev
// agents and serve, deploys the example with the real deploy command,
// sends a request through the gateway, sees the revision scale to zero,
// wakes it with a second request, and stops everything on Ctrl-C.
func TestE2E11DevDeploy(t *testing.T) {
	h := newHarness(t, "11 dev -deploy")
	if h.s.Plan.Mode != StartAgents {
		t.Skip("needs consul and nomad on PATH: dev starts agents of its own")
	}
	root, err := testbin.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	// Ports beside the suite's own agents.
	ports, err := devagents.Ports{}.FillFree()
	if err != nil {
		t.Fatal(err)
	}
	listen := "127.0.0.1:" + strconv.Itoa(ports.ConsulDNS)
	nomadAddr := "http://127.0.0.1:" + strconv.Itoa(ports.NomadHTTP)
	start := time.Now()
	p := testbin.Start(t, h.bin, []string{"dev", "-deploy", filepath.Join(root, "examples", "raw-exec.hcl"),
		"-consul-port", strconv.Itoa(ports.ConsulHTTP), "-nomad-port", strconv.Itoa(ports.NomadHTTP),
		"-listen", listen, "-admin-listen", "127.0.0.1:" + strconv.Itoa(ports.ConsulServer),
		"-internal-listen", "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))}, nil)
	// dev stops its serve and agents in order on SIGINT: should this test
	// binary end abruptly, the guard gives it that chance too.
	h.s.Guard.StopFirst(p.PID(), "dev")

	eventually(t, 5*time.Minute, "dev -deploy deploys, wakes and keeps running", func() (bool, string) {
		select {
		case <-p.Done():
			t.Fatalf("dev exited (%v):\n%s", p.Cmd.ProcessState, p.Output())
		default:
		}
		out := p.Output()
		return strings.Contains(out, "Still running:"), lastLine(out)
	})
	h.timing("dev -deploy: start, deploy, request, zero, wake", time.Since(start))
	out := p.Output()
	for _, want := range []string{
		"testapp-00001: ready (1/1 instances passing)",
		"testapp is at http://testapp.default.localhost/",
		"Request through the gateway: 200 OK \"ok\"",
		"Waiting for testapp-00001 to scale to zero",
		"testapp-00001 is at zero after ",
		"Request at zero woke it: 200 OK \"ok\"; first byte after ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("dev's output lacks %q:\n%s", want, out)
		}
	}
	if m := regexp.MustCompile(`first byte after (\d+)ms`).FindStringSubmatch(out); m != nil {
		ms, _ := strconv.Atoi(m[1])
		h.timing("dev -deploy: wake, first byte", time.Duration(ms)*time.Millisecond)
	}

	// What dev's own Nomad says: the revision went to zero and back.
	nc, err := nomad.NewClient(&nomad.Config{Address: nomadAddr})
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 15*time.Second, "dev's Nomad at "+nomadAddr+" records testapp-00001 scaled to zero and from zero", func() (bool, string) {
		st, _, err := nc.Jobs().ScaleStatus("testapp-00001", nil)
		if err != nil || st == nil {
			return false, fmt.Sprintf("scale status of testapp-00001: %v", err)
		}
		var toZero, fromZero bool
		events := st.TaskGroups[spec.GroupName].Events
		for _, e := range events {
			if e.Error || e.Count == nil {
				continue
			}
			toZero = toZero || *e.Count == 0
			fromZero = fromZero || e.PreviousCount == 0 && *e.Count > 0
		}
		return toZero && fromZero, fmt.Sprintf("to zero %v, from zero %v: %+v", toZero, fromZero, events)
	})

	// Ctrl-C stops everything dev started, in order, and it exits 0.
	if err := p.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	code, err := p.Wait(3 * time.Minute)
	if err != nil {
		t.Fatalf("dev did not exit after Ctrl-C: %v\n%s", err, p.Output())
	}
	out = p.Output()
	if code != 0 {
		t.Errorf("dev exited %d after Ctrl-C", code)
	}
	stops := regexp.MustCompile(`Stopping (\w+)\.\.\.`).FindAllStringSubmatch(out, -1)
	if fmt.Sprint(stops) != "[[Stopping serve... serve] [Stopping nomad... nomad] [Stopping consul... consul]]" {
		t.Errorf("stops = %v:\n%s", stops, out)
	}
	for _, port := range []int{ports.ConsulHTTP, ports.NomadHTTP} {
		if err := devagents.PortFree(port, "a dev agent"); err != nil {
			t.Errorf("after dev exited: %v", err)
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimRight(s, "\n")
	return s[strings.LastIndexByte(s, '\n')+1:]
}
