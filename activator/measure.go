package activator

import (
	"sync/atomic"
	"time"

	"github.com/nomad-serverless/nomad-serverless/autoscaler"
	"github.com/nomad-serverless/nomad-serverless/canary"
)

// measure is what the gateway measures of one revision's requests for
// rollouts (issue 42): requests ended, the failed ones among them (an
// answer of 500 or more: the app's 5xx, and the gateway's own 502, 503
// and 504 for the revision), and their latency in canary's histogram
// buckets. The counters only grow and are updated with atomics on the
// request path; the report loop (one goroutine) sends the growth since
// its previous report that reached the leader, so a report that fails is
// not lost, and a replica that restarts starts from zero with nothing
// counted twice.
type measure struct {
	requests, errors atomic.Uint64
	latency          [canary.NumBuckets]atomic.Uint64

	// sent is what reached the leader; only the report loop touches it.
	sent canary.Measurement
}

// observe counts one request that ended with status after d. A request
// that got no answer (status 0: the client left first) is not counted: it
// says nothing of the revision.
func (m *measure) observe(status int, d time.Duration) {
	if status == 0 {
		return
	}
	m.latency[canary.BucketOf(d)].Add(1)
	if status >= 500 {
		m.errors.Add(1)
	}
	// Requests last, so a snapshot taken meanwhile never holds more
	// errors or latencies than requests.
	m.requests.Add(1)
}

// delta is the growth since the last report that reached the leader, and
// the totals to mark sent once it did; nil when nothing ended meanwhile.
func (m *measure) delta() (*canary.Measurement, canary.Measurement) {
	var now canary.Measurement
	// Requests first: observe counts them last, so errors and latencies
	// loaded after them may run ahead (requests ending meanwhile) but
	// never behind.
	now.Requests = m.requests.Load()
	now.Errors = m.errors.Load()
	for i := range m.latency {
		now.Latency.Counts[i] = m.latency[i].Load()
	}
	if now.Requests == m.sent.Requests {
		return nil, m.sent
	}
	d := &canary.Measurement{Requests: now.Requests - m.sent.Requests}
	// Errors and latencies may run ahead of Requests (they are counted
	// first); what is ahead waits for the next report.
	d.Errors = min(now.Errors-m.sent.Errors, d.Requests)
	now.Errors = m.sent.Errors + d.Errors
	var timed uint64
	for i := range now.Latency.Counts {
		c := min(now.Latency.Counts[i]-m.sent.Latency.Counts[i], d.Requests-timed)
		d.Latency.Counts[i] = c
		now.Latency.Counts[i] = m.sent.Latency.Counts[i] + c
		timed += c
	}
	return d, now
}

// withMeasured adds the revision's delta to its demand entry; ok is false
// when the entry has nothing to say (no demand, nothing measured). sent
// is what to mark sent once the report reached the leader.
func (r *revision) withMeasured(d autoscaler.Demand) (autoscaler.Demand, canary.Measurement, bool) {
	delta, sent := r.measure.delta()
	d.Measured = delta
	return d, sent, d.Queued > 0 || d.InFlight > 0 || delta != nil
}

// pending reports whether requests ended since the last report that
// reached the leader. Only the report loop calls it (it reads sent).
func (m *measure) pending() bool { return m.requests.Load() != m.sent.Requests }
