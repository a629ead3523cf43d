package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// testService is the scenarios' usual service: the test app, named v1, at
// most 10 requests per instance, fast scaling.
func testService(name string) Service {
	return Service{
		Name:        name,
		Env:         map[string]string{"TESTAPP_NAME": "v1"},
		Concurrency: 10,
		Scaling:     FastScaling(),
	}
}

// Scenario 1: deploy -> ready -> request through the gateway.
func TestE2E1DeployReadyRequest(t *testing.T) {
	h := newHarness(t, "1 deploy")
	const svc = "e2e-deploy"
	rev := revision(svc, 1)
	h.cleanupService(svc)
	g := h.startServe("e2e-1", "", "")

	// min 1: this scenario looks at a steady instance; scenario 2 scales
	// to zero. With the usual 2 s grace the revision could go to zero
	// between deploy and the request, and the request would reach a new
	// allocation instead of the one the test inspects.
	service := testService(svc)
	service.Scaling.Min = 1
	file := h.writeServices("deploy.hcl", service)
	start := time.Now()
	out := h.deploy(file)
	h.timing("deploy (register, publish, wait for an instance)", time.Since(start))
	// What deploy says: a new revision, ready, routed, and where the
	// gateway serve registered in Consul answers for it.
	if out.Registered[rev] != 1 || out.Ready[rev] != (Ready{Passing: 1, Want: 1}) || out.Routes[svc] != rev+" 100%" {
		t.Errorf("deploy's report: registered %v, ready %v, routes %v:\n%s", out.Registered, out.Ready, out.Routes, out.Text)
	}
	wantURL := ServiceURL{URL: "http://" + host(svc, "") + "/", Host: host(svc, ""), Gateway: g.listen}
	if out.URLs[svc] != wantURL {
		t.Errorf("deploy's URL line = %+v, want %+v:\n%s", out.URLs[svc], wantURL, out.Text)
	}

	// Nomad: the revision job with the contract's shape, one instance running.
	job, _, err := h.nomad.Jobs().Info(rev, nil)
	if err != nil {
		t.Fatalf("Nomad has no job %s: %v", rev, err)
	}
	if job.Type == nil || *job.Type != "service" || job.Meta[spec.JobMetaService] != svc || job.Meta[spec.JobMetaRevision] != rev || job.Meta[spec.JobMetaGen] != "1" {
		t.Errorf("job %s: type %v meta %v", rev, deref(job.Type), job.Meta)
	}
	if n, _ := h.groupCount(rev); n != 1 {
		t.Errorf("group count %d, want initial 1", n)
	}
	// deploy waited for Consul's passing check; Nomad may still list the
	// allocation pending for a moment (its client reports in batches).
	alloc := h.waitRunning(rev, 1, 30*time.Second)[0].ID
	// Consul: one passing instance (the sidecar's check wraps /ready), the
	// route, the KV copy.
	pass := h.passing(rev)
	if len(pass) != 1 {
		t.Fatalf("Consul lists %d passing instances of %s, want 1", len(pass), rev)
	}
	if !strings.Contains(strings.Join(pass[0].Service.Tags, ","), spec.TagServicePrefix+svc) {
		t.Errorf("instance tags %v lack %s%s", pass[0].Service.Tags, spec.TagServicePrefix, svc)
	}
	if s := h.splits(svc); len(s) != 1 || s[rev] != 100 {
		t.Errorf("service-splitter %s = %v, want %s: 100", svc, s, rev)
	}
	if d, ok := h.configEntry(consul.ServiceDefaults, svc).(*consul.ServiceConfigEntry); !ok || d.Protocol != "http" {
		t.Errorf("service-defaults %s: %#v, want protocol http", svc, d)
	}
	if kv, _, err := h.consul.KV().Get(consulroute.RecordKey("default", svc), nil); err != nil || kv == nil {
		t.Errorf("KV copy of the service missing: %v", err)
	}

	// The gateway routes to the instance Nomad runs, and the autoscaler
	// (this serve leads) counts it.
	eventually(t, 10*time.Second, "the gateway routes "+rev+" to allocation "+alloc, func() (bool, string) {
		v := g.gatewayView(t)[rev]
		return len(v.Instances) == 1 && v.Instances[0].Alloc == alloc, fmt.Sprintf("%+v", v)
	})
	eventually(t, 10*time.Second, "the autoscaler counts one instance of "+rev, func() (bool, string) {
		v, err := g.autoscalerView(svc)
		if err != nil {
			return false, err.Error()
		}
		return v[rev].Count == 1 && v[rev].Actual == 1, fmt.Sprintf("%+v", v)
	})

	// A request through the gateway reaches the app.
	client := NewClient(4)
	o := g.request(svc, "", "/", client).Do(context.Background())
	if !o.OK() || o.App != "v1" {
		t.Fatalf("GET via gateway: %s, app %q", o.Describe(), o.App)
	}
	h.timing("request through the gateway, warm", o.End.Sub(o.Start))
	if st := h.appStats(alloc); st.Requests < 1 {
		t.Errorf("the app counted %d requests, want the one sent", st.Requests)
	}

	// The same file again makes no new revision.
	if again := h.deploy(file); len(again.Registered) != 0 || len(again.Unchanged) != 1 || again.Unchanged[0] != rev {
		t.Errorf("deploying the same file again: registered %v, unchanged %v:\n%s", again.Registered, again.Unchanged, again.Text)
	}
	if _, _, err := h.nomad.Jobs().Info(revision(svc, 2), nil); err == nil {
		t.Errorf("deploying the same file again registered %s", revision(svc, 2))
	}
	if jobs, _, _ := h.nomad.Jobs().PrefixList(svc + "-"); len(jobs) != 1 {
		t.Errorf("Nomad has %d jobs for %s, want 1", len(jobs), svc)
	}
}
