package autoscaler

import "time"

// maxWindow is the highest count recorded over a sliding span of time: the
// scale-down delay (Knative's max.TimeWindow). The count may drop only after
// every count recorded within the delay is at or below it.
//
// It is a monotonic queue: entries are kept in time order with strictly
// decreasing counts, so the front is the maximum and each record costs
// amortized O(1). It holds nothing until a revision sets scale_down_delay.
type maxWindow struct {
	entries []maxEntry
}

type maxEntry struct {
	at    int64 // unix nanoseconds
	count int
}

// record adds count at now and forgets entries older than span.
func (m *maxWindow) record(now time.Time, count int, span time.Duration) {
	t := now.UnixNano()
	// A newer, higher or equal count makes older lower ones irrelevant.
	for len(m.entries) > 0 && m.entries[len(m.entries)-1].count <= count {
		m.entries = m.entries[:len(m.entries)-1]
	}
	m.entries = append(m.entries, maxEntry{at: t, count: count})
	cut := t - int64(span)
	drop := 0
	for drop < len(m.entries)-1 && m.entries[drop].at <= cut {
		drop++
	}
	if drop > 0 {
		m.entries = append(m.entries[:0], m.entries[drop:]...)
	}
}

// max is the highest count recorded within the span (0 when empty).
func (m *maxWindow) max() int {
	if len(m.entries) == 0 {
		return 0
	}
	return m.entries[0].count
}

// reset forgets everything (the delay was switched off).
func (m *maxWindow) reset() { m.entries = nil }
