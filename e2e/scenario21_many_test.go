package e2e

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomadapi "github.com/hashicorp/nomad/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

var (
	manyRevisions    = flag.Int("revisions", 0, "scenario 21: deploy this many services at zero and measure serve, Consul and Nomad (make e2e-scale passes 1000); 0 skips it")
	manyReplicas     = flag.Int("replicas", 3, "scenario 21: serve replicas")
	manyDeleters     = flag.Int("deleters", 8, "scenario 21: deletes run at once")
	manyDeleteWithin = flag.Duration("delete-within", 0, "scenario 21: start no delete after this long (0: delete all)")
	manyFinishBy     = flag.String("finish-by", "", "scenario 21: an RFC 3339 time by which the run must end: deploying stops -reserve before it, deleting 4 min before it (with -deploy-within and -delete-within, the earlier bound counts)")
	manyReserve      = flag.Duration("reserve", 25*time.Minute, "scenario 21: with -finish-by, the time kept for what follows the deploy")
	manyWithin       = flag.Duration("deploy-within", 0, "scenario 21: stop deploying after the batch that ends past this long, and measure at the size reached (0: deploy all)")
)

// Scenario 21: serve replicas over many revisions, all at zero (issues 14
// and 45's scale run). The replicas run from the start, as in a cluster
// that fills up. It measures, and prints as one table at the end (also when
// a step fails: the figures so far):
//   - deploy throughput, batch by batch (the last batch into a full cluster
//     against the first into an empty one);
//   - per replica at idle: RSS, CPU, connections to Consul and to Nomad
//     (flat: as many at n revisions as at none);
//   - the Consul and Nomad agents' RSS and CPU (dev agents: one process
//     each is agent and server);
//   - the routing table's rebuild time and the autoscaler's tick time
//     (their histograms on /metrics);
//   - `list` and `status`;
//   - a route change and the wake of a random revision; a burst of
//     concurrent wakes on different revisions;
//   - kill -9 of the leader: the next leader, and a new replica's start
//     over n revisions;
//   - `delete` of every service, then nothing of them left in Nomad or
//     Consul.
//
// The budgets of issue 45 are checked and failed as errors, after the
// figures are in.
func TestE2E21ManyRevisions(t *testing.T) {
	n := *manyRevisions
	if n <= 0 {
		t.Skip("e2e 21: SKIPPED: pass -revisions N (make e2e-scale runs 1000)")
	}
	h := newHarness(t, "21 many revisions")
	consulPort := portOf(t, "http://"+strings.TrimPrefix(h.s.ConsulAddr, "http://"))
	nomadPort := portOf(t, h.s.NomadAddr)
	fig := &figures{n: n}
	defer fig.print(t)

	prefix := "e2e-many"
	var services []Service
	for i := range n {
		s := testService(fmt.Sprintf("%s-s%05d", prefix, i))
		s.Scaling.Initial = 0
		services = append(services, s)
	}
	if h.s.Agents == nil {
		// Running agents outlive the suite; the suite's own go with it.
		h.t.Cleanup(func() { h.deleteAll(prefix+"-", 8, 0) })
	}

	// The replicas, before any revision: the first leads.
	lock := h.watchLock(t)
	var leader string
	replicas := max(*manyReplicas, 1)
	gs := map[string]*gateway{}
	var names []string
	conns := watchConns(t, consulPort, nomadPort)
	defer func() {
		fig.add("most connections per replica to Consul/Nomad, by phase (sampled every second)", conns.report(), "", "")
	}()
	for i := range replicas {
		name := fmt.Sprintf("e2e-21%c", 'a'+i)
		names = append(names, name)
		if i == 0 {
			gs[name] = h.startServe(name, "", "")
		} else {
			gs[name] = h.startManyReplica(t, name)
		}
		conns.add(name, gs[name].proc.PID())
	}
	emptyConns := map[string][2]int{}
	for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		for _, name := range names {
			c := emptyConns[name]
			c[0] = max(c[0], connectionsTo(t, gs[name].proc.PID(), consulPort))
			c[1] = max(c[1], connectionsTo(t, gs[name].proc.PID(), nomadPort))
			emptyConns[name] = c
		}
	}

	conns.phase("deploy")
	// Deploy in batches of a tenth (at most 1,000), each one `deploy
	// -detach` of files of 200 services (a file is bounded at 256 KiB).
	batch := max(1, min(1000, n/10))
	rebuild0 := h.scrapeAll(t, gs, names, rebuildMetric)
	var deployTotal time.Duration
	var lastRebuild map[string]Histogram
	deployStart := time.Now()
	var finishBy time.Time
	if *manyFinishBy != "" {
		var err error
		if finishBy, err = time.Parse(time.RFC3339, *manyFinishBy); err != nil {
			t.Fatalf("-finish-by %q: %v", *manyFinishBy, err)
		}
		t.Logf("finish by %s: deploying until %s", finishBy, finishBy.Add(-*manyReserve))
	}
	for from := 0; from < n; from += batch {
		if (*manyWithin > 0 && time.Since(deployStart) > *manyWithin) || (!finishBy.IsZero() && time.Until(finishBy) < *manyReserve) {
			t.Logf("deploy: stopped at %d of %d revisions after %s (-deploy-within %s, -finish-by %q)", from, n, time.Since(deployStart).Round(time.Second), *manyWithin, *manyFinishBy)
			fig.add("DEPLOY CUT SHORT (-deploy-within or -finish-by)", fmt.Sprintf("%d of %d revisions deployed in %s; every figure below is at %d", from, n, time.Since(deployStart).Round(time.Second), from), "all deployed", "MISSED")
			n, services = from, services[:from]
			fig.n = n
			break
		}
		to := min(from+batch, n)
		lastRebuild = h.scrapeAll(t, gs, names, rebuildMetric)
		args := []string{"deploy", "-sidecar-command", h.bin, "-detach"}
		const perFile = 200
		for i := from; i < to; i += perFile {
			args = append(args, h.writeServices(fmt.Sprintf("many-%05d.hcl", i), services[i:min(i+perFile, to)]...))
		}
		cpu0 := h.cpuNow(gs, names)
		start := time.Now()
		if _, errOut, code := h.cliWithin(40*time.Minute, 4, args...); code != 0 {
			t.Fatalf("deploy of services %d to %d: exit %d\n%s", from, to-1, code, tailLines(errOut, 20))
		}
		took := time.Since(start)
		cpu := h.cpuNow(gs, names).since(cpu0, took)
		deployTotal += took
		rate := float64(to-from) / took.Seconds()
		t.Logf("deploy: services %d-%d into %d: %s, %.1f/s; CPU %s", from, to-1, from, took.Round(time.Millisecond), rate, cpu)
		fig.add(fmt.Sprintf("deploy -detach of %d into a cluster of %d", to-from, from), fmt.Sprintf("%.1f services/s; CPU, %% of a core: %s", rate, cpu), "", "")
		if from == 0 {
			fig.firstRate = rate
		}
		fig.lastRate = rate
	}
	h.timing(fmt.Sprintf("deploy -detach of %d services at zero", n), deployTotal)
	fig.add(fmt.Sprintf("deploy -detach of all %d", n), fmt.Sprintf("%s, %.1f services/s", deployTotal.Round(time.Second), float64(n)/deployTotal.Seconds()), "", "")
	if n >= 2*batch {
		ratio := fig.lastRate / fig.firstRate
		fig.add(fmt.Sprintf("last %d (into %d) against first %d (into none)", batch, n-batch, batch),
			fmt.Sprintf("%.1f/s against %.1f/s: x%.2f", fig.lastRate, fig.firstRate, ratio), "as fast (x0.8 or better)", metOrMissed(ratio >= 0.8))
	}

	// Every replica routes every revision and holds a stand-in for each.
	settle := time.Now()
	for _, name := range names {
		h.waitKnowsAll(t, gs[name], name, n, 10*time.Minute)
	}
	eventually(t, 10*time.Minute, fmt.Sprintf("%d stand-ins of each replica", n), func() (bool, string) {
		byReplica, err := h.standInsByReplica()
		if err != nil {
			return false, err.Error()
		}
		for _, name := range names {
			if byReplica[name] < n {
				return false, fmt.Sprintf("%v", byReplica)
			}
		}
		return true, ""
	})
	fig.add("last deploy -> every replica routes every revision and has its stand-ins", time.Since(settle).Round(time.Millisecond).String(), "", "")
	rebuildEnd := h.scrapeAll(t, gs, names, rebuildMetric)
	for _, name := range names {
		all, last := rebuildEnd[name].Since(rebuild0[name]), rebuildEnd[name].Since(lastRebuild[name])
		fig.add("routing table rebuild, "+name+", over the last batch (at "+strconv.Itoa(n-batch)+" to "+strconv.Itoa(n)+")",
			fmt.Sprintf("%d rebuilds, mean %s, p99 <= %s", int(last.Count), secs(last.Mean()), secs(last.Quantile(0.99))), "", "")
		fig.add("routing table rebuilds, "+name+", whole deploy", fmt.Sprintf("%d, %s of CPU in all", int(all.Count), secs(all.Sum)), "", "")
	}

	conns.phase("idle")
	// Idle: let start-up work settle, then sample for 30 s.
	time.Sleep(10 * time.Second)
	leader = lock.current()
	tick0 := h.scrapeAll(t, gs, []string{leader}, tickMetric)
	type sample struct {
		p0                             ProcSample
		consulMin, consulMax, nomadMax int
	}
	samples := map[string]*sample{}
	for _, name := range names {
		p0, err := SampleProc(gs[name].proc.PID())
		if err != nil {
			t.Fatalf("sample serve %s: %v", name, err)
		}
		samples[name] = &sample{p0: p0, consulMin: math.MaxInt}
	}
	var consul0, nomad0 ProcSample
	if h.s.Agents != nil {
		consul0, _ = SampleProc(h.s.Agents.Consul.Pid())
		nomad0, _ = SampleProc(h.s.Agents.Nomad.Pid())
	}
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		for _, name := range names {
			s, pid := samples[name], gs[name].proc.PID()
			c := connectionsTo(t, pid, consulPort)
			s.consulMin, s.consulMax = min(s.consulMin, c), max(s.consulMax, c)
			s.nomadMax = max(s.nomadMax, connectionsTo(t, pid, nomadPort))
		}
	}
	for _, name := range names {
		s := samples[name]
		p1, err := SampleProc(gs[name].proc.PID())
		if err != nil {
			t.Fatalf("sample serve %s: %v", name, err)
		}
		role := "follower"
		if name == leader {
			role = "leader"
		}
		fig.add("serve "+name+" ("+role+") RSS at idle", fmt.Sprintf("%d MiB", p1.RSS>>20), "<= 250 MiB", metOrMissed(p1.RSS <= 250<<20))
		cpu := CPUShare(s.p0, p1) * 100
		fig.add("serve "+name+" CPU at idle, 30 s", fmt.Sprintf("%.2f %% of a core", cpu), "<= 5 %", metOrMissed(cpu <= 5))
		e := emptyConns[name]
		flat := s.consulMax <= 10 && s.consulMax <= e[0]+2
		fig.add("serve "+name+" connections to Consul", fmt.Sprintf("%d-%d at idle (at no revision: %d)", s.consulMin, s.consulMax, e[0]),
			"flat, <= 10", metOrMissed(flat))
		fig.add("serve "+name+" connections to Nomad", fmt.Sprintf("at most %d at idle (at no revision: %d)", s.nomadMax, e[1]), "", "")
	}
	if h.s.Agents != nil {
		if c1, err := SampleProc(h.s.Agents.Consul.Pid()); err == nil {
			fig.add("Consul dev agent (agent and server in one) at idle", fmt.Sprintf("RSS %d MiB, CPU %.2f %% of a core", c1.RSS>>20, CPUShare(consul0, c1)*100), "", "")
		}
		if n1, err := SampleProc(h.s.Agents.Nomad.Pid()); err == nil {
			fig.add("Nomad dev agent (server and client in one) at idle", fmt.Sprintf("RSS %d MiB, CPU %.2f %% of a core", n1.RSS>>20, CPUShare(nomad0, n1)*100), "", "")
		}
	}
	tick := h.scrapeAll(t, gs, []string{leader}, tickMetric)[leader].Since(tick0[leader])
	fig.add("autoscaler tick on the leader, 30 s at idle", fmt.Sprintf("%d ticks, mean %s, p99 <= %s", int(tick.Count), secs(tick.Mean()), secs(tick.Quantile(0.99))), "", "")
	for _, name := range names {
		if out := gs[name].proc.Output(); strings.Contains(out, "429") || strings.Contains(out, "too many concurrent connections") {
			t.Errorf("Consul refused serve %s (429):\n%s", name, tailLines(out, 20))
		}
	}

	// kill -9 of the leader: another replica leads; a new replica starts
	// over n revisions.
	leader = lock.current()
	// At idle, before the wakes: a machine loaded by a burst of wakes
	// fails the followers' own checks (1 s timeout), which ends their
	// sessions too (30 s at 300 revisions).
	killed := time.Now()
	if err := syscall.Kill(gs[leader].proc.PID(), syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 the leader %s: %v", leader, err)
	}
	next, led := lock.waitOther(t, leader, time.Minute)
	failover := led.Sub(killed)
	fig.add("kill -9 of the leader -> "+next+" leads", failover.Round(time.Millisecond).String(), "< 5 s", metOrMissed(failover < 5*time.Second))
	conns.drop(leader)
	delete(gs, leader)
	names = slices.DeleteFunc(names, func(s string) bool { return s == leader })
	start := time.Now()
	fresh := fmt.Sprintf("e2e-21%c", 'a'+replicas)
	conns.phase("failover and a new replica")
	gs[fresh] = h.startManyReplica(t, fresh)
	conns.add(fresh, gs[fresh].proc.PID())
	up := time.Since(start)
	h.waitKnowsAll(t, gs[fresh], fresh, n, 10*time.Minute)
	fig.add("a new replica's start over "+strconv.Itoa(n)+" revisions: healthy, then routes all", fmt.Sprintf("%s, %s", up.Round(time.Millisecond), time.Since(start).Round(time.Millisecond)), "", "")
	names = append(names, fresh)
	if p, err := SampleProc(gs[fresh].proc.PID()); err == nil {
		fig.add("serve "+fresh+" (new) RSS after its start", fmt.Sprintf("%d MiB", p.RSS>>20), "<= 250 MiB", metOrMissed(p.RSS <= 250<<20))
	}

	conns.phase("list, status, wakes")
	// list and status.
	start = time.Now()
	if _, errOut, code := h.cliWithin(5*time.Minute, 3, "list"); code != 0 {
		t.Errorf("list: exit %d\n%s", code, errOut)
	}
	took := time.Since(start)
	fig.add(fmt.Sprintf("list (%d services)", n), took.Round(time.Millisecond).String(), "", "")
	pick := services[rand.IntN(n)].Name
	start = time.Now()
	if _, errOut, code := h.cliWithin(time.Minute, 0, "status", pick); code != 0 {
		t.Errorf("status %s: exit %d\n%s", pick, code, errOut)
	}
	took = time.Since(start)
	fig.add("status of one service", took.Round(time.Millisecond).String(), "< 1 s", metOrMissed(took < time.Second))

	// A random revision: its route changes (a tag), which reaches the
	// gateways, and the first request through the tag wakes it.
	rev := revision(pick, 1)
	rebuild1 := h.scrapeAll(t, gs, names, rebuildMetric)
	h.mustCLI("traffic", pick, "-to", "latest=100", "-tag", rev+"=pick")
	routed := time.Now()
	g := gs[names[len(names)-1]]
	client := NewClient(2)
	var o Outcome
	eventually(t, 30*time.Second, "the tag route of "+pick+" reaches the gateway and wakes "+rev, func() (bool, string) {
		req := g.request(pick, "pick", "/", client)
		req.Timeout = 30 * time.Second
		o = req.Do(context.Background())
		return o.Status != http.StatusNotFound, o.Describe()
	})
	fig.add("route change (traffic -tag) -> a follower routes it", o.Start.Sub(routed).Round(time.Millisecond).String(), "", "")
	if !o.OK() {
		t.Errorf("the first request through the new tag: %s", o.Describe())
	} else {
		fb := o.FirstByte.Sub(o.Start)
		h.timing("cold start of a random revision among the idle ones: first byte", fb)
		fig.add("wake of a random revision among "+strconv.Itoa(n)+": first byte", fb.Round(time.Millisecond).String(), "<= 1 s", metOrMissed(fb <= time.Second))
	}
	for _, name := range names {
		d := h.scrapeAll(t, gs, []string{name}, rebuildMetric)[name].Since(rebuild1[name])
		fig.add("routing table rebuild, "+name+", at "+strconv.Itoa(n)+" (route change and wake)",
			fmt.Sprintf("%d rebuilds, mean %s, p99 <= %s", int(d.Count), secs(d.Mean()), secs(d.Quantile(0.99))), "", "")
	}

	conns.phase("burst")
	// A burst of wakes, each on its own revision, spread over the
	// replicas.
	burst := min(100, n-1)
	var picks []string
	for _, i := range rand.Perm(n) {
		if services[i].Name != pick && len(picks) < burst {
			picks = append(picks, services[i].Name)
		}
	}
	outs := make([]Outcome, len(picks))
	var wg sync.WaitGroup
	for i, svc := range picks {
		wg.Go(func() {
			req := gs[names[i%len(names)]].request(svc, "", "/", NewClient(1))
			// One 2-core node starts 100 instances (6 processes each
			// with raw_exec: two tasks, their executors and log
			// monitors) in minutes, not seconds.
			req.Timeout = 5 * time.Minute
			outs[i] = req.Do(context.Background())
		})
	}
	wg.Wait()
	var fbs []time.Duration
	for i, o := range outs {
		if !o.OK() {
			t.Errorf("burst: the wake of %s: %s", picks[i], o.Describe())
			continue
		}
		fbs = append(fbs, o.FirstByte.Sub(o.Start))
	}
	slices.Sort(fbs)
	if len(fbs) > 0 {
		q := func(p float64) time.Duration {
			return fbs[min(len(fbs)-1, int(p*float64(len(fbs))))].Round(time.Millisecond)
		}
		fig.add(fmt.Sprintf("burst of %d wakes on %d revisions at once: first byte", burst, burst),
			fmt.Sprintf("%d/%d answered; median %s, p90 %s, max %s", len(fbs), burst, q(0.5), q(0.9), fbs[len(fbs)-1].Round(time.Millisecond)), "", "")
	}

	// The burst's instances back at zero first: on one host every
	// process reaches Consul from 127.0.0.1, and Nomad holds a connection
	// or more per instance, so the deletes beside them met Consul's limit
	// per client address (429) at 300 revisions.
	// Bounded, and not fatal: the deletes stop what is left.
	stopWait := time.Now()
	for live := -1; live != 0 && time.Since(stopWait) < 5*time.Minute; time.Sleep(2 * time.Second) {
		allocs, _, err := h.nomad.Allocations().List(&nomadapi.QueryOptions{Prefix: ""})
		if err != nil {
			t.Logf("list allocations: %v", err)
			continue
		}
		live = 0
		for _, a := range allocs {
			if strings.HasPrefix(a.JobID, prefix+"-") && (a.ClientStatus == nomadapi.AllocClientStatusRunning || a.ClientStatus == nomadapi.AllocClientStatusPending) {
				live++
			}
		}
		t.Logf("after the burst: %d allocations running or pending", live)
	}
	fig.add("after the burst: its instances back at zero", time.Since(stopWait).Round(time.Second).String(), "", "")

	// delete of every service, -deleters at a time, then nothing left.
	conns.phase("delete")
	start = time.Now()
	deleteWithin := *manyDeleteWithin
	if !finishBy.IsZero() {
		left := max(time.Until(finishBy)-4*time.Minute, time.Minute)
		if deleteWithin == 0 || left < deleteWithin {
			deleteWithin = left
		}
	}
	del := h.deleteAll(prefix+"-", *manyDeleters, deleteWithin)
	took = time.Since(start)
	q := func(p float64) time.Duration {
		if len(del.each) == 0 {
			return 0
		}
		return del.each[min(len(del.each)-1, int(p*float64(len(del.each))))].Round(time.Millisecond)
	}
	fig.add(fmt.Sprintf("delete, %d at a time", *manyDeleters), fmt.Sprintf("%d deleted in %s (%.1f/s), %d failed, %d not started; one delete: median %s, p90 %s, max %s",
		del.deleted, took.Round(time.Second), float64(del.deleted)/took.Seconds(), del.failed, del.left, q(0.5), q(0.9), q(1)), "", "")
	if del.left > 0 {
		fig.add("DELETE CUT SHORT (-delete-within or -finish-by)", fmt.Sprintf("%d services not deleted; nothing-left not checked", del.left), "nothing left", "MISSED")
	} else {
		if del.failed > 0 {
			h.deleteAll(prefix+"-", 1, 0)
		}
		var left string
		gone := eventually(t, 3*time.Minute, "nothing of "+prefix+" left in Nomad or Consul", func() (bool, string) {
			left = h.leftoversOf(prefix + "-")
			return left == "", left
		})
		fig.add("after the deletes: nothing left in Nomad or Consul", "nothing left "+gone.Round(time.Millisecond).String()+" after the last delete returned", "nothing left", metOrMissed(left == ""))
	}
	fmt.Fprintf(os.Stdout, "e2e scenario 21: %d revisions, %d replicas: deploy %.1f/s (first batch %.1f/s, last %.1f/s); wake %s; failover %s\n",
		n, replicas, float64(n)/deployTotal.Seconds(), fig.firstRate, fig.lastRate, o.FirstByte.Sub(o.Start).Round(time.Millisecond), failover.Round(time.Millisecond))
	for _, f := range fig.rows {
		if f.met == "MISSED" {
			t.Errorf("budget missed: %s: %s (budget %s)", f.what, f.value, f.budget)
		}
	}
}

