package e2e

// Unit tests of the cluster scenarios' timeline helpers (cluster.go); they
// need no agents.

import (
	"errors"
	"fmt"
	"testing"
	"time"

	svchcl "github.com/nomad-serverless/nomad-serverless/hcl"
)

// A client killed at t0: Nomad marks the node down at +4s and its
// allocation lost at +4.2s while Consul still lists the orphan passing;
// gateway 0 drops it at +4.3s, gateway 1 at +4.5s; the replacement runs at
// +5s and is routed at +5.5s; the autoscaler counts one too many at +4.4s
// (within a second of the loss: allowed) and at +5.5s (not allowed).
func TestUnitAnalyzeNodeLoss(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const victim, host = "n1", "127.0.0.2"
	orphan := SampledAlloc{ID: "a1", Node: victim, ClientStatus: "running", DesiredStatus: "run"}
	lost := SampledAlloc{ID: "a1", Node: victim, ClientStatus: "lost", DesiredStatus: "stop"}
	other := SampledAlloc{ID: "a2", Node: "n2", ClientStatus: "running", DesiredStatus: "run"}
	pending := SampledAlloc{ID: "a3", Node: "n3", ClientStatus: "pending", DesiredStatus: "run"}
	repl := SampledAlloc{ID: "a3", Node: "n3", ClientStatus: "running", DesiredStatus: "run"}
	both := []string{"127.0.0.2:20001", "127.0.0.3:24001"}
	two := []string{"127.0.0.3:24001", "127.0.0.4:28001"}
	samples := []ClusterSample{
		{At: at(-100), NodeStatus: "ready", Allocs: []SampledAlloc{orphan, other}, Passing: both, Gateways: [][]string{both, both}, Actual: 2},
		{At: at(1000), NodeStatus: "ready", Allocs: []SampledAlloc{orphan, other}, Passing: both, Gateways: [][]string{both, both}, Actual: 2},
		{At: at(4000), NodeStatus: "down", Allocs: []SampledAlloc{orphan, other}, Passing: both, Gateways: [][]string{both, nil}, Actual: -1},
		{At: at(4200), NodeStatus: "down", Allocs: []SampledAlloc{lost, other, pending}, Passing: both, Gateways: [][]string{both, both}, Actual: 2},
		{At: at(4300), NodeStatus: "down", Allocs: []SampledAlloc{lost, other, pending}, Passing: both, Gateways: [][]string{{"127.0.0.3:24001"}, both}, Actual: 2},
		{At: at(4500), NodeStatus: "down", Allocs: []SampledAlloc{lost, other, pending}, Passing: both, Gateways: [][]string{{"127.0.0.3:24001"}, {"127.0.0.3:24001"}}, Actual: 1},
		{At: at(5000), NodeStatus: "down", Allocs: []SampledAlloc{lost, other, repl}, Passing: append(both, "127.0.0.4:28001"), Gateways: [][]string{{"127.0.0.3:24001"}, {"127.0.0.3:24001"}}, Actual: 1},
		{At: at(5500), NodeStatus: "down", Allocs: []SampledAlloc{lost, other, repl}, Passing: append(both, "127.0.0.4:28001"), Gateways: [][]string{two, two}, Actual: 3},
		{At: at(9000), NodeStatus: "down", Allocs: []SampledAlloc{lost, other, repl}, Passing: two, Gateways: [][]string{two, two}, Actual: 2},
	}
	l := AnalyzeNodeLoss(samples, t0, victim, host, 2)
	ms := time.Millisecond
	for _, c := range []struct {
		name      string
		got, want time.Duration
	}{
		{"node down", l.NodeDown, 4000 * ms},
		{"lost", l.Lost, 4200 * ms},
		{"consul gone", l.ConsulGone, 9000 * ms},
		{"gateway 0 dropped", l.Dropped[0], 4300 * ms},
		{"gateway 1 dropped", l.Dropped[1], 4500 * ms},
		{"replaced", l.Replaced, 5000 * ms},
		{"routed", l.Routed, 5500 * ms},
		{"routed to the node", l.RoutedToNode(), 4500 * ms},
	} {
		if c.got != c.want {
			t.Errorf("%s = %s, want %s", c.name, c.got, c.want)
		}
	}
	if l.OrphansAtLost != 1 {
		t.Errorf("orphans passing when lost = %d, want 1", l.OrphansAtLost)
	}
	if fmt.Sprint(l.Overcounted) != "[+5500.0ms: actual 3, 2 allocations placed]" || l.Counted != 2 {
		t.Errorf("overcounted = %v in %d samples, want one in 2", l.Overcounted, l.Counted)
	}

	// Nothing after the kill: everything NotSeen, no gateway ever dropped.
	none := AnalyzeNodeLoss(samples[:1], t0, victim, host, 2)
	if none.Lost != NotSeen || none.Routed != NotSeen || none.RoutedToNode() != 0 || len(none.Dropped) != 0 {
		t.Errorf("empty timeline: %+v", none)
	}
	stuck := AnalyzeNodeLoss(samples[:3], t0, victim, host, 2)
	if stuck.RoutedToNode() != NotSeen {
		t.Errorf("a gateway that never dropped the node: routed to it %s, want NotSeen", stuck.RoutedToNode())
	}
}

