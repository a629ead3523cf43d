package e2e

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"

	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/grpcapp"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// Scenario 31: traces in a real Jaeger. serve, the revisions' sidecars
// (through the settings serve publishes and deploy compiles into the job)
// and testapp export over OTLP/HTTP to Jaeger v1.75.0. A request with a
// traceparent wakes a revision from zero, and Jaeger returns its trace:
// the gateway, the hold with the wake's timeline steps (each saying whose
// time it was) and the Nomad scale call the wake made, the forward, the
// sidecar, its queue, the call to the app and testapp's own span, each
// the child of the one before, the gateway's span as long as the client's
// request within 10 ms. A request with sampled=0 exports nothing; a
// traced request's id is the exemplar of the gateway's latency histogram
// (what the dashboard follows to Jaeger); requests with B3 headers, single
// and multiple, join the trace they name. A gRPC call is a trace of its
// own; and with Jaeger stopped requests keep flowing, as fast, while the
// dropped spans are counted.
func TestE2E31Traces(t *testing.T) {
	jaegerBin, err := exec.LookPath("jaeger")
	if err != nil {
		t.Skip("e2e 31 skipped: jaeger is not on PATH (" + JaegerGetHint + ")")
	}
	h := newHarness(t, "31 traces")
	otlp, query, grpcQuery := testbin.FreePort(t), testbin.FreePort(t), testbin.FreePort(t)
	addr := func(p int) string { return "127.0.0.1:" + strconv.Itoa(p) }
	cfgFile := filepath.Join(h.dir, "jaeger.yaml")
	if err := os.WriteFile(cfgFile, []byte(JaegerConfig(addr(otlp), addr(query), addr(grpcQuery))), 0o600); err != nil {
		t.Fatal(err)
	}
	// Jaeger's own OpenTelemetry SDK stays off: it would export Jaeger's
	// spans to the default localhost:4317 and retry for seconds at exit.
	jaeger := testbin.Start(t, jaegerBin, []string{"--config", cfgFile}, map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "none"})
	jaeger.WaitPort(t, otlp, 60*time.Second)
	jaeger.WaitPort(t, query, 60*time.Second)
	queryURL := "http://" + addr(query)
	endpoint := "http://" + addr(otlp)

	// serve gets the standard variables; it publishes them for deploy,
	// which compiles them into the sidecar's task. testapp is the user's
	// app: the user configures it.
	h.env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
	h.env["OTEL_EXPORTER_OTLP_PROTOCOL"] = "http/protobuf"
	const svc = "e2e-traces"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-31", "", "")
	s := testService(svc)
	s.Env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
	h.deploy(h.writeServices("traces.hcl", s))
	job, _, err := h.nomad.Jobs().Info(rev, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range job.TaskGroups[0].Tasks {
		if task.Name == spec.SidecarTaskName && task.Env["OTEL_EXPORTER_OTLP_ENDPOINT"] != endpoint {
			t.Fatalf("the sidecar task's environment %v lacks serve's OTEL_EXPORTER_OTLP_ENDPOINT", task.Env)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}

	// (1) A traced request wakes the revision from zero. The client's
	// connection is open before (a request for a host nobody serves), so
	// the client's time is the request's, as the gateway's span is.
	h.waitZero(rev, 90*time.Second)
	warm, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	warm.Host = "nobody.default.localhost"
	if resp, err := client.Do(warm); err != nil {
		t.Fatal(err)
	} else {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	tid, parent := randomHex(t, 16), randomHex(t, 8)
	o := tracedGet(ctx, t, client, g, svc, "00-"+tid+"-"+parent+"-01")
	if !o.OK() {
		t.Fatalf("traced request at zero: %s", o.Describe())
	}
	took := o.End.Sub(o.Start)
	h.timing("traced request at zero", took)
	var tr JaegerTrace
	eventually(t, 90*time.Second, "Jaeger has the whole trace of the request that woke "+rev, func() (bool, string) {
		var found bool
		tr, found, err = GetJaegerTrace(ctx, queryURL, tid)
		if err != nil || !found {
			return false, fmt.Sprintf("found %v, %v", found, err)
		}
		names := spanNames(tr)
		for _, want := range []string{"gateway", "activator hold", "gateway -> sidecar", "sidecar", "sidecar queue", "sidecar -> app", "testapp", "wake " + rev, "wake: first_byte", "nomad scale"} {
			if !slices.Contains(names, want) {
				return false, fmt.Sprintf("no %q yet among %v", want, names)
			}
		}
		return true, ""
	})
	one := func(name string) JaegerSpan {
		t.Helper()
		spans := tr.Named(name)
		if len(spans) != 1 {
			t.Fatalf("%d spans %q in the trace, want 1 (all: %v)", len(spans), name, spanNames(tr))
		}
		return spans[0]
	}
	gw, hold, fwd := one("gateway"), one("activator hold"), one("gateway -> sidecar")
	sc, q, toApp, app := one("sidecar"), one("sidecar queue"), one("sidecar -> app"), one("testapp")
	wake := one("wake " + rev)
	// The wake's scale-up, as the autoscaler wrote it to Nomad: a span of
	// its own under the hold of the request that caused it.
	scale := one("nomad scale")
	for _, c := range []struct {
		child, parent JaegerSpan
		service       string
	}{
		{gw, JaegerSpan{SpanID: parent}, "nomad-serverless"},
		{hold, gw, "nomad-serverless"},
		{fwd, gw, "nomad-serverless"},
		{wake, hold, "nomad-serverless"},
		{scale, hold, "nomad-serverless"},
		{sc, fwd, "nomad-serverless-sidecar"},
		{q, sc, "nomad-serverless-sidecar"},
		{toApp, sc, "nomad-serverless-sidecar"},
		{app, toApp, "testapp"},
	} {
		if c.child.Parent() != c.parent.SpanID || tr.Service(c.child) != c.service {
			t.Errorf("span %q of %s: parent %s, want %s (%q)", c.child.OperationName, tr.Service(c.child), c.child.Parent(), c.parent.SpanID, c.parent.OperationName)
		}
	}
	if gw.Tag("serverless.revision") != rev || gw.Tag("serverless.service") != svc || gw.Tag("http.response.status_code") != "200" || gw.Tag("serverless.retries") != "0" {
		t.Errorf("gateway span's tags %v", gw.Tags)
	}
	steps := 0
	sort.Slice(tr.Spans, func(i, j int) bool { return tr.Spans[i].StartTime < tr.Spans[j].StartTime })
	for _, st := range tr.Spans {
		if !strings.HasPrefix(st.OperationName, "wake: ") {
			continue
		}
		steps++
		whose := st.Tag("serverless.wake.whose")
		if st.Parent() != wake.SpanID || !slices.Contains([]string{"ours", "nomad", "app", "consul"}, whose) {
			t.Errorf("step %q: parent %s (wake %s), whose %q", st.OperationName, st.Parent(), wake.SpanID, whose)
		}
		t.Logf("  %-32s %-6s +%s (%s)", st.OperationName, whose, FormatDuration(st.Start().Sub(wake.Start())), FormatDuration(st.Took()))
	}
	if steps < 8 {
		t.Errorf("%d timeline steps in the trace, want the wake's (at least 8)", steps)
	}
	// The scale call is made after the hold began and before Nomad placed
	// the allocation; it asked for one instance.
	if scale.Tag("serverless.revision") != rev || scale.Tag("serverless.scale.count") != "1" || scale.Start().Before(hold.Start()) {
		t.Errorf("nomad scale span: tags %v, start %s (hold %s)", scale.Tags, scale.Start(), hold.Start())
	}
	if placed := tr.Named("wake: allocation_placed"); len(placed) == 1 && scale.Start().After(placed[0].Start().Add(placed[0].Took())) {
		t.Errorf("nomad scale span starts at %s, after the allocation was placed (%s)", scale.Start(), placed[0].Start().Add(placed[0].Took()))
	}
	t.Logf("  %-32s %-6s +%s (%s)", scale.OperationName, "nomad", FormatDuration(scale.Start().Sub(hold.Start())), FormatDuration(scale.Took()))
	// One clock (this machine): the gateway's span is within the client's
	// request, and at most 10 ms shorter.
	if d := took - gw.Took(); d < -time.Millisecond || d > 10*time.Millisecond {
		t.Errorf("gateway span %s, client's request %s: %s apart, want within 10 ms", gw.Took(), took, d)
	}
	if hold.Took() > gw.Took() || sc.Took() > fwd.Took() || app.Took() > toApp.Took() {
		t.Errorf("a child outlasts its parent: hold %s gateway %s; sidecar %s forward %s; testapp %s call %s", hold.Took(), gw.Took(), sc.Took(), fwd.Took(), app.Took(), toApp.Took())
	}
	h.timing("trace: gateway span vs client", took-gw.Took())

	// (2) sampled=0 exports nothing: a sampled request sent after it
	// arrives whole, and the unsampled one is still not in Jaeger.
	unsampled := randomHex(t, 16)
	if o := tracedGet(ctx, t, client, g, svc, "00-"+unsampled+"-"+randomHex(t, 8)+"-00"); !o.OK() {
		t.Fatalf("request with sampled=0: %s", o.Describe())
	}
	marker := randomHex(t, 16)
	if o := tracedGet(ctx, t, client, g, svc, "00-"+marker+"-"+randomHex(t, 8)+"-01"); !o.OK() {
		t.Fatalf("marker request: %s", o.Describe())
	}
	eventually(t, 60*time.Second, "Jaeger has the marker request's testapp span", func() (bool, string) {
		mt, found, err := GetJaegerTrace(ctx, queryURL, marker)
		return found && len(mt.Named("testapp")) == 1 && len(mt.Named("gateway")) == 1, fmt.Sprintf("found %v, %v", found, err)
	})
	if _, found, err := GetJaegerTrace(ctx, queryURL, unsampled); found || err != nil {
		t.Errorf("a request with sampled=0 was exported (found %v, %v)", found, err)
	}
	// The gateway's latency histogram links the marker request to its
	// trace (an exemplar with its trace id, in the OpenMetrics format a
	// Prometheus with exemplar storage asks for): the link the dashboard's
	// Latency panel follows to Jaeger.
	eventually(t, 30*time.Second, "the gateway's latency histogram has the marker's trace id as an exemplar", func() (bool, string) {
		page, err := openMetrics(ctx, g.adminURL()+"/metrics")
		if err != nil {
			return false, err.Error()
		}
		for _, line := range strings.Split(page, "\n") {
			if strings.HasPrefix(line, "nomad_serverless_gateway_request_duration_seconds_bucket") && strings.Contains(line, `# {trace_id="`+marker+`"}`) {
				return true, ""
			}
		}
		return false, "no exemplar with trace_id " + marker
	})

	// B3 (Zipkin's headers, single and multiple): the request joins the
	// trace the headers name, its gateway span the child of their span.
	for _, style := range []string{"single", "multi"} {
		b3tid, b3span := randomHex(t, 16), randomHex(t, 8)
		headers := map[string]string{"b3": b3tid + "-" + b3span + "-1"}
		if style == "multi" {
			headers = map[string]string{"X-B3-TraceId": b3tid, "X-B3-SpanId": b3span, "X-B3-Sampled": "1"}
		}
		if o := headerGet(ctx, t, client, g, svc, headers); !o.OK() {
			t.Fatalf("request with B3 (%s): %s", style, o.Describe())
		}
		eventually(t, 60*time.Second, "Jaeger has the trace of the request with B3 headers ("+style+")", func() (bool, string) {
			bt, found, err := GetJaegerTrace(ctx, queryURL, b3tid)
			if !found {
				return false, fmt.Sprintf("found %v, %v", found, err)
			}
			gws := bt.Named("gateway")
			if len(gws) != 1 || len(bt.Named("testapp")) != 1 {
				return false, fmt.Sprintf("spans %v", spanNames(bt))
			}
			if gws[0].Parent() != b3span {
				return false, fmt.Sprintf("gateway span's parent %s, want the B3 span %s", gws[0].Parent(), b3span)
			}
			return true, ""
		})
	}

	// (3) A gRPC call is a trace like any request (HTTP/2 end to end).
	grpcSvc := svc + "-grpc"
	grpcRev := revision(grpcSvc, 1)
	h.cleanupService(grpcSvc)
	gs := Service{Name: grpcSvc, Binary: testbin.Program(t, grpcapp.Command), GRPC: true, Concurrency: 10, Scaling: FastScaling()}
	h.deploy(h.writeServices("traces-grpc.hcl", gs))
	gc := grpcapp.Dial(t, g.listen, host(grpcSvc, ""))
	gtid := randomHex(t, 16)
	cctx := metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+gtid+"-"+randomHex(t, 8)+"-01")
	if resp, err := gc.UnaryCall(cctx, &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("traced")}}); err != nil || resp.GetServerId() != grpcRev {
		t.Fatalf("traced gRPC call: %v (server %q)", err, resp.GetServerId())
	}
	eventually(t, 60*time.Second, "Jaeger has the gRPC call's trace", func() (bool, string) {
		gt, found, err := GetJaegerTrace(ctx, queryURL, gtid)
		if !found {
			return false, fmt.Sprintf("found %v, %v", found, err)
		}
		gws, scs := gt.Named("gateway"), gt.Named("sidecar")
		if len(gws) != 1 || len(scs) != 1 || len(gt.Named("sidecar -> app")) != 1 {
			return false, fmt.Sprintf("spans %v", spanNames(gt))
		}
		if gws[0].Tag("network.protocol.version") != "2" || gws[0].Tag("url.path") != "/grpc.testing.TestService/UnaryCall" || gws[0].Tag("serverless.revision") != grpcRev {
			return false, fmt.Sprintf("gateway span tags %v", gws[0].Tags)
		}
		return true, ""
	})

	// (4) Jaeger stopped: requests flow as fast as before, and the spans
	// that cannot go are dropped and counted.
	measure := func(n int) (time.Duration, []Outcome) {
		var all []Outcome
		var ds []time.Duration
		for range n {
			o := tracedGet(ctx, t, client, g, svc, "00-"+randomHex(t, 16)+"-"+randomHex(t, 8)+"-01")
			all = append(all, o)
			ds = append(ds, o.End.Sub(o.Start))
		}
		sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
		return ds[len(ds)/2], all
	}
	if o := tracedGet(ctx, t, client, g, svc, ""); !o.OK() { // the revision may have gone to zero meanwhile
		t.Fatalf("warm-up request: %s", o.Describe())
	}
	up, _ := measure(50)
	// Killed, not stopped: a collector that vanishes (its own shutdown
	// would also take seconds, flushing its self-telemetry).
	if err := jaeger.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-jaeger.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("Jaeger did not die of SIGKILL within 30s")
	}
	down, outs := measure(50)
	for _, o := range outs {
		if !o.OK() {
			t.Fatalf("with Jaeger stopped a request failed: %s", o.Describe())
		}
	}
	h.timing("traced request, Jaeger up (median)", up)
	h.timing("traced request, Jaeger stopped (median)", down)
	if down > 2*up+10*time.Millisecond {
		t.Errorf("with Jaeger stopped the median request took %s, against %s with Jaeger up", down, up)
	}
	eventually(t, 60*time.Second, "serve counts the spans it could not export", func() (bool, string) {
		n, err := metricSum(ctx, g.adminURL()+"/metrics", "nomad_serverless_trace_spans_dropped_total")
		return err == nil && n > 0, fmt.Sprintf("dropped %v, %v", n, err)
	})
}

