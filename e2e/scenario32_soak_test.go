package e2e

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/dev/devagents"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

var (
	soakDuration = flag.Duration("soak-duration", 0, "scenario 32: run the soak this long (make soak passes 60m; under 30m every fault comes sooner, each at least once); 0 skips it")
	soakServices = flag.Int("soak-services", 50, "scenario 32: services with traffic")
	soakWakers   = flag.Int("soak-wakers", 20, "scenario 32: of them, services that go to zero between bursts")
	soakRPS      = flag.Float64("soak-rps", 2, "scenario 32: requests per second to each service while it has traffic")
	soakOut      = flag.String("soak-out", "", "scenario 32: directory for the table, the samples and the plot (default: a new one under the temporary directory)")
)

// soakFirstAddr is the soak's node address: neither dev's 127.0.0.2 nor
// scenario 20's.
func soakFirstAddr() [4]byte { return [4]byte{127, 0, 32, 2} }

// The soak's shape; soakPlan says when each thing happens.
const (
	soakReplicas    = 4 // a: the survivor; b, c: killed and restarted; d: killed for good
	soakSampleEvery = 10 * time.Second
	// soakSlow is a successful request slow enough to put down to a
	// cause, as failures are: far above a wake's (under a second here).
	soakSlow         = 2 * time.Second
	soakDeployTarget = 5 // services 0-4 take the deploys; 5 the split changes
)

// soakPlan is when the faults come, from the run's length.
type soakPlan struct {
	d                          time.Duration
	deployEvery, splitEvery    time.Duration
	wakeOn, wakeOff            time.Duration
	kills                      []time.Duration // from the start; the first is for good
	nomadRestart, consulRestrt time.Duration
}

func newSoakPlan(d time.Duration) soakPlan {
	p := soakPlan{d: d, deployEvery: time.Minute, splitEvery: 3 * time.Minute, wakeOn: 20 * time.Second, wakeOff: 40 * time.Second}
	if d < 30*time.Minute {
		// A short try: everything sooner, each fault at least once.
		p.deployEvery, p.splitEvery, p.wakeOn, p.wakeOff = 30*time.Second, time.Minute, 15*time.Second, 30*time.Second
	}
	// A kill every tenth of an hour (a sixth of the run): 10, 20, 30, 40
	// and 50 minutes into an hour; the Nomad client's restart at a
	// quarter, the Consul agent's at 7/12, each away from any kill.
	for k := 1; k <= 5; k++ {
		p.kills = append(p.kills, d*time.Duration(k)/6)
	}
	p.nomadRestart, p.consulRestrt = d/4, d*7/12
	return p
}

