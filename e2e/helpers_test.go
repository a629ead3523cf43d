package e2e

// Unit tests of the suite's helpers. They need no agents and run under plain
// `go test ./e2e/` whatever TestMain decided.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
	nomad "github.com/hashicorp/nomad/api"

	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

func TestUnitDecide(t *testing.T) {
	found := func(have ...string) func(string) (string, error) {
		return func(name string) (string, error) {
			for _, h := range have {
				if h == name {
					if strings.Contains(name, "/") {
						return name, nil
					}
					return "/usr/bin/" + name, nil
				}
			}
			return "", errors.New("not found")
		}
	}
	envOf := func(kv map[string]string) func(string) string { return func(k string) string { return kv[k] } }
	for _, tc := range []struct {
		name     string
		env      map[string]string
		have     []string
		mode     Mode
		skipLine string
	}{
		{"running agents win over PATH", map[string]string{"NOMAD_ADDR": "http://10.0.0.1:4646", "CONSUL_HTTP_ADDR": "10.0.0.1:8500"}, []string{"nomad", "consul"}, UseRunning, ""},
		{"both binaries", nil, []string{"nomad", "consul"}, StartAgents, ""},
		{"neither", nil, nil, Skip,
			"e2e: SKIPPED: nomad and consul are not on PATH and NOMAD_ADDR/CONSUL_HTTP_ADDR are not set (install from https://developer.hashicorp.com/nomad/install and https://developer.hashicorp.com/consul/install)"},
		{"consul only", nil, []string{"consul"}, Skip,
			"e2e: SKIPPED: nomad is not on PATH and NOMAD_ADDR/CONSUL_HTTP_ADDR are not set (install from https://developer.hashicorp.com/nomad/install)"},
		{"nomad only", nil, []string{"nomad"}, Skip,
			"e2e: SKIPPED: consul is not on PATH and NOMAD_ADDR/CONSUL_HTTP_ADDR are not set (install from https://developer.hashicorp.com/consul/install)"},
		{"NOMAD_BIN and CONSUL_BIN over PATH", map[string]string{"NOMAD_BIN": "/opt/nomad-2.0/nomad", "CONSUL_BIN": "/opt/consul-1.22/consul"}, []string{"/opt/nomad-2.0/nomad", "/opt/consul-1.22/consul"}, StartAgents, ""},
		{"NOMAD_BIN alone, consul on PATH", map[string]string{"NOMAD_BIN": "/opt/nomad-2.0/nomad"}, []string{"/opt/nomad-2.0/nomad", "consul"}, StartAgents, ""},
		{"NOMAD_BIN that is not there", map[string]string{"NOMAD_BIN": "/opt/nomad"}, []string{"nomad", "consul"}, Misconfigured,
			"e2e: NOT RUN: NOMAD_BIN=/opt/nomad: not found"},
		{"half the addresses", map[string]string{"NOMAD_ADDR": "http://x:4646"}, []string{"nomad", "consul"}, Misconfigured,
			"e2e: NOT RUN: NOMAD_ADDR is set but CONSUL_HTTP_ADDR is not: set both to use running agents, or neither to let the suite start dev agents"},
	} {
		p := Decide(envOf(tc.env), found(tc.have...))
		if p.Mode != tc.mode {
			t.Errorf("%s: mode %d, want %d", tc.name, p.Mode, tc.mode)
		}
		if got := p.SkipLine(); got != tc.skipLine {
			t.Errorf("%s: skip line\n got %q\nwant %q", tc.name, got, tc.skipLine)
		}
		if strings.Contains(p.SkipLine(), "\n") {
			t.Errorf("%s: the skip line must be one line", tc.name)
		}
		switch p.Mode {
		case UseRunning:
			if p.NomadAddr != tc.env["NOMAD_ADDR"] || p.ConsulAddr != tc.env["CONSUL_HTTP_ADDR"] {
				t.Errorf("%s: addresses %q %q", tc.name, p.NomadAddr, p.ConsulAddr)
			}
		case StartAgents:
			wantNomad, wantConsul := "/usr/bin/nomad", "/usr/bin/consul"
			if b := tc.env["NOMAD_BIN"]; b != "" {
				wantNomad = b
			}
			if b := tc.env["CONSUL_BIN"]; b != "" {
				wantConsul = b
			}
			if p.NomadBin != wantNomad || p.ConsulBin != wantConsul {
				t.Errorf("%s: binaries %q %q", tc.name, p.NomadBin, p.ConsulBin)
			}
		}
	}
}

