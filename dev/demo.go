package dev

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/activator"
	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/dev/localcluster"
	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// demoSettings pace the demonstration; tests shorten them.
type demoSettings struct {
	// Example is the service file to run; when it cannot be read, the
	// built-in copy of examples/raw-exec.hcl is used.
	Example string
	// Window and Grace, when set, replace the example's stable window and
	// scale-to-zero grace.
	Window, Grace time.Duration
	// Tick is the autoscaler's decision period.
	Tick time.Duration
	// CheckInterval is the simulated Consul check's.
	CheckInterval time.Duration
	// Workers keep that many requests of Work each in flight for Hold.
	Workers int
	Work    time.Duration
	Hold    time.Duration
	// Deadline bounds the whole demonstration.
	Deadline time.Duration
}

func defaultDemoSettings() demoSettings {
	return demoSettings{
		Example:       filepath.Join("examples", "raw-exec.hcl"),
		Tick:          2 * time.Second,
		CheckInterval: time.Second,
		Workers:       40,
		Work:          300 * time.Millisecond,
		Hold:          8 * time.Second,
		Deadline:      90 * time.Second,
	}
}

// RunDemo runs the closest real demonstration there is without Nomad and
// Consul: `dev -demo`. Like Run, it says what goes wrong on Stderr and
// returns it; Ctrl-C (ctx) ends it normally.
func RunDemo(ctx context.Context, e Env, c Config) error {
	exe, err := os.Executable()
	if err != nil {
		return say(e, "nomad-serverless dev -demo: ", "cannot find this binary to run the sidecar and app: %v", err)
	}
	c.Executable = exe
	return demo(ctx, e, c, defaultDemoSettings())
}

// demoService is examples/raw-exec.hcl, for when the demo runs outside the
// repository.
func demoService() spec.Service {
	s := spec.NewService("testapp")
	s.Template.Task.Driver = "raw_exec"
	s.Template.Task.Config = map[string]any{"command": "nomad-serverless", "args": []any{"testapp"}}
	s.Template.Task.KillTimeout = 5 * time.Second
	s.Template.Concurrency = 10
	s.Scaling.Min, s.Scaling.Max, s.Scaling.Initial, s.Scaling.Target = 0, 5, 1, 5
	s.Scaling.Window, s.Scaling.ScaleToZeroGrace = 6*time.Second, 5*time.Second
	return s
}

// demoNarrator prints each step with the time since the demo began.
type demoNarrator struct {
	w     io.Writer
	start time.Time
}

func (n *demoNarrator) say(format string, a ...any) {
	fmt.Fprintf(n.w, "[%5.1fs] %s\n", time.Since(n.start).Seconds(), fmt.Sprintf(format, a...))
}

