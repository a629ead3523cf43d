package sidecar_test

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// sidecarEnv is the environment of a sidecar process in front of appPort.
func sidecarEnv(port, appPort, adminPort int) map[string]string {
	return map[string]string{
		spec.EnvSidecarPort:      strconv.Itoa(port),
		spec.EnvSidecarAppPort:   strconv.Itoa(appPort),
		spec.EnvSidecarAdminPort: strconv.Itoa(adminPort),
		spec.EnvSidecarService:   "hello",
		spec.EnvSidecarRevision:  "hello-00001",
		spec.EnvSidecarInstance:  "alloc-1",
	}
}

// SIGTERM under load: the probe fails at once; requests in flight, queued
// and still arriving (from a gateway that has not yet seen the probe fail)
// are all answered; the app served exactly what the clients got back.
func TestDrainUnderLoadLosesNothing(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	port, admin := testbin.FreePort(t), testbin.FreePort(t)
	env := sidecarEnv(port, a.port, admin)
	env[spec.EnvSidecarConcurrency] = "4"
	env[spec.EnvSidecarQueueDepth] = "100"
	env[spec.EnvSidecarDrainGrace] = "1500ms"
	env[spec.EnvSidecarDrainLimit] = "10s"
	sc := testbin.Start(t, testbin.Path(t), []string{"sidecar"}, env)
	sc.WaitPort(t, port, 20*time.Second)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	r := &running{url: url, adminURL: "http://127.0.0.1:" + strconv.Itoa(admin)}
	r.waitReady(t)
	a.post(t, "/reset")

	// Sixteen clients against a limit of four: requests are in the app
	// and queued at every moment.
	const clients = 16
	var ok, failed, bad atomic.Int64
	var errs sync.Map
	var wg sync.WaitGroup
	client := newClient(clients)
	stopSending := make(chan struct{})
	for c := 0; c < clients; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stopSending:
					return
				default:
				}
				resp, err := client.Get(url + "/?sleep=50ms")
				if err != nil {
					failed.Add(1)
					errs.Store(err.Error(), true)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					ok.Add(1)
				} else {
					bad.Add(1)
				}
			}
		}()
	}
	waitUntil(t, "load flowing, some queued", func() bool { return ok.Load() > 50 })
	okAtTerm := ok.Load()
	if err := sc.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	// The probe fails at once, while the sidecar still serves requests.
	waitUntil(t, "the probe fails after SIGTERM", func() bool { c, _ := probe(t, url); return c == http.StatusServiceUnavailable })
	if _, body := probe(t, url); !strings.Contains(body, "draining") {
		t.Fatalf("probe body during drain %q", body)
	}
	// A gateway stops sending once Consul has seen the probe fail; until
	// then (well within the grace) requests keep arriving.
	time.Sleep(300 * time.Millisecond)
	close(stopSending)
	wg.Wait()
	code, err := sc.Wait(20 * time.Second)
	if err != nil || code != 0 {
		t.Fatalf("sidecar exit %d, %v", code, err)
	}
	if failed.Load() != 0 || bad.Load() != 0 {
		var list []string
		errs.Range(func(k, _ any) bool { list = append(list, k.(string)); return true })
		t.Fatalf("%d requests failed, %d not 200 (errors: %v)", failed.Load(), bad.Load(), list)
	}
	if ok.Load() <= okAtTerm {
		t.Fatal("no request completed after SIGTERM")
	}
	// Every request the app served came back to a client.
	if st := a.stats(t); st.Requests != ok.Load() {
		t.Fatalf("the app served %d requests, clients got %d answers", st.Requests, ok.Load())
	}
	// The sidecar recorded the drain: the requests in flight at SIGTERM
	// and those that arrived after it all completed.
	rep := drainedLog(t, sc.Output())
	if rep.InFlight == 0 || rep.Arrived == 0 || rep.Completed != rep.InFlight+rep.Arrived || rep.Abandoned != 0 || rep.Waited == "" {
		t.Fatalf("drain record %+v", rep)
	}
	t.Logf("answered %d (%d after SIGTERM); drain record %+v", ok.Load(), ok.Load()-okAtTerm, rep)
}

