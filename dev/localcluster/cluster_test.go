package localcluster

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// The cluster is the autoscaler's test scaler.
var _ autoscaler.Scaler = (*Cluster)(nil)

func newCluster(t *testing.T, opts Options) (*Cluster, *catalog.Catalog) {
	t.Helper()
	opts.Binary = testbin.Path(t)
	out := &testbin.Buffer{}
	opts.Output = out
	cat := catalog.New()
	c, err := New(cat, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		if t.Failed() {
			t.Logf("process output:\n%s", out.String())
		}
	})
	return c, cat
}

func waitFor(t *testing.T, what string, d time.Duration, cond func() bool) {
	t.Helper()
	testbin.Eventually(t, d, 5*time.Millisecond, what, func() (bool, string) { return cond(), "" })
}

func running(cat *catalog.Catalog, rev string) []catalog.Allocation {
	var out []catalog.Allocation
	for _, a := range cat.Allocations(rev) {
		if a.Running {
			out = append(out, a)
		}
	}
	return out
}

func get(t *testing.T, url string, hdr map[string]string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := client.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestNewValidates(t *testing.T) {
	if _, err := New(nil, Options{Binary: "/bin/true"}); err == nil {
		t.Error("nil catalog accepted")
	}
	if _, err := New(catalog.New(), Options{}); err == nil {
		t.Error("empty binary accepted")
	}
	if _, err := New(catalog.New(), Options{Binary: "/nonexistent/binary"}); err == nil || !strings.Contains(err.Error(), "/nonexistent/binary") {
		t.Errorf("missing binary: %v", err)
	}
	if _, err := New(catalog.New(), Options{Binary: os.TempDir()}); err == nil {
		t.Error("a directory accepted as binary")
	}
}

func TestAddRevisionAndRouteValidate(t *testing.T) {
	c, err := New(catalog.New(), Options{Binary: "/bin/true"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.AddRevision(catalog.Revision{Name: "not a revision name"}, App{}); err == nil {
		t.Error("revision without service and with a bad name accepted")
	}
	if err := c.AddRevision(catalog.Revision{Name: "hello-00001"}, App{}); err != nil {
		t.Fatal(err)
	}
	rev, ok := c.Catalog().Revision("hello-00001")
	if !ok || rev.Service != "hello" || rev.Namespace != "default" || rev.Timeout != spec.DefaultTimeout || rev.Scaling.Target != 100 {
		t.Fatalf("defaults not applied: %+v", rev)
	}
	if err := c.AddRevision(catalog.Revision{Name: "hello-00001"}, App{}); err == nil {
		t.Error("duplicate revision accepted")
	}
	bad := catalog.Service{Name: "hello", Route: consulroute.Route{Splits: []consulroute.Split{{Revision: "hello-00001", Percent: 60}}}}
	if err := c.SetRoute(bad); err == nil || !strings.Contains(err.Error(), "add to 60") {
		t.Errorf("splits adding to 60: %v", err)
	}
	unknown := catalog.Service{Name: "hello", Route: consulroute.Route{Splits: []consulroute.Split{{Revision: "hello-00009", Percent: 100}}}}
	if err := c.SetRoute(unknown); err == nil || !strings.Contains(err.Error(), "hello-00009") {
		t.Errorf("unknown revision: %v", err)
	}
	if err := c.Scale(context.Background(), "nope-00001", 1, "", nil); err == nil {
		t.Error("scaling an unknown revision accepted")
	}
	if err := c.Scale(context.Background(), "hello-00001", -1, "", nil); err == nil {
		t.Error("negative count accepted")
	}
}

// The whole life of instances: Nomad-like Running at process start,
// Consul-like ready only after a check, stop before signal, processes gone
// after Close.
func TestScaleUpServeAndDown(t *testing.T) {
	c, cat := newCluster(t, Options{CheckInterval: 200 * time.Millisecond, ShutdownDelay: 100 * time.Millisecond})
	if err := c.AddRevision(catalog.Revision{Name: "hello-00001", Concurrency: 4, Timeout: 10 * time.Second}, App{Name: "hi"}); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(context.Background(), "hello-00001", 2, "test up", map[string]string{"k": "v"}); err != nil {
		t.Fatal(err)
	}
	if rev, _ := cat.Revision("hello-00001"); rev.Desired != 2 {
		t.Fatalf("catalog desired = %d, want 2", rev.Desired)
	}
	waitFor(t, "2 running allocations", 20*time.Second, func() bool { return len(running(cat, "hello-00001")) == 2 })
	// Running comes before the simulated Consul check passes.
	if n := len(cat.Ready("hello-00001")); n == 2 {
		t.Log("both instances were already ready when Running was first seen (slow test machine?)")
	}
	waitFor(t, "2 ready instances", 20*time.Second, func() bool { return len(cat.Ready("hello-00001")) == 2 })

	for _, in := range cat.Ready("hello-00001") {
		url := "http://" + in.HostPort() + "/"
		if code, body := get(t, url, map[string]string{spec.ProbeHeader: spec.ProbeHeaderValue}); code != 200 || strings.TrimSpace(body) != "queue" {
			t.Fatalf("probe of %s: %d %q", in.HostPort(), code, body)
		}
		if code, body := get(t, url, nil); code != 200 || strings.TrimSpace(body) != "ok" {
			t.Fatalf("request to %s: %d %q", in.HostPort(), code, body)
		}
		if in.AdminPort == 0 || !strings.HasPrefix(in.ID, "_nomad-task-") {
			t.Fatalf("instance %+v lacks Nomad-style ID or admin port", in)
		}
	}
	tm := c.Timings("hello-00001")
	if len(tm) != 2 {
		t.Fatalf("%d timings, want 2", len(tm))
	}
	for _, x := range tm {
		if x.ScaleCalled.IsZero() || x.Started.Before(x.ScaleCalled) || x.SidecarListening.Before(x.Started) ||
			x.AppListening.IsZero() || x.FirstCheckPass.Before(x.Started.Add(200*time.Millisecond)) {
			t.Fatalf("timings out of order: %+v", x)
		}
	}

	before := cat.Ready("hello-00001")
	if err := c.Scale(context.Background(), "hello-00001", 1, "test down", nil); err != nil {
		t.Fatal(err)
	}
	// At once: one allocation not Running, one ready instance.
	if n := len(running(cat, "hello-00001")); n != 1 {
		t.Fatalf("%d running right after the scale down, want 1", n)
	}
	if n := len(cat.Ready("hello-00001")); n != 1 {
		t.Fatalf("%d ready right after the scale down, want 1", n)
	}
	waitFor(t, "the stopped allocation to disappear", 20*time.Second, func() bool { return len(cat.Allocations("hello-00001")) == 1 })
	var stopped consulroute.Instance
	for _, in := range before {
		if in != cat.Ready("hello-00001")[0] {
			stopped = in
		}
	}
	if _, err := net.DialTimeout("tcp", stopped.HostPort(), time.Second); err == nil {
		t.Fatalf("stopped instance %s still listens", stopped.HostPort())
	}
	tm = c.Timings("hello-00001")
	last := tm[len(tm)-1]
	if last.Stopping.IsZero() || last.Stopped.Sub(last.Stopping) < 100*time.Millisecond || last.ExitErr != "" {
		t.Fatalf("stop: shutdown delay not honoured or unclean exit: %+v", last)
	}
	ev := c.ScaleEvents("hello-00001")
	if len(ev) != 2 || ev[0].To != 2 || ev[0].Reason != "test up" || ev[0].Meta["k"] != "v" || ev[1].From != 2 || ev[1].To != 1 {
		t.Fatalf("scale events %+v", ev)
	}
	if c.Wakes("hello-00001") != 1 {
		t.Fatalf("wakes = %d, want 1", c.Wakes("hello-00001"))
	}

	alive := cat.Ready("hello-00001")[0]
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := net.DialTimeout("tcp", alive.HostPort(), time.Second); err == nil {
		t.Fatalf("instance %s still listens after Close", alive.HostPort())
	}
	if n := len(cat.Allocations("hello-00001")) + len(cat.Ready("hello-00001")); n != 0 {
		t.Fatalf("catalog still holds %d allocations/instances after Close", n)
	}
	if err := c.Scale(context.Background(), "hello-00001", 1, "", nil); err == nil {
		t.Fatal("Scale after Close accepted")
	}
}

// An instance whose process dies leaves the catalog at once and is
// replaced, like a Nomad reschedule.
func TestDeadInstanceIsReplaced(t *testing.T) {
	c, cat := newCluster(t, Options{CheckInterval: 100 * time.Millisecond})
	if err := c.AddRevision(catalog.Revision{Name: "hello-00001", Timeout: 10 * time.Second}, App{}); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(context.Background(), "hello-00001", 1, "", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", 20*time.Second, func() bool { return len(cat.Ready("hello-00001")) == 1 })
	first := running(cat, "hello-00001")[0]
	// The ready instance's (an earlier one may have died at the start, its
	// port taken meanwhile by another process, and been replaced).
	pid := 0
	for _, x := range c.Timings("hello-00001") {
		if x.Alloc == first.ID {
			pid = x.AppPID
		}
	}
	if pid == 0 {
		t.Fatal("no app pid")
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a replacement", 20*time.Second, func() bool {
		r := running(cat, "hello-00001")
		return len(r) == 1 && r[0].ID != first.ID && len(cat.Ready("hello-00001")) == 1
	})
	var ready int
	for _, x := range c.Timings("hello-00001") {
		if !x.FirstCheckPass.IsZero() {
			ready++
		}
	}
	if ready != 2 {
		t.Fatalf("%d instances became ready, want 2 (the first and its replacement): %+v", ready, c.Timings("hello-00001"))
	}
}

func TestReadyDelayIsSeenByChecks(t *testing.T) {
	c, cat := newCluster(t, Options{CheckInterval: 50 * time.Millisecond})
	if err := c.AddRevision(catalog.Revision{Name: "slow-00001", Timeout: 10 * time.Second}, App{ReadyDelay: 700 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := c.Scale(context.Background(), "slow-00001", 1, "", nil); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "ready", 20*time.Second, func() bool { return len(cat.Ready("slow-00001")) == 1 })
	var x InstanceTiming // the ready one (see TestDeadInstanceIsReplaced)
	for _, y := range c.Timings("slow-00001") {
		if !y.FirstCheckPass.IsZero() {
			x = y
		}
	}
	// The app's delay counts from its start, which comes after the Scale
	// call: the check passes no sooner than that after the call. (After
	// the app listened is no sound bound: the cluster sees the port open
	// up to a busy machine's scheduling delay late.)
	if d := x.FirstCheckPass.Sub(x.ScaleCalled); d < 700*time.Millisecond {
		t.Fatalf("ready %s after the Scale call, before the app's 700ms ready delay", d)
	}
	t.Logf("ready %s after the app was seen listening", x.FirstCheckPass.Sub(x.AppListening).Round(time.Millisecond))
	url := "http://" + cat.Ready("slow-00001")[0].HostPort() + "/"
	if code, _ := get(t, url, nil); code != 200 {
		t.Fatalf("request: %d", code)
	}
}
