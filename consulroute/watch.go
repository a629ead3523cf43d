package consulroute

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/hashicorp/consul/api"
	"github.com/nomad-serverless/nomad-serverless/spec"
)

// blockingQuery runs one blocking query: it is given the index to wait on
// (0 for the first call) and returns Consul's new index.
type blockingQuery func(q *api.QueryOptions) (index uint64, err error)

// watch repeats a blocking query until ctx ends, the way Consul documents
// it: wait on the last index; an unchanged index means nothing changed (a
// wait that timed out, fixture 018) and is not reported; an index that went
// backwards resets to 0; failures are retried with backoff and logged, never
// returned. changed is called after each query whose index moved.
func (c *Client) watch(ctx context.Context, what string, query blockingQuery, changed func()) {
	c.watchPaced(ctx, what, query, func() time.Duration { changed(); return 0 })
}

// watchPaced is watch whose changed returns how long to wait before the
// next query: a watch whose every answer is the whole set (a KV prefix)
// costs Consul and this process in proportion to the set on each change,
// so during a burst of changes (a bulk deploy) it reads at most every so
// often, while a lone change after a quiet spell is still seen at once.
func (c *Client) watchPaced(ctx context.Context, what string, query blockingQuery, changed func() time.Duration) {
	var index uint64
	failures := 0
	for ctx.Err() == nil {
		next, err := query(c.blocking(ctx, index))
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			d := c.backoff(failures)
			failures++
			c.log.WarnContext(ctx, "consul watch failed; retrying", "watch", what, "retry_in", d, "err", err)
			sleep(ctx, d)
			continue
		}
		failures = 0
		if index != 0 && next == index {
			continue
		}
		index = nextIndex(index, next)
		if gap := changed(); gap > 0 && !sleep(ctx, gap) {
			return
		}
	}
}

// nextIndex applies Consul's rules for a blocking query's next index: reset
// when it goes backwards, never 0 after a first answer.
func nextIndex(prev, got uint64) uint64 {
	if got < prev {
		return 0
	}
	return max(got, 1)
}

// WatchRecords follows every service record (KV prefix
// nomad-serverless/services/, recursive) with blocking queries and calls fn
// with the full, sorted list at start and whenever it changes: the gateway's
// routes and domains. fn is called from one goroutine, never concurrently.
// It returns nil when ctx ends; Consul errors are retried with backoff.
//
// Every answer is every record: a record whose key and ModifyIndex are
// those of the last answer is not decoded again, an answer whose keys and
// indexes are all the last answer's is not passed on, and after an answer
// the next query waits (recordsGap). At 10,000 services one answer is about
// 15 MB, which each replica used to read and decode again for every
// service deployed (issue 45).
func (c *Client) WatchRecords(ctx context.Context, fn func([]Record)) error {
	if fn == nil {
		return errors.New("watch records: fn is nil")
	}
	var latest []Record
	var lastIdx, latestIdx []recordIndex
	cache := map[string]cachedRecord{}
	first := true
	var cost queryCost
	c.watchPaced(ctx, "records", func(q *api.QueryOptions) (uint64, error) {
		start := time.Now()
		pairs, meta, err := c.api.KV().List(KVPrefix, q)
		if err != nil {
			return 0, c.wrap("list services under "+KVPrefix, err)
		}
		cost.add(time.Since(start))
		latest, latestIdx = c.decodeRecords(ctx, pairs, cache)
		return meta.LastIndex, nil
	}, func() time.Duration {
		gap := min(max(recordsGap(len(latest)), 9*cost.estimate()), 2*time.Second)
		if !first && slices.Equal(lastIdx, latestIdx) {
			return gap
		}
		first = false
		lastIdx = latestIdx
		fn(slices.Clone(latest))
		return gap
	})
	return nil
}

// recordsGap is the least the records watch waits after an answer of n
// records before its next query: 50 µs a record, at most 1 s (0.5 s at
// 10,000; 15 ms at 300). It waits nine times what the answer cost
// instead when that is longer (queryCost), at most 2 s.
func recordsGap(n int) time.Duration {
	return min(time.Duration(n)*50*time.Microsecond, time.Second)
}