// Scenario 32: the soak (issue 45 part 3; make soak). A dev cluster of one
// Nomad server and one client node with its own Consul agent (the servers'
// heartbeats at Nomad's defaults, 10 s, as in production), and 4 serve
// replicas that use the node's Consul agent, as replicas run beside one in
// production. For -soak-duration:
//   - -soak-services services get -soak-rps requests a second each
//     through the replicas in turn; -soak-wakers of them in bursts
//     (20 s on, 40 s off), going to zero between and waking again;
//   - a deploy every minute to one of 5 services, alternately good (a new
//     revision that takes the traffic) and bad (a revision that never
//     passes readiness: deploy fails and the traffic stays);
//   - a traffic split change every 3 minutes on another service of two
//     revisions;
//   - kill -9 of a serve replica every 10 minutes: the first (replica d)
//     for good, the others (the leader when it is not replica a, else b or
//     c) restarted 10 s later with the same name and ports;
//   - a Nomad client restart (kill -9, started again) at a quarter, a
//     Consul agent restart (SIGTERM: the agent leaves, and comes back with
//     what it persisted) at 7/12.
//
// It reports every request's outcome, failures by cause (only those in
// flight at a replica's kill are excused), per replica life the slope of
// RSS, goroutines, open files, Consul connections and sessions from a
// linear fit after a warm-up, and that after deleting everything (and
// stopping the replicas) nothing of it is left in Nomad or Consul. The
// table and a plot (RSS, goroutines, p99) go to -soak-out.
func TestE2E32Soak(t *testing.T) {
	if *soakDuration <= 0 {
		t.Skip("e2e 32: SKIPPED: pass -soak-duration (make soak runs 60m)")
	}
	h := newHarness(t, "32 soak")
	if h.s.Plan.Mode != StartAgents {
		t.Skip("e2e 32: SKIPPED: needs agents the suite starts itself: it starts a cluster of its own")
	}
	plan := newSoakPlan(*soakDuration)
	out := *soakOut
	if out == "" {
		var err error
		if out, err = os.MkdirTemp("", "nomad-serverless-soak-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Logf("soak: %s; output in %s; plan %+v", plan.d, out, plan)

	cl, node := h.startSoakCluster(t)
	consulPort := portOf(t, "http://"+node.ConsulAddr)
	s := &soak{h: h, t: t, plan: plan, cl: cl, node: node, consulPort: consulPort, out: out,
		gws: map[string]*gateway{}, lives: map[string]int{}}

	// The table is printed whatever happens, with the figures so far.
	defer s.writeTable()

	// The services: the wakers last, since the first ones take the
	// deploys (0-4) and the split changes (5), and stay up.
	n, wakers := max(*soakServices, soakDeployTarget+1), min(*soakWakers, *soakServices-soakDeployTarget-1)
	var svcs []Service
	for i := range n {
		sv := testService(fmt.Sprintf("soak-s%02d", i))
		sv.CPU = 20
		sv.Scaling = Scaling{Min: 1, Max: 3, Initial: 1, Target: 5, Window: 6 * time.Second, ScaleToZeroGrace: 2 * time.Second}
		if i >= n-wakers {
			sv.Scaling.Min, sv.Scaling.Initial = 0, 0
		}
		svcs = append(svcs, sv)
		s.services = append(s.services, soakService{name: sv.Name, wake: i >= n-wakers})
	}
	t.Cleanup(func() {
		if t.Failed() {
			h.deleteAll("soak-", 4, 0)
		}
	})

	// Replicas: b first, so it leads (a leader's kill comes early), then
	// a, c, d.
	s.startReplica("e2e-32b", true)
	for _, r := range []string{"e2e-32a", "e2e-32c", "e2e-32d"} {
		s.startReplica(r, false)
		if t.Failed() {
			t.FailNow()
		}
	}
	s.lock = h.watchLock(t)

	start := time.Now()
	h.mustCLI("deploy", "-sidecar-command", h.bin, "-detach", h.writeServices("soak.hcl", svcs...))
	for i, sv := range svcs {
		if !s.services[i].wake {
			eventually(t, 5*time.Minute, sv.Name+" has a passing instance", func() (bool, string) {
				p := h.passing(revision(sv.Name, 1))
				return len(p) > 0, fmt.Sprintf("%d passing", len(p))
			})
		}
	}
	// The split service gets its second revision, half the traffic each.
	split := svcs[soakDeployTarget]
	split.Env = map[string]string{"TESTAPP_NAME": "v2"}
	split.Traffic = []Traffic{{Revision: revision(split.Name, 1), Percent: 50}, {Latest: true, Percent: 50}}
	h.deploy(h.writeServices("split.hcl", split))
	s.deployGen = map[string]int{}
	t.Logf("soak: set up in %s", time.Since(start).Round(time.Second))

	// The run.
	ctx, cancel := context.WithCancel(context.Background())
	s.start = time.Now()
	s.lat = map[bool]*Latencies{false: {Start: s.start, Width: soakSampleEvery}, true: {Start: s.start, Width: soakSampleEvery}}
	var bg sync.WaitGroup
	bg.Go(func() { s.sample(ctx) })
	for i := range s.services {
		bg.Go(func() { s.traffic(ctx, i) })
	}
	bg.Go(func() { s.deploys(ctx, svcs[:soakDeployTarget]) })
	bg.Go(func() { s.splits(ctx, split.Name) })
	// Whatever ends the run (a step that fails the test included), the
	// figures so far are counted and fitted, and everything is deleted
	// and checked.
	defer func() {
		cancel()
		bg.Wait()
		s.end = time.Now()
		t.Logf("soak: traffic and faults ended after %s", s.end.Sub(s.start).Round(time.Second))
		s.report()
		s.cleanUp()
	}()
	s.faults(ctx)
	if rest := time.Until(s.start.Add(plan.d)); rest > 0 {
		time.Sleep(rest)
	}
}

// soak is the run's state; the goroutines share it under mu.
type soak struct {
	h          *harness
	t          *testing.T
	plan       soakPlan
	cl         *devagents.Cluster
	node       *devagents.Node
	consulPort int
	out        string
	lock       *lockWatch
	services   []soakService
	start, end time.Time

	mu sync.Mutex
	// gws are the replicas, by name; live those that take traffic now,
	// in order.
	gws   map[string]*gateway
	live  []string
	lives map[string]int // replica -> its current life (1, 2, ...)
	procs []lifeProc     // every replica process, for its log
	// series are per replica life: measure -> life name -> samples.
	series map[string]map[string]*Series
	// totals are cluster-wide samples (sessions, registrations).
	totals    map[string]*Series
	requests  []SoakRequest // failures only, plus counts below
	slow      []SoakRequest // successes slower than soakSlow
	count     map[bool]int  // by wake
	failed    map[bool]int
	lat       map[bool]*Latencies
	faultLog  []Fault
	deployGen map[string]int
	deploysOK map[string]int // "good ok", "good failed", "bad refused", "bad passed"
	splitsN   int
	rows      [][]string // the table: measure, value, verdict
	notes     []string
}

type lifeProc struct {
	life string
	proc *testbin.Proc
}

type soakService struct {
	name string
	wake bool
}

// startSoakCluster starts the soak's cluster (one node) and points the
// harness at it: Nomad at the server, Consul at the node's agent (the
// replicas' agent; reads of the catalog go through it).
func (h *harness) startSoakCluster(t *testing.T) (*devagents.Cluster, *devagents.Node) {
	t.Helper()
	dir, err := os.MkdirTemp("", "nomad-serverless-e2e-soak-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cl, err := devagents.StartCluster(ctx, devagents.ClusterOptions{
		ConsulBin: h.s.Plan.ConsulBin, NomadBin: h.s.Plan.NomadBin, Dir: dir,
		Nodes: 1, FirstAddr: netip.AddrFrom4(soakFirstAddr()), LogLevel: "INFO",
		// 60-odd instances of 20 MHz plus their sidecars on a node
		// that measures a few GHz (raw_exec caps no CPU).
		CPUTotalCompute: 16000,
		// Nomad's defaults: a client restart within them keeps its
		// allocations, as it does in production.
		HeartbeatTTL: 10 * time.Second, HeartbeatGrace: 10 * time.Second,
		ReadyTimeout: 2 * time.Minute, StopGrace: agentStopGrace,
		Progress: testWriter{t}, Guard: h.s.Guard,
	})
	if err != nil {
		os.RemoveAll(dir)
		if strings.Contains(err.Error(), "needs root or CAP_NET_ADMIN") {
			t.Skipf("e2e 32: SKIPPED: the cluster's node needs an address of its own on lo: %v", err)
		}
		t.Fatalf("start the soak's cluster: %v", err)
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
	node := cl.Nodes[0]
	if h.nomad, err = nomad.NewClient(&nomad.Config{Address: cl.NomadAddr}); err != nil {
		t.Fatal(err)
	}
	if h.consul, err = consul.NewClient(&consul.Config{Address: node.ConsulAddr}); err != nil {
		t.Fatal(err)
	}
	h.env["NOMAD_ADDR"], h.env["CONSUL_HTTP_ADDR"] = cl.NomadAddr, node.ConsulAddr
	return cl, node
}

// startReplica starts (or starts again, on the same ports) a replica and
// puts it in the traffic rotation once Consul lists it passing.
func (s *soak) startReplica(name string, lead bool) {
	s.t.Helper()
	s.mu.Lock()
	g := s.gws[name]
	s.mu.Unlock()
	listen, admin := "", ""
	if g != nil {
		listen, admin = g.listen, g.admin
	}
	if lead {
		g = s.h.startServe(name, listen, admin)
	} else {
		var err error
		if g, err = s.h.startSoakReplica(s.t, name, listen, admin); err != nil {
			// A restart that does not come up is a finding, not the end
			// of the run: the others go on.
			s.t.Errorf("soak: %v", err)
			s.mu.Lock()
			s.notes = append(s.notes, err.Error())
			s.mu.Unlock()
			return
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gws[name] = g
	s.lives[name]++
	s.live = append(s.live, name)
	s.procs = append(s.procs, lifeProc{fmt.Sprintf("%s#%d", name, s.lives[name]), g.proc})
}

// startSoakReplica is startManyReplica on given ports ("" picks free
// ones), failing with an error (its output's tail) instead of the test.
func (h *harness) startSoakReplica(t *testing.T, replica, listen, admin string) (*gateway, error) {
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
	took, last := pollUntil(2*time.Minute, func() string {
		select {
		case <-g.proc.Done():
			return "exited"
		default:
		}
		status, _, err := getBody(NewClient(1), g.adminURL()+"/healthz")
		if err != nil || status != http.StatusOK {
			return fmt.Sprintf("healthz %d %v", status, err)
		}
		entries, _, err := h.consul.Health().Service(spec.ActivatorServiceName, "", true, nil)
		if err != nil {
			return err.Error()
		}
		for _, e := range entries {
			if e.Service.Meta[consulroute.MetaReplica] == replica && strconv.Itoa(e.Service.Port) == port {
				return ""
			}
		}
		return "not passing in Consul yet"
	})
	if last != "" {
		g.proc.Stop(t)
		return nil, fmt.Errorf("serve %s is not up and registered after %s (%s); its output:\n%s", replica, took.Round(time.Second), last, tailLines(g.proc.Output(), 30))
	}
	return g, nil
}

// pick is the next live replica in turn (round robin by the counter i).
func (s *soak) pick(i int) (string, *gateway) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.live) == 0 {
		return "", nil
	}
	name := s.live[i%len(s.live)]
	return name, s.gws[name]
}

// traffic sends one service's requests until ctx ends: -soak-rps a
// second, a waker's only during its bursts (its phase is random, so the
// wakes spread out).
func (s *soak) traffic(ctx context.Context, i int) {
	svc := s.services[i]
	client := NewClient(4)
	period := time.Duration(float64(time.Second) / *soakRPS)
	cycle := s.plan.wakeOn + s.plan.wakeOff
	phase := time.Duration(rand.Int64N(int64(cycle)))
	// Steady services start at random moments of the first period too.
	sleepCtx(ctx, time.Duration(rand.Int64N(int64(period))))
	for n := i; ctx.Err() == nil; n++ {
		if svc.wake {
			pos := (time.Since(s.start) + phase) % cycle
			if pos >= s.plan.wakeOn {
				sleepCtx(ctx, cycle-pos)
				continue
			}
		}
		name, g := s.pick(n)
		if g == nil {
			sleepCtx(ctx, period)
			continue
		}
		req := g.request(svc.name, "", "/", client)
		req.Timeout = 2 * time.Minute
		o := req.Do(context.WithoutCancel(ctx))
		s.record(SoakRequest{Service: svc.name, Replica: name, Wake: svc.wake, Outcome: o})
		sleepCtx(ctx, period-time.Since(o.Start)+time.Duration(rand.Int64N(int64(period/5)))-period/10)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	if d <= 0 {
		return
	}
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

func (s *soak) record(r SoakRequest) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.count == nil {
		s.count, s.failed = map[bool]int{}, map[bool]int{}
	}
	s.count[r.Wake]++
	if !r.OK() {
		s.failed[r.Wake]++
		s.requests = append(s.requests, r)
		return
	}
	took := r.End.Sub(r.Start)
	s.lat[r.Wake].Add(r.Start, took.Seconds())
	if took > soakSlow {
		s.slow = append(s.slow, r)
	}
}

func (s *soak) fault(f Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faultLog = append(s.faultLog, f)
	s.t.Logf("soak +%s: %s %s%s (%s)", f.From.Sub(s.start).Round(time.Second), f.Kind, f.Replica, f.Service, f.To.Sub(f.From).Round(time.Millisecond))
}

// cli runs the binary without failing the test (the goroutines may not).
func (s *soak) cli(ctx context.Context, timeout time.Duration, args ...string) (string, int) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, s.h.bin, args...)
	cmd.Env = os.Environ()
	for k, v := range s.h.env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var b bytes.Buffer
	cmd.Stdout, cmd.Stderr = &b, &b
	err := cmd.Run()
	code := 0
	if err != nil {
		code = -1
		if cmd.ProcessState != nil {
			code = cmd.ProcessState.ExitCode()
		}
	}
	return b.String(), code
}

// deploys deploys one of the targets every deployEvery, alternately good
// (a new TESTAPP_NAME: a new revision, ready, takes the traffic) and bad
// (TESTAPP_FAIL_READY: never ready; deploy must fail and leave the traffic
// where it was).
func (s *soak) deploys(ctx context.Context, targets []Service) {
	tick := time.NewTicker(s.plan.deployEvery)
	defer tick.Stop()
	s.mu.Lock()
	s.deploysOK = map[string]int{}
	s.mu.Unlock()
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		sv := targets[(k/2)%len(targets)]
		good := k%2 == 1
		s.mu.Lock()
		s.deployGen[sv.Name]++
		gen := s.deployGen[sv.Name]
		s.mu.Unlock()
		sv.Env = map[string]string{"TESTAPP_NAME": fmt.Sprintf("g%d", gen)}
		wait := "3m"
		if !good {
			sv.Env["TESTAPP_FAIL_READY"] = "true"
			wait = "20s"
		}
		path, err := WriteServiceFile(s.h.dir, fmt.Sprintf("deploy-%03d.hcl", k), withBinary(sv, s.h.bin))
		if err != nil {
			s.t.Errorf("soak: write a deploy file: %v", err)
			continue
		}
		from := time.Now()
		out, code := s.cli(context.WithoutCancel(ctx), 5*time.Minute, "deploy", "-sidecar-command", s.h.bin, "-wait", wait, path)
		to := time.Now()
		s.mu.Lock()
		switch {
		case good && code == 0:
			s.deploysOK["good: deployed"]++
		case good:
			s.deploysOK["good: FAILED"]++
			s.notes = append(s.notes, fmt.Sprintf("good deploy of %s at +%s failed (exit %d): %s", sv.Name, from.Sub(s.start).Round(time.Second), code, tailLines(out, 6)))
		case code != 0:
			s.deploysOK["bad: refused"]++
		default:
			s.deploysOK["bad: PASSED"]++
			s.notes = append(s.notes, fmt.Sprintf("bad deploy of %s at +%s exited 0", sv.Name, from.Sub(s.start).Round(time.Second)))
		}
		s.mu.Unlock()
		if !good {
			s.fault(Fault{Kind: CauseBadDeploy, Service: sv.Name, From: from, To: to})
		}
		s.t.Logf("soak +%s: deploy %s (%s): exit %d in %s", from.Sub(s.start).Round(time.Second), sv.Name, map[bool]string{true: "good", false: "bad"}[good], code, to.Sub(from).Round(time.Millisecond))
	}
}

