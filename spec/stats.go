package spec

// StatsPath is where a sidecar's admin port serves Stats.
const StatsPath = "/stats"

// Stats is what a sidecar reports to the autoscaler on each scrape, as JSON:
// one small object every two seconds per instance costs nothing worth a
// binary format, and JSON can be read with curl when debugging scaling.
//
// The averages cover the interval since the previous scrape (or since start),
// so the autoscaler sees every request exactly once even when it scrapes
// irregularly.
type Stats struct {
	Service  string `json:"service"`
	Revision string `json:"revision"`
	Instance string `json:"instance"`

	// IntervalSeconds is the length of the interval the averages cover.
	IntervalSeconds float64 `json:"interval_seconds"`
	// AverageConcurrency is requests in flight (queued or in the app),
	// time-averaged over the interval.
	AverageConcurrency float64 `json:"average_concurrency"`
	// Requests is how many requests arrived in the interval; RPS is
	// Requests / IntervalSeconds.
	Requests float64 `json:"requests"`
	RPS      float64 `json:"rps"`

	// InFlight and Queued are the values at the moment of the scrape.
	InFlight int `json:"in_flight"`
	Queued   int `json:"queued"`

	Ready    bool `json:"ready"`
	Draining bool `json:"draining"`
}
