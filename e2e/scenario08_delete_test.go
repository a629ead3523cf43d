package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// leftovers lists everything of a service Nomad or Consul still has: revision
// jobs (even dead ones), catalog registrations and checks of its revisions
// (the activator's stand-ins included), config entries of the service and
// its revisions, and KV keys naming it. Each check is also returned as a line
// for the report.
func (h *harness) leftovers(svc string, revs []string) (found, checked []string) {
	h.t.Helper()
	check := func(what string, left []string) {
		status := "nothing"
		if len(left) > 0 {
			status = strings.Join(left, ", ")
			found = append(found, what+": "+status)
		}
		checked = append(checked, fmt.Sprintf("%-58s %s", what, status))
	}

	jobs, _, err := h.nomad.Jobs().PrefixList(svc + "-")
	if err != nil {
		h.t.Fatal(err)
	}
	var ids []string
	for _, j := range jobs {
		ids = append(ids, j.ID+" ("+j.Status+")")
	}
	check("Nomad jobs with prefix "+svc+"- (any status)", ids)

	for _, rev := range revs {
		inst, _, err := h.consul.Catalog().Service(rev, "", nil)
		if err != nil {
			h.t.Fatal(err)
		}
		var regs []string
		for _, s := range inst {
			regs = append(regs, s.ServiceID)
		}
		check("Consul catalog instances of "+rev+" (stand-ins too)", regs)
		checks, _, err := h.consul.Health().Checks(rev, nil)
		if err != nil {
			h.t.Fatal(err)
		}
		var cs []string
		for _, c := range checks {
			cs = append(cs, c.CheckID)
		}
		check("Consul health checks of "+rev, cs)
	}

	for _, e := range []struct{ kind, name string }{
		{consul.ServiceDefaults, svc}, {consul.ServiceSplitter, svc}, {consul.ServiceRouter, svc}, {consul.ServiceResolver, svc},
	} {
		var left []string
		if h.configEntry(e.kind, e.name) != nil {
			left = append(left, e.kind+"/"+e.name)
		}
		check("Consul config entry "+e.kind+"/"+e.name, left)
	}
	for _, rev := range revs {
		for _, kind := range []string{consul.ServiceDefaults, consul.ServiceResolver} {
			var left []string
			if h.configEntry(kind, rev) != nil {
				left = append(left, kind+"/"+rev)
			}
			check("Consul config entry "+kind+"/"+rev, left)
		}
	}

	keys, _, err := h.consul.KV().Keys("nomad-serverless/", "", nil)
	if err != nil {
		h.t.Fatal(err)
	}
	var named []string
	for _, k := range keys {
		if strings.Contains(k, svc) {
			named = append(named, k)
		}
	}
	check("Consul KV keys under nomad-serverless/ naming "+svc, named)
	return found, checked
}

// Scenario 8: a file with one bad service deploys nothing; delete leaves
// nothing behind in Nomad or Consul.
func TestE2E8BadFileAndDelete(t *testing.T) {
	h := newHarness(t, "8 bad file, delete")
	const good, bad, del = "e2e-badfile-ok", "e2e-badfile-broken", "e2e-delete"
	h.cleanupService(good)
	h.cleanupService(bad)
	h.cleanupService(del)

	// One valid service and one whose scaling bounds contradict: deploy
	// refuses the whole file, names where, and changes nothing.
	broken := testService(bad)
	broken.Scaling.Min, broken.Scaling.Max = 4, 2
	path := h.writeServices("bad.hcl", testService(good), broken)
	out, errOut, code := h.cli("deploy", "-sidecar-command", h.bin, "-wait", "1m", path)
	if code == 0 {
		t.Fatalf("deploy of a file with an invalid service succeeded:\n%s%s", out, errOut)
	}
	if msg := out + errOut; !strings.Contains(msg, filepath.Base(path)) || !strings.Contains(msg, "min 4 is greater than max 2") || !strings.Contains(msg, "Nothing was deployed.") {
		t.Errorf("deploy's refusal does not name the file and the setting, or does not say nothing was deployed:\n%s", msg)
	}
	for _, svc := range []string{good, bad} {
		found, checked := h.leftovers(svc, []string{revision(svc, 1)})
		t.Logf("after the refused deploy, %s:\n  %s", svc, strings.Join(checked, "\n  "))
		if len(found) > 0 {
			t.Errorf("a refused deploy changed the cluster: %v", found)
		}
	}

	// Two revisions of a service, traffic split, then delete.
	g := h.startServe("e2e-8", "", "")
	s := testService(del)
	h.deploy(h.writeServices("del-v1.hcl", s))
	s.Env = map[string]string{"TESTAPP_NAME": "v2"}
	s.Traffic = []Traffic{{Revision: revision(del, 1), Percent: 50}, {Latest: true, Percent: 50, Tag: "new"}}
	h.deploy(h.writeServices("del-v2.hcl", s))
	revs := []string{revision(del, 1), revision(del, 2)}
	eventually(t, 30*time.Second, "the gateway knows both revisions of "+del, func() (bool, string) {
		view := g.gatewayView(t)
		_, ok1 := view[revs[0]]
		_, ok2 := view[revs[1]]
		return ok1 && ok2, fmt.Sprintf("%+v", view)
	})
	if found, _ := h.leftovers(del, revs); len(found) == 0 {
		t.Fatalf("the deployed service left no trace to delete: the leftovers check sees nothing")
	}
	if o := g.request(del, "", "/", NewClient(2)).Do(context.Background()); !o.OK() {
		t.Fatalf("deployed service does not answer: %s", o.Describe())
	}

	start := time.Now()
	out = h.mustCLI("delete", del)
	for _, want := range []string{del + ": route removed from Consul", revs[0] + ": purged from Nomad", revs[1] + ": purged from Nomad"} {
		if !strings.Contains(out, want) {
			t.Errorf("delete's output lacks %q:\n%s", want, out)
		}
	}
	var checked []string
	eventually(t, 90*time.Second, "nothing of "+del+" left in Nomad or Consul", func() (bool, string) {
		var found []string
		found, checked = h.leftovers(del, revs)
		return len(found) == 0, strings.Join(found, "; ")
	})
	h.timing("delete -> nothing left in Nomad and Consul", time.Since(start))
	report := "checked after delete " + del + ":\n  " + strings.Join(checked, "\n  ")
	t.Log(report)
	fmt.Fprintln(os.Stdout, "e2e scenario 8, "+report)

	// The gateway forgot it too: its view has none of the revisions, and
	// the service's host answers 404.
	eventually(t, 30*time.Second, "the gateway stops routing "+del, func() (bool, string) {
		view := g.gatewayView(t)
		for _, rev := range revs {
			if _, ok := view[rev]; ok {
				return false, "the gateway's view still lists " + rev
			}
		}
		o := g.request(del, "", "/", NewClient(1)).Do(context.Background())
		return o.Err == nil && o.Status == http.StatusNotFound, o.Describe()
	})
}
