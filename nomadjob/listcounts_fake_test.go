package nomadjob_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/nomad-serverless/nomad-serverless/test/fakecluster"
	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// TestAllRevisionCountsReadsOnlyJobsNotAtRest: `list` reads the job of a
// revision that has instances, never of one at rest, so it costs one
// listing whatever the number of revisions at zero (issue 45: 4.8 s at
// 2,716 services, one job read each).
func TestAllRevisionCountsReadsOnlyJobsNotAtRest(t *testing.T) {
	c := fakecluster.Start(t, fakecluster.Options{ShutdownDelay: -1})
	target, err := url.Parse(c.Nomad.Addr())
	if err != nil {
		t.Fatal(err)
	}
	var jobReads atomic.Int64
	proxy := httputil.NewSingleHostReverseProxy(target)
	counting := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && strings.HasPrefix(r.URL.Path, "/v1/job/") {
			jobReads.Add(1)
		}
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(counting.Close)
	cfg := c.Nomad.ClientConfig()
	cfg.Address = counting.URL
	nc, err := nomadjob.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	const atZero = 40
	for i := range atZero {
		svc := sleepService()
		svc.Name = fmt.Sprintf("idle%d", i)
		svc.Scaling.Min, svc.Scaling.Initial = 0, 0
		if _, err := nc.Register(ctx, sleeper(t, &svc, 1), 0); err != nil {
			t.Fatal(err)
		}
	}
	busy := sleepService()
	busy.Name = "busy"
	busy.Scaling.Initial = 2
	if _, err := nc.Register(ctx, sleeper(t, &busy, 1), 0); err != nil {
		t.Fatal(err)
	}
	testbin.Eventually(t, 20*time.Second, 50*time.Millisecond, "busy-00001 running 2", func() (bool, string) {
		revs, err := nc.Revisions(ctx, "default", "busy")
		return err == nil && len(revs) == 1 && revs[0].Running == 2, fmt.Sprintf("%+v, %v", revs, err)
	})

	jobReads.Store(0)
	counts, err := nc.AllRevisionCounts(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := jobReads.Load(); n != 1 {
		t.Errorf("listing %d revisions at zero and one busy read %d jobs, want 1 (the busy one)", atZero, n)
	}
	if len(counts) != atZero+1 {
		t.Fatalf("%d revisions listed, want %d: %+v", len(counts), atZero+1, counts)
	}
	for _, rc := range counts {
		want := nomadjob.RevisionCount{Name: rc.Service + "-00001", Service: rc.Service, Namespace: spec.DefaultNamespace}
		if rc.Service == "busy" {
			want.Desired, want.Running = 2, 2
		}
		if rc != want {
			t.Errorf("counts %+v, want %+v", rc, want)
		}
	}
}
