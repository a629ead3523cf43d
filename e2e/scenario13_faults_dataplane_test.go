package e2e

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Scenario 13 (data path): kill -9 of one instance's app under load
// through the gateway. Nomad restarts the task in place (the allocation
// stays running, the sidecar too), so for a while the sidecar stands in
// front of a dead app. GETs: no request fails (the sidecar says the app did
// not serve them, the gateway sends them to the other instance and takes
// this one out of balancing until its probe passes). POSTs with a body: at
// most the requests the app had when it died fail.
func TestE2E13KillAppUnderLoad(t *testing.T) {
	h := newHarness(t, "13 kill -9 of an app")
	const svc = "e2e-faults"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-13", "", "")
	s := testService(svc)
	s.Concurrency = 10
	s.Scaling.Min, s.Scaling.Max, s.Scaling.Initial = 2, 2, 2
	h.deploy(h.writeServices("faults.hcl", s))
	eventually(t, 60*time.Second, "two instances passing", func() (bool, string) {
		n := len(h.passing(rev))
		return n == 2, fmt.Sprintf("%d passing", n)
	})
	allocs := h.waitRunning(rev, 2, 30*time.Second)
	eventually(t, 30*time.Second, "the gateway routes to both", func() (bool, string) {
		n := len(g.gatewayView(t)[rev].Instances)
		return n == 2, fmt.Sprintf("%d routable", n)
	})

	t.Run("GET", func(t *testing.T) {
		victim := allocs[0].ID
		load := StartLoad(context.Background(), g.request(svc, "", "/?sleep=10ms", NewClient(16)), 8, 0, 3*time.Minute)
		defer load.Stop()
		time.Sleep(3 * time.Second)
		inFlight, killedAt := killApp(t, h, g, rev, victim)
		waitAppBack(t, h, g, rev, victim, killedAt)
		time.Sleep(2 * time.Second)
		res := load.Stop()
		t.Logf("load: %s; %d in flight to the killed instance at the kill (%s)", res.Summary(), inFlight, killedAt.Format("15:04:05.000"))
		logAround(t, res, killedAt)
		if failed := res.Failed(); len(failed) > 0 {
			t.Errorf("%d GETs failed, want 0: %s", len(failed), failed.Summary())
		}
	})

	// Consul, then Nomad, stopped (SIGSTOP) for 8 s under load, with a
	// second replica holding or waiting for the leader lock: the data path
	// keeps what it knows (the routes, the instances, their readiness) and
	// serves on; nothing in it waits for an agent.
	t.Run("agents paused", func(t *testing.T) {
		if h.s.Agents == nil {
			t.Skip("e2e: SKIPPED pausing the agents: the suite did not start them (NOMAD_ADDR and CONSUL_HTTP_ADDR are someone's running agents)")
		}
		g2 := h.startStandby(t, "e2e-13b", rev)
		defer g2.stop(t)
		for _, a := range []struct {
			name string
			pid  int
		}{{"Consul", h.s.Agents.Consul.Pid()}, {"Nomad", h.s.Agents.Nomad.Pid()}} {
			load := StartLoad(context.Background(), g.request(svc, "", "/?sleep=10ms", NewClient(16)), 8, 0, time.Minute)
			time.Sleep(2 * time.Second)
			pausedAt := time.Now()
			if err := syscall.Kill(a.pid, syscall.SIGSTOP); err != nil {
				load.Stop()
				t.Fatalf("SIGSTOP %s (pid %d): %v", a.name, a.pid, err)
			}
			time.Sleep(8 * time.Second)
			if err := syscall.Kill(a.pid, syscall.SIGCONT); err != nil {
				t.Fatalf("SIGCONT %s (pid %d): %v", a.name, a.pid, err)
			}
			time.Sleep(2 * time.Second)
			res := load.Stop()
			during := res.Count(func(o Outcome) bool {
				return o.OK() && !o.Start.Before(pausedAt) && o.Start.Before(pausedAt.Add(8*time.Second))
			})
			t.Logf("%s paused 8 s: load %s; %d answered while it was stopped", a.name, res.Summary(), during)
			logAround(t, res, pausedAt)
			if failed := res.Failed(); len(failed) > 0 {
				t.Errorf("%s paused 8 s: %d requests failed, want 0: %s", a.name, len(failed), failed.Summary())
			}
			if during == 0 {
				t.Errorf("%s paused 8 s: no request was answered while it was stopped", a.name)
			}
			eventually(t, 30*time.Second, a.name+" answers again", func() (bool, string) {
				n := len(h.passing(rev))
				return n == 2, fmt.Sprintf("%d passing", n)
			})
		}
	})

	t.Run("POST", func(t *testing.T) {
		victim := allocs[1].ID
		body := strings.Repeat("p", 1024)
		load := startPostLoad(g, svc, "/echo", body, 8)
		time.Sleep(3 * time.Second)
		inFlight, killedAt := killApp(t, h, g, rev, victim)
		goneAt := waitAppGone(t, h.appAddr(victim), killedAt)
		waitAppBack(t, h, g, rev, victim, killedAt)
		time.Sleep(2 * time.Second)
		res := load.stop()
		// The app takes a moment to die after SIGKILL (its sockets close
		// as the process exits): requests written to them meanwhile were
		// in flight at the kill too.
		dying := res.Count(func(o Outcome) bool { return !o.Start.Before(killedAt) && o.Start.Before(goneAt) })
		t.Logf("load: %s; %d in flight to the killed instance at the kill (%s), %d more sent while it died (%s)",
			res.Summary(), inFlight, killedAt.Format("15:04:05.000"), dying, goneAt.Sub(killedAt).Round(time.Microsecond))
		logAround(t, res, killedAt)
		failed := res.Failed()
		if len(failed) > inFlight+dying {
			t.Errorf("%d POSTs failed, more than the %d in flight to the killed instance: %s", len(failed), inFlight+dying, failed.Summary())
		}
		for _, o := range failed {
			if !o.Start.Before(goneAt) {
				t.Errorf("a POST sent %s after the app was gone failed: %s", o.Start.Sub(goneAt).Round(time.Microsecond), o.Describe())
			}
		}
	})
}

