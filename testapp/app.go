// Package testapp is the small HTTP app that component tests, benchmarks and
// e2e tests run behind the sidecar and the gateway (`nomad-serverless
// testapp`). It records what it saw (its own maximum concurrency, request
// count, readiness answers) so tests assert on the app's view rather than on
// the proxy's.
//
// Routes (every other path is a "work" request and counts):
//
//	/               work: query sleep=50ms, cpu=2ms, status=500, size=N bytes,
//	                stream=N chunks (flushed one by one; interval=10ms between
//	                them; gate=ID holds after the first chunk until
//	                POST /release?gate=ID)
//	/echo           work: streams the request body back as it arrives (full duplex)
//	/headers        work: the request as JSON {method, proto, host, uri,
//	                remote_addr, headers}
//	/ws             work: websocket echo
//	/file           work: the file at query path= (at most 64 KiB), 404
//	                if there is none: what an init step or a volume put
//	                in the instance
//	/fetch          work: GET url=http://IP:port/path (loopback and private
//	                addresses only; host=H sets its Host) and answer with
//	                what it answered: one service calling another (fetch.go)
//	/ready          readiness: 200 after TESTAPP_READY_DELAY unless failing
//	/healthz        liveness: 200 unless POST /fail-live
//	/stats          JSON Stats; POST /reset zeroes it
//	POST /fail-ready, /ready-ok, /fail-live, /live-ok, /release?gate=ID
//
// The work path is kept cheap (no allocations beyond net/http's own, no
// locks) because it is the "direct" baseline of the sidecar benchmark.
package testapp

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/websocket"
)

// Stats is what GET /stats returns.
type Stats struct {
	// MaxConcurrency is the most work requests the app ever handled at once
	// since start or the last reset.
	MaxConcurrency int64 `json:"max_concurrency"`
	// Requests counts work requests (not the control routes).
	Requests int64 `json:"requests"`
	InFlight int64 `json:"in_flight"`
	// ReadyOK and ReadyFailed count /ready answers; FirstReadyUnixNano is
	// when /ready first answered 200 (0: never).
	ReadyOK            int64 `json:"ready_ok"`
	ReadyFailed        int64 `json:"ready_failed"`
	FirstReadyUnixNano int64 `json:"first_ready_unix_nano"`
	// HealthzCalls counts /healthz calls.
	HealthzCalls int64 `json:"healthz_calls"`
	// PID is the app's process, for tests that kill it (kill -9 of an
	// instance's app, as a crash would).
	PID int `json:"pid"`
}

// App is the test app's handler. It is safe for concurrent use; its counters
// are atomics so the work path takes no lock.
type App struct {
	cfg     Config
	readyAt time.Time
	name    []string

	failReady atomic.Bool
	failLive  atomic.Bool
	// failSeq numbers work requests for Config.FailPercent.
	failSeq atomic.Uint64

	inFlight   atomic.Int64
	maxConc    atomic.Int64
	requests   atomic.Int64
	readyOK    atomic.Int64
	readyFail  atomic.Int64
	firstReady atomic.Int64
	healthz    atomic.Int64
	sink       atomic.Uint64

	gatesMu sync.Mutex
	gates   map[string]chan struct{}

	ws    websocket.Server
	fetch *http.Client // /fetch's (fetch.go)
}

// New returns the app; readiness delays count from now.
func New(cfg Config) *App {
	a := &App{
		cfg:     cfg,
		readyAt: time.Now().Add(cfg.ReadyDelay),
		gates:   make(map[string]chan struct{}),
		fetch:   newFetchClient(),
	}
	if cfg.Name != "" {
		a.name = []string{cfg.Name}
	}
	a.failReady.Store(cfg.FailReady)
	// No Handshake: the default origin check would refuse clients that send
	// no Origin, and the test app has nothing to protect.
	a.ws = websocket.Server{Handler: func(c *websocket.Conn) { _, _ = io.Copy(c, c) }}
	return a
}

// Shared header values: net/http only reads them, so one slice serves all
// requests without an allocation each.
var (
	textPlain = []string{"text/plain; charset=utf-8"}
	appJSON   = []string{"application/json"}
	okBody    = []byte("ok\n")
	filler    = func() []byte {
		b := make([]byte, 32<<10)
		for i := range b {
			b[i] = 'x'
		}
		return b
	}()
)

