package main

import (
	"context"
	"fmt"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
)

// Targets the gateway should meet (issue 6). Every proxy hop costs about as
// much CPU as the app here (client, app and proxies share 2 cores), so the
// gateway is judged against the sidecar alone.
const (
	targetGatewayVsSidecar = 0.6
	targetGatewayVsDirect  = 0.2
	targetGatewayAddedP99  = 2 * time.Millisecond
)

// runGatewayBench measures (a) the test app directly, (b) through a sidecar
// and (c) through the gateway and the same sidecar, alternating in one run
// with (d) the gateway straight to the app and each installed peer in the
// gateway's place, in front of the same sidecar (HAProxy, nginx: (e), (f));
// then the load-balancing policies' tail latency over several instances;
// then cold starts (gateway_coldstart.go).
func runGatewayBench(ctx context.Context, o Options) error {
	ports, err := freePorts(3)
	if err != nil {
		return err
	}
	appPort, scPort, scAdmin := ports[0], ports[1], ports[2]
	app, err := startApp(o.Bin, "testapp", appPort, nil)
	if err != nil {
		return err
	}
	defer app.stop(5 * time.Second)
	sc, err := startSidecar(o.Bin, "sidecar", scPort, appPort, scAdmin, 0, nil)
	if err != nil {
		return err
	}
	defer sc.stop(5 * time.Second)
	svc := gatewayBenchSvc{Service: "bench", Concurrency: 0, Instances: []string{addrOf(scPort)}}
	// (d) is a diagnostic: the gateway in the sidecar's place, straight
	// to the app, so the two proxies compare hop for hop.
	svcApp := gatewayBenchSvc{Service: "app", Concurrency: 0, Instances: []string{addrOf(appPort)}}
	gw, gwAddr, err := startGatewayChild("gateway", activator.PolicyAuto, []gatewayBenchSvc{svc, svcApp}, o.ProxyEnv)
	if err != nil {
		return err
	}
	defer gw.stop(5 * time.Second)
	peers, err := startPeers(o.Out, o.Peers, addrOf(scPort))
	if err != nil {
		return err
	}
	defer stopPeers(peers)

	direct := Target{Name: "(a) direct", Addr: addrOf(appPort)}
	viaSidecar := Target{Name: "(b) sidecar", Addr: addrOf(scPort)}
	viaGateway := Target{Name: "(c) gateway+sidecar", Addr: gwAddr, Host: svc.host()}
	gatewayOnly := Target{Name: "(d) gateway, no sidecar", Addr: gwAddr, Host: svcApp.host()}
	// CPU of the proxies each target crosses.
	cpuOf := map[string][]*proc{viaSidecar.Name: {sc}, viaGateway.Name: {gw, sc}, gatewayOnly.Name: {gw}}
	// The gateway's share of each series' CPU, keyed by series: the
	// 32-connection and one-connection series of a target share its name,
	// and their CPU must not be pooled.
	gwCPU := map[*Series]time.Duration{}
	// A peer's own CPU (all its processes), counted with the sidecar's as
	// the gateway's is.
	peerOf := map[string]*peer{}
	var viaPeers []Target
	for i, p := range peers {
		t := Target{Name: fmt.Sprintf("(%c) %s+sidecar", 'e'+i, p.Kind.Name), Addr: p.Addr, Host: svc.host()}
		viaPeers = append(viaPeers, t)
		cpuOf[t.Name] = []*proc{sc}
		peerOf[t.Name] = p
	}

	for _, t := range append([]Target{direct, viaSidecar, viaGateway, gatewayOnly}, viaPeers...) {
		r := Run(ctx, t, Load{Conns: o.Conns, Duration: o.Warmup})
		if r.Requests == 0 || r.ByClass[2] != r.Requests {
			return fmt.Errorf("warm-up of %s: %d requests, %d 2xx, %d errors", t.Name, r.Requests, r.ByClass[2], r.Errors)
		}
	}

	run := func(t Target, conns int, d time.Duration, s *Series, round int) error {
		procs := cpuOf[t.Name]
		span := startCPUSpan(procs, peerOf[t.Name], app)
		idle := s.measureIdle()
		r := Run(ctx, t, Load{Conns: conns, Duration: d})
		idle()
		for i, used := range span.end(s) {
			if procs[i] == gw {
				gwCPU[s] += used
			}
		}
		s.Add(r)
		PrintRun(o.Out, round, r)
		return ctx.Err()
	}

	type step struct {
		t Target
		s *Series
	}
	fmt.Fprintf(o.Out, "\nthroughput, %d connections, alternating (a) (b) (c) (d)%s\n", o.Conns, peerLetters(len(peers)))
	sA, sB, sC, sD := &Series{Name: direct.Name}, &Series{Name: viaSidecar.Name}, &Series{Name: viaGateway.Name}, &Series{Name: gatewayOnly.Name}
	sPeers := seriesOf(viaPeers)
	steps := []step{{direct, sA}, {viaSidecar, sB}, {viaGateway, sC}, {gatewayOnly, sD}}
	for i, t := range viaPeers {
		steps = append(steps, step{t, sPeers[i]})
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, x := range steps {
			if err := run(x.t, o.Conns, o.Duration, x.s, round); err != nil {
				return err
			}
		}
	}
	fmt.Fprintf(o.Out, "\nlatency, 1 connection, alternating\n")
	oA, oB, oC := &Series{Name: direct.Name}, &Series{Name: viaSidecar.Name}, &Series{Name: viaGateway.Name}
	oPeers := seriesOf(viaPeers)
	oneSteps := []step{{direct, oA}, {viaSidecar, oB}, {viaGateway, oC}}
	for i, t := range viaPeers {
		oneSteps = append(oneSteps, step{t, oPeers[i]})
	}
	for round := 1; round <= o.Rounds; round++ {
		for _, x := range oneSteps {
			if err := run(x.t, 1, o.SingleDuration, x.s, round); err != nil {
				return err
			}
		}
	}

	PrintComparison(o.Out, fmt.Sprintf("== throughput, %d connections (ratio = target / direct; CPU/req = the proxies' CPU)", o.Conns), sA, sB, sC, sD)
	PrintComparison(o.Out, "== one connection", oA, oB, oC)
	if len(o.Peers) > 0 {
		// (a), (b) and (d) are references: a peer takes the gateway's
		// place in front of the same sidecar, so only (c) gets ratios.
		if err := PrintPeerComparison(o.Out, fmt.Sprintf("== against the peers, %d connections (medians of the rounds; vs = our req/s / the peer's; CPU/req = the proxies' CPU; app CPU/req = the app's behind each; idle = the machine's CPU left idle)", o.Conns),
			peerRows([]*Series{sA, sB, sD}, []*Series{sC}, sPeers)); err != nil {
			return err
		}
		if err := PrintPeerComparison(o.Out, "== against the peers, one connection",
			peerRows([]*Series{oA, oB}, []*Series{oC}, oPeers)); err != nil {
			return err
		}
	}

	a, b, c := sA.Merged(), sB.Merged(), sC.Merged()
	vsSidecar, vsDirect := c.RPS()/b.RPS(), c.RPS()/a.RPS()
	addedP99 := c.Latency.Quantile(.99) - b.Latency.Quantile(.99)
	one1, one2 := oB.Merged(), oC.Merged()
	addedP99One := one2.Latency.Quantile(.99) - one1.Latency.Quantile(.99)
	addedP50One := one2.Latency.Quantile(.5) - one1.Latency.Quantile(.5)
	fmt.Fprintf(o.Out, "\n== summary (target in brackets)\n")
	fmt.Fprintf(o.Out, "throughput (c)/(b):              %.3f  [>= %.2f] %s\n", vsSidecar, targetGatewayVsSidecar, verdict(vsSidecar >= targetGatewayVsSidecar))
	fmt.Fprintf(o.Out, "throughput (c)/(a):              %.3f  [>= %.2f] %s\n", vsDirect, targetGatewayVsDirect, verdict(vsDirect >= targetGatewayVsDirect))
	fmt.Fprintf(o.Out, "throughput (b)/(a):              %.3f\n", b.RPS()/a.RPS())
	fmt.Fprintf(o.Out, "added p99 (c)-(b), %d conns:     %s  [< %s] %s\n", o.Conns, fmtDur(addedP99), fmtDur(targetGatewayAddedP99), verdict(addedP99 < targetGatewayAddedP99))
	fmt.Fprintf(o.Out, "added p99 (c)-(b), 1 conn:       %s  [< %s] %s (p50 %s)\n", fmtDur(addedP99One), fmtDur(targetGatewayAddedP99), verdict(addedP99One < targetGatewayAddedP99), fmtDur(addedP50One))
	for i, p := range peers {
		if p.Kind.Name != "haproxy" {
			continue
		}
		// The issue-16 targets: the gateway in HAProxy's place in front
		// of the same sidecar (sidecar.go has the constants).
		ours, hp := medianStats(sC), medianStats(sPeers[i])
		rps, p99 := div(ours.RPS, hp.RPS), divDur(ours.P99, hp.P99)
		fmt.Fprintf(o.Out, "(c) vs haproxy+sidecar, %d conns: req/s %.3f  [>= %.2f] %s\n", o.Conns, rps, targetVsHAProxyRPS, verdict(rps >= targetVsHAProxyRPS))
		fmt.Fprintf(o.Out, "(c) vs haproxy+sidecar, %d conns: p99 %.2fx  [<= %.2fx] %s\n", o.Conns, p99, targetVsHAProxyP99, verdict(p99 <= targetVsHAProxyP99))
	}
	perReq := func(d time.Duration, n int64) string { return fmtDur(d / time.Duration(max(n, 1))) }
	if c.Requests > 0 {
		fmt.Fprintf(o.Out, "gateway CPU per request, %d conns: %s in (c), %s in (d); sidecar %s in (c), %s in (b)\n", o.Conns,
			perReq(gwCPU[sC], c.Requests), perReq(gwCPU[sD], sD.Merged().Requests),
			perReq(sC.CPU-gwCPU[sC], c.Requests), perReq(sB.CPU, b.Requests))
		fmt.Fprintf(o.Out, "gateway CPU per request, 1 conn:  %s in (c); sidecar %s in (c), %s in (b)\n",
			perReq(gwCPU[oC], one2.Requests), perReq(oC.CPU-gwCPU[oC], one2.Requests), perReq(oB.CPU, one1.Requests))
	}
	if rss, err := peakRSS(gw.pid()); err == nil {
		fmt.Fprintf(o.Out, "gateway peak RSS (VmHWM):        %s\n", fmtMiB(rss))
	}
	app.stop(5 * time.Second)
	sc.stop(5 * time.Second)
	gw.stop(5 * time.Second)
	stopPeers(peers)

	if err := runPolicyBench(ctx, o); err != nil {
		return err
	}
	// make bench-gateway prints every gateway number; -mode coldstart runs
	// this part alone.
	return runColdStartBench(ctx, o)
}

