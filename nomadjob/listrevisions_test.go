package nomadjob

import (
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/fixtures"
)

// ListRevisions is one listing with meta=true (nomad-1.6/063 and
// nomad-2.0/063, recorded from dev agents 1.6.5 and 2.0.5): each stub
// carries the job's meta, so every revision's routing fields come without
// reading its job.
func TestListRevisionsFromTheListingWithMeta(t *testing.T) {
	for _, dir := range []string{"nomad-1.6", "nomad-2.0"} {
		t.Run(dir, func(t *testing.T) {
			c, r := newTestClient(t, fixtures.Load(t, dir+"/063-jobs-list-with-meta.json"))
			revs, index, err := c.ListRevisions(testCtx(t))
			if err != nil {
				t.Fatal(err)
			}
			if index == 0 || len(revs) != 2 {
				t.Fatalf("index %d revisions %+v", index, revs)
			}
			got := r.Received()
			if q := got[0].Query; q.Get("meta") != "true" || q.Get("filter") != `"serverless.service" in Meta` || q.Get("namespace") != "*" {
				t.Errorf("listing query %v, want meta=true, our filter, every namespace", q)
			}
			if len(got) != 1 {
				t.Errorf("%d requests, want the one listing (no job read)", len(got))
			}
			hello, idle := revs[0], revs[1]
			if hello.Name != "hello-00001" || !hello.MetaListed || hello.Service != "hello" || hello.Namespace != "default" ||
				hello.Generation != 1 || hello.Concurrency != 5 || hello.Timeout != 42*time.Second || hello.Stopped ||
				hello.JobModifyIndex == 0 || hello.Queued != 1 || hello.AtRest() {
				t.Errorf("hello-00001 = %+v", hello)
			}
			if idle.Name != "idle-00001" || !idle.MetaListed || idle.Service != "idle" || !idle.AtRest() {
				t.Errorf("idle-00001 = %+v", idle)
			}
			// Only the job says these.
			if hello.Count != 0 || hello.ServiceTags != nil || hello.Scaling.Target != 0 {
				t.Errorf("hello-00001 has fields the listing does not carry: %+v", hello)
			}
		})
	}
}

// A listing without meta (Nomad before 1.6 ignores meta=true; here the
// recorded 1.6 listing that did not ask) says only the name: the feed
// reads those jobs.
func TestListRevisionsWithoutMetaSaysSo(t *testing.T) {
	e := allRevisionsList(t)
	e.Request.Query.Set("meta", "true")
	c, _ := newTestClient(t, e)
	revs, _, err := c.ListRevisions(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(revs) != 1 || revs[0].MetaListed || revs[0].Name != "hello-00001" || revs[0].Running != 1 {
		t.Errorf("revisions %+v, want hello-00001 without meta", revs)
	}
}
