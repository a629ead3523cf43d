package autoscaler

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/consulroute"
	"github.com/nomad-serverless/nomad-serverless/nomadjob"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// StatsScraper reads one instance's sidecar stats. The autoscaler calls it
// from several goroutines at once.
type StatsScraper interface {
	Scrape(ctx context.Context, inst consulroute.Instance) (spec.Stats, error)
}

// HTTPScraper reads spec.Stats as JSON from
// http://<Address>:<AdminPort>/stats. Connections are kept alive: the same
// instances are scraped every tick.
type HTTPScraper struct {
	client *http.Client
}

// NewHTTPScraper returns a scraper using client; nil gets a client of its
// own (no proxy, a few idle connections per instance). Deadlines come from
// the context of each Scrape.
func NewHTTPScraper(client *http.Client) *HTTPScraper {
	if client == nil {
		client = &http.Client{Transport: &http.Transport{
			Proxy:               nil, // sidecars are never behind a proxy
			DialContext:         (&net.Dialer{Timeout: 2 * time.Second}).DialContext,
			MaxIdleConns:        1024,
			MaxIdleConnsPerHost: 2,
			IdleConnTimeout:     30 * time.Second,
		}}
	}
	return &HTTPScraper{client: client}
}

// maxStatsBody bounds a stats answer: the real one is a few hundred bytes.
const maxStatsBody = 64 << 10

// Scrape implements StatsScraper.
func (h *HTTPScraper) Scrape(ctx context.Context, inst consulroute.Instance) (spec.Stats, error) {
	if inst.Address == "" || inst.AdminPort <= 0 {
		return spec.Stats{}, fmt.Errorf("scrape %s: Consul lists no admin port for it (service meta %q)", inst.ID, spec.ServiceMetaAdminPort)
	}
	url := "http://" + net.JoinHostPort(inst.Address, strconv.Itoa(inst.AdminPort)) + spec.StatsPath
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return spec.Stats{}, fmt.Errorf("scrape %s: %w", inst.ID, err)
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return spec.Stats{}, fmt.Errorf("scrape %s: %w", inst.ID, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		io.Copy(io.Discard, io.LimitReader(resp.Body, maxStatsBody))
		return spec.Stats{}, fmt.Errorf("scrape %s: GET %s: %s", inst.ID, url, resp.Status)
	}
	var st spec.Stats
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxStatsBody)).Decode(&st); err != nil {
		return spec.Stats{}, fmt.Errorf("scrape %s: GET %s: decode stats: %w", inst.ID, url, err)
	}
	return st, nil
}

// sampleSize is Knative's population-mean sample size: every instance up
// to 3, then n = N*X / (N+X-1) with X = 1.96^2 * 100 / 5^2 (95 % confidence,
// margin of error 5, variance 100), so 10 instances are sampled 7 at a time
// and 1,000 instances 16 at a time.
func sampleSize(population int) int {
	if population <= 3 {
		return max(population, 0)
	}
	const x = 1.96 * 1.96 * 100 / (5 * 5)
	n := float64(population)
	return int(math.Ceil(n * x / (n + x - 1)))
}

// ResourceReader reads how much of its reservation the serving task of
// one instance uses, as a percentage: the metric of revisions scaled on cpu
// or memory (m), from Nomad's allocation stats. *nomadjob.UsageReader is
// one. The autoscaler calls it from several goroutines at once, only for
// such revisions.
type ResourceReader interface {
	Utilization(ctx context.Context, revision, allocID string, m spec.Metric) (float64, error)
}

// scrapeJob is one instance to scrape this tick; scrapeResult its answer.
type scrapeJob struct {
	rev    int32                 // index of the revision in the tick
	metric spec.Metric           // what to read (an effective metric: never "")
	inst   *consulroute.Instance // points into the revision's ready list of this tick
}

type scrapeResult struct {
	value float64
	ok    bool
}