// Instances of the policy comparison: several fast ones and one slow (a
// noisy neighbour), which is where policies differ.
const (
	policyFast      = 3
	policyFastSleep = 2 * time.Millisecond
	policySlowSleep = 20 * time.Millisecond
)

// runPolicyBench compares the load-balancing policies at concurrency 1, 10
// and unlimited over policyFast fast instances and one slow one.
func runPolicyBench(ctx context.Context, o Options) error {
	n := policyFast + 1
	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop(5 * time.Second)
		}
	}()
	appPorts := make([]int, n)
	for i := range n {
		ports, err := freePorts(1)
		if err != nil {
			return err
		}
		sleep := policyFastSleep
		if i == n-1 {
			sleep = policySlowSleep
		}
		p, err := startApp(o.Bin, "testapp-"+strconv.Itoa(i), ports[0], map[string]string{"TESTAPP_SLEEP": sleep.String()})
		if err != nil {
			return err
		}
		procs = append(procs, p)
		appPorts[i] = ports[0]
	}
	type level struct {
		cc    int
		conns int
	}
	levels := []level{{1, 2 * n}, {10, o.Conns}, {0, o.Conns}}
	var routes []gatewayBenchSvc
	for _, lv := range levels {
		svc := gatewayBenchSvc{Service: "cc" + strconv.Itoa(lv.cc), Concurrency: lv.cc}
		for i := range n {
			ports, err := freePorts(2)
			if err != nil {
				return err
			}
			p, err := startSidecar(o.Bin, fmt.Sprintf("sidecar-cc%d-%d", lv.cc, i), ports[0], appPorts[i], ports[1], lv.cc, nil)
			if err != nil {
				return err
			}
			procs = append(procs, p)
			svc.Instances = append(svc.Instances, addrOf(ports[0]))
		}
		routes = append(routes, svc)
	}
	policies := []activator.Policy{activator.PolicyFirstAvailable, activator.PolicyRoundRobin, activator.PolicyPowerOfTwo, activator.PolicyLeastLoaded}
	gwAddr := map[activator.Policy]string{}
	for _, pol := range policies {
		p, addr, err := startGatewayChild("gateway-"+string(pol), pol, routes, nil)
		if err != nil {
			return err
		}
		procs = append(procs, p)
		gwAddr[pol] = addr
	}

	d := o.SingleDuration
	rounds := min(o.Rounds, 3)
	fmt.Fprintf(o.Out, "\nload-balancing policies: %d instances (%d answer in %s, 1 in %s), %s per run, %d rounds\n",
		n, policyFast, policyFastSleep, policySlowSleep, d, rounds)
	series := map[string]*Series{}
	key := func(cc int, pol activator.Policy) string { return fmt.Sprintf("cc=%d %s", cc, pol) }
	for round := 1; round <= rounds; round++ {
		for li, lv := range levels {
			for _, pol := range policies {
				t := Target{Name: key(lv.cc, pol), Addr: gwAddr[pol], Host: routes[li].host()}
				if round == 1 {
					Run(ctx, t, Load{Conns: lv.conns, Duration: 300 * time.Millisecond})
				}
				r := Run(ctx, t, Load{Conns: lv.conns, Duration: d})
				s := series[t.Name]
				if s == nil {
					s = &Series{Name: t.Name}
					series[t.Name] = s
				}
				s.Add(r)
				PrintRun(o.Out, round, r)
				if err := ctx.Err(); err != nil {
					return err
				}
			}
		}
	}
	fmt.Fprintf(o.Out, "\n== load-balancing policies (auto picks least-loaded with a limit, p2c without; Knative: first-available up to 3, round-robin above, p2c)\n")
	tw := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "concurrency\tconns\tpolicy\treq/s\tp50\tp99\tp99.9\terrors\tnon-2xx\t")
	for _, lv := range levels {
		for _, pol := range policies {
			m := series[key(lv.cc, pol)].Merged()
			fmt.Fprintf(tw, "%d\t%d\t%s\t%.0f\t%s\t%s\t%s\t%d\t%d\t\n", lv.cc, lv.conns, pol, m.RPS(),
				fmtDur(m.Latency.Quantile(.5)), fmtDur(m.Latency.Quantile(.99)), fmtDur(m.Latency.Quantile(.999)),
				m.Errors, m.Requests-m.ByClass[2])
		}
	}
	return tw.Flush()
}

