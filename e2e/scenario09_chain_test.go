package e2e

import (
	"fmt"
	"slices"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/spec"
)

// Scenario 9: the config entries deploy and traffic write compile, in
// Consul's discovery chain, to the expected splits, tag routes and the
// failover of every revision to the activator.
func TestE2E9DiscoveryChain(t *testing.T) {
	h := newHarness(t, "9 discovery chain")
	const svc = "e2e-chain"
	h.cleanupService(svc)
	rev1 := revision(svc, 1)
	rev1, rev2 := h.twoRevisions(svc, []Traffic{{Revision: rev1, Percent: 70, Tag: "stable"}, {Latest: true, Percent: 30, Tag: "canary"}})

	resp, _, err := h.consul.DiscoveryChain().Get(svc, nil, nil)
	if err != nil || resp == nil || resp.Chain == nil {
		t.Fatalf("discovery chain of %s: %v (answer %+v)", svc, err, resp)
	}
	if resp.Chain.Protocol != "http" {
		t.Errorf("chain protocol %q, want http (service-defaults)", resp.Chain.Protocol)
	}
	got := SummarizeChain(resp.Chain)
	want := ChainSummary{
		Splits:   map[string]float32{rev1: 70, rev2: 30},
		Tags:     map[string]string{"stable": rev1, "canary": rev2},
		Failover: map[string][]string{rev1: {spec.ActivatorServiceName}, rev2: {spec.ActivatorServiceName}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("compiled chain:\n got  %+v\n want %+v", got, want)
	}
	// The entries behind it, as written.
	for _, rev := range []string{rev1, rev2} {
		r, ok := h.configEntry(consul.ServiceResolver, rev).(*consul.ServiceResolverConfigEntry)
		if !ok || r == nil {
			t.Errorf("no service-resolver %s", rev)
			continue
		}
		var targets []string
		for _, f := range r.Failover {
			targets = append(targets, f.Service)
			for _, ft := range f.Targets {
				targets = append(targets, ft.Service)
			}
		}
		if !slices.Contains(targets, spec.ActivatorServiceName) {
			t.Errorf("service-resolver %s fails over to %v, not the activator", rev, targets)
		}
	}

	// A traffic change recompiles the chain.
	h.mustCLI("traffic", "-to", rev2+"=100", svc)
	eventually(t, 10*time.Second, "chain follows traffic 100 to "+rev2, func() (bool, string) {
		resp, _, err := h.consul.DiscoveryChain().Get(svc, nil, nil)
		if err != nil || resp == nil {
			return false, fmt.Sprint(err)
		}
		s := SummarizeChain(resp.Chain)
		return len(s.Splits) == 1 && s.Splits[rev2] == 100, fmt.Sprint(s.Splits)
	})
}