func (a *App) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/ready":
		a.serveReady(w)
	case "/healthz":
		a.healthz.Add(1)
		if a.failLive.Load() {
			http.Error(w, "not live (POST /live-ok to recover)", http.StatusServiceUnavailable)
			return
		}
		w.Write(okBody)
	case "/stats":
		w.Header()["Content-Type"] = appJSON
		_ = json.NewEncoder(w).Encode(a.Stats())
	case "/reset", "/fail-ready", "/ready-ok", "/fail-live", "/live-ok", "/release":
		a.serveControl(w, r)
	default:
		a.serveWork(w, r)
	}
}

// Stats returns the counters.
func (a *App) Stats() Stats {
	return Stats{
		MaxConcurrency:     a.maxConc.Load(),
		Requests:           a.requests.Load(),
		InFlight:           a.inFlight.Load(),
		ReadyOK:            a.readyOK.Load(),
		ReadyFailed:        a.readyFail.Load(),
		FirstReadyUnixNano: a.firstReady.Load(),
		HealthzCalls:       a.healthz.Load(),
		PID:                os.Getpid(),
	}
}

func (a *App) serveReady(w http.ResponseWriter) {
	if a.failReady.Load() || time.Now().Before(a.readyAt) {
		a.readyFail.Add(1)
		http.Error(w, "not ready", http.StatusServiceUnavailable)
		return
	}
	if a.firstReady.Load() == 0 {
		a.firstReady.CompareAndSwap(0, time.Now().UnixNano())
	}
	a.readyOK.Add(1)
	w.Write(okBody)
}

func (a *App) serveControl(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		http.Error(w, "use POST", http.StatusMethodNotAllowed)
		return
	}
	switch r.URL.Path {
	case "/reset":
		a.maxConc.Store(a.inFlight.Load())
		a.requests.Store(0)
	case "/fail-ready":
		a.failReady.Store(true)
	case "/ready-ok":
		a.failReady.Store(false)
	case "/fail-live":
		a.failLive.Store(true)
	case "/live-ok":
		a.failLive.Store(false)
	case "/release":
		close(a.gate(r.URL.Query().Get("gate")))
	}
	w.Write(okBody)
}

// gate returns the channel a held stream waits on; the first of the two
// sides to arrive creates it.
func (a *App) gate(id string) chan struct{} {
	a.gatesMu.Lock()
	defer a.gatesMu.Unlock()
	ch, ok := a.gates[id]
	if !ok {
		ch = make(chan struct{})
		a.gates[id] = ch
	} else {
		// The second arrival takes it out, so an ID can be reused.
		delete(a.gates, id)
	}
	return ch
}

func (a *App) serveWork(w http.ResponseWriter, r *http.Request) {
	n := a.inFlight.Add(1)
	// Lock-free maximum: retry only while another request raised it
	// concurrently and ours is still higher.
	for {
		m := a.maxConc.Load()
		if n <= m || a.maxConc.CompareAndSwap(m, n) {
			break
		}
	}
	a.requests.Add(1)
	defer a.inFlight.Add(-1)

	h := w.Header()
	if a.name != nil {
		h["X-Testapp-Name"] = a.name
	}
	switch r.URL.Path {
	case "/echo":
		a.serveEcho(w, r)
		return
	case "/headers":
		a.serveHeaders(w, r)
		return
	case "/ws":
		a.ws.ServeHTTP(w, r)
		return
	case "/file":
		serveFile(w, r)
		return
	case "/fetch":
		a.serveFetch(w, r)
		return
	}

	// The benchmark's request: no query, no configured work.
	if r.URL.RawQuery == "" {
		if a.cfg.Sleep > 0 {
			time.Sleep(a.cfg.Sleep)
		}
		if a.cfg.CPU > 0 {
			a.burn(a.cfg.CPU)
		}
		h["Content-Type"] = textPlain
		if a.failsNext() {
			w.WriteHeader(http.StatusInternalServerError)
		}
		w.Write(okBody)
		return
	}
	a.serveQuery(w, r)
}

// maxFile bounds what /file reads.
const maxFile = 64 << 10