func TestUnitTimingTable(t *testing.T) {
	var tm Timings
	ms := time.Millisecond
	tm.Add("2 wake", StageFirstByte, 900*ms)
	tm.Add("2 wake", StageScaleCall, 40*ms)
	tm.Add("2 wake", StageFirstByte, 700*ms)
	tm.Add("2 wake", StageFirstByte, 1200*ms)
	tm.Note("2 wake", StageFirstByte, "target <= 1s: met")
	tm.Add("3 load", "load start -> count > 1", 12500*ms)
	tm.Note("8 delete", "checked", "nothing left")

	rows := tm.Rows()
	if len(rows) != 4 || rows[0].Measure != StageFirstByte || rows[1].Measure != StageScaleCall {
		t.Fatalf("rows out of first-added order: %+v", rows)
	}
	if m := Median(rows[0].Values); m != 900*ms {
		t.Errorf("median of 900,700,1200 = %v", m)
	}
	if m := Median([]time.Duration{4, 1, 3, 2}); m != 2 {
		t.Errorf("median of an even count = %v, want 2 (mean of 2 and 3, truncated)", m)
	}
	if Median(nil) != 0 {
		t.Errorf("median of nothing is not 0")
	}

	table := FormatTable(rows)
	lines := strings.Split(strings.TrimRight(table, "\n"), "\n")
	if len(lines) != 2+len(rows) {
		t.Fatalf("table has %d lines, want header, rule and %d rows:\n%s", len(lines), len(rows), table)
	}
	for _, want := range []string{
		"900.0ms", "700.0ms", "1200.0ms", "target <= 1s: met", "12.50s", "nothing left",
	} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	// Columns line up: "median" starts at the same offset in the header and
	// the value under it ends where the header's column ends.
	hdr := lines[0]
	col := strings.Index(hdr, "median")
	end := col + len("median")
	if end > len(lines[2]) || !strings.HasSuffix(strings.TrimSpace(lines[2][:end]), "900.0ms") {
		t.Errorf("median column not aligned:\n%s", table)
	}
	for _, l := range lines {
		if strings.HasSuffix(l, " ") {
			t.Errorf("trailing space in %q", l)
		}
	}
	if !strings.Contains(lines[5], "-") || strings.Contains(lines[5], "ms") {
		t.Errorf("a row without values shows dashes: %q", lines[5])
	}
}

func TestUnitColdStart(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	cs := ColdStart{RequestIn: t0, ScaleCall: t0.Add(30 * time.Millisecond), AllocRunning: t0.Add(400 * time.Millisecond), FirstByte: t0.Add(850 * time.Millisecond)}
	split := cs.Split()
	want := []Stage{
		{StageScaleCall, 30 * time.Millisecond, true},
		{StageAllocRunning, 400 * time.Millisecond, true},
		{StageFirstProbe, 0, false},
		{StageFirstByte, 850 * time.Millisecond, true},
	}
	if fmt.Sprint(split) != fmt.Sprint(want) {
		t.Errorf("split = %v, want %v", split, want)
	}

	count := func(n int64) *int64 { return &n }
	at := func(d time.Duration) uint64 { return uint64(t0.Add(d).UnixNano()) }
	events := []nomad.ScalingEvent{ // newest first, as Nomad keeps them
		{Count: count(0), PreviousCount: 2, Time: at(20 * time.Second), Message: "idle"},
		{Count: count(2), PreviousCount: 0, Time: at(10 * time.Second), Message: "wake"},
		{Count: count(3), PreviousCount: 0, Time: at(9 * time.Second), Error: true, Message: "refused"},
		{Count: count(1), PreviousCount: 0, Time: at(2 * time.Second), Message: "wake"},
		{Count: count(1), PreviousCount: 0, Time: at(-time.Second), Message: "before"},
		{Count: nil, PreviousCount: 0, Time: at(3 * time.Second), Message: "no count"},
	}
	ups := ScaleUpsFromZero(events, t0)
	if len(ups) != 2 || !ups[0].Equal(t0.Add(2*time.Second)) || !ups[1].Equal(t0.Add(10*time.Second)) {
		t.Errorf("scale-ups from zero = %v, want the two successful ones since t0, oldest first", ups)
	}

	started := t0.Add(time.Second)
	alloc := &nomad.Allocation{TaskStates: map[string]*nomad.TaskState{
		"user":        {StartedAt: started},
		"queue-proxy": {Events: []*nomad.TaskEvent{{Type: nomad.TaskReceived, Time: t0.UnixNano()}, {Type: nomad.TaskStarted, Time: started.Add(time.Millisecond).UnixNano()}}},
	}}
	if got := TaskStarted(alloc, "user"); !got.Equal(started) {
		t.Errorf("user started %v", got)
	}
	if got := TaskStarted(alloc, "queue-proxy"); !got.Equal(started.Add(time.Millisecond)) {
		t.Errorf("queue-proxy started %v (from its Started event)", got)
	}
	if !TaskStarted(alloc, "nope").IsZero() || !TaskStarted(nil, "user").IsZero() {
		t.Errorf("unknown task or alloc must give the zero time")
	}
}

