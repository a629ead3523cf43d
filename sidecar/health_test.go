package sidecar

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestProbeSchedule(t *testing.T) {
	readiness := func(period time.Duration, succ, fail int) *probeSchedule {
		return newReadinessSchedule(spec.Probe{Period: period, SuccessThreshold: succ, FailureThreshold: fail, Timeout: time.Second})
	}
	type step struct {
		pass        bool
		wantHealthy bool
		wantNext    time.Duration
	}
	for _, c := range []struct {
		name  string
		sched *probeSchedule
		start bool
		steps []step
	}{
		{"aggressive until the first success, then the default period", readiness(0, 1, 3), false, []step{
			{false, false, spec.AggressiveProbePeriod},
			{false, false, spec.AggressiveProbePeriod},
			{true, true, spec.DefaultProbePeriod},
			// Not aggressive again after losing readiness.
			{false, true, spec.DefaultProbePeriod},
			{false, true, spec.DefaultProbePeriod},
			{false, false, spec.DefaultProbePeriod},
		}},
		{"configured period, thresholds", readiness(2*time.Second, 2, 2), false, []step{
			{true, false, 2 * time.Second},
			{false, false, 2 * time.Second},
			{true, false, 2 * time.Second},
			{true, true, 2 * time.Second},
			{false, true, 2 * time.Second},
			{true, true, 2 * time.Second}, // a pass resets the failure run
			{false, true, 2 * time.Second},
			{false, false, 2 * time.Second},
		}},
		{"liveness starts healthy", newLivenessSchedule(spec.Probe{SuccessThreshold: 1, FailureThreshold: 2, Timeout: time.Second}), true, []step{
			{false, true, spec.DefaultLivenessPeriod},
			{false, false, spec.DefaultLivenessPeriod},
			{true, true, spec.DefaultLivenessPeriod},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.sched.healthy != c.start {
				t.Fatalf("starts healthy=%v", c.sched.healthy)
			}
			if !c.start && c.sched.aggressive && c.sched.next() != spec.AggressiveProbePeriod {
				t.Fatalf("first wait %s", c.sched.next())
			}
			for i, s := range c.steps {
				before := c.sched.healthy
				changed := c.sched.record(s.pass)
				if c.sched.healthy != s.wantHealthy || changed != (before != s.wantHealthy) || c.sched.next() != s.wantNext {
					t.Fatalf("step %d (pass=%v): healthy=%v changed=%v next=%s, want healthy=%v next=%s",
						i, s.pass, c.sched.healthy, changed, c.sched.next(), s.wantHealthy, s.wantNext)
				}
			}
		})
	}
}

// A refused connection makes the app unready at once, whatever the
// thresholds, and probing aggressive until it is ready again, whatever the
// period; then the period is back.
func TestProbeScheduleRefused(t *testing.T) {
	type step struct {
		refused, pass bool // refused: a refusal instead of a probe
		wantHealthy   bool
		wantChanged   bool
		wantNext      time.Duration
	}
	agg := spec.AggressiveProbePeriod
	for _, c := range []struct {
		name  string
		sched *probeSchedule
		steps []step
	}{
		{"default readiness", newReadinessSchedule(spec.Probe{SuccessThreshold: 1, FailureThreshold: 3, Timeout: time.Second}), []step{
			{pass: true, wantHealthy: true, wantChanged: true, wantNext: spec.DefaultProbePeriod},
			{refused: true, wantHealthy: false, wantChanged: true, wantNext: agg},
			{refused: true, wantHealthy: false, wantChanged: false, wantNext: agg},
			{pass: false, wantHealthy: false, wantNext: agg},
			{pass: false, wantHealthy: false, wantNext: agg},
			{pass: true, wantHealthy: true, wantChanged: true, wantNext: spec.DefaultProbePeriod},
		}},
		{"period 10s, two passes to be ready", newReadinessSchedule(spec.Probe{Period: 10 * time.Second, SuccessThreshold: 2, FailureThreshold: 5, Timeout: time.Second}), []step{
			{pass: true, wantNext: 10 * time.Second},
			{pass: true, wantHealthy: true, wantChanged: true, wantNext: 10 * time.Second},
			{refused: true, wantChanged: true, wantNext: agg},
			{pass: true, wantNext: agg},
			// A refusal between passes starts the count again.
			{refused: true, wantNext: agg},
			{pass: true, wantNext: agg},
			{pass: true, wantHealthy: true, wantChanged: true, wantNext: 10 * time.Second},
		}},
		{"refused before ever ready", newReadinessSchedule(spec.Probe{Period: 5 * time.Second, SuccessThreshold: 1, FailureThreshold: 3, Timeout: time.Second}), []step{
			{pass: false, wantNext: 5 * time.Second},
			{refused: true, wantNext: agg},
			{pass: true, wantHealthy: true, wantChanged: true, wantNext: 5 * time.Second},
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			for i, s := range c.steps {
				var changed bool
				if s.refused {
					changed = c.sched.refused()
				} else {
					changed = c.sched.record(s.pass)
				}
				if c.sched.healthy != s.wantHealthy || changed != s.wantChanged || c.sched.next() != s.wantNext {
					t.Fatalf("step %d %+v: healthy=%v changed=%v next=%s", i, s, c.sched.healthy, changed, c.sched.next())
				}
			}
		})
	}
}

