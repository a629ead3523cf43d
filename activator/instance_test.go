package activator

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/testapp"
)

// procInstance is one instance as Nomad runs it: `nomad-serverless
// testapp` and `nomad-serverless sidecar` processes, the sidecar on port.
type procInstance struct {
	id             string
	port, appPort  int
	app, sidecar   *testbin.Proc
	concurrency    int
	revision, host string
}

// startProcInstance starts a test app and its sidecar for revision
// hello-00001 and waits until the sidecar answers its probe.
func startProcInstance(t *testing.T, id string, concurrency int) *procInstance {
	t.Helper()
	if testing.Short() {
		t.Skip("component test with real processes (skipped in -short)")
	}
	bin := testbin.Path(t)
	in := &procInstance{id: id, appPort: testbin.FreePort(t), port: testbin.FreePort(t), concurrency: concurrency,
		revision: "hello-00001", host: "127.0.0.1"}
	in.app = testbin.Start(t, bin, []string{"testapp"}, map[string]string{
		testapp.EnvPort: strconv.Itoa(in.appPort), testapp.EnvName: id})
	in.app.WaitPort(t, in.appPort, 20*time.Second)
	cfg := spec.SidecarConfig{
		Service: "hello", Revision: in.revision, Instance: id,
		Concurrency: concurrency, QueueDepth: concurrency * spec.DefaultQueueDepthFactor,
		Timeout: 30 * time.Second, DrainTimeout: 5 * time.Second,
	}
	env := cfg.Env()
	env[spec.EnvSidecarPort] = strconv.Itoa(in.port)
	env[spec.EnvSidecarAppPort] = strconv.Itoa(in.appPort)
	env[spec.EnvSidecarAdminPort] = strconv.Itoa(testbin.FreePort(t))
	in.sidecar = testbin.Start(t, bin, []string{"sidecar"}, env)
	testbin.Eventually(t, 20*time.Second, 5*time.Millisecond, "sidecar "+id+" ready", func() (bool, string) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+in.addr()+"/", nil)
		req.Header.Set(spec.ProbeHeader, spec.ProbeHeaderValue)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return false, err.Error()
		}
		resp.Body.Close()
		return resp.StatusCode == 200, resp.Status
	})
	return in
}

func (in *procInstance) addr() string { return net.JoinHostPort(in.host, strconv.Itoa(in.port)) }

func (in *procInstance) consul() consulroute.Instance {
	return consulroute.Instance{ID: "c-" + in.id, Revision: in.revision, Address: in.host, Port: in.port}
}

func (in *procInstance) allocation(running bool) catalog.Allocation {
	return catalog.Allocation{ID: in.id, Revision: in.revision, Address: in.host, Port: in.port, Running: running}
}

// appStats reads the test app's own counters.
func (in *procInstance) appStats(t *testing.T) testapp.Stats {
	t.Helper()
	var st testapp.Stats
	getJSONTo(t, "http://127.0.0.1:"+strconv.Itoa(in.appPort)+"/stats", &st)
	return st
}

// procGateway is a gateway in this process in front of process instances,
// as serve runs it: the listener screened, the catalog saying what Nomad
// and Consul would (every instance Running and passing until told).
type procGateway struct {
	*testGateway
	cat  *catalog.Catalog
	addr string
}

func startProcGateway(t *testing.T, concurrency int, mod func(*Config), ins ...*procInstance) *procGateway {
	t.Helper()
	cat := oneRevision(concurrency, time.Minute)
	var ready []consulroute.Instance
	for _, in := range ins {
		cat.SetAllocation(in.allocation(true))
		ready = append(ready, in.consul())
	}
	cat.SetReady("hello-00001", ready)
	tg := startGateway(t, cat, nil, mod)
	addr := serveScreened(t, tg.g)
	waitFor(t, "every instance routable", func() bool { return len(tg.g.routable("hello-00001")) == len(ins) })
	return &procGateway{testGateway: tg, cat: cat, addr: addr}
}

// serveScreened serves g's Server on a screened listener of its own
// (Listener), as `serve` is meant to, until the test ends, and returns
// its address.
func serveScreened(t *testing.T, g *Gateway) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := g.Server("")
	go func() { _ = srv.Serve(g.Listener(ln)) }()
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// url is the screened listener's base URL.
func (pg *procGateway) url() string { return "http://" + pg.addr }

func getJSONTo(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}
