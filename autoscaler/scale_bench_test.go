package autoscaler

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/spec"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/common/expfmt"
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
				cat := bigCatalog(n)
				benchCatalogTicks(b, cat, changing)
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(n), "ns/revision")
			})
		}
	}
}

// BenchmarkScaleScrape is one Prometheus scrape of the autoscaler's
// metrics (gather and text encoding, as promhttp serves them) over n
// revisions, 1 % of them with 3 instances and the rest at rest at zero
// (issue 45: at 10,000 revisions the leader's idle CPU was 12.85 % of a
// core against 2.7-3 % on the followers, and only the leader exports the
// autoscaler's series). series is how many series one scrape carries.
func BenchmarkScaleScrape(b *testing.B) {
	for _, n := range []int{1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("revisions=%d", n), func(b *testing.B) {
			cat := bigCatalog(n)
			reg := prometheus.NewRegistry()
			clk := newClock()
			a, err := New(Config{
				Revisions:  cat,
				Scaler:     nopScaler{},
				Scraper:    constScraper{spec.Stats{AverageConcurrency: 60, IntervalSeconds: 2}},
				Now:        clk.Now,
				Registerer: reg,
			})
			if err != nil {
				b.Fatal(err)
			}
			a.running.Store(true)
			l := newLoop(a)
			for range 30 {
				clk.Advance(2 * time.Second)
				l.tickAll(context.Background())
			}
			l.applies.Wait()
			series := 0
			b.ReportAllocs()
			cpu := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				mfs, err := reg.Gather()
				if err != nil {
					b.Fatal(err)
				}
				series = 0
				enc := expfmt.NewEncoder(io.Discard, expfmt.NewFormat(expfmt.TypeTextPlain))
				for _, mf := range mfs {
					series += len(mf.GetMetric())
					if err := enc.Encode(mf); err != nil {
						b.Fatal(err)
					}
				}
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu).Microseconds())/1000/float64(b.N), "cpu-ms/scrape")
			b.ReportMetric(float64(series), "series")
		})
	}
}

// bigCatalog holds n revisions, 1 % of them with 3 ready instances and the
// rest at zero, as a big cluster is.
func bigCatalog(n int) *catalog.Catalog {
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
	return cat
}