// The loop applies a refusal at once (not ready, told through set), probes
// every AggressiveProbePeriod from then on, and is ready again at the
// first pass.
func TestProbeLoopRefusal(t *testing.T) {
	var up atomic.Bool
	up.Store(true)
	probes := make(chan time.Time, 1000)
	pr := proberFunc(func(context.Context) error {
		probes <- time.Now()
		if up.Load() {
			return nil
		}
		return errors.New("connection refused")
	})
	changed := make(chan bool, 10)
	l := newProbeLoop("readiness", pr, newReadinessSchedule(spec.Probe{Period: time.Hour, SuccessThreshold: 1, FailureThreshold: 3, Timeout: time.Second}),
		discardLog(), func(ok bool, err error) { changed <- ok }, func(bool) {})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	if ok := <-changed; !ok {
		t.Fatal("not ready first")
	}
	// Now probed every hour; a refusal:
	up.Store(false)
	refusedAt := time.Now()
	l.refused()
	select {
	case ok := <-changed:
		if ok {
			t.Fatal("ready after a refusal")
		}
	case <-time.After(time.Second):
		t.Fatal("the refusal was not applied")
	}
	for len(probes) > 0 {
		<-probes
	}
	// Probed at the aggressive period, not the hour.
	var last time.Time
	for range 4 {
		select {
		case last = <-probes:
		case <-time.After(time.Second):
			t.Fatal("no aggressive probing after the refusal")
		}
	}
	if span := last.Sub(refusedAt); span > 20*spec.AggressiveProbePeriod {
		t.Errorf("4 probes took %s", span)
	}
	up.Store(true)
	select {
	case ok := <-changed:
		if !ok {
			t.Fatal("not ready after the app came back")
		}
	case <-time.After(time.Second):
		t.Fatal("not ready within a second of the app coming back")
	}
}

