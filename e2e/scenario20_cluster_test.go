package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// clusterNodes and clusterReplicas are the cluster scenario's size.
const (
	clusterNodes    = 3
	clusterReplicas = 3
)

// clusterFirstAddr is the first node's address in the suite's cluster: not
// dev's 127.0.0.2, so a `dev -nodes` running on the machine keeps its
// addresses.
func clusterFirstAddr() [4]byte { return [4]byte{127, 0, 20, 2} }

// Scenario 20: a real cluster, started by the scenario itself: a Nomad
// server and 3 client nodes, each with its own loopback address and Consul
// agent (dev/devagents.StartCluster, as `dev -nodes 3`), and 3 serve
// replicas. One revision runs 3 to 6 instances on the nodes' own addresses
// (host_network). In turn:
//   - the instances spread over the nodes, each on its node's address and
//     registered in its node's Consul agent, and every replica's gateway
//     routes to all of them;
//   - kill -9 of one Nomad client under load: its allocations are lost and
//     replaced on the other nodes, and the gateways and the autoscaler stop
//     using them as soon as Nomad marks them lost, although their orphaned
//     tasks still answer and pass in Consul; no request fails but those in
//     flight at the kill;
//   - kill -9 of a whole node (Nomad client, Consul agent and the tasks):
//     the same, and how long the gateways kept routing to it;
//   - a scale-up under load spreads the instances over the nodes, as
//     Nomad's default scheduler spreads them (over more than one, not
//     evenly), and every gateway routes to all of them;
//   - one replica (the leader) restarted: the other two serve on without a
//     single error.
func TestE2E20Cluster(t *testing.T) {
	h := newHarness(t, "20 cluster")
	if h.s.Plan.Mode != StartAgents {
		t.Skip("e2e 20: SKIPPED: needs agents the suite starts itself: it starts a cluster of its own")
	}
	c := &clusterRun{svc: "e2e-cluster", want: 3}
	c.rev = revision(c.svc, 1)
	c.cl = h.startCluster(t, clusterNodes)
	h.cleanupService(c.svc)

	c.gws = []*gateway{h.startServe("e2e-20-1", "", "")}
	s := testService(c.svc)
	s.HostNetwork = devagents.HostNetwork
	s.Scaling = Scaling{Min: c.want, Max: 6, Initial: c.want, Target: 5, Window: 6 * time.Second, ScaleToZeroGrace: 2 * time.Second}
	h.deploy(h.writeServices("cluster.hcl", s))
	for i := 2; i <= clusterReplicas; i++ {
		c.gws = append(c.gws, h.startReplica(t, "e2e-20-"+strconv.Itoa(i), "", "", c.rev))
	}

	for _, step := range []struct {
		name string
		run  func(*testing.T, *harness)
	}{
		{"spread over the nodes", c.spread},
		{"kill -9 of a Nomad client", c.killClient},
		{"kill -9 of a whole node", c.killNode},
		{"scale-up spreads", c.scaleUp},
		{"one replica restarted", c.restartReplica},
	} {
		if err := c.cl.Alive(); err != nil {
			t.Fatalf("before step %q: %v", step.name, err)
		}
		if !t.Run(step.name, func(t *testing.T) { step.run(t, h.on(t)) }) {
			// Each step starts from the state the one before left.
			t.Fatalf("step %q failed; the steps after it would start from a broken cluster", step.name)
		}
	}
}

// clusterRun is the state the steps of scenario 20 share.
type clusterRun struct {
	cl       *devagents.Cluster
	svc, rev string
	gws      []*gateway
	// want is the revision's instances outside a scale-up (its min).
	want int
}

// on is the harness for a subtest: the same clients, failing that test.
func (h *harness) on(t *testing.T) *harness {
	c := *h
	c.t = t
	return &c
}

