package fakecluster

import (
	"encoding/json"
	"net/http"
	"strconv"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/broadcast"
)

// blockingWait parses a blocking query's index and wait parameters the way
// Consul and Nomad read them: no index means answer at once; wait defaults
// to 5 minutes and is capped at 10.
func blockingWait(r *http.Request) (index uint64, wait time.Duration) {
	q := r.URL.Query()
	index, _ = strconv.ParseUint(q.Get("index"), 10, 64)
	wait = 5 * time.Minute
	if v := q.Get("wait"); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			wait = d
		} else if n, err := strconv.Atoi(v); err == nil && n > 0 {
			wait = time.Duration(n) * time.Second
		}
	}
	return index, min(wait, 10*time.Minute)
}

// block runs read until the index it reports is above index, the wait ends,
// the client goes or quit closes; it returns the last read. A query without
// an index (0) answers at once.
func block[T any](r *http.Request, n *broadcast.Signal, quit <-chan struct{}, read func() (T, uint64)) (T, uint64) {
	index, wait := blockingWait(r)
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for {
		changed := n.Changed()
		v, idx := read()
		if index == 0 || idx > index {
			return v, idx
		}
		select {
		case <-changed:
		case <-timer.C:
			return read()
		case <-r.Context().Done():
			return v, idx
		case <-quit:
			return v, idx
		}
	}
}

// writeJSON answers v as JSON with status 200 and the given headers.
func writeJSON(w http.ResponseWriter, headers map[string]string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "fake cluster: encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	for k, val := range headers {
		w.Header().Set(k, val)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(b)
}

// writeText answers a plain-text error the way both agents do.
func writeText(w http.ResponseWriter, headers map[string]string, status int, msg string) {
	for k, val := range headers {
		w.Header().Set(k, val)
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(msg))
}