// recordIndex is a record's key and Consul ModifyIndex: two answers with
// the same list of them hold the same records.
type recordIndex struct {
	key   string
	index uint64
}

type cachedRecord struct {
	index  uint64
	record Record
	ok     bool
}

// decodeRecords decodes an answer of the records watch, sorted as
// listRecords sorts, reusing cache's record for a key whose ModifyIndex
// did not move; cache is left holding exactly the answer's keys.
func (c *Client) decodeRecords(ctx context.Context, pairs api.KVPairs, cache map[string]cachedRecord) ([]Record, []recordIndex) {
	out := make([]Record, 0, len(pairs))
	idx := make([]recordIndex, 0, len(pairs))
	seen := make(map[string]bool, len(pairs))
	for _, p := range pairs {
		if p == nil {
			continue
		}
		seen[p.Key] = true
		cr, hit := cache[p.Key]
		if !hit || cr.index != p.ModifyIndex {
			r, err := decodeRecord(p)
			if err != nil {
				// One unreadable key must not hide every other service.
				c.log.WarnContext(ctx, "skipping unreadable service record", "key", p.Key, "err", err)
			}
			cr = cachedRecord{index: p.ModifyIndex, record: r, ok: err == nil}
			cache[p.Key] = cr
		}
		if cr.ok {
			out = append(out, cr.record)
			idx = append(idx, recordIndex{p.Key, p.ModifyIndex})
		}
	}
	for k := range cache {
		if !seen[k] {
			delete(cache, k)
		}
	}
	sortRecords(out)
	slices.SortFunc(idx, func(a, b recordIndex) int { return strings.Compare(a.key, b.key) })
	return out, idx
}

// Passing is every revision's passing instances by revision name, as
// Consul service IDs, sorted: one answer of WatchPassing.
type Passing map[string][]string

// passingFilter selects, server-side, the checks WatchPassing needs: those
// of services we registered (tag serverless) but the activator's stand-ins
// (one per revision at zero per replica: most of them, at scale), and the
// nodes' own checks (serfHealth, maintenance), which fail every instance on
// a node.
const passingFilter = `("` + spec.TagServerless + `" in ServiceTags and "` + spec.TagActivator + `" not in ServiceTags) or ServiceID == ""`

// WatchPassing follows which instances of every revision pass their checks
// with one blocking query (/v1/health/state/any, filtered to our services
// and the nodes' checks), however many revisions there are: one query per
// revision would hold one Consul connection each, and a few hundred
// revisions exhaust Consul's limit per client address
// (limits.http_max_conns_per_client, 200). An instance passes when every
// check of its own and of its node passes, as ?passing does for
// /v1/health/service. Activator stand-ins and services that are not
// revisions are left out. fn is called from one goroutine at start and
// whenever the set changes. It returns nil when ctx ends.
//
// The checks carry no addresses: a caller joins the service IDs with what
// Nomad says of their allocations (Nomad names a group service
// _nomad-task-<alloc ID>-...), which also keeps an instance Nomad calls
// lost out of traffic while its orphaned task still passes in Consul.
func (c *Client) WatchPassing(ctx context.Context, fn func(Passing)) error {
	if fn == nil {
		return errors.New("watch passing instances: fn is nil")
	}
	var last, latest Passing
	first := true
	var cost queryCost
	c.watchPaced(ctx, "passing instances", func(q *api.QueryOptions) (uint64, error) {
		q.Filter = passingFilter
		start := time.Now()
		checks, meta, err := c.api.Health().State(api.HealthAny, q)
		if err != nil {
			return 0, c.wrap("read the checks of every revision", err)
		}
		cost.add(time.Since(start))
		latest = passingFrom(checks)
		return meta.LastIndex, nil
	}, func() time.Duration {
		if first || !reflect.DeepEqual(last, latest) {
			first = false
			last = latest
			fn(latest)
		}
		return passingGap(cost.estimate())
	})
	return nil
}