func TestUnitOutcomeClasses(t *testing.T) {
	refused := &net.OpError{Op: "dial", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, tc := range []struct {
		o         Outcome
		ok, retry bool
		describe  string
	}{
		{Outcome{Status: 200}, true, false, "status 200"},
		{Outcome{Status: 503, RetryAfter: true}, false, true, "status 503 (Retry-After)"},
		{Outcome{Status: 503}, false, false, "status 503"},
		{Outcome{Status: 502}, false, false, "status 502"},
		{Outcome{Err: fmt.Errorf("Get \"http://x\": %w", refused)}, false, true, "error: connection refused"},
		{Outcome{Err: errors.New("Get \"http://x\": EOF")}, false, false, "error: EOF"},
		{Outcome{Status: 200, Err: errors.New("unexpected EOF")}, false, false, "error: unexpected EOF"},
	} {
		if tc.o.OK() != tc.ok || tc.o.Retryable() != tc.retry || tc.o.Describe() != tc.describe {
			t.Errorf("%+v: ok %v retryable %v describe %q; want %v %v %q", tc.o, tc.o.OK(), tc.o.Retryable(), tc.o.Describe(), tc.ok, tc.retry, tc.describe)
		}
	}
}

// TestUnitLoadAgainstAServer runs the load client against a local server
// that answers by path, and checks what it records.
func TestUnitLoadAgainstAServer(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != "svc.default.localhost" {
			http.Error(w, "wrong host "+r.Host, http.StatusNotFound)
			return
		}
		switch i := n.Add(1); {
		case r.URL.Path == "/busy":
			w.Header().Set("Retry-After", "1")
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case i%2 == 0:
			w.Header().Set("X-Testapp-Name", "v2")
			fmt.Fprint(w, "ok")
		default:
			w.Header().Set("X-Testapp-Name", "v1")
			fmt.Fprint(w, "ok")
		}
	}))
	defer srv.Close()
	client := NewClient(64)
	req := Request{Client: client, URL: srv.URL + "/", Host: "svc.default.localhost", Timeout: 5 * time.Second}

	burst := Burst(context.Background(), req, 50)
	if len(burst) != 50 || burst.OK() != 50 {
		t.Fatalf("burst: %s", burst.Summary())
	}
	by := burst.ByApp()
	if by["v1"]+by["v2"] != 50 || by["v1"] == 0 || by["v2"] == 0 {
		t.Errorf("by app = %v", by)
	}
	for i, o := range burst {
		if o.FirstByte.IsZero() || o.FirstByte.Before(o.Start) || o.End.Before(o.FirstByte) {
			t.Errorf("outcome %d times: start %v first byte %v end %v", i, o.Start, o.FirstByte, o.End)
		}
		if i > 0 && o.Start.Before(burst[i-1].Start) {
			t.Errorf("outcomes not in start order")
		}
	}

	load := StartLoad(context.Background(), req, 4, time.Millisecond, 10*time.Second)
	deadline := time.Now().Add(10 * time.Second)
	for len(load.Snapshot()) < 40 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	res := load.Stop()
	if len(res) < 40 || res.OK() != len(res) || len(res.Lost()) != 0 {
		t.Errorf("load: %s", res.Summary())
	}
	if !res.Within(res[0].Start, res[len(res)-1].Start) {
		t.Errorf("Within of its own span is false")
	}

	busy := Burst(context.Background(), Request{Client: client, URL: srv.URL + "/busy", Host: "svc.default.localhost", Timeout: 5 * time.Second}, 3)
	if busy.OK() != 0 || len(busy.Failed()) != 3 || len(busy.Lost()) != 0 {
		t.Errorf("503+Retry-After is a retryable failure: %s", busy.Summary())
	}
	if !strings.Contains(busy.Summary(), "3 x status 503 (Retry-After)") {
		t.Errorf("summary = %q", busy.Summary())
	}

	// A server that is gone: connection refused, retryable.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	gone := Request{Client: client, URL: "http://" + addr + "/", Host: "svc.default.localhost", Timeout: 5 * time.Second}.Do(context.Background())
	if gone.OK() || !gone.Retryable() {
		t.Errorf("refused connection: ok %v retryable %v err %v", gone.OK(), gone.Retryable(), gone.Err)
	}
}

