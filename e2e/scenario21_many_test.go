package e2e

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

var manyRevisions = flag.Int("revisions", 0, "scenario 21: deploy this many services at zero and measure serve and Consul (make e2e-scale passes 1000); 0 skips it")

// Scenario 21: one serve replica over many revisions, all at zero (issue
// 14's scale run): deploy throughput, serve's RSS and CPU at idle, its
// connections to Consul (they must not grow with the revision count: one
// watch for all revisions' health), Consul's CPU, nothing refused by
// Consul's per-client connection limit, and a random revision's route
// change and cold start while the others idle. Figures go to the timing
// table; the targets that are properties (connections, 429s) are asserted.
func TestE2E21ManyRevisions(t *testing.T) {
	n := *manyRevisions
	if n <= 0 {
		t.Skip("e2e 21: SKIPPED: pass -revisions N (make e2e-scale runs 1000)")
	}
	h := newHarness(t, "21 many revisions")
	consulURL, err := url.Parse("http://" + strings.TrimPrefix(h.s.ConsulAddr, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	consulPort, _ := strconv.Atoi(consulURL.Port())
	prefix := "e2e-many"
	var services []Service
	for i := range n {
		s := testService(fmt.Sprintf("%s-%04d", prefix, i))
		s.Scaling.Initial = 0
		services = append(services, s)
	}
	h.t.Cleanup(func() { h.deleteAll(prefix + "-") })
	// A team keeps many services in several files: one file is bounded
	// (hcl.MaxFileBytes), and 1,000 services are about 500 KB.
	args := []string{"deploy", "-sidecar-command", h.bin, "-detach"}
	const perFile = 200
	for i := 0; i < len(services); i += perFile {
		args = append(args, h.writeServices(fmt.Sprintf("many-%02d.hcl", i/perFile), services[i:min(i+perFile, len(services))]...))
	}
	start := time.Now()
	h.mustCLI(args...)
	took := time.Since(start)
	h.timing(fmt.Sprintf("deploy -detach of %d services at zero", n), took)
	h.timing("deploy: per service", took/time.Duration(n))
	t.Logf("deploy throughput: %.1f services/s", float64(n)/took.Seconds())

	start = time.Now()
	g := h.startServe("e2e-21", "", "")
	eventually(t, 3*time.Minute, fmt.Sprintf("the gateway knows all %d revisions", n), func() (bool, string) {
		v := g.gatewayView(t)
		return len(v) >= n, fmt.Sprintf("%d known", len(v))
	})
	h.timing("serve start -> gateway knows every revision", time.Since(start))
	eventually(t, 3*time.Minute, "a stand-in for every revision", func() (bool, string) {
		entries, _, err := h.consul.Catalog().Services(nil)
		if err != nil {
			return false, err.Error()
		}
		c := 0
		for name, tags := range entries {
			if strings.HasPrefix(name, prefix) && slicesContains(tags, "activator") {
				c++
			}
		}
		return c >= n, fmt.Sprintf("%d revisions with a stand-in", c)
	})

	// Idle: let start-up work settle, then sample for 30 s.
	time.Sleep(10 * time.Second)
	pid := g.proc.PID()
	var consulPID int
	if h.s.Agents != nil {
		consulPID = h.s.Agents.Consul.Pid()
	}
	s0, err := SampleProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	var c0 ProcSample
	if consulPID != 0 {
		c0, _ = SampleProc(consulPID)
	}
	maxConns := 0
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		c, err := ConnectionsTo(pid, consulPort)
		if err != nil {
			t.Fatal(err)
		}
		maxConns = max(maxConns, c)
	}
	s1, err := SampleProc(pid)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("serve idle: RSS %d MiB, CPU %.2f%% of a core, at most %d connections to Consul", s1.RSS>>20, CPUShare(s0, s1)*100, maxConns)
	if consulPID != 0 {
		if c1, err := SampleProc(consulPID); err == nil {
			t.Logf("Consul: CPU %.2f%% of a core, RSS %d MiB", CPUShare(c0, c1)*100, c1.RSS>>20)
		}
	}
	// Targets that are properties, not timings: serve's Consul
	// connections stay far below Consul's per-client limit (200) however
	// many revisions there are, and Consul refused nothing.
	if maxConns > 20 {
		t.Errorf("serve held %d connections to Consul with %d revisions; they must not grow with the revision count", maxConns, n)
	}
	if out := g.proc.Output(); strings.Contains(out, "429") || strings.Contains(out, "too many concurrent connections") {
		t.Errorf("Consul refused serve (429):\n%s", tailLines(out, 20))
	}

	// A random revision: its route changes (a tag), which reaches the
	// gateway, and the first request through the tag wakes it.
	svc := services[rand.IntN(n)].Name
	rev := revision(svc, 1)
	h.mustCLI("traffic", svc, "-to", "latest=100", "-tag", rev+"=pick")
	routed := time.Now()
	client := NewClient(2)
	var o Outcome
	tries := 0
	eventually(t, 30*time.Second, "the tag route of "+svc+" reaches the gateway and wakes "+rev, func() (bool, string) {
		tries++
		req := g.request(svc, "pick", "/", client)
		o = req.Do(context.Background())
		return o.Status != http.StatusNotFound, o.Describe()
	})
	if !o.OK() {
		t.Fatalf("the first request through the new tag: %s", o.Describe())
	}
	h.timing("route change (traffic -tag) -> the gateway routes it", o.Start.Sub(routed))
	h.timing("cold start of a random revision among the idle ones: first byte", o.FirstByte.Sub(o.Start))
	t.Logf("route reached the gateway after %d polls; %s woke with first byte after %s", tries, rev, o.FirstByte.Sub(o.Start))
	fmt.Fprintf(os.Stdout, "e2e scenario 21: %d revisions: deploy %.1f/s; serve idle RSS %d MiB, CPU %.2f%%, %d Consul connections; cold start %s\n",
		n, float64(n)/took.Seconds(), s1.RSS>>20, CPUShare(s0, s1)*100, maxConns, o.FirstByte.Sub(o.Start).Round(time.Millisecond))
}

// deleteAll deletes, with the CLI (route, then jobs) as a user would, every
// service that has a revision job starting with prefix; only failures are
// logged.
func (h *harness) deleteAll(prefix string) {
	jobs, _, err := h.nomad.Jobs().PrefixList(prefix)
	if err != nil {
		h.t.Logf("cleanup %s*: %v", prefix, err)
		return
	}
	seen := map[string]bool{}
	for _, j := range jobs {
		svc, _, ok := spec.ParseRevisionName(j.ID)
		if !ok || seen[svc] {
			continue
		}
		seen[svc] = true
		out, err := exec.Command(h.bin, "delete", svc).CombinedOutput()
		if err != nil {
			h.t.Logf("cleanup: delete %s: %v\n%s", svc, err, out)
		}
	}
}

func slicesContains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