// queryCost estimates what one answer of a blocking query costs: the
// shortest of its last few round trips. A query that waited for a change
// takes longer than its cost, never shorter, and during a burst of
// changes most answers come at once. Consul evaluates the passing
// instances' filter over every check in the cluster, the stand-ins'
// included, so at 10,000 revisions an answer costs its server tens of
// milliseconds, for each replica, on every change (issue 45).
type queryCost struct {
	last [8]time.Duration
	n    int
}

func (q *queryCost) add(d time.Duration) {
	q.last[q.n%len(q.last)] = d
	q.n++
}

func (q *queryCost) estimate() time.Duration {
	if q.n == 0 {
		return 0
	}
	return slices.Min(q.last[:min(q.n, len(q.last))])
}

// passingGap is how long the passing instances' watch waits after an
// answer that cost d before its next query: nine times d, so the watch
// takes at most a tenth of the server's time, and at most 2 s (a new
// instance is probed by the gateway itself, so this delays no wake; an
// instance whose check fails meets the gateway's outlier detection
// first). Consul evaluates the filter over every check in the cluster: at
// 10,000 revisions, with the stand-ins' 30,000 checks, 38 % of its CPU
// went there while a bulk deploy changed checks continuously and each
// replica asked every 500 ms (issue 45's third run).
func passingGap(d time.Duration) time.Duration {
	return min(9*d, 2*time.Second)
}

// passingFrom folds a health state answer into each revision's passing
// instances.
func passingFrom(checks api.HealthChecks) Passing {
	nodeOK := map[string]bool{}
	type key struct{ node, id string }
	type inst struct {
		revision string
		ok       bool
	}
	insts := map[key]*inst{}
	for _, chk := range checks {
		if chk == nil {
			continue
		}
		if chk.ServiceID == "" {
			ok, seen := nodeOK[chk.Node]
			nodeOK[chk.Node] = (ok || !seen) && chk.Status == api.HealthPassing
			continue
		}
		if slices.Contains(chk.ServiceTags, spec.TagActivator) {
			continue
		}
		if _, _, isRev := spec.ParseRevisionName(chk.ServiceName); !isRev {
			continue
		}
		k := key{chk.Node, chk.ServiceID}
		in := insts[k]
		if in == nil {
			in = &inst{revision: chk.ServiceName, ok: true}
			insts[k] = in
		}
		in.ok = in.ok && chk.Status == api.HealthPassing
	}
	out := Passing{}
	for k, in := range insts {
		// A node without a check of its own in the answer is taken as
		// passing (Consul's ?passing reads it the same way).
		if ok, seen := nodeOK[k.node]; !in.ok || (seen && !ok) {
			continue
		}
		out[in.revision] = append(out[in.revision], k.id)
	}
	for _, ids := range out {
		sort.Strings(ids)
	}
	return out
}

// ReadyInstances reads a revision's passing instances once (activator
// stand-ins left out).
func (c *Client) ReadyInstances(ctx context.Context, revision string) ([]Instance, error) {
	entries, _, err := c.api.Health().Service(revision, "", true, c.q(ctx))
	if err != nil {
		return nil, c.wrap("read ready instances of "+revision, err)
	}
	return instancesFrom(revision, entries), nil
}

// instancesFrom lists a revision's instances in a health answer, sorted by
// ID, the activator's stand-ins left out.
func instancesFrom(revision string, entries []*api.ServiceEntry) []Instance {
	out := make([]Instance, 0, len(entries))
	for _, e := range entries {
		if isInstance(e) {
			out = append(out, instanceFrom(revision, e))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// isInstance reports whether a health entry is a real instance, not an
// activator stand-in.
func isInstance(e *api.ServiceEntry) bool {
	return e != nil && e.Service != nil && !slices.Contains(e.Service.Tags, spec.TagActivator)
}

// instanceFrom reads one instance of a revision from its health entry; the
// node's address stands in for a service registered without one.
func instanceFrom(revision string, e *api.ServiceEntry) Instance {
	addr := e.Service.Address
	if addr == "" && e.Node != nil {
		addr = e.Node.Address
	}
	admin, _ := strconv.Atoi(e.Service.Meta[spec.ServiceMetaAdminPort])
	return Instance{
		ID:        e.Service.ID,
		Revision:  revision,
		Address:   addr,
		Port:      e.Service.Port,
		AdminPort: admin,
	}
}
