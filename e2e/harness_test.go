package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// harness is one scenario's view of the cluster: API clients for asserting
// what Nomad and Consul report, and the binary under test to drive it.
type harness struct {
	t      *testing.T
	s      *Suite
	nomad  *nomad.Client
	consul *consul.Client
	bin    string
	dir    string
	// env is added to the binary's environment (tokens in the ACL test).
	env map[string]string
	// serveConsul, when set, is the Consul the serve processes register in
	// (the ACL scenario's second pair of agents); default consul.
	serveConsul *consul.Client
	// scenario names the rows this scenario adds to the timing table.
	scenario string
}

// newHarness returns the harness for a scenario, with clients from
// NOMAD_ADDR/CONSUL_HTTP_ADDR (TestMain set them for agents it started).
func newHarness(t *testing.T, scenario string) *harness {
	t.Helper()
	if suite == nil {
		t.Fatal("e2e: no agents: TestMain did not set up the suite")
	}
	if suite.Agents != nil {
		if err := suite.Agents.Alive(); err != nil {
			t.Fatalf("e2e: %v", err)
		}
	}
	nc, err := nomad.NewClient(nomad.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	cc, err := consul.NewClient(consul.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, s: suite, nomad: nc, consul: cc, bin: testbin.Path(t), dir: t.TempDir(), env: map[string]string{}, scenario: scenario}
}

// timing records one value in the run's timing table.
func (h *harness) timing(measure string, d time.Duration) {
	h.t.Logf("timing: %s: %s", measure, FormatDuration(d))
	h.s.Timings.Add(h.scenario, measure, d)
}

// cli runs the binary under test and returns its output and exit code.
func (h *harness) cli(args ...string) (stdout, stderr string, code int) {
	h.t.Helper()
	return h.cliWithin(4*time.Minute, 0, args...)
}

// cliWithin is cli with a bound on the run, logging only the last
// logLines lines of each output when logLines > 0 (a bulk deploy's or a
// list's thousands of lines).
func (h *harness) cliWithin(timeout time.Duration, logLines int, args ...string) (stdout, stderr string, code int) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, h.bin, args...)
	cmd.Env = os.Environ()
	for k, v := range h.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	var exitErr *exec.ExitError
	if err != nil && !errors.As(err, &exitErr) {
		h.t.Fatalf("run %s %s: %v", h.bin, strings.Join(args, " "), err)
	}
	code = cmd.ProcessState.ExitCode()
	o, e := out.String(), errb.String()
	if logLines > 0 {
		o, e = tailLines(o, logLines)+"\n", tailLines(e, logLines)+"\n"
	}
	h.t.Logf("$ nomad-serverless %s  -> exit %d\n%s%s", strings.Join(args, " "), code, o, e)
	return out.String(), errb.String(), code
}