// startCluster starts a dev cluster of n nodes for this scenario and points
// the harness (API clients, the binary's environment) at it. It is stopped,
// and the nodes' addresses removed, when the test ends; its logs are kept
// when the test failed or -keep is set.
func (h *harness) startCluster(t *testing.T, n int) *devagents.Cluster {
	t.Helper()
	dir, err := os.MkdirTemp("", "nomad-serverless-e2e-cluster-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	cl, err := devagents.StartCluster(ctx, devagents.ClusterOptions{
		ConsulBin: h.s.Plan.ConsulBin, NomadBin: h.s.Plan.NomadBin, Dir: dir,
		Nodes: n, FirstAddr: netip.AddrFrom4(clusterFirstAddr()), LogLevel: "DEBUG",
		ReadyTimeout: 2 * time.Minute, StopGrace: agentStopGrace,
		Progress: testWriter{t}, Guard: h.s.Guard,
	})
	if err != nil {
		os.RemoveAll(dir)
		if strings.Contains(err.Error(), "needs root or CAP_NET_ADMIN") {
			t.Skipf("e2e 20: SKIPPED: the cluster's nodes need addresses of their own on lo: %v", err)
		}
		t.Fatalf("start a cluster of %d nodes: %v", n, err)
	}
	t.Cleanup(func() {
		for _, line := range cl.Stop(30 * time.Second) {
			if strings.Contains(line, "did not stop") || strings.Contains(line, "remove loopback") || strings.Contains(line, "unmount") {
				t.Errorf("cluster stop: %s", line)
			} else {
				t.Logf("cluster stop: %s", line)
			}
		}
		if t.Failed() || *keepData {
			t.Logf("cluster data and logs kept in %s", dir)
			return
		}
		os.RemoveAll(dir)
	})
	h.timing("start a server and "+strconv.Itoa(n)+" client nodes", time.Since(start))
	if h.nomad, err = nomad.NewClient(&nomad.Config{Address: cl.NomadAddr}); err != nil {
		t.Fatal(err)
	}
	if h.consul, err = consul.NewClient(&consul.Config{Address: cl.ConsulAddr}); err != nil {
		t.Fatal(err)
	}
	h.env["NOMAD_ADDR"], h.env["CONSUL_HTTP_ADDR"] = cl.NomadAddr, cl.ConsulAddr
	return cl
}

// startReplica runs a serve replica on the given addresses ("" picks free
// ones) that need not lead the autoscaler, and waits until its admin
// /healthz answers, Consul lists it passing and its gateway routes rev.
func (h *harness) startReplica(t *testing.T, replica, listen, admin, rev string) *gateway {
	t.Helper()
	if listen == "" {
		listen = "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))
	}
	if admin == "" {
		admin = "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))
	}
	p := testbin.Start(t, h.bin, []string{"serve", "-listen", listen, "-admin-listen", admin, "-domain", "localhost", "-replica", replica}, h.env)
	g := &gateway{proc: p, listen: listen, admin: admin}
	_, port, _ := strings.Cut(listen, ":")
	client := NewClient(1)
	eventually(t, 30*time.Second, "serve "+replica+" is up, registered and routes "+rev, func() (bool, string) {
		select {
		case <-p.Done():
			t.Fatalf("serve %s exited:\n%s", replica, p.Output())
		default:
		}
		status, _, err := getBody(client, g.adminURL()+"/healthz")
		if err != nil || status != http.StatusOK {
			return false, fmt.Sprintf("healthz %d %v", status, err)
		}
		entries, _, err := h.consul.Health().Service(spec.ActivatorServiceName, "", true, nil)
		if err != nil {
			return false, err.Error()
		}
		registered := slices.ContainsFunc(entries, func(e *consul.ServiceEntry) bool {
			return e.Service.Meta[consulroute.MetaReplica] == replica && strconv.Itoa(e.Service.Port) == port
		})
		if !registered {
			return false, "not passing in Consul yet"
		}
		addrs, err := instanceAddrs(client, g, rev)
		return err == nil && len(addrs) > 0, fmt.Sprintf("routes %v (%v)", addrs, err)
	})
	return g
}

// instanceAddrs are the addresses the gateway routes rev to.
func instanceAddrs(client *http.Client, g *gateway, rev string) ([]string, error) {
	status, body, err := getBody(client, g.adminURL()+"/v1/activator/revisions")
	if err != nil {
		return nil, err
	}
	if status != http.StatusOK {
		return nil, fmt.Errorf("status %d: %s", status, strings.TrimSpace(body))
	}
	var revs []gatewayRevision
	if err := json.Unmarshal([]byte(body), &revs); err != nil {
		return nil, err
	}
	addrs := []string{}
	for _, r := range revs {
		if r.Revision != rev {
			continue
		}
		for _, in := range r.Instances {
			addrs = append(addrs, in.Address)
		}
	}
	slices.Sort(addrs)
	return addrs, nil
}

// placed is a live allocation of the revision with its node and the
// address Nomad gave its http port.
type placed struct {
	alloc, nodeID, addr string
	appPort             int
}

// placements are the revision's live allocations with their addresses.
func (c *clusterRun) placements(h *harness) []placed {
	h.t.Helper()
	var out []placed
	for _, a := range h.liveAllocs(c.rev) {
		info, _, err := h.nomad.Allocations().Info(a.ID, nil)
		if err != nil {
			h.t.Fatalf("allocation %s: %v", a.ID, err)
		}
		p := placed{alloc: a.ID, nodeID: a.NodeID}
		if r := info.AllocatedResources; r != nil {
			for _, port := range r.Shared.Ports {
				switch port.Label {
				case spec.PortHTTP:
					p.addr = net.JoinHostPort(port.HostIP, strconv.Itoa(port.Value))
				case spec.PortApp:
					p.appPort = port.Value
				}
			}
		}
		out = append(out, p)
	}
	return out
}

