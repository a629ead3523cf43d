package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"time"
)

// runGRPCSidecarBench measures the sidecar's gRPC path alone (issue 44:
// the sidecar's HTTP/2 relay): grpc-go clients to (a) the app directly,
// (b) our sidecar, (c) the sidecar of -base-bin (another build, e.g.
// main's net/http HTTP/2 path) when given, and (d) HAProxy in h2c in
// front of the same app, in the place of a sidecar; the rounds alternate
// the targets and rotate their order, at each of the three
// shapes.
func runGRPCSidecarBench(ctx context.Context, o Options) error {
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	appPort, scPort, scAdmin, basePort, baseAdmin := ports[0], ports[1], ports[2], ports[3], ports[4]
	self, err := os.Executable()
	if err != nil {
		return err
	}
	app, err := startProc("grpc-app", self, nil, map[string]string{envGRPCAppChild: strconv.Itoa(appPort)})
	if err != nil {
		return err
	}
	defer app.stop(5 * time.Second)
	if err := app.waitPort(appPort, 10*time.Second); err != nil {
		return err
	}
	h2c := map[string]string{"SERVERLESS_APP_PROTOCOL": "h2c"}
	for k, v := range o.ProxyEnv {
		h2c[k] = v
	}
	sc, err := startSidecar(o.Bin, "sidecar", scPort, appPort, scAdmin, 0, h2c)
	if err != nil {
		return err
	}
	defer sc.stop(5 * time.Second)
	targets := []grpcTarget{
		{Name: "(a) direct", Addr: addrOf(appPort)},
		{Name: "(b) sidecar", Addr: addrOf(scPort)},
	}
	cpuOf := map[string][]*proc{targets[1].Name: {sc}}
	ours := 1
	var bases []int
	if o.BaseBin != "" {
		base, err := startSidecar(o.BaseBin, "base-sidecar", basePort, appPort, baseAdmin, 0, h2c)
		if err != nil {
			return err
		}
		defer base.stop(5 * time.Second)
		t := grpcTarget{Name: "(c) base sidecar", Addr: addrOf(basePort)}
		targets = append(targets, t)
		cpuOf[t.Name] = []*proc{base}
		bases = append(bases, len(targets)-1)
	}
	peerOf := map[string]*peer{}
	var peerIdx []int
	for _, k := range o.Peers {
		if k.Name != "haproxy" {
			continue
		}
		peers, err := startPeers(o.Out, []peerKind{haproxyH2CPeer()}, addrOf(appPort))
		if err != nil {
			return err
		}
		defer stopPeers(peers)
		for _, p := range peers {
			t := grpcTarget{Name: "(d) haproxy", Addr: p.Addr}
			targets = append(targets, t)
			peerOf[t.Name] = p
			peerIdx = append(peerIdx, len(targets)-1)
		}
	}

	series := make([][]*Series, len(grpcShapes))
	for si, shape := range grpcShapes {
		for _, t := range targets {
			series[si] = append(series[si], &Series{Name: t.Name})
			if _, err := runGRPC(ctx, t, shape, o.Warmup); err != nil {
				return fmt.Errorf("warm-up of %s: %w", t.Name, err)
			}
		}
	}
	for si, shape := range grpcShapes {
		d := o.Duration
		if shape.Conns*shape.Streams == 1 {
			d = o.SingleDuration
		}
		fmt.Fprintf(o.Out, "\ngRPC unary, %s (%s), %s a run, load average %s\n", shape.Name, shape, d, loadAverage())
		for round := 1; round <= o.Rounds; round++ {
			for k := range targets {
				i := (k + round - 1) % len(targets)
				t, s := targets[i], series[si][i]
				span := startCPUSpan(cpuOf[t.Name], peerOf[t.Name], app)
				idle := s.measureIdle()
				r, err := runGRPC(ctx, t, shape, d)
				idle()
				if err != nil {
					return err
				}
				span.end(s)
				s.Add(r)
				PrintRun(o.Out, round, r)
			}
		}
	}
	for si, shape := range grpcShapes {
		ss := series[si]
		pick := func(idx []int) []*Series {
			var out []*Series
			for _, i := range idx {
				out = append(out, ss[i])
			}
			return out
		}
		// The base sidecar is a peer too: "vs" says ours against it.
		rows := peerRows(ss[:1], ss[ours:ours+1], append(pick(bases), pick(peerIdx)...))
		if err := PrintPeerComparison(o.Out, fmt.Sprintf("== gRPC unary through the sidecar, %s (medians of the rounds; vs = our calls/s / theirs; CPU/req = the proxy's CPU)", shape), rows); err != nil {
			return err
		}
	}
	fmt.Fprintf(o.Out, "\nload average at the end: %s\n", loadAverage())
	if rss, err := peakRSS(sc.pid()); err == nil {
		fmt.Fprintf(o.Out, "sidecar peak RSS (VmHWM): %s\n", fmtMiB(rss))
	}
	return nil
}