const (
	rebuildMetric = "nomad_serverless_gateway_routing_table_rebuild_seconds"
	tickMetric    = "nomad_serverless_autoscaler_tick_seconds"
)

// figures are scenario 21's measures, printed as one table.
type figures struct {
	n                   int
	mu                  sync.Mutex
	rows                []figure
	firstRate, lastRate float64
}

type figure struct{ what, value, budget, met string }

func (f *figures) add(what, value, budget, met string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rows = append(f.rows, figure{what, value, budget, met})
}

func (f *figures) print(t *testing.T) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "\ne2e scenario 21 figures, %d revisions:\n\n| measure | value | budget | |\n|---|---|---|---|\n", f.n)
	for _, r := range f.rows {
		fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", r.what, r.value, r.budget, r.met)
	}
	fmt.Fprint(os.Stdout, b.String())
	t.Log(b.String())
}

func metOrMissed(ok bool) string {
	if ok {
		return "met"
	}
	return "MISSED"
}

func secs(s float64) string {
	if math.IsInf(s, 1) {
		return "+Inf"
	}
	return FormatDuration(time.Duration(s * float64(time.Second)))
}

func portOf(t *testing.T, addr string) int {
	t.Helper()
	u, err := url.Parse(addr)
	if err != nil {
		t.Fatalf("parse %q: %v", addr, err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		t.Fatalf("the port of %q: %v", addr, err)
	}
	return p
}

func connectionsTo(t *testing.T, pid, port int) int {
	t.Helper()
	c, err := ConnectionsTo(pid, port)
	if err != nil {
		t.Fatalf("connections of %d to port %d: %v", pid, port, err)
	}
	return c
}

// startManyReplica runs a `serve` replica that does not lead (another holds the
// lock): it waits until its admin /healthz answers and Consul lists it
// passing.
func (h *harness) startManyReplica(t *testing.T, replica string) *gateway {
	t.Helper()
	listen := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))
	admin := "127.0.0.1:" + strconv.Itoa(testbin.FreePort(t))
	p := testbin.Start(t, h.bin, []string{"serve", "-listen", listen, "-admin-listen", admin, "-domain", "localhost", "-replica", replica}, h.env)
	g := &gateway{proc: p, listen: listen, admin: admin}
	_, port, _ := strings.Cut(listen, ":")
	eventually(t, 5*time.Minute, "serve "+replica+" is up and registered", func() (bool, string) {
		select {
		case <-g.proc.Done():
			t.Fatalf("serve %s exited:\n%s", replica, g.proc.Output())
		default:
		}
		status, _, err := getBody(NewClient(1), g.adminURL()+"/healthz")
		if err != nil || status != http.StatusOK {
			return false, fmt.Sprintf("healthz %d %v", status, err)
		}
		entries, _, err := h.consul.Health().Service(spec.ActivatorServiceName, "", true, nil)
		if err != nil {
			return false, err.Error()
		}
		for _, e := range entries {
			if e.Service.Meta[consulroute.MetaReplica] == replica && strconv.Itoa(e.Service.Port) == port {
				return true, ""
			}
		}
		return false, "not passing in Consul yet"
	})
	return g
}