type drainRecord struct {
	Waited    string `json:"waited"`
	InFlight  int    `json:"in_flight_at_start"`
	Arrived   int    `json:"arrived_during_drain"`
	Completed int    `json:"completed_during_drain"`
	Abandoned int    `json:"abandoned"`
}

func drainedLog(t *testing.T, out string) drainRecord {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var line struct {
			Msg string `json:"msg"`
			drainRecord
		}
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "drained" {
			return line.drainRecord
		}
	}
	t.Fatalf("no \"drained\" log line in:\n%s", out)
	return drainRecord{}
}

// A wrong environment stops the sidecar at start with every problem named.
func TestBadConfigurationExitsWithReasons(t *testing.T) {
	t.Parallel()
	env := map[string]string{
		spec.EnvSidecarPort:        "8080",
		spec.EnvSidecarAppPort:     "99999",
		spec.EnvSidecarConcurrency: "-1",
		spec.EnvSidecarTimeout:     "soon",
		spec.EnvSidecarService:     "",
		spec.EnvSidecarRevision:    "",
		spec.EnvSidecarAdminPort:   "",
	}
	p := testbin.Start(t, testbin.Path(t), []string{"sidecar"}, env)
	code, err := p.Wait(20 * time.Second)
	if err != nil || code != 2 {
		t.Fatalf("exit %d, %v; want 2", code, err)
	}
	out := p.Output()
	for _, want := range []string{spec.EnvSidecarAppPort, spec.EnvSidecarConcurrency, spec.EnvSidecarTimeout,
		spec.EnvSidecarService, spec.EnvSidecarAdminPort, "queue-proxy task"} {
		if !strings.Contains(out, want) {
			t.Errorf("output does not mention %s:\n%s", want, out)
		}
	}
}

// The access log is off by default and, when on, has one JSON line per
// request with method, path, status, duration and bytes.
func TestAccessLog(t *testing.T) {
	t.Parallel()
	a := startApp(t, nil)
	port, admin := testbin.FreePort(t), testbin.FreePort(t)
	env := sidecarEnv(port, a.port, admin)
	env[spec.EnvSidecarAccessLog] = "true"
	sc := testbin.Start(t, testbin.Path(t), []string{"sidecar"}, env)
	sc.WaitPort(t, port, 20*time.Second)
	url := "http://127.0.0.1:" + strconv.Itoa(port)
	if code, _ := get(t, url+"/some/path?size=1234"); code != 200 {
		t.Fatal(code)
	}
	waitUntil(t, "an access log line", func() bool { return strings.Contains(sc.Output(), `"path":"/some/path"`) })
	sc.Stop(t)
	var line struct {
		Msg      string  `json:"msg"`
		Method   string  `json:"method"`
		Path     string  `json:"path"`
		Status   int     `json:"status"`
		Duration float64 `json:"duration_ms"`
		Bytes    int     `json:"bytes"`
	}
	for _, l := range strings.Split(sc.Output(), "\n") {
		if strings.Contains(l, `"path":"/some/path"`) {
			if err := json.Unmarshal([]byte(l), &line); err != nil {
				t.Fatal(err)
			}
		}
	}
	if line.Msg != "request" || line.Method != "GET" || line.Status != 200 || line.Bytes != 1234 || line.Duration <= 0 {
		t.Fatalf("access log line %+v", line)
	}

	// Off by default: no request lines.
	port2, admin2 := testbin.FreePort(t), testbin.FreePort(t)
	quiet := testbin.Start(t, testbin.Path(t), []string{"sidecar"}, sidecarEnv(port2, a.port, admin2))
	quiet.WaitPort(t, port2, 20*time.Second)
	get(t, "http://127.0.0.1:"+strconv.Itoa(port2)+"/quiet")
	quiet.Stop(t)
	if strings.Contains(quiet.Output(), "/quiet") {
		t.Fatalf("access log on by default:\n%s", quiet.Output())
	}
}