func TestHTTPProber(t *testing.T) {
	var gotHost, gotHeader string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotHost, gotHeader = r.Host, r.Header.Get("X-Check")
		switch r.URL.Path {
		case "/ok":
		case "/redirect":
			http.Redirect(w, r, "/elsewhere", http.StatusFound)
		default:
			http.Error(w, "nope", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	ctx := context.Background()
	p, err := newProber(spec.Probe{Type: spec.ProbeHTTP, Path: "/ok", Headers: map[string]string{"X-Check": "1", "Host": "app.example"}}, "127.0.0.1", port, false)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.probe(ctx); err != nil || gotHost != "app.example" || gotHeader != "1" {
		t.Fatalf("ok probe: %v host %q header %q", err, gotHost, gotHeader)
	}
	if p, _ := newProber(spec.Probe{Type: spec.ProbeHTTP, Path: "/redirect"}, "127.0.0.1", port, false); p.probe(ctx) != nil {
		t.Fatal("a redirect must pass")
	}
	if p, _ := newProber(spec.Probe{Type: spec.ProbeHTTP, Path: "/bad"}, "127.0.0.1", port, false); p.probe(ctx) == nil {
		t.Fatal("a 500 must fail")
	}
}

func TestTCPAndExecProbers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ctx := context.Background()
	p, _ := newProber(spec.Probe{Type: spec.ProbeTCP}, "127.0.0.1", 1, false)
	p.(*tcpProber).addr = "127.0.0.1:" + strconv.Itoa(port)
	if err := p.probe(ctx); err != nil {
		t.Fatalf("listening port: %v", err)
	}
	ln.Close()
	if err := p.probe(ctx); err == nil {
		t.Fatal("closed port passed")
	}
	if p, _ := newProber(spec.Probe{Type: spec.ProbeExec, Command: []string{"true"}}, "127.0.0.1", 1, false); p.probe(ctx) != nil {
		t.Fatal("exec true failed")
	}
	p, _ = newProber(spec.Probe{Type: spec.ProbeExec, Command: []string{"sh", "-c", "echo broken; exit 3"}}, "127.0.0.1", 1, false)
	if err := p.probe(ctx); err == nil || !strings.Contains(err.Error(), "broken") {
		t.Fatalf("exec exit 3: %v", err)
	}
	tctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	p, _ = newProber(spec.Probe{Type: spec.ProbeExec, Command: []string{"sleep", "5"}}, "127.0.0.1", 1, false)
	if err := p.probe(tctx); err == nil {
		t.Fatal("exec past its timeout passed")
	}
	if _, err := newProber(spec.Probe{Type: "udp"}, "127.0.0.1", 1, false); err == nil {
		t.Fatal("unknown type accepted")
	}
}

func TestProbeLoopAggressiveThenPeriod(t *testing.T) {
	results := make(chan struct{}, 100)
	fails := 3
	pr := proberFunc(func(context.Context) error {
		results <- struct{}{}
		if fails > 0 {
			fails--
			return errors.New("not yet")
		}
		return nil
	})
	changed := make(chan bool, 4)
	l := newProbeLoop("readiness", pr, newReadinessSchedule(spec.Probe{SuccessThreshold: 1, FailureThreshold: 3, Timeout: time.Second}),
		discardLog(), func(ok bool, err error) { changed <- ok }, func(bool) {})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { l.run(ctx); close(done) }()
	select {
	case ok := <-changed:
		if !ok {
			t.Fatal("first change was to not ready")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("never ready")
	}
	// Three failures and a pass: four probes, the fourth made it ready.
	if n := len(results); n != 4 {
		t.Fatalf("%d probes before ready, want 4", n)
	}
	cancel()
	<-done
}

type proberFunc func(context.Context) error

func (f proberFunc) probe(ctx context.Context) error { return f(ctx) }

func discardLog() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func probeGRPC(service string) spec.Probe {
	p := spec.DefaultProbe(spec.ProbeGRPC)
	p.GRPCService = service
	return p
}

// Before the first success of an aggressive schedule, an app whose port
// nobody listens at yet is probed every spec.ListenProbePeriod; one that
// listens but is not ready every spec.AggressiveProbePeriod (its handler
// answers each probe); a schedule with a period keeps it.
func TestProbeScheduleNoListener(t *testing.T) {
	s := newReadinessSchedule(spec.Probe{SuccessThreshold: 1, FailureThreshold: 3, Timeout: time.Second})
	s.noListener = true
	s.record(false)
	if got := s.next(); got != spec.ListenProbePeriod {
		t.Errorf("nothing listening: next %s, want %s", got, spec.ListenProbePeriod)
	}
	s.noListener = false
	s.record(false)
	if got := s.next(); got != spec.AggressiveProbePeriod {
		t.Errorf("listening, not ready: next %s, want %s", got, spec.AggressiveProbePeriod)
	}
	s.record(true)
	s.noListener = true
	if got := s.next(); got != spec.DefaultProbePeriod {
		t.Errorf("after the first success: next %s, want %s", got, spec.DefaultProbePeriod)
	}
	p := newReadinessSchedule(spec.Probe{Period: 5 * time.Second, SuccessThreshold: 1, FailureThreshold: 3, Timeout: time.Second})
	p.noListener = true
	if got := p.next(); got != 5*time.Second {
		t.Errorf("a declared period: next %s", got)
	}

	// What a refused connection, and a proxy's connection closed
	// unanswered, look like to the probes.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	closed := newHTTPProber(addr, "/", nil, false).probe(context.Background())
	ln.Close()
	refused := (&tcpProber{addr: addr}).probe(context.Background())
	for name, err := range map[string]error{"closed unanswered": closed, "refused": refused} {
		if !noListenerAt(err) {
			t.Errorf("%s (%v): not taken for no listener", name, err)
		}
	}
	if noListenerAt(errors.New("GET /: 503 warming up")) || noListenerAt(nil) {
		t.Error("a 503 or a pass taken for no listener")
	}
}