func TestUnitServiceFileParses(t *testing.T) {
	s := Service{
		Name:        "e2e-wake",
		Binary:      "/opt/bin/nomad-serverless",
		Env:         map[string]string{"TESTAPP_NAME": "v2", "TESTAPP_READY_DELAY": "100ms"},
		Concurrency: 10,
		Scaling:     FastScaling(),
		Traffic: []Traffic{
			{Revision: "e2e-wake-00001", Percent: 70},
			{Latest: true, Percent: 30, Tag: "canary"},
		},
	}
	other := Service{Name: "e2e-other", Binary: "/opt/bin/nomad-serverless", Scaling: Scaling{Min: 2, Initial: 2}}
	path, err := WriteServiceFile(t.TempDir(), "svc.hcl", s, other)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := svchcl.ParseFile(path, svchcl.Options{})
	if diags.HasErrors() {
		var b strings.Builder
		f.WriteDiagnostics(&b, diags)
		src, _ := os.ReadFile(path)
		t.Fatalf("the service language rejects the suite's file:\n%s\n%s", b.String(), src)
	}
	if len(f.Services) != 2 {
		t.Fatalf("services = %d", len(f.Services))
	}
	got := f.Services[0]
	task := got.Template.Task
	if got.Name != "e2e-wake" || got.Namespace != "default" || task.Driver != "raw_exec" {
		t.Errorf("name/namespace/driver = %s/%s/%s", got.Name, got.Namespace, task.Driver)
	}
	if task.Config["command"] != "/opt/bin/nomad-serverless" || fmt.Sprint(task.Config["args"]) != "[testapp]" {
		t.Errorf("config = %v", task.Config)
	}
	if task.Env["TESTAPP_NAME"] != "v2" || task.Env["TESTAPP_READY_DELAY"] != "100ms" {
		t.Errorf("env = %v", task.Env)
	}
	if got.Template.Readiness == nil || got.Template.Readiness.Type != spec.ProbeHTTP || got.Template.Readiness.Path != "/ready" {
		t.Errorf("readiness = %+v", got.Template.Readiness)
	}
	if got.Template.Concurrency != 10 {
		t.Errorf("concurrency = %d", got.Template.Concurrency)
	}
	sc := got.Scaling
	if sc.Min != 0 || sc.Max != 5 || sc.Initial != 1 || sc.Target != 5 || sc.Window != 6*time.Second || sc.ScaleToZeroGrace != 2*time.Second {
		t.Errorf("scaling = %+v", sc)
	}
	if len(got.Traffic) != 2 || got.Traffic[0].Revision != "e2e-wake-00001" || got.Traffic[0].Percent != 70 ||
		!got.Traffic[1].Latest || got.Traffic[1].Percent != 30 || got.Traffic[1].Tag != "canary" {
		t.Errorf("traffic = %+v", got.Traffic)
	}
	if o := f.Services[1]; o.Scaling.Min != 2 || o.Scaling.Initial != 2 || o.Scaling.Window != spec.DefaultScaling().Window {
		t.Errorf("other scaling = %+v (unset fields keep the defaults)", o.Scaling)
	}
}