// connWatch samples, every second, each replica's connections to Consul
// and to Nomad, and keeps the most seen in each phase of the run.
type connWatch struct {
	mu     sync.Mutex
	pids   map[string]int
	cur    string
	phases []string
	most   map[string]map[string][2]int // phase -> replica -> {Consul, Nomad}
}

func watchConns(t *testing.T, consulPort, nomadPort int) *connWatch {
	w := &connWatch{pids: map[string]int{}, most: map[string]map[string][2]int{}}
	w.phase("start")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(time.Second)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			w.mu.Lock()
			pids, phase := maps.Clone(w.pids), w.cur
			w.mu.Unlock()
			for name, pid := range pids {
				c, err1 := ConnectionsTo(pid, consulPort)
				nc, err2 := ConnectionsTo(pid, nomadPort)
				if err1 != nil || err2 != nil {
					continue // gone (killed): its last samples stay
				}
				w.mu.Lock()
				m := w.most[phase][name]
				w.most[phase][name] = [2]int{max(m[0], c), max(m[1], nc)}
				w.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	return w
}

func (w *connWatch) add(name string, pid int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.pids[name] = pid
}

func (w *connWatch) drop(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.pids, name)
}

func (w *connWatch) phase(name string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur = name
	if w.most[name] == nil {
		w.most[name] = map[string][2]int{}
		w.phases = append(w.phases, name)
	}
}

