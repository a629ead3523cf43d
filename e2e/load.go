package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Outcome is one request of a load run.
type Outcome struct {
	Start, End time.Time
	// FirstByte is when the first response byte arrived (zero on error).
	FirstByte time.Time
	Status    int
	Err       error
	// App is the X-Testapp-Name the app answered with: which revision
	// served the request.
	App string
	// RetryAfter is true when the response carried Retry-After.
	RetryAfter bool
}

// OK is a 2xx answer read in full.
func (o Outcome) OK() bool { return o.Err == nil && o.Status >= 200 && o.Status < 300 }

// Retryable reports whether a failed request is one a client can safely
// retry: the connection was refused (the request reached no server), or the
// server answered 503 with Retry-After (it says to come back). Everything
// else that fails (a 5xx without Retry-After, a reset or timeout after the
// request was sent) is a request lost.
func (o Outcome) Retryable() bool {
	if o.OK() {
		return false
	}
	if o.Err != nil {
		return errors.Is(o.Err, syscall.ECONNREFUSED)
	}
	return o.Status == http.StatusServiceUnavailable && o.RetryAfter
}

// Describe is a short label of how a request ended, for error summaries.
func (o Outcome) Describe() string {
	switch {
	case o.Err != nil:
		msg := o.Err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:] // drop the URL part, keep the cause
		}
		return "error: " + msg
	case o.RetryAfter:
		return fmt.Sprintf("status %d (Retry-After)", o.Status)
	default:
		return fmt.Sprintf("status %d", o.Status)
	}
}

// Request is what a load worker sends.
type Request struct {
	Client *http.Client
	// URL is the gateway URL with path and query; Host the Host header
	// (<service>.<namespace>.<domain>).
	URL, Host string
	Timeout   time.Duration
}

// Do sends one GET and reads the whole answer.
func (r Request) Do(ctx context.Context) Outcome {
	o := Outcome{Start: time.Now()}
	if r.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, r.Timeout)
		defer cancel()
	}
	var mu sync.Mutex
	trace := &httptrace.ClientTrace{GotFirstResponseByte: func() {
		mu.Lock()
		o.FirstByte = time.Now()
		mu.Unlock()
	}}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodGet, r.URL, nil)
	if err != nil {
		o.Err, o.End = err, time.Now()
		return o
	}
	req.Host = r.Host
	resp, err := r.Client.Do(req)
	if err != nil {
		o.Err = err
		mu.Lock()
		o.FirstByte = time.Time{}
		mu.Unlock()
		o.End = time.Now()
		return o
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	o.Status, o.Err = resp.StatusCode, err
	o.App = resp.Header.Get("X-Testapp-Name")
	o.RetryAfter = resp.Header.Get("Retry-After") != ""
	o.End = time.Now()
	return o
}

// Load runs Workers goroutines, each sending Request back to back (with
// Pause between) until Stop. Every outcome is kept.
type Load struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	out    []Outcome
}

// StartLoad starts workers; limit bounds the run even if Stop is never
// called.
func StartLoad(ctx context.Context, r Request, workers int, pause, limit time.Duration) *Load {
	ctx, cancel := context.WithTimeout(ctx, limit)
	l := &Load{cancel: cancel}
	for i := 0; i < workers; i++ {
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for ctx.Err() == nil {
				o := r.Do(context.WithoutCancel(ctx))
				l.mu.Lock()
				l.out = append(l.out, o)
				l.mu.Unlock()
				if pause > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(pause):
					}
				}
			}
		}()
	}
	return l
}

// Snapshot returns the outcomes so far.
func (l *Load) Snapshot() Result {
	l.mu.Lock()
	defer l.mu.Unlock()
	return Result(append([]Outcome(nil), l.out...))
}

// Stop ends the run: workers finish the request they are in (bounded by the
// Request's timeout) and the outcomes are returned in start order.
func (l *Load) Stop() Result {
	l.cancel()
	l.wg.Wait()
	r := l.Snapshot()
	sort.SliceStable(r, func(i, j int) bool { return r[i].Start.Before(r[j].Start) })
	return r
}

// Burst sends n requests at once and returns them in start order.
func Burst(ctx context.Context, r Request, n int) Result {
	out := make(Result, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-start
			out[i] = r.Do(ctx)
		}(i)
	}
	close(start)
	wg.Wait()
	sort.SliceStable(out, func(i, j int) bool { return out[i].Start.Before(out[j].Start) })
	return out
}

// Result is the outcomes of a run.
type Result []Outcome

// Count counts the outcomes f accepts.
func (r Result) Count(f func(Outcome) bool) int {
	n := 0
	for _, o := range r {
		if f(o) {
			n++
		}
	}
	return n
}

// OK counts successful requests.
func (r Result) OK() int { return r.Count(Outcome.OK) }

// Lost returns the failed requests a client could not retry.
func (r Result) Lost() Result {
	var out Result
	for _, o := range r {
		if !o.OK() && !o.Retryable() {
			out = append(out, o)
		}
	}
	return out
}

// Failed returns every failed request.
func (r Result) Failed() Result {
	var out Result
	for _, o := range r {
		if !o.OK() {
			out = append(out, o)
		}
	}
	return out
}

// ByApp counts successful requests per X-Testapp-Name.
func (r Result) ByApp() map[string]int {
	m := map[string]int{}
	for _, o := range r {
		if o.OK() {
			m[o.App]++
		}
	}
	return m
}

// Summary is "n requests, k ok, failures by kind" for messages.
func (r Result) Summary() string {
	kinds := map[string]int{}
	for _, o := range r {
		if !o.OK() {
			kinds[o.Describe()]++
		}
	}
	keys := make([]string, 0, len(kinds))
	for k := range kinds {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%d x %s", kinds[k], k))
	}
	s := fmt.Sprintf("%d requests, %d ok", len(r), r.OK())
	if len(parts) > 0 {
		s += "; failed: " + strings.Join(parts, ", ")
	}
	return s
}

// Within reports whether every outcome of r started inside [from, to].
func (r Result) Within(from, to time.Time) bool {
	for _, o := range r {
		if o.Start.Before(from) || o.Start.After(to) {
			return false
		}
	}
	return true
}

// NewClient is the HTTP client of the suite: no proxy from the environment,
// enough idle connections per host for a burst, no keep-alive reuse across
// a gateway restart beyond what the transport detects itself.
func NewClient(maxConns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        maxConns,
		MaxIdleConnsPerHost: maxConns,
		IdleConnTimeout:     30 * time.Second,
	}}
}