// cpuSpan counts the CPU a run costs: the proxies it crosses, a peer's
// processes and the app behind them.
type cpuSpan struct {
	procs                 []*proc
	peer                  *peer // nil: none
	app                   *proc
	before                []time.Duration
	peerBefore, appBefore time.Duration
}

func startCPUSpan(procs []*proc, pe *peer, app *proc) *cpuSpan {
	c := &cpuSpan{procs: procs, peer: pe, app: app, before: make([]time.Duration, len(procs))}
	for i, p := range procs {
		c.before[i], _ = cpuTime(p.pid())
	}
	if pe != nil {
		c.peerBefore = pe.cpu()
	}
	c.appBefore, _ = cpuTime(app.pid())
	return c
}

// end adds what the proxies and the peer used to s.CPU and what the app
// used to s.AppCPU, and returns what each of procs used.
func (c *cpuSpan) end(s *Series) []time.Duration {
	app, _ := cpuTime(c.app.pid())
	s.AppCPU += app - c.appBefore
	used := make([]time.Duration, len(c.procs))
	for i, p := range c.procs {
		after, _ := cpuTime(p.pid())
		used[i] = after - c.before[i]
		s.CPU += used[i]
	}
	if c.peer != nil {
		s.CPU += c.peer.cpu() - c.peerBefore
	}
	return used
}

