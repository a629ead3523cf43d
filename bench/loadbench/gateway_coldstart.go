package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"slices"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/dev/localcluster"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// targetColdOverhead bounds what the control plane adds to a cold start
// beyond starting the processes (issue 6).
const targetColdOverhead = 50 * time.Millisecond

// coldSplit is one wake from zero, each part a duration.
type coldSplit struct {
	Decision time.Duration // request arrives -> Scale called (activator wake + autoscaler decision)
	Spawn    time.Duration // Scale called -> both processes started (allocation Running)
	Boot     time.Duration // processes started -> app and sidecar listening
	Detect   time.Duration // listening -> first successful direct probe (sidecar's readiness + our probe period)
	Forward  time.Duration // probe success -> first response byte at the client
	Total    time.Duration // request sent -> first response byte
	Consul   time.Duration // request sent -> first passing Consul check (what waiting for Consul would cost)
}

// overhead is what we add beyond starting processes.
func (c coldSplit) overhead() time.Duration { return c.Decision + c.Detect + c.Forward }

// runColdStartBench wakes a revision from zero several times through the
// real gateway, activator and autoscaler over the local cluster (real
// sidecar and test app processes; simulated Consul checks every second) and
// prints the median split.
func runColdStartBench(ctx context.Context, o Options) error {
	log := slog.New(slog.DiscardHandler)
	cat := catalog.New()
	lc, err := localcluster.New(cat, localcluster.Options{Binary: o.Bin, Logger: log})
	if err != nil {
		return err
	}
	defer lc.Close()
	as, err := autoscaler.New(autoscaler.Config{Revisions: cat, Scaler: lc, Tick: 500 * time.Millisecond, Logger: log})
	if err != nil {
		return err
	}
	var probed atomic.Int64
	g, err := activator.New(activator.Config{Catalog: cat, Autoscaler: as, Logger: log, Replica: "bench",
		OnInstanceReady: func(_, _ string, at time.Time) { probed.CompareAndSwap(0, at.UnixNano()) }})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() { _ = as.Run(ctx) }()
	go func() { _ = g.Run(ctx) }()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := g.Server("")
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()

	// Short windows so the autoscaler takes the revision back to zero
	// quickly between wakes.
	sc := spec.DefaultScaling()
	sc.Window = 2 * time.Second
	sc.ScaleToZeroGrace = 500 * time.Millisecond
	const rev = "cold-00001"
	if err := lc.AddRevision(catalog.Revision{Name: rev, Service: "cold", Timeout: 30 * time.Second, Scaling: sc}, localcluster.App{}); err != nil {
		return err
	}
	if err := lc.SetRoute(catalog.Service{Name: "cold", Route: consulroute.Route{Splits: []consulroute.Split{{Revision: rev, Percent: 100}}}}); err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	url := "http://" + ln.Addr().String() + "/"
	wakes := max(3*o.Rounds, 5)
	fmt.Fprintf(o.Out, "\ncold start: %d wakes of a revision at zero (Consul check interval 1s, probe every %s)\n", wakes, activator.DefaultProbeInterval)

	var splits []coldSplit
	for i := 1; i <= wakes; i++ {
		if err := waitAtZero(ctx, cat, lc, rev, 60*time.Second); err != nil {
			return err
		}
		probed.Store(0)
		var firstByte time.Time
		req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
			GotFirstResponseByte: func() { firstByte = time.Now() },
		}), http.MethodGet, url, nil)
		req.Host = "cold.default." + activator.DefaultDomain
		t0 := time.Now()
		resp, err := client.Do(req)
		if err != nil {
			return fmt.Errorf("wake %d: %w", i, err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("wake %d: status %d", i, resp.StatusCode)
		}
		// Let the simulated Consul check pass once, to show what waiting
		// for it would have cost.
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && len(cat.Ready(rev)) == 0; {
			time.Sleep(10 * time.Millisecond)
		}
		s, err := splitOf(lc, rev, t0, firstByte, time.Unix(0, probed.Load()))
		if err != nil {
			return fmt.Errorf("wake %d: %w", i, err)
		}
		splits = append(splits, s)
		fmt.Fprintf(o.Out, "  wake %2d  total %8s  decision %8s  spawn %8s  boot %8s  detect %8s  forward %8s  (overhead %s)\n",
			i, fmtDur(s.Total), fmtDur(s.Decision), fmtDur(s.Spawn), fmtDur(s.Boot), fmtDur(s.Detect), fmtDur(s.Forward), fmtDur(s.overhead()))
	}

	med := func(f func(coldSplit) time.Duration) time.Duration {
		v := make([]time.Duration, len(splits))
		for i, s := range splits {
			v[i] = f(s)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	fmt.Fprintf(o.Out, "\n== cold start, median of %d wakes\n", len(splits))
	tw := tabwriter.NewWriter(o.Out, 0, 0, 2, ' ', tabwriter.AlignRight)
	for _, row := range []struct {
		name string
		f    func(coldSplit) time.Duration
	}{
		{"scale decision (request -> Scale call)", func(s coldSplit) time.Duration { return s.Decision }},
		{"process start (Scale -> processes started)", func(s coldSplit) time.Duration { return s.Spawn }},
		{"boot (started -> app and sidecar listening)", func(s coldSplit) time.Duration { return s.Boot }},
		{"first successful probe (listening -> probe ok)", func(s coldSplit) time.Duration { return s.Detect }},
		{"forward (probe ok -> first response byte)", func(s coldSplit) time.Duration { return s.Forward }},
		{"total (request -> first response byte)", func(s coldSplit) time.Duration { return s.Total }},
		{"overhead beyond process start (decision+probe+forward)", coldSplit.overhead},
		{"had we waited for Consul (request -> first check pass)", func(s coldSplit) time.Duration { return s.Consul }},
	} {
		fmt.Fprintf(tw, "%s\t%s\t\n", row.name, fmtDur(med(row.f)))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	ov := med(coldSplit.overhead)
	fmt.Fprintf(o.Out, "overhead beyond process start: %s  [< %s] %s\n", fmtDur(ov), fmtDur(targetColdOverhead), verdict(ov < targetColdOverhead))
	return nil
}

// waitAtZero waits until the revision has no allocation and a desired count
// of zero (the autoscaler took it there).
func waitAtZero(ctx context.Context, cat *catalog.Catalog, lc *localcluster.Cluster, rev string, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for len(cat.Allocations(rev)) > 0 || lc.Desired(rev) > 0 {
		if time.Now().After(deadline) {
			return fmt.Errorf("revision %s not back at zero after %s (desired %d)", rev, limit, lc.Desired(rev))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// splitOf cuts one wake into its parts from the cluster's records.
func splitOf(lc *localcluster.Cluster, rev string, t0, firstByte, probed time.Time) (coldSplit, error) {
	if firstByte.IsZero() || probed.Before(t0) {
		return coldSplit{}, errors.New("no first byte or no direct probe success recorded")
	}
	var scaleAt time.Time
	for _, e := range lc.ScaleEvents(rev) {
		if e.From == 0 && e.To > 0 && !e.At.Before(t0) {
			scaleAt = e.At
			break
		}
	}
	if scaleAt.IsZero() {
		return coldSplit{}, errors.New("no scale from zero after the request")
	}
	var first *localcluster.InstanceTiming
	for _, x := range lc.Timings(rev) {
		if x.ScaleCalled.Equal(scaleAt) && !x.Started.IsZero() && (first == nil || x.Started.Before(first.Started)) {
			x := x
			first = &x
		}
	}
	if first == nil {
		return coldSplit{}, errors.New("no instance started by the wake")
	}
	listening := first.AppListening
	if first.SidecarListening.After(listening) {
		listening = first.SidecarListening
	}
	// The cluster sees the ports by polling every 2ms, so it can see them
	// after our probe got its answer; that answer proves both listened.
	if probed.Before(listening) {
		listening = probed
	}
	s := coldSplit{
		Decision: scaleAt.Sub(t0),
		Spawn:    first.Started.Sub(scaleAt),
		Boot:     listening.Sub(first.Started),
		Detect:   probed.Sub(listening),
		Forward:  firstByte.Sub(probed),
		Total:    firstByte.Sub(t0),
	}
	if !first.FirstCheckPass.IsZero() {
		s.Consul = first.FirstCheckPass.Sub(t0)
	}
	return s, nil
}
