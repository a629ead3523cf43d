package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

func TestPeerConfigs(t *testing.T) {
	h := haproxyConfig("/tmp/d", "127.0.0.1:8001", "127.0.0.1:9001")
	for _, want := range []string{"nbthread 2", "http-reuse always", "option http-keep-alive", "bind 127.0.0.1:8001", "server app 127.0.0.1:9001", "mode http"} {
		if !strings.Contains(h, want) {
			t.Errorf("haproxy config lacks %q:\n%s", want, h)
		}
	}
	n := nginxConfig("/tmp/d", "127.0.0.1:8001", "127.0.0.1:9001")
	for _, want := range []string{"worker_processes 2;", "keepalive 64;", "proxy_http_version 1.1;", `proxy_set_header Connection "";`,
		"listen 127.0.0.1:8001;", "server 127.0.0.1:9001;", "pid /tmp/d/nginx.pid;", "error_log /tmp/d/error.log", "proxy_temp_path /tmp/d/proxy;"} {
		if !strings.Contains(n, want) {
			t.Errorf("nginx config lacks %q:\n%s", want, n)
		}
	}
	// The command line says daemon off; the file saying it too is an error.
	for name, cfg := range map[string]string{"haproxy": h, "nginx": n} {
		if strings.Contains(cfg, "daemon") {
			t.Errorf("%s config runs a daemon:\n%s", name, cfg)
		}
	}
	args := strings.Join(nginxPeer().Args("/tmp/d", "/tmp/d/nginx.conf"), " ")
	if !strings.Contains(args, "-g daemon off;") || !strings.Contains(args, "-e /tmp/d/error.log") || !strings.Contains(args, "-p /tmp/d/") {
		t.Errorf("nginx args %q", args)
	}
	if args := haproxyPeer().Args("/tmp/d", "/tmp/d/haproxy.cfg"); !strings.Contains(strings.Join(args, " "), "-db -f /tmp/d/haproxy.cfg") {
		t.Errorf("haproxy args %q", args)
	}
}

func TestLocatePeer(t *testing.T) {
	none := func(string) (string, error) { return "", exec.ErrNotFound }
	for _, k := range peerKinds() {
		if k.Builtin {
			// Nothing to install: the benchmark runs it itself.
			if path, skip := locatePeer(k, none); path == "" || skip != "" {
				t.Errorf("%s: path %q, skip %q", k.Name, path, skip)
			}
			continue
		}
		path, skip := locatePeer(k, none)
		if path != "" || !strings.Contains(skip, "apt-get install "+k.Package) || strings.Contains(skip, "\n") {
			t.Errorf("%s missing: path %q, skip %q", k.Name, path, skip)
		}
	}
	// Not in PATH (a non-root PATH), but in /usr/sbin.
	sbin := func(name string) (string, error) {
		if name == "/usr/sbin/haproxy" {
			return name, nil
		}
		return "", exec.ErrNotFound
	}
	if path, skip := locatePeer(haproxyPeer(), sbin); path != "/usr/sbin/haproxy" || skip != "" {
		t.Errorf("in /usr/sbin: path %q skip %q", path, skip)
	}
	inPath := func(name string) (string, error) { return "/opt/bin/" + name, nil }
	if path, _ := locatePeer(nginxPeer(), inPath); path != "/opt/bin/nginx" {
		t.Errorf("PATH first: %q", path)
	}
}

func TestParsePeers(t *testing.T) {
	for in, want := range map[string]string{"": "", "haproxy,nginx": "haproxy,nginx", " nginx ,haproxy,nginx": "nginx,haproxy"} {
		ks, err := parsePeers(in)
		var names []string
		for _, k := range ks {
			names = append(names, k.Name)
		}
		if err != nil || strings.Join(names, ",") != want {
			t.Errorf("parsePeers(%q) = %v, %v; want %s", in, names, err, want)
		}
	}
	if _, err := parsePeers("envoy"); err == nil {
		t.Error("unknown peer accepted")
	}
}