func withBinary(sv Service, bin string) Service {
	sv.Binary = bin
	return sv
}

// splits changes the split of the service of two revisions every
// splitEvery: 90/10, 10/90, 50/50, ...
func (s *soak) splits(ctx context.Context, svc string) {
	tick := time.NewTicker(s.plan.splitEvery)
	defer tick.Stop()
	shares := []int{90, 10, 50}
	for k := 0; ; k++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		p := shares[k%len(shares)]
		out, code := s.cli(context.WithoutCancel(ctx), time.Minute, "traffic", svc, "-to", fmt.Sprintf("%s=%d", revision(svc, 1), p), "-to", fmt.Sprintf("%s=%d", revision(svc, 2), 100-p))
		s.mu.Lock()
		if code == 0 {
			s.splitsN++
		} else {
			s.notes = append(s.notes, fmt.Sprintf("traffic change of %s failed (exit %d): %s", svc, code, tailLines(out, 4)))
		}
		s.mu.Unlock()
	}
}

// faults runs the kills and restarts at their times, in order.
func (s *soak) faults(ctx context.Context) {
	type event struct {
		at  time.Duration
		run func()
	}
	var evs []event
	for k, at := range s.plan.kills {
		evs = append(evs, event{at, func() { s.killReplica(k == 0) }})
	}
	evs = append(evs, event{s.plan.nomadRestart, s.restartNomadClient}, event{s.plan.consulRestrt, s.restartConsulAgent})
	slices.SortFunc(evs, func(a, b event) int { return int(a.at - b.at) })
	for _, e := range evs {
		sleepCtx(ctx, time.Until(s.start.Add(e.at)))
		if ctx.Err() != nil {
			return
		}
		e.run()
	}
}