// demo runs the gateway/activator and the autoscaler in process over
// localcluster (real sidecar and test app processes) and narrates a wake
// from zero, a burst that scales up, and the way back to zero.
func demo(ctx context.Context, e Env, c Config, ds demoSettings) (err error) {
	e = Env{Stdout: &lockedWriter{w: e.Stdout}, Stderr: &lockedWriter{w: e.Stderr}, Getenv: e.Getenv}
	n := &demoNarrator{w: e.Stdout, start: time.Now()}
	fail := func(format string, a ...any) error {
		return say(e, "nomad-serverless dev -demo: ", format, a...)
	}
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, ds.Deadline)
	defer cancel()
	// Ctrl-C ends the demo normally; running out of its time bound is a
	// failure.
	interrupted := func() bool { return parent.Err() != nil }

	missing := missingBinaries(e.Getenv("PATH"))
	switch {
	case c.OrDemo:
		// -or-demo already said what is missing and where to get it.
		fmt.Fprintln(e.Stdout, "Demo without Nomad and Consul.")
	case len(missing) > 0:
		fmt.Fprintf(e.Stdout, "Demo without Nomad and Consul (%s not on PATH: see 'nomad-serverless dev' for where to get them).\n", strings.Join(missing, ", "))
	default:
		fmt.Fprintln(e.Stdout, "Demo without Nomad and Consul ('nomad-serverless dev' without -demo runs the real agents).")
	}
	fmt.Fprintln(e.Stdout, "Real here: the gateway and activator, the autoscaler, and every instance's queue-proxy sidecar and")
	fmt.Fprintln(e.Stdout, "app processes. Stand-ins: Nomad allocations are local processes, Consul checks are simulated.")
	fmt.Fprintln(e.Stdout)

	// The service: the example file, or its built-in copy.
	svc := demoService()
	source := "built-in copy of examples/raw-exec.hcl"
	if f, diags := svchcl.ParseFile(ds.Example, svchcl.Options{Vars: map[string]string{"binary": c.Executable}}); !diags.HasErrors() && len(f.Services) > 0 {
		svc, source = f.Services[0], ds.Example
	}
	if ds.Window > 0 {
		svc.Scaling.Window = ds.Window
	}
	if ds.Grace > 0 {
		svc.Scaling.ScaleToZeroGrace = ds.Grace
	}
	rev := spec.NewRevision(&svc, 1)
	revName := rev.Name()

	logBuf := &demoLog{}
	log := slog.New(slog.NewTextHandler(logBuf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	defer func() {
		if err != nil && !interrupted() {
			fmt.Fprintf(e.Stderr, "last log lines:\n%s\n", logBuf.tail(25))
		}
	}()

	cat := catalog.New()
	cluster, err := localcluster.New(cat, localcluster.Options{
		Binary: c.Executable, CheckInterval: ds.CheckInterval, ShutdownDelay: time.Second, Logger: log,
	})
	if err != nil {
		return fail("%v", err)
	}
	defer func() {
		n.say("Stopping every process the demo started...")
		cluster.Close()
	}()
	scaling := svc.Scaling
	scaling.Initial = 0 // the demo starts at zero to show the wake
	if err := cluster.AddRevision(catalog.Revision{
		Name: revName, Service: svc.Name, Namespace: svc.Namespace, Generation: 1,
		Concurrency: svc.Template.Concurrency, Timeout: svc.Template.Timeout, Scaling: scaling,
	}, localcluster.App{Name: revName}); err != nil {
		return fail("%v", err)
	}
	if err := cluster.SetRoute(catalog.Service{Name: svc.Name, Namespace: svc.Namespace,
		Route: consulroute.Route{Service: svc.Name, Namespace: svc.Namespace, Splits: []consulroute.Split{{Revision: revName, Percent: 100}}}}); err != nil {
		return fail("%v", err)
	}

	as, err := autoscaler.New(autoscaler.Config{Revisions: cat, Scaler: cluster, Tick: ds.Tick, Logger: log})
	if err != nil {
		return fail("%v", err)
	}
	var readyMu sync.Mutex
	probed := map[string]time.Time{}
	gw, err := activator.New(activator.Config{
		Catalog: cat, Autoscaler: as, Domain: c.Domain, Replica: "demo", Logger: log,
		OnInstanceReady: func(_, hostPort string, at time.Time) {
			readyMu.Lock()
			defer readyMu.Unlock()
			if _, ok := probed[hostPort]; !ok {
				probed[hostPort] = at
			}
		},
	})
	if err != nil {
		return fail("%v", err)
	}
	ln, err := net.Listen("tcp", c.Listen)
	if err != nil {
		return fail("gateway on %s: %v (pass -listen 127.0.0.1:<port>)", c.Listen, err)
	}
	srv := gw.Server("")
	runCtx, stopRun := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(3)
	go func() { defer wg.Done(); _ = as.Run(runCtx) }()
	go func() { defer wg.Done(); _ = gw.Run(runCtx) }()
	go func() { defer wg.Done(); _ = srv.Serve(gw.Listener(ln)) }()
	defer func() {
		shut, done := context.WithTimeout(context.Background(), 5*time.Second)
		defer done()
		_ = srv.Shutdown(shut)
		stopRun()
		wg.Wait()
	}()

	gwURL := "http://" + dialAddr(ln.Addr().String())
	hostName := svc.Name + "." + svc.Namespace + "." + c.Domain
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: ds.Workers + 4}}
	defer client.CloseIdleConnections()
	n.say("Service %q from %s: revision %s, concurrency %d per instance, target %g, window %s, scale-to-zero grace %s.",
		svc.Name, source, revName, svc.Template.Concurrency, svc.Scaling.Target, svc.Scaling.Window, svc.Scaling.ScaleToZeroGrace)
	n.say("Gateway on %s. Try it yourself meanwhile: curl -H 'Host: %s' %s/", gwURL, hostName, gwURL)
	n.say("Revision %s is at zero: %d instances running.", revName, cluster.Running(revName))

	// 1. The first request wakes it.
	n.say("Sending the first request: the activator holds it and asks the autoscaler for an instance...")
	reqIn := time.Now()
	status, appName, firstByte, err := demoGet(ctx, client, gwURL+"/", hostName)
	if interrupted() {
		return demoInterrupted(n)
	}
	if err != nil || status != http.StatusOK {
		return fail("the first request failed: status %d, %v", status, err)
	}
	n.say("Answered %d by %s. Cold start:", status, appName)
	fmt.Fprint(e.Stdout, demoColdStart(reqIn, firstByte, cluster.ScaleEvents(revName), cluster.Timings(revName), func(hp string) time.Time {
		readyMu.Lock()
		defer readyMu.Unlock()
		return probed[hp]
	}))

	seen := demoEvents(n, cluster.ScaleEvents(revName), 0)

	// 2. A burst scales it up.
	n.say("Burst: %d clients, each keeping one %s request in flight, for %s...", ds.Workers, ds.Work, ds.Hold)
	var ok, failed atomic.Int64
	loadCtx, stopLoad := context.WithTimeout(ctx, ds.Hold)
	var lwg sync.WaitGroup
	for range ds.Workers {
		lwg.Add(1)
		go func() {
			defer lwg.Done()
			for loadCtx.Err() == nil {
				st, _, _, err := demoGet(loadCtx, client, fmt.Sprintf("%s/?sleep=%s", gwURL, ds.Work), hostName)
				switch {
				case loadCtx.Err() != nil:
				case err == nil && st == http.StatusOK:
					ok.Add(1)
				default:
					failed.Add(1)
				}
			}
		}()
	}
	peak := 0
	for loadCtx.Err() == nil {
		seen = demoEvents(n, cluster.ScaleEvents(revName), seen)
		peak = max(peak, cluster.Running(revName))
		select {
		case <-loadCtx.Done():
		case <-time.After(200 * time.Millisecond):
		}
	}
	stopLoad()
	lwg.Wait()
	if interrupted() {
		return demoInterrupted(n)
	}
	seen = demoEvents(n, cluster.ScaleEvents(revName), seen)
	n.say("Burst over: %d requests answered, %d failed; up to %d instances ran (max %d).", ok.Load(), failed.Load(), peak, svc.Scaling.Max)

	// 3. Without traffic it goes back to zero.
	n.say("No more requests: after the %s window and %s grace the autoscaler scales it down to zero...", svc.Scaling.Window, svc.Scaling.ScaleToZeroGrace)
	for cluster.Desired(revName) > 0 || cluster.Running(revName) > 0 {
		seen = demoEvents(n, cluster.ScaleEvents(revName), seen)
		select {
		case <-ctx.Done():
			if !interrupted() {
				return fail("%s did not return to zero within the demo's %s bound (desired %d, running %d)", revName, ds.Deadline, cluster.Desired(revName), cluster.Running(revName))
			}
			return demoInterrupted(n)
		case <-time.After(200 * time.Millisecond):
		}
	}
	demoEvents(n, cluster.ScaleEvents(revName), seen)
	n.say("Back to zero: %d instances, %d wake(s) from zero in all.", cluster.Running(revName), cluster.Wakes(revName))
	if failed.Load() > 0 {
		return fail("%d requests of the burst failed", failed.Load())
	}
	if c.OrDemo {
		fmt.Fprintln(e.Stdout, "\nWith consul and nomad on PATH, the same command runs this on real Nomad and Consul dev agents.")
	} else {
		fmt.Fprintln(e.Stdout, "\nOn a real cluster: 'nomad-serverless dev -deploy examples/raw-exec.hcl' (Consul and Nomad dev agents).")
	}
	return nil
}