// serveFile answers the file at query path=: 404 if it does not exist,
// 500 if it cannot be read. It is a test app's route: it serves whatever
// path it is given.
func serveFile(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Query().Get("path")
	if path == "" {
		http.Error(w, "file: want path=", http.StatusBadRequest)
		return
	}
	f, err := os.Open(path)
	switch {
	case os.IsNotExist(err):
		http.Error(w, "file: "+err.Error(), http.StatusNotFound)
		return
	case err != nil:
		http.Error(w, "file: "+err.Error(), http.StatusInternalServerError)
		return
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFile))
	if err != nil {
		http.Error(w, "file: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header()["Content-Type"] = textPlain
	w.Write(b)
}

func (a *App) serveQuery(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	sleep, cpu := a.cfg.Sleep, a.cfg.CPU
	if v := q.Get("sleep"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			http.Error(w, "sleep: "+err.Error(), http.StatusBadRequest)
			return
		}
		sleep = d
	}
	if v := q.Get("cpu"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			http.Error(w, "cpu: "+err.Error(), http.StatusBadRequest)
			return
		}
		cpu = d
	}
	status := http.StatusOK
	if v := q.Get("status"); v != "" {
		s, err := strconv.Atoi(v)
		if err != nil || s < 200 || s > 999 {
			http.Error(w, "status: want 200 to 999", http.StatusBadRequest)
			return
		}
		status = s
	} else if a.failsNext() {
		status = http.StatusInternalServerError
	}
	if sleep > 0 {
		t := time.NewTimer(sleep)
		select {
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
			return
		}
	}
	if cpu > 0 {
		a.burn(cpu)
	}
	h := w.Header()
	h["Content-Type"] = textPlain
	if v := q.Get("stream"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			http.Error(w, "stream: want a count of chunks", http.StatusBadRequest)
			return
		}
		interval, _ := time.ParseDuration(q.Get("interval"))
		a.serveStream(w, r, status, n, interval, q.Get("gate"))
		return
	}
	if v := q.Get("size"); v != "" {
		size, err := strconv.Atoi(v)
		if err != nil || size < 0 {
			http.Error(w, "size: want a byte count", http.StatusBadRequest)
			return
		}
		h.Set("Content-Length", strconv.Itoa(size))
		w.WriteHeader(status)
		for size > 0 {
			k := min(size, len(filler))
			if _, err := w.Write(filler[:k]); err != nil {
				return
			}
			size -= k
		}
		return
	}
	w.WriteHeader(status)
	w.Write(okBody)
}

// serveStream writes n chunks "chunk i\n", flushing each; with a gate it
// holds after the first chunk until the gate is released, so a test can prove
// the first chunk crossed a proxy before the second existed.
func (a *App) serveStream(w http.ResponseWriter, r *http.Request, status, n int, interval time.Duration, gate string) {
	rc := http.NewResponseController(w)
	w.WriteHeader(status)
	for i := 1; i <= n; i++ {
		if i > 1 {
			if gate != "" && i == 2 {
				select {
				case <-a.gate(gate):
				case <-r.Context().Done():
					return
				case <-time.After(30 * time.Second):
					return
				}
			}
			if interval > 0 {
				select {
				case <-time.After(interval):
				case <-r.Context().Done():
					return
				}
			}
		}
		if _, err := io.WriteString(w, "chunk "+strconv.Itoa(i)+"\n"); err != nil {
			return
		}
		if err := rc.Flush(); err != nil {
			return
		}
	}
}

// serveEcho streams the request body back as it arrives, so a test can show
// that a proxy passes request bytes on before the body ends.
func (a *App) serveEcho(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	_ = rc.EnableFullDuplex()
	w.Header()["Content-Type"] = textPlain
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return
	}
	buf := make([]byte, 32<<10)
	for {
		n, err := r.Body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if rc.Flush() != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Request is what /headers returns.
type Request struct {
	Method     string              `json:"method"`
	Proto      string              `json:"proto"`
	Host       string              `json:"host"`
	URI        string              `json:"uri"`
	RemoteAddr string              `json:"remote_addr"`
	Headers    map[string][]string `json:"headers"`
}

func (a *App) serveHeaders(w http.ResponseWriter, r *http.Request) {
	w.Header()["Content-Type"] = appJSON
	_ = json.NewEncoder(w).Encode(Request{
		Method:     r.Method,
		Proto:      r.Proto,
		Host:       r.Host,
		URI:        r.RequestURI,
		RemoteAddr: r.RemoteAddr,
		Headers:    r.Header,
	})
}

// burn keeps a CPU busy for d.
func (a *App) burn(d time.Duration) {
	end := time.Now().Add(d)
	for x := uint64(1); time.Now().Before(end); {
		for i := 0; i < 1000; i++ {
			x = x*6364136223846793005 + 1442695040888963407
		}
		// Stored so the compiler cannot drop the loop.
		a.sink.Store(x)
	}
}

// failsNext reports whether this work request is one of the FailPercent
// that answer 500: request n fails when n*37 mod 100 is below the
// percentage, so every 100 consecutive requests hold exactly that many
// failures, spread rather than in a run.
func (a *App) failsNext() bool {
	p := a.cfg.FailPercent
	if p <= 0 {
		return false
	}
	n := a.failSeq.Add(1)
	return int(n*37%100) < p
}