// nodeOf is the cluster node an allocation runs on.
func (c *clusterRun) nodeOf(p placed) *devagents.Node {
	for _, n := range c.cl.Nodes {
		if n.ID == p.nodeID {
			return n
		}
	}
	return nil
}

// appRequests reads the test app's request count directly (it listens on
// 127.0.0.1 at its app port; Nomad reserved the number on its node's
// address, and no other node hands it out).
func appRequests(port int) (int64, error) {
	status, body, err := getBody(NewClient(1), "http://127.0.0.1:"+strconv.Itoa(port)+"/stats")
	if err != nil {
		return 0, err
	}
	if status != http.StatusOK {
		return 0, fmt.Errorf("status %d", status)
	}
	var st testapp.Stats
	if err := json.Unmarshal([]byte(body), &st); err != nil {
		return 0, err
	}
	return st.Requests, nil
}

// waitSettled waits until Nomad runs want allocations of the revision on
// nodes other than avoid (nil: any) and none is still stopping, Consul
// lists them passing, and every gateway routes to exactly them.
//
// Why none stopping: an allocation Nomad wants stopped still counts on its
// node for the scheduler until its client says it stopped (job
// anti-affinity scores it as an instance there), and a client that comes
// back after a kill stops its old allocations only after the group's
// shutdown_delay. A placement made meanwhile avoids that node as if it ran
// one more instance.
func (c *clusterRun) waitSettled(h *harness, want int, avoid *devagents.Node, timeout time.Duration) []placed {
	h.t.Helper()
	var ps []placed
	client := NewClient(1)
	eventually(h.t, timeout, fmt.Sprintf("%d instances of %s running and none stopping, passing and routed by every gateway", want, c.rev), func() (bool, string) {
		if stopping := c.stopping(h); len(stopping) > 0 {
			return false, "still stopping: " + strings.Join(stopping, ", ")
		}
		ps = c.placements(h)
		var addrs []string
		for _, p := range ps {
			if avoid != nil && p.nodeID == avoid.ID {
				return false, "an allocation runs on " + avoid.Name
			}
			addrs = append(addrs, p.addr)
		}
		slices.Sort(addrs)
		if len(ps) != want {
			return false, h.allocStates(c.rev)
		}
		// A killed client's orphans pass in Consul until it restarts:
		// what matters is that nothing else does, and that the
		// gateways ignore them.
		passing := slices.DeleteFunc(c.passingAddrs(h), func(a string) bool {
			return avoid != nil && countOnHost([]string{a}, avoid.Addr.String()) == 1
		})
		if !slices.Equal(passing, addrs) {
			return false, fmt.Sprintf("Nomad runs %v, Consul passes %v", addrs, passing)
		}
		for i, g := range c.gws {
			got, err := instanceAddrs(client, g, c.rev)
			if err != nil || !slices.Equal(got, addrs) {
				return false, fmt.Sprintf("gateway %d routes %v (%v), Nomad runs %v", i+1, got, err, addrs)
			}
		}
		return true, ""
	})
	return ps
}

// stopping are the revision's allocations Nomad wants stopped whose client
// has not said they stopped ("id on node").
func (c *clusterRun) stopping(h *harness) []string {
	allocs, _, err := h.nomad.Jobs().Allocations(c.rev, true, nil)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, a := range allocs {
		if a.DesiredStatus != nomad.AllocDesiredStatusRun && (a.ClientStatus == nomad.AllocClientStatusRunning || a.ClientStatus == nomad.AllocClientStatusPending) {
			out = append(out, fmt.Sprintf("%.8s on %s", a.ID, a.NodeName))
		}
	}
	return out
}

// passingAddrs are the addresses of the revision's instances Consul lists
// passing (the activator's stand-ins left out).
func (c *clusterRun) passingAddrs(h *harness) []string {
	var out []string
	for _, e := range h.passing(c.rev) {
		out = append(out, net.JoinHostPort(e.Service.Address, strconv.Itoa(e.Service.Port)))
	}
	slices.Sort(out)
	return out
}

