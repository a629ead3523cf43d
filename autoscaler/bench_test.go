package autoscaler

import (
	"context"
	"fmt"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/catalog"
	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// staticSource is a RevisionSource that hands out prebuilt slices, so the
// benchmarks measure the autoscaler, not the catalog's copies.
type staticSource struct {
	revs  []catalog.Revision
	ready map[string][]consulroute.Instance
}

func (s *staticSource) Revisions() []catalog.Revision { return s.revs }
func (s *staticSource) Ready(name string) []consulroute.Instance {
	return s.ready[name]
}

func newStaticSource(revisions, instancesEach int) *staticSource {
	s := &staticSource{ready: make(map[string][]consulroute.Instance, revisions)}
	for i := range revisions {
		name := fmt.Sprintf("svc%05d-00001", i)
		r := testRevision(name, instancesEach, nil)
		s.revs = append(s.revs, r)
		if instancesEach > 0 {
			s.ready[name] = instances(name, instancesEach)
		}
	}
	return s
}

// constScraper answers every scrape at once with the same stats.
type constScraper struct{ stats spec.Stats }

func (c constScraper) Scrape(context.Context, consulroute.Instance) (spec.Stats, error) {
	return c.stats, nil
}

type nopScaler struct{}

func (nopScaler) Scale(context.Context, string, int, string, map[string]string) error { return nil }

func benchLoop(b *testing.B, src RevisionSource, clk *clock) (*Autoscaler, *loop) {
	b.Helper()
	a, err := New(Config{
		Revisions: src,
		Scaler:    nopScaler{},
		// 60 concurrent per instance: 3 instances are right (180 / 70),
		// so the steady state makes no scale calls.
		Scraper: constScraper{spec.Stats{AverageConcurrency: 60, IntervalSeconds: 2}},
		Now:     clk.Now,
	})
	if err != nil {
		b.Fatal(err)
	}
	a.running.Store(true)
	return a, newLoop(a)
}

// BenchmarkTick10kRevisions is one tick over 10,000 revisions of 3 instances
// each: sampling, scrape fan-out (to an in-memory scraper), aggregation into
// the windows, decisions, publishing. Target: under 50 ms per tick.
func BenchmarkTick10kRevisions(b *testing.B) {
	const revisions, each = 10_000, 3
	src := newStaticSource(revisions, each)
	clk := newClock()
	_, l := benchLoop(b, src, clk)
	ctx := context.Background()
	// Fill the windows (a minute of ticks) so the steady state is measured.
	for range 30 {
		clk.Advance(2 * time.Second)
		l.tickAll(ctx)
	}
	l.applies.Wait()
	b.ReportAllocs()
	cpu := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		clk.Advance(2 * time.Second)
		l.tickAll(ctx)
	}
	b.StopTimer()
	l.applies.Wait()
	reportTick(b, cpuTime()-cpu)
}

// reportTick adds wall and CPU milliseconds per tick. CPU time (the
// process's, all goroutines and the GC) is what a tick costs; wall time on a
// shared 2-core machine also counts other processes' turns.
func reportTick(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(b.Elapsed().Microseconds())/1000/float64(b.N), "ms/tick")
	b.ReportMetric(float64(cpu.Microseconds())/1000/float64(b.N), "cpu-ms/tick")
}

// benchCatalogTicks times the autoscaler's tick over cat after 30 ticks of
// warm-up; changing makes a catalog change before every tick, so each one
// reads the whole catalog again.
func benchCatalogTicks(b *testing.B, cat *catalog.Catalog, changing bool) {
	clk := newClock()
	_, l := benchLoop(b, cat, clk)
	ctx := context.Background()
	for range 30 {
		clk.Advance(2 * time.Second)
		l.tickAll(ctx)
	}
	l.applies.Wait()
	other := testRevision("other-00001", 0, nil)
	b.ReportAllocs()
	cpu := cpuTime()
	b.ResetTimer()
	for b.Loop() {
		if changing {
			other.Desired = 1 - other.Desired
			cat.SetRevision(other)
		}
		clk.Advance(2 * time.Second)
		l.tickAll(ctx)
	}
	b.StopTimer()
	l.applies.Wait()
	reportTick(b, cpuTime()-cpu)
}

// cpuTime is the process's user+system CPU time so far.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkTick10kRevisionsCatalog is the same tick reading a real
// *catalog.Catalog. Its Revisions and Ready hand out copies; "unchanged"
// is a steady cluster (the loop keeps last tick's read), "changing" has a
// catalog change every tick, so every tick re-reads all of it: the cost the
// production source adds on top of the autoscaler's own.
func BenchmarkTick10kRevisionsCatalog(b *testing.B) {
	for _, changing := range []bool{false, true} {
		name := "unchanged"
		if changing {
			name = "changing"
		}
		b.Run(name, func(b *testing.B) {
			const revisions, each = 10_000, 3
			src := newStaticSource(revisions, each)
			cat := catalog.New()
			for _, r := range src.revs {
				cat.SetRevision(r)
				cat.SetReady(r.Name, src.ready[r.Name])
			}
			benchCatalogTicks(b, cat, changing)
		})
	}
}

// BenchmarkIdleRevisionMemory measures the heap an idle revision (at zero,
// default scaling, a full stable window of samples) costs the autoscaler,
// as a runtime.MemStats delta over 10,000 of them. Target: under 2 KiB.
// The timed part is an idle tick.
func BenchmarkIdleRevisionMemory(b *testing.B) {
	const revisions = 10_000
	src := newStaticSource(revisions, 0)
	clk := newClock()
	ctx := context.Background()

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	a, l := benchLoop(b, src, clk)
	for range 31 {
		clk.Advance(2 * time.Second)
		l.tickAll(ctx)
	}
	l.applies.Wait()
	runtime.GC()
	runtime.ReadMemStats(&after)
	perRevision := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)) / revisions

	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		clk.Advance(2 * time.Second)
		l.tickAll(ctx)
	}
	b.StopTimer()
	b.ReportMetric(perRevision, "B/idle-revision")
	if _, ok := a.State(src.revs[0].Name); !ok {
		b.Fatal("no state for an idle revision")
	}
	runtime.KeepAlive(l)
}
