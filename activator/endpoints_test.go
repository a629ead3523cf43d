package activator

import (
	"testing"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
)

func alloc(id string, port int, running bool) catalog.Allocation {
	return catalog.Allocation{ID: id, Revision: "r", Address: "10.0.0.1", Port: port, AdminPort: port + 1, Running: running}
}

func starting(id string, port int) catalog.Allocation {
	a := alloc(id, port, false)
	a.Starting = true
	return a
}

func ready(port int) consulroute.Instance {
	return consulroute.Instance{ID: "svc-" + hostPort("10.0.0.1", port), Revision: "r", Address: "10.0.0.1", Port: port, AdminPort: port + 1}
}

// step is one update of the tracker and what it must say about the address
// 10.0.0.1:1000 afterwards.
type step struct {
	name     string
	allocs   []catalog.Allocation
	ready    []consulroute.Instance
	probed   map[probeKey]bool
	routable bool
	probe    bool
	absent   bool // the address is not in the output at all
}

func TestEndpointTrackerRule(t *testing.T) {
	const hp = "10.0.0.1:1000"
	ok := func(a string) map[probeKey]bool { return map[probeKey]bool{{hp, a, 0}: true} }
	okGen := func(a string, gen int) map[probeKey]bool { return map[probeKey]bool{{hp, a, gen}: true} }
	cases := []struct {
		name  string
		steps []step
	}{
		{"nomad running, not probed, not listed: probe it, no traffic", []step{
			{name: "running", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probe: true},
		}},
		{"probe success makes a running allocation routable before consul", []step{
			{name: "running", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probe: true},
			{name: "probed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: ok("a"), routable: true},
			{name: "consul lists it too", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, probed: ok("a"), routable: true},
		}},
		{"consul alone is enough (nomad events late or control plane restarted)", []step{
			{name: "listed", ready: []consulroute.Instance{ready(1000)}, routable: true},
		}},
		{"nomad stopping wins over consul still listing", []step{
			{name: "listed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, routable: true},
			{name: "nomad stops it", allocs: []catalog.Allocation{alloc("a", 1000, false)}, ready: []consulroute.Instance{ready(1000)}},
			{name: "nomad forgets it, consul lags", ready: []consulroute.Instance{ready(1000)}},
			{name: "consul drops it too", absent: true},
		}},
		{"nomad forgetting a known allocation stops it even when consul lists it", []step{
			{name: "listed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, routable: true},
			{name: "gone from nomad", ready: []consulroute.Instance{ready(1000)}},
		}},
		{"consul dropping a listed instance overrides an old probe success; a new probe is sent", []step{
			{name: "probed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: ok("a"), routable: true},
			{name: "listed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, probed: ok("a"), routable: true},
			{name: "check fails", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: ok("a"), probe: true},
			{name: "still failing: the old success does not count", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: ok("a"), probe: true},
			{name: "check passes again", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, routable: true},
		}},
		// Issue 45's soak: a Consul agent restart (a leave, then the agent
		// back with its checks critical until they run) dropped every
		// instance on its node, and the gateways held every request for
		// seconds; a probe after the drop makes them routable again at once.
		{"consul dropping a running instance without its check failing: a new probe routes it again", []step{
			{name: "listed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, routable: true},
			{name: "dropped (the agent left)", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probe: true},
			{name: "the new probe answers ready", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: okGen("a", 1), routable: true},
			{name: "listed again", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, probed: okGen("a", 1), routable: true},
			{name: "dropped again: the first re-probe does not count", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: okGen("a", 1), probe: true},
			{name: "its own probe does", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: okGen("a", 2), routable: true},
		}},
		{"consul dropping an instance nomad stops: no probe", []step{
			{name: "listed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, ready: []consulroute.Instance{ready(1000)}, routable: true},
			{name: "stopped and dropped", allocs: []catalog.Allocation{alloc("a", 1000, false)}},
		}},
		{"a probe result never applies to a later allocation on the same port", []step{
			{name: "a probed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: ok("a"), routable: true},
			{name: "b replaces a", allocs: []catalog.Allocation{alloc("b", 1000, true)}, probed: ok("a"), probe: true},
			{name: "b probed", allocs: []catalog.Allocation{alloc("b", 1000, true)}, probed: ok("b"), routable: true},
		}},
		{"a running allocation beside its stopping predecessor on one port", []step{
			{name: "both", allocs: []catalog.Allocation{alloc("old", 1000, false), alloc("new", 1000, true)}, probed: ok("new"), routable: true},
		}},
		{"told to stop and never listed: neither routable nor probed", []step{
			{name: "stopping", allocs: []catalog.Allocation{alloc("a", 1000, false)}},
		}},
		{"starting (placed, client not reported running): probed, routable once probed, stays so when running", []step{
			{name: "starting", allocs: []catalog.Allocation{starting("a", 1000)}, probe: true},
			{name: "probed", allocs: []catalog.Allocation{starting("a", 1000)}, probed: ok("a"), routable: true},
			{name: "nomad says running", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: ok("a"), routable: true},
		}},
		{"starting and told to stop before it ran: not routable, not probed again", []step{
			{name: "starting, probed", allocs: []catalog.Allocation{starting("a", 1000)}, probed: ok("a"), routable: true},
			{name: "stopped", allocs: []catalog.Allocation{alloc("a", 1000, false)}, probed: ok("a")},
		}},

		{"an allocation restarted in place must be probed again", []step{
			{name: "probed", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probed: ok("a"), routable: true},
			{name: "stopped", allocs: []catalog.Allocation{alloc("a", 1000, false)}, probed: ok("a")},
			{name: "running again", allocs: []catalog.Allocation{alloc("a", 1000, true)}, probe: true},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := newEndpointTracker()
			for _, s := range tc.steps {
				eps := tr.update(s.allocs, s.ready, s.probed)
				var got *endpoint
				for i := range eps {
					if eps[i].HostPort == hp {
						got = &eps[i]
					}
				}
				if s.absent {
					if got != nil {
						t.Fatalf("%s: %s still reported: %+v", s.name, hp, *got)
					}
					continue
				}
				if got == nil {
					t.Fatalf("%s: %s missing from %+v", s.name, hp, eps)
				}
				if got.Routable != s.routable || got.NeedsProbe != s.probe {
					t.Fatalf("%s: routable=%v needsProbe=%v, want routable=%v needsProbe=%v", s.name, got.Routable, got.NeedsProbe, s.routable, s.probe)
				}
			}
		})
	}
}

func TestEndpointTrackerKeepsOtherAddressesApart(t *testing.T) {
	tr := newEndpointTracker()
	eps := tr.update(
		[]catalog.Allocation{alloc("a", 1000, true), alloc("b", 2000, true)},
		[]consulroute.Instance{ready(2000), ready(3000)},
		map[probeKey]bool{{"10.0.0.1:1000", "a", 0}: true},
	)
	want := map[string]bool{"10.0.0.1:1000": true, "10.0.0.1:2000": true, "10.0.0.1:3000": true}
	if len(eps) != len(want) {
		t.Fatalf("got %d endpoints, want %d: %+v", len(eps), len(want), eps)
	}
	for i, e := range eps {
		if !want[e.HostPort] || !e.Routable {
			t.Errorf("endpoint %+v: want routable", e)
		}
		if i > 0 && eps[i-1].HostPort >= e.HostPort {
			t.Errorf("endpoints not sorted: %s before %s", eps[i-1].HostPort, e.HostPort)
		}
	}
	if eps[1].AdminPort != 2001 || eps[1].Alloc != "b" {
		t.Errorf("endpoint 2000 = %+v, want alloc b with admin port 2001", eps[1])
	}
}

// An instance address is dialed and probed as host:port, so an IPv6 address
// must come in brackets.
func TestHostPortBracketsIPv6(t *testing.T) {
	for _, tc := range []struct {
		addr string
		port int
		want string
	}{{"10.0.0.1", 8080, "10.0.0.1:8080"}, {"fd00::1", 8080, "[fd00::1]:8080"}} {
		if got := hostPort(tc.addr, tc.port); got != tc.want {
			t.Errorf("hostPort(%q, %d) = %q, want %q", tc.addr, tc.port, got, tc.want)
		}
	}
}