// report says, phase by phase, the most connections each replica held.
func (w *connWatch) report() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var parts []string
	for _, p := range w.phases {
		var rs []string
		for _, name := range slices.Sorted(maps.Keys(w.most[p])) {
			m := w.most[p][name]
			rs = append(rs, fmt.Sprintf("%s %d/%d", name, m[0], m[1]))
		}
		parts = append(parts, p+": "+strings.Join(rs, ", "))
	}
	return strings.Join(parts, "; ")
}

// current is the replica that holds the lock now ("" when none).
func (w *lockWatch) current() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.holder
}

// waitOther waits until a replica other than old holds the lock and
// returns it, with when Consul said so.
func (w *lockWatch) waitOther(t *testing.T, old string, timeout time.Duration) (string, time.Time) {
	t.Helper()
	deadline := time.After(timeout)
	for {
		w.mu.Lock()
		holder, since, changed := w.holder, w.since, w.changed
		w.mu.Unlock()
		if holder != "" && holder != old {
			return holder, since
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("no replica other than %s holds the autoscaler's lock after %s (holder %q)", old, timeout, holder)
		}
	}
}

// waitKnowsAll waits until a replica's gateway routes n revisions.
func (h *harness) waitKnowsAll(t *testing.T, g *gateway, name string, n int, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, fmt.Sprintf("serve %s routes all %d revisions", name, n), func() (bool, string) {
		v := g.gatewayView(t)
		return len(v) >= n, fmt.Sprintf("%d known", len(v))
	})
}