// collector scrapes many instances in parallel with one deadline. Its job
// and result slices are reused from tick to tick, so a steady cluster
// allocates little besides the scrapes themselves. Owned by the loop.
type collector struct {
	scraper StatsScraper
	// resources reads cpu and memory use (nil: unknown, every tick); at
	// most cap(resourceSem) reads run at once, because each is a request
	// to a Nomad server, which forwards it to a client, where a sidecar
	// scrape reaches the instance itself.
	resources   ResourceReader
	resourceSem chan struct{}
	timeout     time.Duration
	workers     int

	jobs    []scrapeJob
	results []scrapeResult
	failed  []error // first failure per job, for logs; nil entries on success
}

func (c *collector) reset() {
	c.jobs = c.jobs[:0]
}

func (c *collector) add(rev int32, metric spec.Metric, inst *consulroute.Instance) {
	c.jobs = append(c.jobs, scrapeJob{rev: rev, metric: metric, inst: inst})
}

// run scrapes every job, at most workers at a time, and fills results. A
// failed scrape (error, timeout, or stats of another revision) leaves ok
// false: the instance is unknown this tick, not idle.
func (c *collector) run(ctx context.Context) {
	n := len(c.jobs)
	if cap(c.results) < n {
		c.results = make([]scrapeResult, n)
		c.failed = make([]error, n)
	}
	c.results = c.results[:n]
	c.failed = c.failed[:n]
	clear(c.results)
	clear(c.failed)
	if n == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var next atomic.Int64
	work := func() {
		for {
			i := int(next.Add(1) - 1)
			if i >= n {
				return
			}
			c.scrapeOne(ctx, i)
		}
	}
	workers := min(c.workers, n)
	var wg sync.WaitGroup
	wg.Add(workers - 1)
	for range workers - 1 {
		go func() {
			defer wg.Done()
			work()
		}()
	}
	work()
	wg.Wait()
}

func (c *collector) scrapeOne(ctx context.Context, i int) {
	j := &c.jobs[i]
	if j.metric.Resource() {
		c.readResource(ctx, i)
		return
	}
	st, err := c.scraper.Scrape(ctx, *j.inst)
	if err == nil && st.Revision != "" && j.inst.Revision != "" && st.Revision != j.inst.Revision {
		// The port now belongs to another revision's sidecar.
		err = fmt.Errorf("scrape %s: it reports revision %s, not %s", j.inst.ID, st.Revision, j.inst.Revision)
	}
	if err != nil {
		c.failed[i] = err
		return
	}
	v := st.AverageConcurrency
	if j.metric == spec.MetricRPS {
		v = st.RPS
		if v == 0 && st.IntervalSeconds > 0 {
			v = st.Requests / st.IntervalSeconds
		}
	}
	if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
		c.failed[i] = fmt.Errorf("scrape %s: invalid value %v", j.inst.ID, v)
		return
	}
	c.results[i] = scrapeResult{value: v, ok: true}
}

// readResource reads job i's cpu or memory use from Nomad. A failure, or
// an instance whose Consul service ID names no allocation, leaves it
// unknown this tick.
func (c *collector) readResource(ctx context.Context, i int) {
	j := &c.jobs[i]
	if c.resources == nil {
		c.failed[i] = fmt.Errorf("read %s use of %s: the autoscaler has no resource reader (Config.Resources)", j.metric, j.inst.ID)
		return
	}
	allocID, ok := nomadjob.ServiceAllocID(j.inst.ID)
	if !ok {
		c.failed[i] = fmt.Errorf("read %s use of %s: its Consul service ID names no Nomad allocation", j.metric, j.inst.ID)
		return
	}
	select {
	case c.resourceSem <- struct{}{}:
		defer func() { <-c.resourceSem }()
	case <-ctx.Done():
		c.failed[i] = fmt.Errorf("read %s use of revision %s in allocation %s: %w", j.metric, j.inst.Revision, allocID, ctx.Err())
		return
	}
	v, err := c.resources.Utilization(ctx, j.inst.Revision, allocID, j.metric)
	if err == nil && (math.IsNaN(v) || math.IsInf(v, 0) || v < 0) {
		err = fmt.Errorf("read %s use of revision %s in allocation %s: invalid value %v", j.metric, j.inst.Revision, allocID, v)
	}
	if err != nil {
		c.failed[i] = err
		return
	}
	c.results[i] = scrapeResult{value: v, ok: true}
}