// killReplica kill -9s a replica: d for good, else the leader when it is
// not a, else b or c in turn; the victim leaves the rotation first (a
// client's balancer would stop sending to it after its first refusal), and
// is started again 10 s later unless for good.
func (s *soak) killReplica(forGood bool) {
	victim := "e2e-32d"
	s.mu.Lock()
	if !forGood {
		victim = s.lock.current()
		if victim == "" || victim == "e2e-32a" || victim == "e2e-32d" || !slices.Contains(s.live, victim) {
			victim = []string{"e2e-32b", "e2e-32c"}[len(s.faultLog)%2]
		}
		if !slices.Contains(s.live, victim) {
			// A restart that did not come up: the other one.
			victim = map[string]string{"e2e-32b": "e2e-32c", "e2e-32c": "e2e-32b"}[victim]
		}
	}
	if !slices.Contains(s.live, victim) {
		s.notes = append(s.notes, fmt.Sprintf("kill at +%s skipped: %s does not run", time.Since(s.start).Round(time.Second), victim))
		s.mu.Unlock()
		return
	}
	g := s.gws[victim]
	s.live = slices.DeleteFunc(s.live, func(n string) bool { return n == victim })
	s.mu.Unlock()
	// Requests that picked it before it left the rotation are under way by
	// now: they are the ones in flight at the kill.
	time.Sleep(200 * time.Millisecond)
	at := time.Now()
	if err := syscall.Kill(g.proc.PID(), syscall.SIGKILL); err != nil {
		s.t.Errorf("soak: kill -9 %s: %v", victim, err)
		return
	}
	<-g.proc.Done()
	s.fault(Fault{Kind: CauseReplicaKill, Replica: victim, From: at, To: time.Now()})
	if forGood {
		// The leader removes what it left within seconds (issue 45 part 4).
		gone := time.Now()
		deadline := gone.Add(2 * time.Minute)
		for time.Now().Before(deadline) {
			if n := s.registrationsOf(victim); n == 0 {
				s.row("registrations of "+victim+" (killed for good) gone", fmt.Sprintf("%s after the kill", time.Since(at).Round(100*time.Millisecond)), "met")
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
		s.row("registrations of "+victim+" (killed for good) gone", fmt.Sprintf("%d still there 2 min after the kill", s.registrationsOf(victim)), "MISSED")
		return
	}
	time.Sleep(10 * time.Second)
	s.startReplica(victim, false)
}

// registrationsOf counts the Consul registrations (stand-ins, activator,
// internal listener) of a replica on the node's agent; -1 when unreadable.
func (s *soak) registrationsOf(replica string) int {
	svcs, err := s.h.consul.Agent().Services()
	if err != nil {
		return -1
	}
	n := 0
	for _, sv := range svcs {
		if sv.Meta[consulroute.MetaReplica] == replica {
			n++
		}
	}
	return n
}

func (s *soak) restartNomadClient() {
	w, err := s.cl.KillClient(s.node)
	if err != nil {
		s.t.Errorf("soak: kill the Nomad client: %v", err)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := s.cl.RestartNode(ctx, s.node); err != nil {
		s.t.Errorf("soak: restart the Nomad client: %v", err)
	}
	// Its allocations are its again once it has synced them; 10 s more.
	s.fault(Fault{Kind: CauseNomadRestart, From: w.From, To: time.Now().Add(10 * time.Second)})
}

func (s *soak) restartConsulAgent() {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w, err := s.cl.RestartConsulAgent(ctx, s.node, 30*time.Second)
	if err != nil {
		s.t.Errorf("soak: restart the Consul agent: %v", err)
		return
	}
	// Checks run again within their interval; 15 s more.
	s.fault(Fault{Kind: CauseConsulRestart, From: w.From, To: w.To.Add(15 * time.Second)})
}

// The measures sampled per replica life, with the floor below which a
// slope per hour does not matter (Fit.Flat).
var soakMeasures = []struct {
	name  string
	floor float64
}{
	{"RSS (MiB)", 2},
	{"Go heap in use (MiB)", 1},
	{"goroutines", 5},
	{"open files", 2},
	{"Consul connections", 1},
	{"Consul sessions", 0.5},
}

// sample reads, every soakSampleEvery, each live replica's RSS (from
// /proc), goroutines (go_goroutines on its /metrics), open files (its
// /proc fd table), connections to the Consul agent, and the Consul
// sessions it holds, plus cluster-wide totals.
func (s *soak) sample(ctx context.Context) {
	s.mu.Lock()
	s.series, s.totals = map[string]map[string]*Series{}, map[string]*Series{}
	for _, m := range soakMeasures {
		s.series[m.name] = map[string]*Series{}
	}
	s.mu.Unlock()
	client := NewClient(1)
	tick := time.NewTicker(soakSampleEvery)
	defer tick.Stop()
	for {
		now := time.Now()
		s.mu.Lock()
		type target struct {
			name, life string
			g          *gateway
		}
		var ts []target
		for _, name := range s.live {
			ts = append(ts, target{name, fmt.Sprintf("%s#%d", name, s.lives[name]), s.gws[name]})
		}
		s.mu.Unlock()
		sessions, _, serr := s.h.consul.Session().List(nil)
		leader := s.lock.current()
		for _, tg := range ts {
			pid := tg.g.proc.PID()
			p, err := SampleProc(pid)
			if err != nil {
				continue
			}
			fds, ferr := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
			_, text, merr := getBody(client, tg.g.adminURL()+"/metrics")
			conns, cerr := ConnectionsTo(pid, s.consulPort)
			vals := map[string]float64{"RSS (MiB)": float64(p.RSS) / (1 << 20)}
			if ferr == nil {
				vals["open files"] = float64(len(fds))
			}
			if merr == nil && strings.Contains(text, "go_goroutines ") {
				vals["goroutines"] = MetricSum(text, "go_goroutines", "")
			}
			// What of the RSS is live heap: a slope in RSS with none
			// here is the runtime keeping freed memory, not a leak.
			if merr == nil && strings.Contains(text, "go_memstats_heap_inuse_bytes ") {
				vals["Go heap in use (MiB)"] = MetricSum(text, "go_memstats_heap_inuse_bytes", "") / (1 << 20)
			}
			if cerr == nil {
				vals["Consul connections"] = float64(conns)
			}
			if serr == nil {
				check := "service:" + spec.ActivatorServiceName + "-" + tg.name
				n := 0
				for _, se := range sessions {
					if slices.ContainsFunc(se.ServiceChecks, func(c consul.ServiceCheck) bool { return c.ID == check }) {
						n++
					}
				}
				vals["Consul sessions"] = float64(n)
			}
			s.mu.Lock()
			for m, v := range vals {
				ser := s.series[m][tg.life]
				if ser == nil {
					ser = &Series{Name: tg.life}
					s.series[m][tg.life] = ser
				}
				ser.Add(now, v, tg.name == leader)
			}
			s.mu.Unlock()
		}
		if serr == nil {
			s.addTotal("Consul sessions (all)", now, float64(len(sessions)))
		}
		if svcs, err := s.h.consul.Agent().Services(); err == nil {
			s.addTotal("registrations on the node's agent", now, float64(len(svcs)))
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

func (s *soak) addTotal(name string, at time.Time, v float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	ser := s.totals[name]
	if ser == nil {
		ser = &Series{Name: name}
		s.totals[name] = ser
	}
	ser.Add(at, v, false)
}

func (s *soak) row(what, value, verdict string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rows = append(s.rows, []string{what, value, verdict})
}

// warmUp is how much of a series' start the fit leaves out: a fifth of
// its life, at most 5 minutes.
func warmUp(ser *Series) time.Duration {
	if len(ser.At) < 2 {
		return 0
	}
	return min(ser.At[len(ser.At)-1].Sub(ser.At[0])/5, 5*time.Minute)
}

// report counts the requests, classifies the failures, fits the series,
// draws the plot, and fails the test on what is not allowed.
func (s *soak) report() {
	t := s.t
	s.mu.Lock()
	faults := slices.Clone(s.faultLog)
	reqs := slices.Clone(s.requests)
	total := s.count[false] + s.count[true]
	s.mu.Unlock()

	s.row("run", fmt.Sprintf("%s of traffic and faults, %d services (%d waking), %.1f rps each while on, %d replicas", s.end.Sub(s.start).Round(time.Second), len(s.services), countWake(s.services), *soakRPS, soakReplicas), "")
	s.row("requests", fmt.Sprintf("%d (steady %d, waking services %d), %d failed", total, s.count[false], s.count[true], s.failed[false]+s.failed[true]), "")
	byCause := map[string]Result{}
	for _, r := range reqs {
		c := Classify(r, faults)
		byCause[c] = append(byCause[c], r.Outcome)
	}
	for _, c := range []string{CauseReplicaKill, CauseNomadRestart, CauseConsulRestart, CauseBadDeploy, CauseOther} {
		verdict := "met"
		if len(byCause[c]) > 0 && !Excused(c) {
			verdict = "MISSED"
			t.Errorf("soak: %d requests failed %s: %s", len(byCause[c]), c, byCause[c].Summary())
		}
		if Excused(c) {
			verdict = "excused"
		}
		s.row("failed "+c, fmt.Sprintf("%d: %s", len(byCause[c]), byCause[c].Summary()), verdict)
	}
	s.mu.Lock()
	slow := slices.Clone(s.slow)
	s.mu.Unlock()
	slowBy := map[string][]SoakRequest{}
	for _, r := range slow {
		c := Classify(r, faults)
		slowBy[c] = append(slowBy[c], r)
	}
	for _, c := range []string{CauseReplicaKill, CauseNomadRestart, CauseConsulRestart, CauseBadDeploy, CauseOther} {
		if len(slowBy[c]) == 0 {
			continue
		}
		var longest time.Duration
		for _, r := range slowBy[c] {
			longest = max(longest, r.End.Sub(r.Start))
		}
		s.row("successful but slower than "+soakSlow.String()+", "+c, fmt.Sprintf("%d (steady %d, waking %d), the longest %s", len(slowBy[c]), countSteady(slowBy[c]), len(slowBy[c])-countSteady(slowBy[c]), longest.Round(time.Millisecond)), "")
	}
	for _, r := range reqs {
		if c := Classify(r, faults); !Excused(c) {
			t.Logf("soak: failed request (%s): %s via %s at +%s for %s: %s", c, r.Service, r.Replica, r.Start.Sub(s.start).Round(time.Millisecond), r.End.Sub(r.Start).Round(time.Millisecond), r.Describe())
		}
	}
	kinds := map[string]int{}
	for _, f := range faults {
		kinds[f.Kind]++
	}
	s.row("faults", fmt.Sprintf("replica kills %d, Nomad client restarts %d, Consul agent restarts %d, bad deploys %d", kinds[CauseReplicaKill], kinds[CauseNomadRestart], kinds[CauseConsulRestart], kinds[CauseBadDeploy]), "")
	s.mu.Lock()
	s.rows = append(s.rows, []string{"deploys", fmt.Sprint(s.deploysOK), metOrMissed(s.deploysOK["good: FAILED"]+s.deploysOK["bad: PASSED"] == 0)},
		[]string{"traffic split changes", strconv.Itoa(s.splitsN), ""})
	bad := s.deploysOK["good: FAILED"] + s.deploysOK["bad: PASSED"]
	s.mu.Unlock()
	if bad > 0 {
		t.Errorf("soak: %d deploys did not end as they should", bad)
	}
	for _, lat := range []struct {
		wake bool
		name string
	}{{false, "steady"}, {true, "waking"}} {
		var all []float64
		for _, b := range s.lat[lat.wake].Buckets {
			all = append(all, b...)
		}
		p50, _ := Quantile(all, 0.5)
		p99, _ := Quantile(all, 0.99)
		mx, _ := Quantile(all, 1)
		s.row("latency of successful requests, "+lat.name+" services", fmt.Sprintf("p50 %s, p99 %s, max %s", secs(p50), secs(p99), secs(mx)), "")
	}

	// Slopes.
	var sampleRows []string
	for _, m := range soakMeasures {
		s.mu.Lock()
		lives := s.series[m.name]
		s.mu.Unlock()
		for _, life := range slices.Sorted(mapsKeys(lives)) {
			ser := lives[life]
			warm := warmUp(ser)
			f := ser.FitPerHour(warm)
			flat, why := f.Flat(m.floor)
			verdict := "flat"
			if !flat {
				verdict = "NOT FLAT"
				t.Errorf("soak: %s of %s is not flat: %+.3g per hour (%s)", m.name, life, f.Slope, why)
			}
			s.row(fmt.Sprintf("%s, %s: slope per hour", m.name, life),
				fmt.Sprintf("%+.3g ± %.2g (SE), mean %.4g%s, resid SD %.2g (lag-1 r %.2f), %d samples over %s after %s warm-up; %s", f.Slope, f.SE, f.Mean, stepNote(f), f.ResidSD, f.R1, f.N, (time.Duration(f.Span*float64(time.Hour))).Round(time.Second), warm.Round(time.Second), why), verdict)
			for i := range ser.At {
				sampleRows = append(sampleRows, fmt.Sprintf("%s,%s,%.1f,%g", m.name, life, ser.At[i].Sub(s.start).Seconds(), ser.V[i]))
			}
		}
	}
	s.mu.Lock()
	totals := s.totals
	s.mu.Unlock()
	for _, name := range slices.Sorted(mapsKeys(totals)) {
		ser := totals[name]
		f := ser.FitPerHour(warmUp(ser))
		_, why := f.Flat(1)
		s.row(name+": slope per hour (for information: agents restart)", fmt.Sprintf("%+.3g ± %.2g, mean %.4g; %s", f.Slope, f.SE, f.Mean, why), "")
		for i := range ser.At {
			sampleRows = append(sampleRows, fmt.Sprintf("%s,total,%.1f,%g", name, ser.At[i].Sub(s.start).Seconds(), ser.V[i]))
		}
	}
	if err := os.WriteFile(filepath.Join(s.out, "soak-samples.csv"), []byte("measure,life,seconds,value\n"+strings.Join(sampleRows, "\n")+"\n"), 0o644); err != nil {
		t.Errorf("soak: write the samples: %v", err)
	}
	s.plot(faults)
}

func countSteady(rs []SoakRequest) int {
	n := 0
	for _, r := range rs {
		if !r.Wake {
			n++
		}
	}
	return n
}

func countWake(svcs []soakService) int {
	n := 0
	for _, sv := range svcs {
		if sv.wake {
			n++
		}
	}
	return n
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// stepNote says how much more the replica had while it led, when the fit
// could tell.
func stepNote(f Fit) string {
	if !f.HasStep {
		return ""
	}
	return fmt.Sprintf(", %+.3g while leading", f.Step)
}

// plot draws RSS and goroutines per replica life and the p99 of each
// 10 s bucket, with the faults marked.
func (s *soak) plot(faults []Fault) {
	mins := func(at time.Time) float64 { return at.Sub(s.start).Minutes() }
	var panels []PlotPanel
	for _, m := range []struct{ name, title string }{{"RSS (MiB)", "serve RSS per replica life"}, {"goroutines", "serve goroutines per replica life"}} {
		pn := PlotPanel{Title: m.title, YLabel: m.name}
		s.mu.Lock()
		lives := s.series[m.name]
		s.mu.Unlock()
		for _, life := range slices.Sorted(mapsKeys(lives)) {
			ser := lives[life]
			ps := PlotSeries{Name: life}
			for i := range ser.At {
				ps.X = append(ps.X, mins(ser.At[i]))
				ps.Y = append(ps.Y, ser.V[i])
			}
			pn.Lines = append(pn.Lines, ps)
		}
		panels = append(panels, pn)
	}
	pn := PlotPanel{Title: "p99 latency of successful requests per 10 s", YLabel: "seconds"}
	for _, lat := range []struct {
		wake bool
		name string
	}{{false, "steady services"}, {true, "waking services"}} {
		ps := PlotSeries{Name: lat.name}
		l := s.lat[lat.wake]
		for i, b := range l.Buckets {
			if q, ok := Quantile(b, 0.99); ok {
				ps.X = append(ps.X, mins(l.Start.Add(time.Duration(i)*l.Width+l.Width/2)))
				ps.Y = append(ps.Y, q)
			}
		}
		pn.Lines = append(pn.Lines, ps)
	}
	panels = append(panels, pn)
	marks := map[string][]float64{}
	for _, f := range faults {
		if f.Kind == CauseBadDeploy {
			continue // one a minute: the deploys are not what the eye looks for
		}
		marks[f.Kind] = append(marks[f.Kind], mins(f.From))
	}
	path := filepath.Join(s.out, "soak.png")
	if err := WriteSoakPlot(path, panels, marks); err != nil {
		s.t.Errorf("soak: %v", err)
		return
	}
	s.t.Logf("soak: plot in %s", path)
}

// cleanUp deletes every service, checks that nothing of them is left,
// stops the replicas, and checks that nothing of them is left either.
func (s *soak) cleanUp() {
	t, h := s.t, s.h
	start := time.Now()
	del := h.deleteAll("soak-", 4, 0)
	q := func(p float64) time.Duration {
		if len(del.each) == 0 {
			return 0
		}
		return del.each[min(len(del.each)-1, int(p*float64(len(del.each))))].Round(time.Millisecond)
	}
	s.row("delete of every service, 4 at a time", fmt.Sprintf("%d deleted, %d failed, in %s; one delete: median %s, p90 %s, max %s", del.deleted, del.failed, time.Since(start).Round(time.Second), q(0.5), q(0.9), q(1)), metOrMissed(del.failed == 0))
	gone, left := pollUntil(3*time.Minute, func() string { return h.leftoversOf("soak-") })
	if left != "" {
		t.Errorf("soak: 3 min after the deletes, left in Nomad or Consul: %s", left)
		s.row("after the deletes: nothing left in Nomad or Consul", "left 3 min after the deletes: "+left, "MISSED")
	} else {
		s.row("after the deletes: nothing left in Nomad or Consul", fmt.Sprintf("nothing left %s after the last delete", gone.Round(time.Millisecond)), "met")
	}
	s.mu.Lock()
	live := slices.Clone(s.live)
	s.mu.Unlock()
	for _, name := range live {
		s.gws[name].stop(t)
	}
	gone, left = pollUntil(time.Minute, s.replicaLeftovers)
	if left != "" {
		t.Errorf("soak: a minute after the replicas stopped, left in Consul: %s", left)
	}
	s.row("after stopping the replicas: nothing of them left in Consul", cmpOr(left, fmt.Sprintf("nothing left %s after they stopped", gone.Round(time.Millisecond))), metOrMissed(left == ""))
	if jobs, _, err := h.nomad.Jobs().List(nil); err == nil {
		s.row("Nomad jobs at the end", strconv.Itoa(len(jobs)), metOrMissed(len(jobs) == 0))
		if len(jobs) > 0 {
			t.Errorf("soak: %d Nomad jobs left (%s ...)", len(jobs), jobs[0].ID)
		}
	}
}

// pollUntil calls what every second until it says nothing ("") or timeout
// passes, and returns how long it took and its last word.
func pollUntil(timeout time.Duration, what func() string) (time.Duration, string) {
	start := time.Now()
	for {
		left := what()
		if left == "" || time.Since(start) > timeout {
			return time.Since(start), left
		}
		time.Sleep(time.Second)
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// replicaLeftovers says what Consul still holds of the replicas: services
// of ours on the node's agent, sessions, the lock's holder.
func (s *soak) replicaLeftovers() string {
	var left []string
	if svcs, err := s.h.consul.Agent().Services(); err != nil {
		left = append(left, err.Error())
	} else {
		for id, sv := range svcs {
			if strings.HasPrefix(sv.Service, spec.ReservedPrefix) || sv.Meta[consulroute.MetaReplica] != "" {
				left = append(left, "service "+id)
			}
		}
	}
	if ss, _, err := s.h.consul.Session().List(nil); err != nil {
		left = append(left, err.Error())
	} else {
		for _, se := range ss {
			left = append(left, "session "+se.Name)
		}
	}
	if p, _, err := s.h.consul.KV().Get(consulroute.AutoscalerLockKey, nil); err == nil && p != nil && p.Session != "" {
		left = append(left, "the autoscaler's lock held by "+string(p.Value))
	}
	slices.Sort(left)
	return strings.Join(left, "; ")
}

// writeTable prints the table and writes it next to the plot.
func (s *soak) writeTable() {
	s.mu.Lock()
	defer s.mu.Unlock()
	host, _ := os.Hostname()
	var b strings.Builder
	fmt.Fprintf(&b, "\ne2e scenario 32, the soak: %s on %s (%s, Nomad %s, Consul %s), %d CPUs\n\n", s.end.Sub(s.start).Round(time.Second), host, s.start.UTC().Format(time.RFC3339), s.h.s.Plan.NomadBin, s.h.s.Plan.ConsulBin, runtime.NumCPU())
	b.WriteString(FormatMarkdownTable([]string{"measure", "value", ""}, s.rows))
	for _, n := range s.notes {
		b.WriteString("\nnote: " + n + "\n")
	}
	for _, p := range s.procs {
		if err := os.WriteFile(filepath.Join(s.out, "serve-"+strings.ReplaceAll(p.life, "#", "-")+".log"), []byte(p.proc.Output()), 0o644); err != nil {
			s.t.Errorf("soak: write the log of %s: %v", p.life, err)
		}
	}
	fmt.Fprintf(&b, "\nplot: %s\nsamples: %s\nthe replicas' logs: %s\n", filepath.Join(s.out, "soak.png"), filepath.Join(s.out, "soak-samples.csv"), filepath.Join(s.out, "serve-*.log"))
	fmt.Fprint(os.Stdout, b.String())
	if err := os.WriteFile(filepath.Join(s.out, "soak-table.md"), []byte(b.String()), 0o644); err != nil {
		s.t.Errorf("soak: write the table: %v", err)
	}
}