func TestUnitFailuresAroundAFault(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	// The fault lasts from t0 to +10ms (a node's processes killed one
	// after the other).
	r := Result{
		{Start: at(-50), End: at(-10), Status: 200},
		{Start: at(-20), End: at(30), Err: errors.New("connection reset by peer")}, // in flight: excused
		{Start: at(-10), End: at(40), Status: 200},
		{Start: at(5), End: at(9), Status: 502},                   // sent during the fault: excused
		{Start: at(-30), End: at(2), Status: 502},                 // cut during the fault: excused
		{Start: at(11), End: at(20), Status: 502},                 // after: not excused
		{Start: at(-90), End: at(-60), Err: errors.New("EOF")},    // before: not excused
		{Start: at(0), End: at(5), Status: 503, RetryAfter: true}, // at the fault: excused
	}
	got := r.FailedNotInFlight(t0, at(10))
	if len(got) != 2 || got[0].Status != 502 || got[1].Err == nil {
		t.Errorf("not excused = %+v", got)
	}
	if !r[1].InFlightDuring(t0, t0) || r[0].InFlightDuring(t0, at(10)) || r[5].InFlightDuring(t0, at(10)) {
		t.Errorf("InFlightDuring wrong")
	}
}

func TestUnitByHost(t *testing.T) {
	m := ByHost([]string{"127.0.0.3:1", "127.0.0.2:5", "127.0.0.3:7", "nohost"})
	if got := FormatByHost(m); got != "127.0.0.2:1 127.0.0.3:2 nohost:1" {
		t.Errorf("FormatByHost = %q", got)
	}
}

func TestUnitMetricSum(t *testing.T) {
	text := `# HELP nomad_serverless_gateway_retries_total Requests sent to another instance
# TYPE nomad_serverless_gateway_retries_total counter
nomad_serverless_gateway_retries_total{revision="a-00001",service="a"} 3
nomad_serverless_gateway_retries_total{revision="a-00001",service="a",reason="x"} 2
nomad_serverless_gateway_retries_total{revision="b-00001",service="b"} 7
nomad_serverless_gateway_retries_total_other{revision="a-00001"} 100
nomad_serverless_gateway_ejections_total{revision="a-00001",service="a"} 1
`
	if got := MetricSum(text, "nomad_serverless_gateway_retries_total", `revision="a-00001"`); got != 5 {
		t.Errorf("retries of a = %g, want 5", got)
	}
	if got := MetricSum(text, "nomad_serverless_gateway_ejections_total", `revision="b-00001"`); got != 0 {
		t.Errorf("ejections of b = %g, want 0", got)
	}
}

// A service with a host network renders a network block the service
// language reads back.
func TestUnitServiceFileHostNetwork(t *testing.T) {
	s := testService("e2e-net")
	s.Binary = "/opt/bin/nomad-serverless"
	s.HostNetwork = "own"
	path, err := WriteServiceFile(t.TempDir(), "net.hcl", s)
	if err != nil {
		t.Fatal(err)
	}
	f, diags := svchcl.ParseFile(path, svchcl.Options{})
	if diags.HasErrors() {
		t.Fatalf("the service language rejects the file: %v", diags)
	}
	if got := f.Services[0].Template.Network.HostNetwork; got != "own" {
		t.Errorf("host_network = %q, want own", got)
	}
}
