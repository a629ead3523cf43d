package e2e

import (
	"context"
	"testing"
	"time"
)

// Scenario 5: a tag route reaches the tagged revision, on the gateway's tag
// host and in Consul's router.
func TestE2E5TagRoute(t *testing.T) {
	h := newHarness(t, "5 tag route")
	const svc = "e2e-tag"
	h.cleanupService(svc)
	g := h.startServe("e2e-5", "", "")
	rev1 := revision(svc, 1)
	// All traffic to the latest revision (v2), tag "old" on v1.
	rev1, rev2 := h.twoRevisions(svc, []Traffic{{Latest: true, Percent: 100}, {Revision: rev1, Percent: 0, Tag: "old"}})

	summary := h.chain(svc)
	if summary.Tags["old"] != rev1 {
		t.Errorf("Consul's discovery chain routes tag old to %q, want %s (chain %+v)", summary.Tags["old"], rev1, summary)
	}
	if len(summary.Splits) != 1 || summary.Splits[rev2] != 100 {
		t.Errorf("plain requests split %v, want all to %s", summary.Splits, rev2)
	}

	client := NewClient(8)
	tagged := Burst(context.Background(), g.request(svc, "old", "/", client), 20)
	plain := Burst(context.Background(), g.request(svc, "", "/", client), 20)
	if apps := tagged.ByApp(); apps["v1"] != 20 {
		t.Errorf("Host %s reached %v (%s), want v1 only", host(svc, "old"), apps, tagged.Summary())
	}
	if apps := plain.ByApp(); apps["v2"] != 20 {
		t.Errorf("Host %s reached %v (%s), want v2 only", host(svc, ""), apps, plain.Summary())
	}

	// A tag set with the CLI routes too.
	h.mustCLI("traffic", "-to", "latest=100", "-tag", rev2+"=new", svc)
	eventually(t, 30*time.Second, "tag new reaches "+rev2, func() (bool, string) {
		got := Burst(context.Background(), g.request(svc, "new", "/", client), 5)
		return got.ByApp()["v2"] == 5, got.Summary()
	})
	if got := h.chain(svc).Tags["new"]; got != rev2 {
		t.Errorf("Consul routes tag new to %q, want %s", got, rev2)
	}
}