// mustCLI runs the binary and fails the test unless it exits 0.
func (h *harness) mustCLI(args ...string) string {
	h.t.Helper()
	out, errOut, code := h.cli(args...)
	if code != 0 {
		h.t.Fatalf("nomad-serverless %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
	}
	return out
}

// deploy deploys a file with the binary under test as the sidecar (raw_exec
// on the local node) and returns deploy's output, read back.
func (h *harness) deploy(file string) DeployOutput {
	h.t.Helper()
	return ParseDeployOutput(h.mustCLI("deploy", "-sidecar-command", h.bin, "-wait", "3m", file))
}

// writeServices writes a service file into the scenario's directory.
func (h *harness) writeServices(name string, services ...Service) string {
	h.t.Helper()
	for i := range services {
		if services[i].Binary == "" {
			services[i].Binary = h.bin
		}
	}
	path, err := WriteServiceFile(h.dir, name, services...)
	if err != nil {
		h.t.Fatal(err)
	}
	return path
}

// cleanupService removes a service when the scenario ends, whatever
// happened: `delete`, then a purge of any job left with the service's
// revision prefix, then a bounded wait for its allocations to stop, so the
// next scenario has the node to itself.
func (h *harness) cleanupService(name string) {
	h.t.Cleanup(func() {
		h.cli("delete", name)
		jobs, _, err := h.nomad.Jobs().PrefixList(name + "-")
		if err != nil {
			h.t.Logf("cleanup %s: list jobs: %v", name, err)
			return
		}
		for _, j := range jobs {
			if j.Meta[spec.JobMetaService] != "" && j.Meta[spec.JobMetaService] != name {
				continue
			}
			h.t.Logf("cleanup %s: purging leftover job %s", name, j.ID)
			h.nomad.Jobs().Deregister(j.ID, true, nil)
		}
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			allocs, _, err := h.nomad.Allocations().List(&nomad.QueryOptions{Prefix: ""})
			if err != nil {
				return
			}
			live := 0
			for _, a := range allocs {
				if strings.HasPrefix(a.JobID, name+"-") && (a.ClientStatus == nomad.AllocClientStatusRunning || a.ClientStatus == nomad.AllocClientStatusPending) {
					live++
				}
			}
			if live == 0 {
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
		h.t.Logf("cleanup %s: allocations still running after 60s", name)
	})
}

// gateway is one `serve` process.
type gateway struct {
	proc          *testbin.Proc
	listen, admin string
}

// startServe runs `serve` on the given addresses ("" picks free ports) and
// waits until it is what a user needs before deploying: its admin /healthz
// answers, Consul lists it as a passing instance of
// nomad-serverless-activator (so deploy prints its URL), and it leads the
// autoscaler (its admin /v1/autoscaler/revisions answers 200, not 503 "not
// the leader"; the previous scenario's serve may hold the lock a little
// while). testbin stops it (SIGTERM) at the end of the test.
func (h *harness) startServe(replica, listen, admin string) *gateway {
	h.t.Helper()
	return h.startServeArgs(replica, listen, admin)
}

// startServeArgs is startServe with more of serve's flags (for example
// -internal-listen, -https-port).
func (h *harness) startServeArgs(replica, listen, admin string, extra ...string) *gateway {
	h.t.Helper()
	if listen == "" {
		listen = "127.0.0.1:" + strconv.Itoa(testbin.FreePort(h.t))
	}
	if admin == "" {
		admin = "127.0.0.1:" + strconv.Itoa(testbin.FreePort(h.t))
	}
	p := testbin.Start(h.t, h.bin, append([]string{"serve", "-listen", listen, "-admin-listen", admin, "-domain", "localhost", "-replica", replica}, extra...), h.env)
	g := &gateway{proc: p, listen: listen, admin: admin}
	client := NewClient(4)
	alive := func() {
		select {
		case <-p.Done():
			h.t.Fatalf("serve exited:\n%s", p.Output())
		default:
		}
	}
	eventually(h.t, 30*time.Second, "serve "+replica+" answers /healthz on "+admin, func() (bool, string) {
		alive()
		status, _, err := getBody(client, g.adminURL()+"/healthz")
		if err != nil {
			return false, err.Error()
		}
		return status == http.StatusOK, fmt.Sprintf("status %d", status)
	})
	consulClient := h.consul
	if h.serveConsul != nil {
		consulClient = h.serveConsul
	}
	_, port, _ := strings.Cut(listen, ":")
	eventually(h.t, 30*time.Second, "Consul lists serve "+replica+" as a passing "+spec.ActivatorServiceName, func() (bool, string) {
		alive()
		entries, _, err := consulClient.Health().Service(spec.ActivatorServiceName, "", true, nil)
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, e := range entries {
			seen = append(seen, e.Service.ID)
			if e.Service.Meta[consulroute.MetaReplica] == replica && strconv.Itoa(e.Service.Port) == port {
				return true, ""
			}
		}
		return false, fmt.Sprintf("passing instances %v", seen)
	})
	eventually(h.t, 60*time.Second, "serve "+replica+" leads the autoscaler", func() (bool, string) {
		alive()
		status, body, err := getBody(client, g.adminURL()+"/v1/autoscaler/revisions")
		if err != nil {
			return false, err.Error()
		}
		return status == http.StatusOK, fmt.Sprintf("status %d %s", status, strings.TrimSpace(body))
	})
	return g
}

// gatewayRevision is one revision in the gateway's view
// (/v1/activator/revisions on the admin API).
type gatewayRevision struct {
	Revision  string `json:"revision"`
	Service   string `json:"service"`
	Instances []struct {
		Address string `json:"address"`
		Alloc   string `json:"alloc"`
	} `json:"instances"`
}

// gatewayView reads the revisions the gateway routes to, with their
// instances.
func (g *gateway) gatewayView(t *testing.T) map[string]gatewayRevision {
	t.Helper()
	var revs []gatewayRevision
	if err := g.adminJSON("/v1/activator/revisions", &revs); err != nil {
		t.Fatalf("gateway view: %v", err)
	}
	out := map[string]gatewayRevision{}
	for _, r := range revs {
		out[r.Revision] = r
	}
	return out
}

// autoscalerRevision is one revision in the leading autoscaler's view
// (/v1/autoscaler/revisions).
type autoscalerRevision struct {
	Service  string `json:"service"`
	Revision string `json:"revision"`
	Desired  int    `json:"desired"`
	Count    int    `json:"count"`
	Actual   int    `json:"actual"`
	Reason   string `json:"reason"`
}

// autoscalerView reads the autoscaler's state of a service's revisions; it
// fails (503 "not the leader") on a replica that does not lead.
func (g *gateway) autoscalerView(service string) (map[string]autoscalerRevision, error) {
	var revs []autoscalerRevision
	if err := g.adminJSON("/v1/autoscaler/revisions?service="+service, &revs); err != nil {
		return nil, err
	}
	out := map[string]autoscalerRevision{}
	for _, r := range revs {
		out[r.Revision] = r
	}
	return out, nil
}

// adminJSON GETs an admin path and decodes its 200 answer.
func (g *gateway) adminJSON(path string, v any) error {
	// Whole, however long: at 10,000 revisions the gateway's view is
	// megabytes (getBody stops at 1 MiB).
	resp, err := NewClient(1).Get(g.adminURL() + path)
	if err != nil {
		return err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return fmt.Errorf("GET %s: read: %w", path, err)
	}
	body := string(b)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: status %d: %s", path, resp.StatusCode, strings.TrimSpace(tailLines(body, 5)))
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("GET %s: %w: %.300s", path, err, body)
	}
	return nil
}

func (g *gateway) url() string      { return "http://" + g.listen }
func (g *gateway) adminURL() string { return "http://" + g.admin }

// stop stops serve (SIGTERM, bounded by testbin) and returns when it exited.
func (g *gateway) stop(t *testing.T) { g.proc.Stop(t) }

// host is the gateway Host of a service (tag "" for the service itself).
func host(service, tag string) string {
	if tag != "" {
		return tag + "-" + service + ".default.localhost"
	}
	return service + ".default.localhost"
}

// request is a GET of path on the gateway for a service.
func (g *gateway) request(service, tag, path string, client *http.Client) Request {
	return Request{Client: client, URL: g.url() + path, Host: host(service, tag), Timeout: 60 * time.Second}
}

// eventually polls f every 250ms until it reports done, failing the test
// with f's last word after timeout.
func eventually(t *testing.T, timeout time.Duration, what string, f func() (bool, string)) time.Duration {
	t.Helper()
	return testbin.Eventually(t, timeout, 250*time.Millisecond, what, f)
}

// revision is a service's revision name for a generation.
func revision(service string, gen int) string { return fmt.Sprintf("%s-%05d", service, gen) }

// groupCount is the job's app group count in Nomad.
func (h *harness) groupCount(job string) (int, error) { return groupCountOf(h.nomad, job) }

// groupCountOf is the job's app group count in the Nomad c talks to.
func groupCountOf(c *nomad.Client, job string) (int, error) {
	j, _, err := c.Jobs().Info(job, nil)
	if err != nil {
		return 0, err
	}
	for _, g := range j.TaskGroups {
		if g.Name != nil && *g.Name == spec.GroupName && g.Count != nil {
			return *g.Count, nil
		}
	}
	return 0, fmt.Errorf("job %s has no group %q", job, spec.GroupName)
}

// scalingEvents are the app group's scaling events (`nomad job
// scaling-events`), newest first.
func (h *harness) scalingEvents(job string) []nomad.ScalingEvent {
	h.t.Helper()
	st, _, err := h.nomad.Jobs().ScaleStatus(job, nil)
	if err != nil {
		h.t.Fatalf("scale status of %s: %v", job, err)
	}
	g, ok := st.TaskGroups[spec.GroupName]
	if !ok {
		h.t.Fatalf("scale status of %s has no group %q", job, spec.GroupName)
	}
	return g.Events
}

// liveAllocs are the job's allocations Nomad wants running and that run.
func (h *harness) liveAllocs(job string) []*nomad.AllocationListStub {
	h.t.Helper()
	allocs, _, err := h.nomad.Jobs().Allocations(job, false, nil)
	if err != nil {
		h.t.Fatalf("allocations of %s: %v", job, err)
	}
	var out []*nomad.AllocationListStub
	for _, a := range allocs {
		if a.DesiredStatus == nomad.AllocDesiredStatusRun && a.ClientStatus == nomad.AllocClientStatusRunning {
			out = append(out, a)
		}
	}
	return out
}

// waitRunning waits until Nomad lists exactly n allocations of the job as
// running (liveAllocs) and returns them, so a caller may index them. Never
// read that list once: a Nomad client reports its allocations' status to
// the servers in batches, and Consul can show an instance passing while
// Nomad still lists its allocation pending.
func (h *harness) waitRunning(job string, n int, timeout time.Duration) []*nomad.AllocationListStub {
	h.t.Helper()
	var live []*nomad.AllocationListStub
	eventually(h.t, timeout, fmt.Sprintf("Nomad lists %d running allocations of %s", n, job), func() (bool, string) {
		live = h.liveAllocs(job)
		return len(live) == n, h.allocStates(job)
	})
	return live
}

// allocStates says what Nomad reports of each of the job's allocations
// (desired/client status), for a wait's last word.
func (h *harness) allocStates(job string) string {
	h.t.Helper()
	allocs, _, err := h.nomad.Jobs().Allocations(job, false, nil)
	if err != nil {
		return err.Error()
	}
	states := make([]string, 0, len(allocs))
	for _, a := range allocs {
		states = append(states, fmt.Sprintf("%.8s %s/%s", a.ID, a.DesiredStatus, a.ClientStatus))
	}
	return fmt.Sprintf("allocations of %s: %v", job, states)
}

// passing are the revision's instances Consul reports passing, without the
// activator's stand-in.
func (h *harness) passing(rev string) []*consul.ServiceEntry {
	h.t.Helper()
	entries, _, err := h.consul.Health().Service(rev, "", true, nil)
	if err != nil {
		h.t.Fatalf("health of %s: %v", rev, err)
	}
	var out []*consul.ServiceEntry
	for _, e := range entries {
		if !slices.Contains(e.Service.Tags, spec.TagActivator) {
			out = append(out, e)
		}
	}
	return out
}

// standIns are the activator's stand-in instances in a revision's Consul
// service (tagged activator), whatever their health.
func (h *harness) standIns(rev string) []*consul.ServiceEntry {
	h.t.Helper()
	entries, _, err := h.consul.Health().Service(rev, spec.TagActivator, false, nil)
	if err != nil {
		h.t.Fatalf("stand-ins of %s: %v", rev, err)
	}
	return entries
}

// appAddr is where an allocation's user app listens (its "app" port).
func (h *harness) appAddr(allocID string) string {
	h.t.Helper()
	a, _, err := h.nomad.Allocations().Info(allocID, nil)
	if err != nil {
		h.t.Fatalf("allocation %s: %v", allocID, err)
	}
	if r := a.AllocatedResources; r != nil {
		for _, p := range r.Shared.Ports {
			if p.Label == spec.PortApp {
				ip := p.HostIP
				if ip == "" {
					ip = "127.0.0.1"
				}
				return fmt.Sprintf("%s:%d", ip, p.Value)
			}
		}
		for _, n := range r.Shared.Networks {
			for _, p := range n.DynamicPorts {
				if p.Label == spec.PortApp {
					return fmt.Sprintf("%s:%d", n.IP, p.Value)
				}
			}
		}
	}
	h.t.Fatalf("allocation %s has no %q port", allocID, spec.PortApp)
	return ""
}

// appStats reads the test app's own counters, directly from the app.
func (h *harness) appStats(allocID string) testapp.Stats {
	h.t.Helper()
	st, listening := h.appStatsIfListening(allocID)
	if !listening {
		h.t.Fatalf("stats of the app in %s: nothing listens at its port", allocID)
	}
	return st
}

// appStatsIfListening is appStats of an allocation whose app may not
// listen yet (Nomad says running once the sidecar runs, before the app
// task's start on a busy node): false when its port refuses, as an app
// that never listened has served nothing.
func (h *harness) appStatsIfListening(allocID string) (testapp.Stats, bool) {
	h.t.Helper()
	resp, err := NewClient(1).Get("http://" + h.appAddr(allocID) + "/stats")
	if errors.Is(err, syscall.ECONNREFUSED) {
		return testapp.Stats{}, false
	}
	if err != nil {
		h.t.Fatalf("stats of the app in %s: %v", allocID, err)
	}
	defer resp.Body.Close()
	var st testapp.Stats
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		h.t.Fatalf("stats of the app in %s: %v", allocID, err)
	}
	return st, true
}