func addrOf(port int) string { return "127.0.0.1:" + strconv.Itoa(port) }

// freePorts returns n distinct ports that were free a moment ago.
func freePorts(n int) ([]int, error) {
	seen := map[int]bool{}
	var out []int
	for len(out) < n {
		p, err := freePort()
		if err != nil {
			return nil, err
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	return out, nil
}

// startApp runs the test app on port.
func startApp(bin, name string, port int, env map[string]string) (*proc, error) {
	e := map[string]string{"PORT": strconv.Itoa(port)}
	for k, v := range env {
		e[k] = v
	}
	p, err := startProc(name, bin, []string{"testapp"}, e)
	if err != nil {
		return nil, err
	}
	if err := p.waitPort(port, 10*time.Second); err != nil {
		p.stop(time.Second)
		return nil, err
	}
	return p, nil
}

// startSidecar runs a sidecar in front of the app on appPort.
func startSidecar(bin, name string, port, appPort, admin, concurrency int, env map[string]string) (*proc, error) {
	e := map[string]string{
		"PORT":                   strconv.Itoa(port),
		"SERVERLESS_APP_PORT":    strconv.Itoa(appPort),
		"SERVERLESS_ADMIN_PORT":  strconv.Itoa(admin),
		"SERVERLESS_SERVICE":     "bench",
		"SERVERLESS_REVISION":    "bench-00001",
		"SERVERLESS_CONCURRENCY": strconv.Itoa(concurrency),
		"SERVERLESS_DRAIN_GRACE": "0s",
		// As a compiled job runs it (-proxy-env GOMAXPROCS=N overrides).
		"GOMAXPROCS": strconv.Itoa(nomadjob.SidecarProcs(nomadjob.DefaultSidecarCPU)),
	}
	for k, v := range env {
		e[k] = v
	}
	p, err := startProc(name, bin, []string{"sidecar"}, e)
	if err != nil {
		return nil, err
	}
	if err := p.waitPort(port, 10*time.Second); err != nil {
		p.stop(time.Second)
		return nil, err
	}
	return p, nil
}