// spread: the deployed instances run on 3 different nodes, each on its
// node's own address and registered in its node's own Consul agent, and
// every gateway routes to all of them and gets answers from all of them.
func (c *clusterRun) spread(t *testing.T, h *harness) {
	ps := c.waitSettled(h, c.want, nil, 90*time.Second)
	nodes := map[string]bool{}
	for _, p := range ps {
		n := c.nodeOf(p)
		if n == nil {
			t.Fatalf("allocation %s runs on node %s, not one of the cluster's", p.alloc, p.nodeID)
		}
		nodes[n.Name] = true
		if host, _, _ := net.SplitHostPort(p.addr); host != n.Addr.String() {
			t.Errorf("allocation %s on %s has its http port on %s, not on its node's address %s", p.alloc, n.Name, host, n.Addr)
		}
	}
	if len(nodes) != clusterNodes {
		t.Errorf("%d instances on %d nodes (%v), want one on each of %d", len(ps), len(nodes), nodes, clusterNodes)
	}
	for _, e := range h.passing(c.rev) {
		if n := c.cl.NodeAt(e.Service.Address); n == nil || e.Node.Node != n.Name {
			t.Errorf("instance %s:%d is registered in Consul node %q, not in its own node's agent", e.Service.Address, e.Service.Port, e.Node.Node)
		}
	}

	before := map[string]int64{}
	for _, p := range ps {
		n, err := appRequests(p.appPort)
		if err != nil {
			t.Fatalf("stats of the app of %s: %v", p.alloc, err)
		}
		before[p.alloc] = n
	}
	client := NewClient(4)
	for i, g := range c.gws {
		r := Burst(context.Background(), g.request(c.svc, "", "/?sleep=50ms", client), 30)
		if r.OK() != len(r) {
			t.Errorf("gateway %d: %s", i+1, r.Summary())
		}
	}
	for _, p := range ps {
		n, err := appRequests(p.appPort)
		if err != nil {
			t.Fatalf("stats of the app of %s: %v", p.alloc, err)
		}
		t.Logf("instance %s at %s: %d requests", p.alloc[:8], p.addr, n-before[p.alloc])
		if n == before[p.alloc] {
			t.Errorf("instance %s at %s answered none of the %d requests", p.alloc, p.addr, 30*len(c.gws))
		}
	}
}

// clusterLoad is load through several gateways at once.
type clusterLoad struct{ loads []*Load }

// startLoad runs workersPer workers on each of gateways, each sending path
// with pause between requests, until stopped.
func (c *clusterRun) startLoad(gateways []*gateway, path string, workersPer int, pause time.Duration) *clusterLoad {
	l := &clusterLoad{}
	for _, g := range gateways {
		l.loads = append(l.loads, StartLoad(context.Background(), g.request(c.svc, "", path, NewClient(workersPer)), workersPer, pause, 4*time.Minute))
	}
	return l
}

// stop ends the load and returns every outcome in start order.
func (l *clusterLoad) stop() Result {
	var all Result
	for _, ld := range l.loads {
		all = append(all, ld.Stop()...)
	}
	slices.SortFunc(all, func(a, b Outcome) int { return a.Start.Compare(b.Start) })
	return all
}

// sampler looks at the revision every 100 ms (ClusterSample) until
// stopped.
type sampler struct {
	stopc   chan struct{}
	done    chan struct{}
	samples []ClusterSample
}