// standInsByReplica counts the stand-ins in the catalog, by the replica
// that registered them: every stand-in node's services (16 nodes per
// replica, one query each).
func (h *harness) standInsByReplica() (map[string]int, error) {
	q := &consul.QueryOptions{NodeMeta: map[string]string{consulroute.NodeMetaStandIns: "true"}}
	nodes, _, err := h.consul.Catalog().Nodes(q)
	if err != nil {
		return nil, fmt.Errorf("list the stand-in nodes: %w", err)
	}
	out := map[string]int{}
	for _, n := range nodes {
		list, _, err := h.consul.Catalog().NodeServiceList(n.Node, nil)
		if err != nil {
			return nil, fmt.Errorf("list the stand-ins on node %s: %w", n.Node, err)
		}
		if list == nil {
			continue
		}
		for _, s := range list.Services {
			if slices.Contains(s.Tags, spec.TagActivator) {
				out[s.Meta[consulroute.MetaReplica]]++
			}
		}
	}
	return out, nil
}

// scrapeAll reads one histogram from each named replica's /metrics.
func (h *harness) scrapeAll(t *testing.T, gs map[string]*gateway, names []string, metric string) map[string]Histogram {
	t.Helper()
	out := map[string]Histogram{}
	client := NewClient(1)
	for _, name := range names {
		// Whole: at thousands of revisions a scrape is megabytes
		// (getBody stops at 1 MiB).
		resp, err := client.Get(gs[name].adminURL() + "/metrics")
		if err != nil {
			t.Fatalf("scrape serve %s: %v", name, err)
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		status, body := resp.StatusCode, string(b)
		if err != nil || status != http.StatusOK {
			t.Fatalf("scrape serve %s: status %d, %v", name, status, err)
		}
		hist, err := ParseHistogram(body, metric)
		if err != nil {
			t.Fatalf("serve %s: %v", name, err)
		}
		out[name] = hist
	}
	return out
}

// leftoversOf says what Nomad and Consul still hold of the services named
// with prefix: revision jobs, catalog services (instances and stand-ins),
// config entries and KV records; "" when nothing.
func (h *harness) leftoversOf(prefix string) string {
	var left []string
	if jobs, _, err := h.nomad.Jobs().PrefixList(prefix); err != nil {
		left = append(left, "list Nomad jobs: "+err.Error())
	} else if len(jobs) > 0 {
		left = append(left, fmt.Sprintf("%d Nomad jobs (%s ...)", len(jobs), jobs[0].ID))
	}
	if svcs, _, err := h.consul.Catalog().Services(nil); err != nil {
		left = append(left, "list Consul services: "+err.Error())
	} else {
		c, first := 0, ""
		for name := range svcs {
			if strings.HasPrefix(name, prefix) {
				c, first = c+1, name
			}
		}
		if c > 0 {
			left = append(left, fmt.Sprintf("%d Consul services (%s ...)", c, first))
		}
	}
	if local, err := h.consul.Agent().Services(); err != nil {
		left = append(left, "list the local agent's services: "+err.Error())
	} else {
		c := 0
		for _, s := range local {
			if strings.HasPrefix(s.Service, prefix) {
				c++
			}
		}
		if c > 0 {
			left = append(left, fmt.Sprintf("%d registrations on the local agent", c))
		}
	}
	for _, kind := range []string{consul.ServiceDefaults, consul.ServiceResolver, consul.ServiceSplitter, consul.ServiceRouter} {
		entries, _, err := h.consul.ConfigEntries().List(kind, nil)
		if err != nil {
			left = append(left, "list "+kind+": "+err.Error())
			continue
		}
		c := 0
		for _, e := range entries {
			if strings.HasPrefix(e.GetName(), prefix) {
				c++
			}
		}
		if c > 0 {
			left = append(left, fmt.Sprintf("%d %s entries", c, kind))
		}
	}
	if keys, _, err := h.consul.KV().Keys(consulroute.KVPrefix, "", nil); err != nil {
		left = append(left, "list KV records: "+err.Error())
	} else {
		c := 0
		for _, k := range keys {
			if strings.Contains(k, "/"+prefix) {
				c++
			}
		}
		if c > 0 {
			left = append(left, fmt.Sprintf("%d KV records", c))
		}
	}
	return strings.Join(left, "; ")
}

// deleteResult is what a deleteAll did.
type deleteResult struct {
	deleted, failed, left int
	// each is every delete's own time, sorted.
	each []time.Duration
}

// deleteAll deletes, with the CLI (route, then jobs) as a user would,
// workers at a time, every service that has a revision job starting with
// prefix, starting no delete after within (0: no bound); only failures are
// logged.
func (h *harness) deleteAll(prefix string, workers int, within time.Duration) deleteResult {
	jobs, _, err := h.nomad.Jobs().PrefixList(prefix)
	if err != nil {
		h.t.Logf("delete %s*: list jobs: %v", prefix, err)
		return deleteResult{failed: 1}
	}
	seen := map[string]bool{}
	var svcs []string
	for _, j := range jobs {
		svc, _, ok := spec.ParseRevisionName(j.ID)
		if !ok || seen[svc] {
			continue
		}
		seen[svc] = true
		svcs = append(svcs, svc)
	}
	start := time.Now()
	var next, deleted, failed atomic.Int64
	var mu sync.Mutex
	var each []time.Duration
	var wg sync.WaitGroup
	for range max(workers, 1) {
		wg.Go(func() {
			for {
				if within > 0 && time.Since(start) > within {
					return
				}
				i := int(next.Add(1)) - 1
				if i >= len(svcs) {
					return
				}
				ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
				began := time.Now()
				cmd := exec.CommandContext(ctx, h.bin, "delete", svcs[i])
				// The harness's environment: a scenario on a cluster
				// of its own points NOMAD_ADDR and CONSUL_HTTP_ADDR there.
				cmd.Env = os.Environ()
				for k, v := range h.env {
					cmd.Env = append(cmd.Env, k+"="+v)
				}
				out, err := cmd.CombinedOutput()
				took := time.Since(began)
				cancel()
				if err != nil {
					failed.Add(1)
					h.t.Logf("delete %s: %v\n%s", svcs[i], err, out)
					continue
				}
				if took > 25*time.Second {
					// Slow: say what it waited for.
					h.t.Logf("delete %s took %s:\n%s", svcs[i], took.Round(time.Millisecond), tailLines(string(out), 6))
				}
				deleted.Add(1)
				mu.Lock()
				each = append(each, took)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	slices.Sort(each)
	d, f := int(deleted.Load()), int(failed.Load())
	return deleteResult{deleted: d, failed: f, left: len(svcs) - d - f, each: each}
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// cpuUse is the CPU time used so far by the deploy processes (children
// the test waited for), the serve replicas, Consul and Nomad.
type cpuUse struct{ deploy, serve, consul, nomad time.Duration }

func (h *harness) cpuNow(gs map[string]*gateway, names []string) cpuUse {
	var u cpuUse
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_CHILDREN, &ru); err == nil {
		u.deploy = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	for _, name := range names {
		if p, err := SampleProc(gs[name].proc.PID()); err == nil {
			u.serve += p.CPU
		}
	}
	if h.s.Agents != nil {
		if p, err := SampleProc(h.s.Agents.Consul.Pid()); err == nil {
			u.consul = p.CPU
		}
		if p, err := SampleProc(h.s.Agents.Nomad.Pid()); err == nil {
			u.nomad = p.CPU
		}
	}
	return u
}

// since says, as shares of a core over wall, what each used since u0.
func (u cpuUse) since(u0 cpuUse, wall time.Duration) string {
	pct := func(a, b time.Duration) float64 { return 100 * (a - b).Seconds() / wall.Seconds() }
	return fmt.Sprintf("deploy %.0f, serve (all replicas) %.0f, Consul %.0f, Nomad %.0f",
		pct(u.deploy, u0.deploy), pct(u.serve, u0.serve), pct(u.consul, u0.consul), pct(u.nomad, u0.nomad))
}

// agentLogLevel is the agents' log level: DEBUG, but INFO for the scale
// run. At DEBUG the Consul agent logs every registration it holds as "in
// sync" each time it syncs one: with thousands of stand-ins that logging
// was 72 % of the agent's sync time and 17 % of its CPU during a deploy
// at 300 services, and it grows with each one (a test artifact: agents
// run at INFO).
func agentLogLevel() string {
	if *manyRevisions > 0 {
		return "INFO"
	}
	return "DEBUG"
}

// scaleRunCompute is the compute the Nomad dev agent declares for the scale
// run (scenario 21's burst of 100 wakes needs 100 instances of 100 MHz: 10
// GHz, on a node that measures 4.6), and 0 (what it measures) otherwise.
func scaleRunCompute() int {
	if *manyRevisions > 0 {
		return 16000
	}
	return 0
}