// killApp sends SIGKILL to the app of an allocation (its PID from the
// app's own /stats) and returns the requests in flight to that instance
// just before: the most the gateway says it has there, or the app itself.
func killApp(t *testing.T, h *harness, g *gateway, rev, alloc string) (int, time.Time) {
	t.Helper()
	st := h.appStats(alloc)
	if st.PID <= 0 {
		st.PID = appPIDFromProc(t, h.appAddr(alloc))
	}
	inFlight := int(st.InFlight)
	var revs []struct {
		Revision  string `json:"revision"`
		Instances []struct {
			Alloc    string `json:"alloc"`
			InFlight int    `json:"in_flight"`
		} `json:"instances"`
	}
	if err := g.adminJSON("/v1/activator/revisions", &revs); err == nil {
		for _, r := range revs {
			for _, in := range r.Instances {
				if r.Revision == rev && in.Alloc == alloc {
					inFlight = max(inFlight, in.InFlight)
				}
			}
		}
	}
	at := time.Now()
	if err := syscall.Kill(st.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (the app of %s): %v", st.PID, alloc, err)
	}
	return inFlight, at
}

// appPIDFromProc finds the test app listening on addr in /proc (for a
// binary whose app does not report its PID): the process run as
// "testapp" with PORT set to the address's port.
func appPIDFromProc(t *testing.T, addr string) int {
	t.Helper()
	_, port, _ := net.SplitHostPort(addr)
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || !bytes.HasSuffix(bytes.TrimRight(cmd, "\x00"), []byte("\x00testapp")) {
			continue
		}
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), []byte("\x00PORT="+port+"\x00")) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(d))
		if err == nil {
			return pid
		}
	}
	t.Fatalf("no testapp process with PORT=%s in /proc", port)
	return 0
}

// waitAppGone returns when the killed app's port first refuses a
// connection (its process has closed its sockets).
func waitAppGone(t *testing.T, addr string, killedAt time.Time) time.Time {
	t.Helper()
	for time.Since(killedAt) < 10*time.Second {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err != nil {
			return time.Now()
		}
		c.Close()
		time.Sleep(200 * time.Microsecond)
	}
	t.Fatalf("the app on %s still accepts connections 10s after kill -9", addr)
	return time.Time{}
}

// waitAppBack waits for Nomad's restart of the killed task (a new PID in
// the same allocation), Consul passing both instances again and the
// gateway routing to both.
func waitAppBack(t *testing.T, h *harness, g *gateway, rev, alloc string, killedAt time.Time) {
	t.Helper()
	eventually(t, 90*time.Second, "the killed app restarted, both instances passing and routed", func() (bool, string) {
		resp, err := NewClient(1).Get("http://" + h.appAddr(alloc) + "/stats")
		if err != nil {
			return false, "app: " + err.Error()
		}
		resp.Body.Close()
		pass := len(h.passing(rev))
		routed := len(g.gatewayView(t)[rev].Instances)
		return pass == 2 && routed == 2, fmt.Sprintf("app answers; %d passing, %d routed", pass, routed)
	})
	h.timing("kill -9 of an app -> restarted and back in balancing", time.Since(killedAt))
}

// logAround logs the failures within two seconds of the kill, by time.
func logAround(t *testing.T, res Result, at time.Time) {
	for _, o := range res.Failed() {
		t.Logf("failed at %+.3fs: %s", o.Start.Sub(at).Seconds(), o.Describe())
	}
}

// postLoad runs workers that POST body to path and check the echo.
type postLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	out    Result
}

func startPostLoad(g *gateway, service, path, body string, workers int) *postLoad {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	l := &postLoad{cancel: cancel}
	client := NewClient(2 * workers)
	for range workers {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				o := postOnce(client, g.url()+path, host(service, ""), body)
				l.mu.Lock()
				l.out = append(l.out, o)
				l.mu.Unlock()
			}
		}()
	}
	return l
}

// postOnce sends one POST; an echo that differs from the body is an error.
func postOnce(client *http.Client, url, host, body string) Outcome {
	o := Outcome{Start: time.Now()}
	defer func() { o.End = time.Now() }()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	if err != nil {
		o.Err = err
		return o
	}
	req.Host = host
	resp, err := client.Do(req)
	if err != nil {
		o.Err = err
		return o
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	o.Status, o.Err = resp.StatusCode, err
	o.App = resp.Header.Get("X-Testapp-Name")
	o.RetryAfter = resp.Header.Get("Retry-After") != ""
	if err == nil && o.Status == http.StatusOK && string(b) != body {
		o.Err = fmt.Errorf("echo of %d bytes came back as %d", len(body), len(b))
	}
	return o
}

func (l *postLoad) stop() Result {
	l.cancel()
	l.wg.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.out
}