// series builds a series of runs of the given req/s (over one second) and
// a constant latency each.
func series(name string, rps []int64, lat []time.Duration) *Series {
	s := &Series{Name: name}
	for i, n := range rps {
		r := &Result{Target: name, Elapsed: time.Second, Requests: n}
		r.ByClass[2] = n
		for range n {
			r.Latency.Record(lat[i])
		}
		s.Add(r)
	}
	return s
}

func TestMedianStats(t *testing.T) {
	ms := time.Millisecond
	// The third round is an outlier (another job on the machine).
	s := series("x", []int64{100, 110, 10, 105, 95}, []time.Duration{ms, 2 * ms, 50 * ms, ms, 2 * ms})
	s.CPU = 420 * ms
	s.AppCPU = 840 * ms
	s.Idle, s.MachineCPU = 3*time.Second, 12*time.Second
	st := medianStats(s)
	if st.Runs != 5 || st.RPS != 100 || st.Errors != 0 || st.Non2xx != 0 {
		t.Errorf("stats %+v", st)
	}
	if d := st.P50 - 2*ms; d < -ms/50 || d > ms/50 {
		t.Errorf("p50 %s, want 2ms", st.P50)
	}
	if st.CPUPerReq != ms {
		t.Errorf("CPU/req %s, want 1ms", st.CPUPerReq)
	}
	if st.AppCPUPerReq != 2*ms {
		t.Errorf("app CPU/req %s, want 2ms", st.AppCPUPerReq)
	}
	if st.Idle != 0.25 || fmtShare(st.Idle) != "25%" {
		t.Errorf("idle %v (%s), want 0.25", st.Idle, fmtShare(st.Idle))
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("even median %v", got)
	}
	if got := medianStats(&Series{Name: "empty"}); got.RPS != 0 || got.Runs != 0 {
		t.Errorf("empty %+v", got)
	}
}

func TestPrintPeerComparison(t *testing.T) {
	ms := time.Millisecond
	lat := []time.Duration{ms, ms, ms}
	rows := []peerRow{
		{series("direct", []int64{400, 400, 400}, lat), roleBaseline},
		{series("sidecar", []int64{180, 200, 190}, []time.Duration{2 * ms, 2 * ms, 2 * ms}), roleOurs},
		{series("haproxy", []int64{200, 200, 200}, lat), rolePeer},
		{series("nginx", []int64{100, 100, 100}, []time.Duration{4 * ms, 4 * ms, 4 * ms}), rolePeer},
	}
	rs := peerRatios(rows)
	if len(rs) != 2 || rs[0].Peer != "haproxy" || rs[0].RPS != 190.0/200 || rs[1].Peer != "nginx" || rs[1].RPS != 1.9 {
		t.Fatalf("ratios %+v", rs)
	}
	if rs[0].P50 < 1.9 || rs[0].P50 > 2.1 || rs[1].P99 < 0.45 || rs[1].P99 > 0.55 {
		t.Errorf("latency ratios %+v", rs)
	}
	var b bytes.Buffer
	if err := PrintPeerComparison(&b, "== title", rows); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if lines[0] != "== title" || !strings.Contains(lines[1], "p99.9") || !strings.Contains(lines[1], "vs haproxy") || !strings.Contains(lines[1], "vs nginx") || !strings.Contains(lines[1], "app CPU/req") || !strings.Contains(lines[1], "idle") {
		t.Errorf("header:\n%s", out)
	}
	for _, want := range []string{"sidecar / haproxy:  req/s 0.950", "sidecar / nginx:    req/s 1.900"} {
		if !strings.Contains(out, want) {
			t.Errorf("no %q in:\n%s", want, out)
		}
	}
	// Only our rows get ratios: the sidecar row ends in both.
	for _, l := range lines {
		f := strings.Fields(l)
		if len(f) > 1 && f[0] == "sidecar" && f[1] != "/" && (f[len(f)-2] != "0.950" || f[len(f)-1] != "1.900") {
			t.Errorf("sidecar row %q", l)
		}
		if len(f) > 0 && (f[0] == "direct" || f[0] == "haproxy") && f[len(f)-1] != "-" {
			t.Errorf("row with a ratio: %q", l)
		}
	}

	b.Reset()
	if err := PrintPeerComparison(&b, "== alone", rows[:2]); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "no peer ran") || strings.Contains(b.String(), "vs ") {
		t.Errorf("without peers:\n%s", b.String())
	}
}

