package controlplane

import (
	"context"
	"fmt"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// scaleRevisions is a Nomad listing of n revisions at zero.
func scaleRevisions(n int) []nomadjob.RevisionStatus {
	out := make([]nomadjob.RevisionStatus, n)
	for i := range out {
		svc := fmt.Sprintf("s%06d", i)
		out[i] = nomadjob.RevisionStatus{RevisionInfo: nomadjob.RevisionInfo{Name: spec.RevisionName(svc, 1), Service: svc,
			Namespace: spec.DefaultNamespace, Generation: 1, Scaling: spec.DefaultScaling(), Timeout: spec.DefaultTimeout}}
	}
	return out
}

// BenchmarkScaleCatalogFeed is the catalog feed's bookkeeping over n
// revisions (issue 45: 1k, 10k, 100k), Nomad answering from memory:
// "list" folds a whole listing into an empty catalog (serve's start),
// "relist" into a catalog that already holds it (after the event stream
// broke), "event" folds one event (a revision scaled) into a catalog of n.
func BenchmarkScaleCatalogFeed(b *testing.B) {
	ctx := context.Background()
	for _, n := range []int{1_000, 10_000, 100_000} {
		revs := scaleRevisions(n)
		src := &fakeNomadSource{revs: revs, allocs: map[string][]nomadjob.Allocation{}}
		b.Run(fmt.Sprintf("revisions=%d/list", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				b.StopTimer()
				cat, tags := catalog.New(), newRevisionTags()
				b.StartTimer()
				reconcileNomad(ctx, src, cat, tags, revs, quietLog)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/revision")
		})
		b.Run(fmt.Sprintf("revisions=%d/relist", n), func(b *testing.B) {
			cat, tags := catalog.New(), newRevisionTags()
			reconcileNomad(ctx, src, cat, tags, revs, quietLog)
			b.ReportAllocs()
			for b.Loop() {
				reconcileNomad(ctx, src, cat, tags, revs, quietLog)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/revision")
		})
		b.Run(fmt.Sprintf("revisions=%d/event", n), func(b *testing.B) {
			cat, tags := catalog.New(), newRevisionTags()
			reconcileNomad(ctx, src, cat, tags, revs, quietLog)
			ev := nomadjob.Event{Kind: nomadjob.EventRevisionUpdated, Revision: revs[n/2].RevisionInfo}
			b.ReportAllocs()
			for b.Loop() {
				ev.Revision.Count = 1 - ev.Revision.Count
				noteWake(cat, nil, ev)
				applyNomadEvent(cat, tags, ev)
			}
		})
	}
}