func (c *clusterRun) startSampler(h *harness, victim *devagents.Node) *sampler {
	s := &sampler{stopc: make(chan struct{}), done: make(chan struct{})}
	client := NewClient(2)
	go func() {
		defer close(s.done)
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			s.samples = append(s.samples, c.sample(h, client, victim))
			select {
			case <-s.stopc:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *sampler) stop() []ClusterSample {
	close(s.stopc)
	<-s.done
	return s.samples
}

// sample takes one ClusterSample; what cannot be read stays empty.
func (c *clusterRun) sample(h *harness, client *http.Client, victim *devagents.Node) ClusterSample {
	s := ClusterSample{At: time.Now(), Actual: -1}
	if n, _, err := h.nomad.Nodes().Info(victim.ID, nil); err == nil {
		s.NodeStatus = n.Status
	}
	if allocs, _, err := h.nomad.Jobs().Allocations(c.rev, true, nil); err == nil {
		for _, a := range allocs {
			s.Allocs = append(s.Allocs, SampledAlloc{ID: a.ID, Node: a.NodeID, ClientStatus: a.ClientStatus, DesiredStatus: a.DesiredStatus})
		}
	}
	if entries, _, err := h.consul.Health().Service(c.rev, "", true, nil); err == nil {
		for _, e := range entries {
			if !slices.Contains(e.Service.Tags, spec.TagActivator) {
				s.Passing = append(s.Passing, net.JoinHostPort(e.Service.Address, strconv.Itoa(e.Service.Port)))
			}
		}
	}
	for _, g := range c.gws {
		addrs, err := instanceAddrs(client, g, c.rev)
		if err != nil {
			addrs = nil
		}
		s.Gateways = append(s.Gateways, addrs)
	}
	for _, g := range c.gws {
		status, body, err := getBody(client, g.adminURL()+"/v1/autoscaler/revisions?service="+c.svc)
		if err != nil || status != http.StatusOK {
			continue
		}
		var revs []autoscalerRevision
		if json.Unmarshal([]byte(body), &revs) == nil {
			for _, r := range revs {
				if r.Revision == c.rev {
					s.Actual = r.Actual
				}
			}
		}
		break
	}
	return s
}

// mostLoaded is the node running the most of ps.
func (c *clusterRun) mostLoaded(ps []placed) *devagents.Node {
	count := map[*devagents.Node]int{}
	var best *devagents.Node
	for _, p := range ps {
		n := c.nodeOf(p)
		count[n]++
		if best == nil || count[n] > count[best] {
			best = n
		}
	}
	return best
}

// nodeLoss is one kill under load, with what the scenario read of it.
type nodeLoss struct {
	victim  *devagents.Node
	killed  devagents.KillWindow
	loss    NodeLoss
	res     Result
	orphans []placed
	// retried and ejected are the gateways' retries and ejections of the
	// revision (their metrics) from just before the kill to the end.
	retried, ejected float64
}

// dataPathCount is the gateways' retries and ejections of the revision so
// far, summed over the replicas.
type dataPathCount struct{ retries, ejections float64 }

func (c *clusterRun) dataPathCounts(h *harness) dataPathCount {
	var n dataPathCount
	client := NewClient(1)
	for i, g := range c.gws {
		status, body, err := getBody(client, g.adminURL()+"/metrics")
		if err != nil || status != http.StatusOK {
			h.t.Fatalf("metrics of gateway %d: %d %v", i+1, status, err)
		}
		n.retries += MetricSum(body, "nomad_serverless_gateway_retries_total", `revision="`+c.rev+`"`)
		n.ejections += MetricSum(body, "nomad_serverless_gateway_ejections_total", `revision="`+c.rev+`"`)
	}
	return n
}

// underLoad kills victim with kill while every gateway carries load, and
// samples until the revision runs want instances elsewhere, every gateway
// routes to them, and settle more has passed.
func (c *clusterRun) underLoad(h *harness, victim *devagents.Node, kill func(*devagents.Node) (devagents.KillWindow, error), settle time.Duration) nodeLoss {
	t := h.t
	var orphans []placed
	for _, p := range c.placements(h) {
		if p.nodeID == victim.ID {
			orphans = append(orphans, p)
		}
	}
	if len(orphans) == 0 {
		t.Fatalf("no instance of %s runs on %s", c.rev, victim.Name)
	}
	load := c.startLoad(c.gws, "/?sleep=20ms", 2, 10*time.Millisecond)
	time.Sleep(2 * time.Second)
	smp := c.startSampler(h, victim)
	time.Sleep(500 * time.Millisecond)
	before := c.dataPathCounts(h)
	kw, err := kill(victim)
	if err != nil {
		load.stop()
		smp.stop()
		t.Fatal(err)
	}
	c.waitSettled(h, c.want, victim, 2*time.Minute)
	time.Sleep(settle)
	samples := smp.stop()
	res := load.stop()
	l := AnalyzeNodeLoss(samples, kw.From, victim.ID, victim.Addr.String(), c.want)
	after := c.dataPathCounts(h)
	t.Logf("%s: %d samples; node down +%s, lost +%s, Consul stopped passing +%s, gateways stopped routing to it +%v, replaced +%s, routed +%s; Consul passing %d orphans when Nomad said lost",
		victim.Name, len(samples), fmtSeen(l.NodeDown), fmtSeen(l.Lost), fmtSeen(l.ConsulGone), fmtAll(l.Dropped), fmtSeen(l.Replaced), fmtSeen(l.Routed), l.OrphansAtLost)
	t.Logf("load: %s; in flight at the kill (%s from the first signal to the last) and failed: %d",
		res.Summary(), FormatDuration(kw.To.Sub(kw.From)), len(res.Failed())-len(res.FailedNotInFlight(kw.From, kw.To)))
	nl := nodeLoss{victim: victim, killed: kw, loss: l, res: res, orphans: orphans,
		retried: after.retries - before.retries, ejected: after.ejections - before.ejections}
	t.Logf("the gateways retried %g requests on another instance and took %g instances out of balancing", nl.retried, nl.ejected)
	return nl
}

// checkLoss asserts what both kills must show: Nomad marked the node's
// allocations lost and replaced them, every gateway stopped routing to the
// node within a second of Nomad saying lost (if not before), the
// autoscaler never counted a lost instance, and no request failed but those
// in flight at the kill.
func (c *clusterRun) checkLoss(h *harness, nl nodeLoss, what string) {
	t, l := h.t, nl.loss
	if l.Lost == NotSeen || l.Replaced == NotSeen || l.Routed == NotSeen {
		t.Fatalf("%s: Nomad lost the allocations +%s, replaced them +%s, gateways routed the replacements +%s", what, fmtSeen(l.Lost), fmtSeen(l.Replaced), fmtSeen(l.Routed))
	}
	for i, d := range l.Dropped {
		if d == NotSeen || d > l.Lost+time.Second {
			t.Errorf("%s: gateway %d routed to %s until +%s, Nomad marked it lost at +%s", what, i+1, nl.victim.Name, fmtSeen(d), FormatDuration(l.Lost))
		}
	}
	if len(l.Overcounted) > 0 {
		t.Errorf("%s: the autoscaler counted lost instances as ready: %v", what, l.Overcounted)
	}
	if l.Counted == 0 {
		t.Errorf("%s: no sample read the autoscaler's count after the loss: the check proves nothing", what)
	}
	if bad := nl.res.FailedNotInFlight(nl.killed.From, nl.killed.To); len(bad) > 0 {
		t.Errorf("%s: %d requests failed that were not in flight at the kill: %s (first: %s, sent at +%s)", what, len(bad), bad.Summary(), bad[0].Describe(), FormatDuration(bad[0].Start.Sub(nl.killed.From)))
	}
	h.timing(what+" -> node down (Nomad)", l.NodeDown)
	h.timing(what+" -> allocations lost (Nomad)", l.Lost)
	h.timing(what+" -> replacements running elsewhere (Nomad)", l.Replaced)
	h.timing(what+" -> every gateway routes the replacements", l.Routed)
	h.timing(what+" -> last gateway stops routing to the node", l.RoutedToNode())
	h.s.Timings.Note(h.scenario, what+" -> node down (Nomad)", fmt.Sprintf("heartbeat TTL %s, grace %s", devagents.ClusterMinHeartbeatTTL, devagents.ClusterHeartbeatGrace))
	failed := len(nl.res.Failed())
	h.s.Timings.Note(h.scenario, what+" -> last gateway stops routing to the node", fmt.Sprintf("catalog; %d of %d requests failed (in flight at the kill), %g retried elsewhere, %g ejections", failed, len(nl.res), nl.retried, nl.ejected))
}

// killClient: kill -9 of the Nomad client of the busiest node. Its tasks
// live on and Consul keeps passing them; the gateways and the autoscaler
// follow Nomad's word (lost) instead, and the orphans get no request once
// the gateways dropped them. Restarting the client stops the orphans.
func (c *clusterRun) killClient(t *testing.T, h *harness) {
	victim := c.mostLoaded(c.waitSettled(h, c.want, nil, time.Minute))
	nl := c.underLoad(h, victim, c.cl.KillClient, 3*time.Second)
	c.checkLoss(h, nl, "kill -9 of a Nomad client")
	if nl.loss.OrphansAtLost == 0 {
		t.Errorf("Consul listed none of %s's orphaned instances passing when Nomad marked them lost: the step proves nothing", victim.Name)
	}

	// The orphans still run and still pass in Consul, but get nothing.
	counts := map[string]int64{}
	for _, o := range nl.orphans {
		n, err := appRequests(o.appPort)
		if err != nil {
			t.Fatalf("the orphaned app of %s is gone, although its client alone was killed: %v", o.alloc, err)
		}
		counts[o.alloc] = n
	}
	quiet := c.startLoad(c.gws, "/", 2, 10*time.Millisecond)
	time.Sleep(3 * time.Second)
	if r := quiet.stop(); r.OK() != len(r) {
		t.Errorf("load after the replacement: %s", r.Summary())
	}
	stillPassing := countOnHost(c.passingAddrs(h), victim.Addr.String())
	for _, o := range nl.orphans {
		if n, err := appRequests(o.appPort); err != nil || n != counts[o.alloc] {
			t.Errorf("orphan %s at %s: %d requests, then %d (%v): a gateway still routes to it", o.alloc, o.addr, counts[o.alloc], n, err)
		}
	}
	t.Logf("after the replacement, Consul still passes %d orphans on %s, which got no request in 3 s of load", stillPassing, victim.Name)

	// The client comes back and stops its orphans, which leave Consul.
	restart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.cl.RestartNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	h.timing("restart of the killed client -> node ready", time.Since(restart))
	eventually(t, time.Minute, "the restarted client stops its orphans and Consul lists none of them", func() (bool, string) {
		n := countOnHost(c.passingAddrs(h), victim.Addr.String())
		return n == 0, fmt.Sprintf("%d passing on %s", n, victim.Addr)
	})
	h.timing("restart of the killed client -> orphans gone from Consul", time.Since(restart))
	// It stops them as it stops any allocation: deregistered first,
	// then the group's shutdown_delay, then the app's own drain.
	eventually(t, time.Minute, "the orphaned apps stop", func() (bool, string) {
		for _, o := range nl.orphans {
			if _, err := appRequests(o.appPort); err == nil {
				return false, "the app of " + o.alloc + " still answers"
			}
		}
		return true, ""
	})
	h.timing("restart of the killed client -> orphans stopped", time.Since(restart))
	c.waitOldAllocsGone(h, victim, nl.orphans)
}

// killNode: kill -9 of everything of the busiest node (Nomad client,
// Consul agent, tasks). The gateways stop routing to it (Consul's failure
// detection or the data path may see it before Nomad does), its
// allocations are replaced, and the node then comes back empty.
func (c *clusterRun) killNode(t *testing.T, h *harness) {
	victim := c.mostLoaded(c.waitSettled(h, c.want, nil, time.Minute))
	nl := c.underLoad(h, victim, c.cl.KillNode, time.Second)
	c.checkLoss(h, nl, "kill -9 of a whole node")
	h.timing("kill -9 of a whole node -> Consul stops passing its instances", nl.loss.ConsulGone)
	restart := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := c.cl.RestartNode(ctx, victim); err != nil {
		t.Fatal(err)
	}
	h.timing("restart of the killed node -> node ready", time.Since(restart))
	c.waitOldAllocsGone(h, victim, nl.orphans)
	h.timing("restart of the killed node -> its old allocations' processes gone", time.Since(restart))
	c.waitSettled(h, c.want, nil, time.Minute)
}

// waitOldAllocsGone waits until no process below victim's (restarted)
// Nomad client belongs to one of old. A client that comes back after a
// kill takes its old allocations back, starts again the tasks it cannot
// reattach to, reports them running and only then stops them (after the
// group's shutdown_delay), although Nomad has long replaced them: while it
// does, the scheduler counts them on that node.
func (c *clusterRun) waitOldAllocsGone(h *harness, victim *devagents.Node, old []placed) {
	h.t.Helper()
	eventually(h.t, time.Minute, "the processes of "+victim.Name+"'s old allocations are gone", func() (bool, string) {
		for _, line := range devagents.DescribeDescendants(victim.Nomad.Pid()) {
			for _, o := range old {
				if strings.Contains(line, o.alloc) {
					return false, line
				}
			}
		}
		return true, ""
	})
}

// scaleUp: load that wants 6 instances raises the revision, the 6 run on
// more than one node, and every gateway routes to all of them.
func (c *clusterRun) scaleUp(t *testing.T, h *harness) {
	before := c.waitSettled(h, c.want, nil, time.Minute)
	old := map[string]bool{}
	for _, p := range before {
		old[p.alloc] = true
	}
	if allocs, _, err := h.nomad.Jobs().Allocations(c.rev, true, nil); err == nil {
		var states []string
		for _, a := range allocs {
			states = append(states, fmt.Sprintf("%.8s %s %s/%s", a.ID, a.NodeName, a.DesiredStatus, a.ClientStatus))
		}
		t.Logf("before the scale-up, Nomad lists %s", strings.Join(states, ", "))
	}
	// 18 requests of 300 ms in flight: at 5 per instance and 70 % that
	// wants 6, the max.
	start := time.Now()
	load := c.startLoad(c.gws, "/?sleep=300ms", 6, 0)
	const top = 6 // the service's max
	var ps []placed
	eventually(t, 2*time.Minute, fmt.Sprintf("%s runs %d instances under load", c.rev, top), func() (bool, string) {
		ps = c.placements(h)
		return len(ps) == top, h.allocStates(c.rev)
	})
	h.timing("load for 6 -> 6 instances running (Nomad)", time.Since(start))
	client := NewClient(1)
	var addrs []string
	eventually(t, time.Minute, "every gateway routes to all 6 instances", func() (bool, string) {
		addrs = addrs[:0]
		for _, p := range ps {
			addrs = append(addrs, p.addr)
		}
		slices.Sort(addrs)
		for i, g := range c.gws {
			got, err := instanceAddrs(client, g, c.rev)
			if err != nil || !slices.Equal(got, addrs) {
				return false, fmt.Sprintf("gateway %d routes %v (%v), Nomad runs %v", i+1, got, err, addrs)
			}
		}
		return true, ""
	})
	h.timing("load for 6 -> every gateway routes all 6", time.Since(start))
	res := load.stop()
	if lost := res.Lost(); len(lost) > 0 {
		t.Errorf("requests lost while scaling up: %s", res.Summary())
	}
	t.Logf("load: %s", res.Summary())

	perNode := map[string]int{}
	var added []string
	for _, p := range ps {
		n := c.nodeOf(p)
		perNode[n.Name]++
		if !old[p.alloc] {
			added = append(added, n.Name)
		}
	}
	t.Logf("before: %s; after: %v; the new instances went to %v", FormatByHost(ByHost(addrsOf(before))), perNode, added)
	for _, p := range ps {
		if !old[p.alloc] {
			t.Logf("placement of %s: %s", p.alloc[:8], c.placementWhy(h, p.alloc))
		}
	}
	// Nomad places them, not us, and its default scheduler spreads a
	// job's instances without promising an even split: for each
	// placement it scores a sample of max(2, log2(nodes)) nodes (binpack
	// plus job anti-affinity), and right after a killed node came back
	// it still scores it as holding an instance of the revision (the
	// placement scores logged above). 4/1/1 and 3/3/0 happen. What must
	// hold: the 6 run on more than one node, and every gateway routes to
	// all of them (above). Only a spread block in the job (all nodes
	// scored) would make it even.
	if len(perNode) < 2 {
		t.Errorf("the 6 instances all run on one node (%v)", perNode)
	}
	h.s.Timings.Note(h.scenario, "load for 6 -> 6 instances running (Nomad)", "per node: "+FormatByHost(ByHost(addrs)))
	// Back to the min before the next step.
	c.waitSettled(h, c.want, nil, 2*time.Minute)
}

// placementWhy is Nomad's account of an allocation's placement: the nodes
// it evaluated and filtered, and each scored node's scores.
func (c *clusterRun) placementWhy(h *harness, alloc string) string {
	a, _, err := h.nomad.Allocations().Info(alloc, nil)
	if err != nil || a.Metrics == nil {
		return fmt.Sprintf("unknown (%v)", err)
	}
	m := a.Metrics
	parts := []string{fmt.Sprintf("evaluated %d, filtered %d, exhausted %d %v", m.NodesEvaluated, m.NodesFiltered, m.NodesExhausted, m.DimensionExhausted)}
	for _, sm := range m.ScoreMetaData {
		name := sm.NodeID
		for _, n := range c.cl.Nodes {
			if n.ID == sm.NodeID {
				name = n.Name
			}
		}
		parts = append(parts, fmt.Sprintf("%s %.3f %v", name, sm.NormScore, sm.Scores))
	}
	return strings.Join(parts, "; ")
}

func addrsOf(ps []placed) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.addr
	}
	return out
}