// demoInterrupted ends the demonstration on Ctrl-C: normally.
func demoInterrupted(n *demoNarrator) error {
	n.say("Interrupted.")
	return nil
}

// demoGet sends one GET through the gateway and returns the status, the
// app's name and when the first byte came.
func demoGet(ctx context.Context, client *http.Client, url, host string) (int, string, time.Time, error) {
	var first atomic.Int64
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() { first.Store(time.Now().UnixNano()) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, url, nil)
	if err != nil {
		return 0, "", time.Time{}, err
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		return 0, "", time.Time{}, err
	}
	defer resp.Body.Close()
	_, err = io.Copy(io.Discard, resp.Body)
	var at time.Time
	if ns := first.Load(); ns != 0 {
		at = time.Unix(0, ns)
	}
	return resp.StatusCode, resp.Header.Get("X-Testapp-Name"), at, err
}

// demoColdStart renders the wake's timeline, every step since the request.
func demoColdStart(reqIn, firstByte time.Time, events []localcluster.ScaleEvent, timings []localcluster.InstanceTiming, probedAt func(hostPort string) time.Time) string {
	var scaleCall time.Time
	for _, ev := range events {
		if ev.From == 0 && ev.To > 0 && !ev.At.Before(reqIn) {
			scaleCall = ev.At
			break
		}
	}
	var in localcluster.InstanceTiming
	for _, t := range timings {
		if !t.ScaleCalled.Before(reqIn) {
			in = t
			break
		}
	}
	probe := time.Time{}
	if in.Address != "" {
		probe = probedAt(fmt.Sprintf("%s:%d", in.Address, in.Port))
	}
	var b strings.Builder
	row := func(what string, at time.Time) {
		if at.IsZero() && strings.HasPrefix(what, "simulated") {
			return // not happened yet: the gateway did not wait for it
		}
		if at.IsZero() {
			fmt.Fprintf(&b, "    %-44s %10s\n", what, "(unknown)")
			return
		}
		fmt.Fprintf(&b, "    %-44s %8.0fms\n", what, float64(at.Sub(reqIn))/float64(time.Millisecond))
	}
	row("request in", reqIn)
	row("scale call (autoscaler -> cluster)", scaleCall)
	row("allocation running (processes started)", in.Started)
	row("first probe passing (activator -> sidecar)", probe)
	row("first byte (client)", firstByte)
	row("simulated Consul check passing (not waited)", in.FirstCheckPass)
	return b.String()
}

// demoEvents prints scale events from index seen on and returns the new
// count.
func demoEvents(n *demoNarrator, events []localcluster.ScaleEvent, seen int) int {
	for _, ev := range events[min(seen, len(events)):] {
		n.say("  scale %d -> %d: %s", ev.From, ev.To, ev.Reason)
	}
	return max(seen, len(events))
}

// demoLog keeps the demo's log lines for the error report.
type demoLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *demoLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range strings.Split(strings.TrimRight(string(p), "\n"), "\n") {
		l.lines = append(l.lines, line)
	}
	if len(l.lines) > 1000 {
		l.lines = l.lines[len(l.lines)-1000:]
	}
	return len(p), nil
}

func (l *demoLog) tail(n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines[max(0, len(l.lines)-n):], "\n")
}