// waitZero waits until Nomad has the revision at count 0 with nothing
// running and Consul lists no passing instance.
func (h *harness) waitZero(rev string, timeout time.Duration) time.Duration {
	h.t.Helper()
	return eventually(h.t, timeout, rev+" scaled to zero", func() (bool, string) {
		n, err := h.groupCount(rev)
		if err != nil {
			return false, err.Error()
		}
		live, pass := len(h.liveAllocs(rev)), len(h.passing(rev))
		return n == 0 && live == 0 && pass == 0, fmt.Sprintf("count %d, %d running allocations, %d passing in Consul", n, live, pass)
	})
}

// configEntry reads a config entry; nil when Consul has none.
func (h *harness) configEntry(kind, name string) consul.ConfigEntry {
	h.t.Helper()
	e, _, err := h.consul.ConfigEntries().Get(kind, name, nil)
	if err != nil {
		var se consul.StatusError
		if errors.As(err, &se) && se.Code == http.StatusNotFound || strings.Contains(err.Error(), "404") {
			return nil
		}
		h.t.Fatalf("config entry %s/%s: %v", kind, name, err)
	}
	return e
}

// splits reads the service-splitter of a service as revision -> percent.
func (h *harness) splits(service string) map[string]float32 {
	h.t.Helper()
	out := map[string]float32{}
	e, ok := h.configEntry(consul.ServiceSplitter, service).(*consul.ServiceSplitterConfigEntry)
	if !ok || e == nil {
		return out
	}
	for _, s := range e.Splits {
		out[s.Service] += s.Weight
	}
	return out
}

// getBody GETs a URL and returns status and body.
func getBody(client *http.Client, url string) (int, string, error) {
	resp, err := client.Get(url)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	return resp.StatusCode, string(b), err
}

// deref is *p, or the zero value for a nil p (Nomad's API structs are
// pointers all the way down; a scenario reports a missing field, it does
// not panic on it).
func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