// restartReplica: SIGTERM of the replica leading the autoscaler, and a new
// one on its addresses; load through the other two sees no error at all,
// and the restarted one serves again.
func (c *clusterRun) restartReplica(t *testing.T, h *harness) {
	c.waitSettled(h, c.want, nil, time.Minute)
	leader := -1
	for i, g := range c.gws {
		if _, err := g.autoscalerView(c.svc); err == nil {
			leader = i
		}
	}
	if leader < 0 {
		t.Fatal("no replica leads the autoscaler")
	}
	old := c.gws[leader]
	var others []*gateway
	for i, g := range c.gws {
		if i != leader {
			others = append(others, g)
		}
	}
	load := c.startLoad(others, "/?sleep=20ms", 2, 10*time.Millisecond)
	time.Sleep(2 * time.Second)
	stop := time.Now()
	old.stop(t)
	h.timing("replica SIGTERM -> exited", time.Since(stop))
	g := h.startReplica(t, "e2e-20-"+strconv.Itoa(leader+1)+"-again", old.listen, old.admin, c.rev)
	h.timing("replica SIGTERM -> a new one on its addresses routes", time.Since(stop))
	c.gws[leader] = g
	time.Sleep(2 * time.Second)
	res := load.stop()
	t.Logf("load through the other two replicas: %s", res.Summary())
	if f := res.Failed(); len(f) > 0 {
		t.Errorf("the other replicas failed %d requests while replica %d restarted: %s", len(f), leader+1, res.Summary())
	}
	h.s.Timings.Note(h.scenario, "replica SIGTERM -> a new one on its addresses routes", fmt.Sprintf("the other two: %s", res.Summary()))
	if r := Burst(context.Background(), g.request(c.svc, "", "/", NewClient(4)), 20); r.OK() != len(r) {
		t.Errorf("the restarted replica: %s", r.Summary())
	}
	leads := ""
	eventually(t, 30*time.Second, "a replica leads the autoscaler", func() (bool, string) {
		for i, g := range c.gws {
			if _, err := g.autoscalerView(c.svc); err == nil {
				leads = "replica " + strconv.Itoa(i+1)
				return true, ""
			}
		}
		return false, "none answers"
	})
	t.Logf("after the restart %s leads", leads)
}

// fmtSeen formats a NodeLoss time.
func fmtSeen(d time.Duration) string {
	if d == NotSeen {
		return "never"
	}
	return FormatDuration(d)
}

func fmtAll(ds []time.Duration) string {
	parts := make([]string, len(ds))
	for i, d := range ds {
		parts[i] = fmtSeen(d)
	}
	return "[" + strings.Join(parts, " ") + "]"
}

// testWriter sends each line written to it to t.Log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(b []byte) (int, error) {
	w.t.Helper()
	for _, line := range strings.Split(strings.TrimRight(string(b), "\n"), "\n") {
		w.t.Log(line)
	}
	return len(b), nil
}