// The gRPC test app's service: no testapp argument, protocol h2c, gRPC
// readiness.
func TestUnitGRPCServiceFileParses(t *testing.T) {
	s := Service{Name: "e2e-grpc", Binary: "/tmp/grpcapp", GRPC: true, Env: map[string]string{"GRPCAPP_EVENTS": "/tmp/events"}, Scaling: FastScaling()}
	path, err := WriteServiceFile(t.TempDir(), "grpc.hcl", s)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := svchcl.ParseFile(path, svchcl.Options{})
	if diags.HasErrors() {
		var b strings.Builder
		f.WriteDiagnostics(&b, diags)
		src, _ := os.ReadFile(path)
		t.Fatalf("the service language rejects the suite's file:\n%s\n%s", b.String(), src)
	}
	task := f.Services[0].Template.Task
	if task.Config["command"] != "/tmp/grpcapp" || task.Config["args"] != nil {
		t.Errorf("config = %v", task.Config)
	}
	if task.Protocol != spec.ProtocolH2C {
		t.Errorf("protocol = %q, want h2c", task.Protocol)
	}
	if r := f.Services[0].Template.Readiness; r == nil || r.Type != spec.ProbeGRPC {
		t.Errorf("readiness = %+v, want grpc", r)
	}
}

// TestUnitChainSummary reads Consul 1.16's recorded discovery chain of a
// service split 30/70 over two revisions with tag "old" on the first.
func TestUnitChainSummary(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "test", "fixtures", "testdata", "consul-1.16", "037-discovery-chain.json"))
	if err != nil {
		t.Fatal(err)
	}
	var rec struct {
		Response struct {
			Body consul.DiscoveryChainResponse `json:"body"`
		} `json:"response"`
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		t.Fatalf("decode the recorded chain with the API client's types: %v", err)
	}
	s := SummarizeChain(rec.Response.Body.Chain)
	if fmt.Sprint(s.Splits) != "map[hello-00001:30 hello-00002:70]" {
		t.Errorf("splits = %v", s.Splits)
	}
	if fmt.Sprint(s.Tags) != "map[old:hello-00001]" {
		t.Errorf("tags = %v", s.Tags)
	}
	for _, rev := range []string{"hello-00001", "hello-00002"} {
		if fmt.Sprint(s.Failover[rev]) != "["+spec.ActivatorServiceName+"]" {
			t.Errorf("failover of %s = %v", rev, s.Failover[rev])
		}
	}
	if empty := SummarizeChain(nil); len(empty.Splits)+len(empty.Tags)+len(empty.Failover) != 0 {
		t.Errorf("nil chain: %+v", empty)
	}
}

// TestUnitParseDeployOutput reads what deploy prints (its formats in
// rollout/deploy.go), progress lines included.
func TestUnitParseDeployOutput(t *testing.T) {
	text := strings.Join([]string{
		"e2e-split-00002: registered (generation 2)",
		"e2e-split-00002: 0/1 ready · no allocations yet · 0s",
		"e2e-split-00002: 0/1 ready · allocations 1 running · 1.1s",
		"e2e-split-00002: ready (1/1 instances passing) in 2.3s",
		"e2e-split: route published (e2e-split-00001 100%, tag old -> e2e-split-00001)",
		"e2e-split: deleted old revision e2e-split-00000 (unrouted, untagged, older than 3 kept)",
		"e2e-split: http://e2e-split.default.localhost/  (curl -H 'Host: e2e-split.default.localhost' http://127.0.0.1:38123/)",
		"e2e-other-00001: template unchanged; no new revision",
		"e2e-other-00001: scaled to zero; the first request wakes it",
		"e2e-other: no gateway is running (start `nomad-serverless serve`); mesh clients reach the service as \"e2e-other\"",
		"",
	}, "\n")
	d := ParseDeployOutput(text)
	if fmt.Sprint(d.Registered) != "map[e2e-split-00002:2]" {
		t.Errorf("registered = %v", d.Registered)
	}
	if fmt.Sprint(d.Ready) != "map[e2e-split-00002:{1 1}]" {
		t.Errorf("ready = %v", d.Ready)
	}
	if d.Routes["e2e-split"] != "e2e-split-00001 100%, tag old -> e2e-split-00001" || len(d.Routes) != 1 {
		t.Errorf("routes = %v", d.Routes)
	}
	want := ServiceURL{URL: "http://e2e-split.default.localhost/", Host: "e2e-split.default.localhost", Gateway: "127.0.0.1:38123"}
	if d.URLs["e2e-split"] != want || len(d.URLs) != 1 {
		t.Errorf("urls = %+v", d.URLs)
	}
	if fmt.Sprint(d.Unchanged) != "[e2e-other-00001]" || fmt.Sprint(d.Deleted) != "[e2e-split-00000]" {
		t.Errorf("unchanged %v deleted %v", d.Unchanged, d.Deleted)
	}
	if d.Text != text {
		t.Errorf("text not kept")
	}
}
