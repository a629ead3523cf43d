package autoscaler

import (
	"fmt"
	"testing"

	"github.com/nomad-serverless/nomad-serverless/catalog"
)

// BenchmarkScaleTick is one autoscaler tick over n revisions in a real
// catalog, 1 % of them with 3 instances and the rest at zero, as a big
// cluster is (issue 45: 1k, 10k, 100k). "unchanged": a steady cluster;
// "changing": a catalog change before every tick, so the tick reads the
// whole catalog again.
func BenchmarkScaleTick(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		for _, changing := range []bool{false, true} {
			name := fmt.Sprintf("revisions=%d/unchanged", n)
			if changing {
				name = fmt.Sprintf("revisions=%d/changing", n)
			}
			b.Run(name, func(b *testing.B) {
				cat := catalog.New()
				for i := range n {
					each := 0
					if i%100 == 0 {
						each = 3
					}
					r := testRevision(fmt.Sprintf("s%06d-00001", i), each, nil)
					cat.SetRevision(r)
					if each > 0 {
						cat.SetReady(r.Name, instances(r.Name, each))
					}
				}
				benchCatalogTicks(b, cat, changing)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/revision")
			})
		}
	}
}
