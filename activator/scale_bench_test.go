package activator

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// scaleSizes are the revision counts of the simulation benchmarks (issue
// 45): each cost is measured at 1k, 10k and 100k revisions so its growth
// shows (10x the revisions: 10x the cost is linear, 100x quadratic).
var scaleSizes = []int{1_000, 10_000, 100_000}

// scaleCatalog is a catalog of n services of one revision each, all at
// zero (no allocation, no ready instance), as most of a big cluster is.
func scaleCatalog(n int) *catalog.Catalog {
	cat := catalog.New()
	for i := range n {
		svc := fmt.Sprintf("s%06d", i)
		rev := spec.RevisionName(svc, 1)
		cat.SetRevision(catalog.Revision{Name: rev, Service: svc, Namespace: "default", Generation: 1,
			Timeout: time.Minute, Scaling: spec.DefaultScaling()})
		cat.SetService(catalog.Service{Name: svc, Namespace: "default",
			Route: consulroute.Route{Service: svc, Namespace: "default", Splits: []consulroute.Split{{Revision: rev, Percent: 100}}}})
	}
	return cat
}

func scaleGateway(b *testing.B, cat *catalog.Catalog) *Gateway {
	b.Helper()
	g, err := New(Config{Catalog: cat, Autoscaler: &fakeAutoscaler{}, Registerer: prometheus.NewRegistry()})
	if err != nil {
		b.Fatal(err)
	}
	return g
}

func heapInUse() uint64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// BenchmarkScaleRouteTable is one rebuild of the gateway's routing table,
// as after a catalog change, over n revisions at zero. It also reports the
// heap the gateway holds per revision (its table, revision states and
// their metric series).
func BenchmarkScaleRouteTable(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("revisions=%d", n), func(b *testing.B) {
			cat := scaleCatalog(n)
			before := heapInUse()
			g := scaleGateway(b, cat)
			held := heapInUse() - before
			// A change: the table is rebuilt from the whole catalog.
			cat.SetRevision(catalog.Revision{Name: "other-00001", Service: "other", Namespace: "default", Timeout: time.Minute})
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				g.rebuild()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/revision")
			b.ReportMetric(float64(held)/float64(n), "heap-B/revision")
			runtime.KeepAlive(g)
		})
	}
}

// BenchmarkScaleRevisionStates is a second of the gateway's background
// work over the states of n revisions, 1 % of them with a request in
// flight and the rest at zero: the queue sweeps (every sweepInterval), the
// reads of the excess burst capacity (every ebcInterval) and the demand
// report to the autoscaler (every demandInterval). What it costs is CPU
// spent whether or not requests come.
func BenchmarkScaleRevisionStates(b *testing.B) {
	for _, n := range scaleSizes {
		b.Run(fmt.Sprintf("revisions=%d", n), func(b *testing.B) {
			g := scaleGateway(b, scaleCatalog(n))
			busy := 0
			for _, r := range g.table.Load().revisions {
				if busy == n/100 {
					break
				}
				r.inflight.Add(1)
				g.markActive(r)
				busy++
			}
			ctx := context.Background()
			sweeps, reads := int(demandInterval/sweepInterval), int(demandInterval/ebcInterval)
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				for range sweeps {
					g.sweepQueues()
				}
				for range reads {
					g.refreshEBC()
				}
				g.reportDemand(ctx)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/revision")
		})
	}
}