// tracedGet sends GET / to a service through the gateway with a
// traceparent ("" for none).
func tracedGet(ctx context.Context, t *testing.T, c *http.Client, g *gateway, svc, traceparent string) Outcome {
	t.Helper()
	var h map[string]string
	if traceparent != "" {
		h = map[string]string{"traceparent": traceparent}
	}
	return headerGet(ctx, t, c, g, svc, h)
}

// headerGet sends GET / to a service through the gateway with headers.
func headerGet(ctx context.Context, t *testing.T, c *http.Client, g *gateway, svc string, headers map[string]string) Outcome {
	t.Helper()
	o := Outcome{Start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, g.url()+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Host = host(svc, "")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		o.Err, o.End = err, time.Now()
		return o
	}
	o.FirstByte = time.Now()
	_, o.Err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	o.Status, o.End = resp.StatusCode, time.Now()
	return o
}

// openMetrics reads a /metrics page in the OpenMetrics format, the one
// that carries exemplars.
func openMetrics(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func randomHex(t *testing.T, n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func spanNames(tr JaegerTrace) []string {
	var out []string
	for _, s := range tr.Spans {
		out = append(out, s.OperationName)
	}
	sort.Strings(out)
	return out
}

// metricSum adds up every sample of a counter in a Prometheus text page.
func metricSum(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, err
	}
	sum := 0.0
	for _, line := range strings.Split(string(b), "\n") {
		if !strings.HasPrefix(line, name) {
			continue
		}
		f := strings.Fields(line)
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err == nil {
			sum += v
		}
	}
	return sum, nil
}