// TestPeersForReal runs each installed peer in front of a test server for a
// moment, then checks it is gone with every process it forked.
func TestPeersForReal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("ok")) }))
	defer srv.Close()
	upstream := srv.Listener.Addr().(*net.TCPAddr).String()
	for _, k := range peerKinds() {
		t.Run(k.Name, func(t *testing.T) {
			bin, skip := locatePeer(k, exec.LookPath)
			if skip != "" {
				t.Skip(skip)
			}
			p, err := startPeer(k, bin, upstream)
			if err != nil {
				t.Fatal(err)
			}
			defer p.stop()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			r := Run(ctx, Target{Name: k.Name, Addr: p.Addr}, Load{Conns: 2, Duration: 300 * time.Millisecond, Timeout: 2 * time.Second})
			if r.Requests == 0 || r.Errors != 0 || r.ByClass[2] != r.Requests {
				t.Errorf("through %s: %d requests, %d 2xx, %d errors\n%s", k.Name, r.Requests, r.ByClass[2], r.Errors, p.proc.out.String())
			}
			if k.Name == "nginx" {
				// A master and two workers, whose CPU groupCPUTime adds.
				if n := groupSize(t, p.proc.pid()); n != 3 {
					t.Errorf("nginx runs %d processes, want 3", n)
				}
			}
			pgid := p.proc.pid()
			p.stop()
			deadline := time.Now().Add(peerStopTimeout)
			for groupAlive(pgid) && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond)
			}
			if groupAlive(pgid) {
				t.Errorf("%s's process group %d outlived stop", k.Name, pgid)
			}
		})
	}
}

// groupSize counts the live processes of group pgid.
func groupSize(t *testing.T, pgid int) int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range ents {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if g, _, err := parseStat(b); err == nil && g == pgid {
			n++
		}
	}
	return n
}

func TestParseStat(t *testing.T) {
	// Command names may hold spaces and parentheses.
	line := []byte("4242 (ngin x (w)) S 1 4240 4240 0 -1 4194560 100 0 0 0 250 30 0 0 20 0 1 0 1000 1000 100")
	g, cpu, err := parseStat(line)
	if err != nil || g != 4240 || cpu != 2800*time.Millisecond {
		t.Errorf("pgrp %d cpu %s err %v", g, cpu, err)
	}
	if _, _, err := parseStat([]byte("4242 (x) S 1")); err == nil {
		t.Error("short stat accepted")
	}
}

func TestParseMachineCPU(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	m, ok := parseMachineCPU([]byte("cpu  300 0 100 500 100 0 0 0 40 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"))
	if !ok || m.Idle != 6*time.Second || m.Total != 10*time.Second {
		t.Errorf("got %+v ok %v, want idle 6s of 10s", m, ok)
	}
	for _, bad := range []string{"", "intr 1 2 3\n", "cpu  x 1 2\n"} {
		if _, ok := parseMachineCPU([]byte(bad)); ok {
			t.Errorf("%q accepted", bad)
		}
	}
	if _, ok := readMachineCPU(); !ok {
		t.Error("no /proc/stat")
	}
	// A second reading a moment later has the machine's time move on.
	s := &Series{}
	stop := s.measureIdle()
	time.Sleep(50 * time.Millisecond)
	stop()
	if s.MachineCPU <= 0 || s.Idle > s.MachineCPU {
		t.Errorf("measured idle %s of %s", s.Idle, s.MachineCPU)
	}
}
