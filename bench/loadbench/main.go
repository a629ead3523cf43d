// Command loadbench measures the request hot paths with real processes on
// 127.0.0.1: a closed-loop HTTP/1.1 load generator (load.go, reusable by
// every mode) drives the test app directly and through the proxy under
// test, alternating the two in one run so machine noise lands on both, and
// prints throughput, p50/p99, ratios, CPU per request and peak RSS. HAProxy
// and nginx, when installed, and two bare Go loops as yardsticks
// (peer_goloop.go) run in the same rounds in front of the same upstream
// (peer.go), and our ratios against them are printed too.
//
//	go run ./bench/loadbench -mode sidecar -bin bin/nomad-serverless
//
// It runs on Linux: it reads /proc, ties its peers' lives to its own
// (Pdeathsig), and the reference loops use epoll.
//
// Modes: sidecar (sidecar.go), gateway (gateway.go), coldstart, grpc
// (grpc.go: gRPC unary over h2c). Add a mode by adding it to modes().
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Options are the flags every mode shares.
type Options struct {
	Bin string // the nomad-serverless binary
	// BaseBin is another build measured beside Bin (grpc-sidecar mode).
	BaseBin  string
	Conns    int           // connections of the throughput runs
	Duration time.Duration // length of one run
	Rounds   int           // alternations of direct and proxied
	Warmup   time.Duration
	// SingleDuration is the length of one single-connection run.
	SingleDuration time.Duration
	// ProxyEnv is added to the environment of the proxy under test
	// (e.g. GOGC=50), for experiments.
	ProxyEnv map[string]string
	// ShowOutput prints the output of the processes at the end.
	ShowOutput bool
	// Peers are the production proxies (HAProxy, nginx) measured beside
	// ours in the same rounds (peer.go); one that is not installed is
	// skipped with one line.
	Peers []peerKind
	Out   io.Writer
}

// children are the processes the benchmark starts from its own executable,
// by the environment variable that makes it one and carries its
// configuration: the gateway under test and the reference loops.
func children() map[string]func(config string) error {
	return map[string]func(string) error{envGatewayChild: runGatewayChild, envGoloopChild: runGoloopChild, envGRPCAppChild: runGRPCAppChild}
}

func init() {
	// Runs before main (and before a test binary's tests): a child never
	// parses the benchmark's flags.
	for env, run := range children() {
		if v := os.Getenv(env); v != "" {
			if err := run(v); err != nil {
				fmt.Fprintf(os.Stderr, "loadbench %s: %v\n", env, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
}

// mode runs one benchmark.
type mode func(ctx context.Context, o Options) error

func modes() map[string]mode {
	return map[string]mode{
		"sidecar":   runSidecarBench,
		"gateway":   runGatewayBench,
		"tls":       runTLSBench,
		"coldstart": runColdStartBench,
		"grpc":      runGRPCBench,
		// The sidecar's gRPC path alone (grpc_sidecar.go).
		"grpc-sidecar": runGRPCSidecarBench,
		// The sidecar relay's memory (relaymem.go).
		"relay-mem": runRelayMemBench,
	}
}

func main() {
	var o Options
	name := flag.String("mode", "", "what to measure: "+strings.Join(modeNames(), ", "))
	flag.StringVar(&o.Bin, "bin", "bin/nomad-serverless", "the nomad-serverless binary (make build)")
	flag.StringVar(&o.BaseBin, "base-bin", "", "another build's binary measured beside -bin (grpc-sidecar mode), e.g. main's")
	flag.IntVar(&o.Conns, "conns", 32, "connections in the throughput runs")
	flag.DurationVar(&o.Duration, "duration", 5*time.Second, "length of one throughput run")
	// Five: one run of a target swings by up to a tenth from round to
	// round on a shared two-core machine; five alternating rounds keep a
	// ratio within about 0.03 of where repeated runs centre.
	flag.IntVar(&o.Rounds, "rounds", 5, "rounds; each runs every target once, in turn")
	flag.DurationVar(&o.Warmup, "warmup", time.Second, "warm-up per target before measuring")
	flag.DurationVar(&o.SingleDuration, "single-duration", 3*time.Second, "length of one single-connection run")
	flag.BoolVar(&o.ShowOutput, "show-output", false, "print the output of the started processes at the end")
	peers := flag.String("peers", strings.Join(peerNames(), ","), "peer proxies to measure beside ours (sidecar and gateway modes; grpc mode runs HAProxy in h2c when haproxy is listed), \"\" for none")
	proxyEnv := flag.String("proxy-env", "", "extra environment for the proxy under test, e.g. GOGC=50,GOMAXPROCS=1")
	flag.Parse()
	o.Out = os.Stdout
	o.ProxyEnv = map[string]string{}
	for _, kv := range strings.Split(*proxyEnv, ",") {
		if k, v, ok := strings.Cut(kv, "="); ok {
			o.ProxyEnv[k] = v
		} else if kv != "" {
			fmt.Fprintf(os.Stderr, "loadbench: -proxy-env %q: want KEY=VALUE,...\n", kv)
			os.Exit(2)
		}
	}

	var err error
	if o.Peers, err = parsePeers(*peers); err != nil {
		fmt.Fprintf(os.Stderr, "loadbench: -peers: %v\n", err)
		os.Exit(2)
	}

	m, ok := modes()[*name]
	if !ok {
		fmt.Fprintf(os.Stderr, "loadbench: -mode %q: want one of %s\n", *name, strings.Join(modeNames(), ", "))
		os.Exit(2)
	}
	if _, err := os.Stat(o.Bin); err != nil {
		fmt.Fprintf(os.Stderr, "loadbench: -bin %s: %v (run make build first)\n", o.Bin, err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fmt.Fprintf(o.Out, "loadbench -mode %s: %d CPUs, %s, %d conns x %s x %d rounds, load average %s\n",
		*name, runtime.NumCPU(), runtime.Version(), o.Conns, o.Duration, o.Rounds, loadAverage())
	if len(o.ProxyEnv) > 0 {
		fmt.Fprintf(o.Out, "proxy environment: %s\n", *proxyEnv)
	}
	if err := m(ctx, o); err != nil {
		fmt.Fprintln(os.Stderr, "loadbench:", err)
		os.Exit(1)
	}
	// Other work on the machine skews absolute numbers (ratios less so).
	fmt.Fprintf(o.Out, "load average at the end: %s\n", loadAverage())
}

// loadAverage is the 1, 5 and 15 minute load averages, "" if unknown.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func modeNames() []string {
	var names []string
	for n := range modes() {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}
