package fakecluster

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nomad-serverless/nomad-serverless/datapath/broadcast"
)

// Fault makes a fake agent answer matching requests with an error status
// instead of serving them, as a real agent does when a token lacks a
// permission or it has no leader. The zero Fault is no fault.
type Fault struct {
	Status int // 403, 500, ...
	// PathPrefix limits the fault to requests whose path starts with it
	// (empty: every request); Method, when set, to one method.
	PathPrefix string
	Method     string
}

func (f Fault) matches(r *http.Request) bool {
	return f.Status != 0 && (f.Method == "" || strings.EqualFold(f.Method, r.Method)) && strings.HasPrefix(r.URL.Path, f.PathPrefix)
}

// server is one fake agent's listener on 127.0.0.1. It can be taken down
// (connections refused, open streams broken) and brought back on the same
// address, and it answers an injected fault in the agent's words.
type server struct {
	name      string
	handler   http.Handler
	forbidden string // the agent's text for a 403

	mu    sync.Mutex
	addr  string
	srv   *http.Server
	fault Fault
	wg    sync.WaitGroup
}

// newServer serves an agent's routes; any other request is a 404 saying
// the fake does not implement it.
func newServer(name, forbidden string, routes map[string]http.HandlerFunc) *server {
	mux := http.NewServeMux()
	for pattern, h := range routes {
		mux.HandleFunc(pattern, h)
	}
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		msg := fmt.Sprintf("fake cluster: %s endpoint %s %s is not implemented by the fake", name, r.Method, r.URL.Path)
		writeText(w, nil, http.StatusNotFound, msg)
	})
	return &server{name: name, handler: mux, forbidden: forbidden}
}

// start listens on addr ("127.0.0.1:0" picks a port) and serves.
func (s *server) start(addr string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.srv != nil {
		return nil
	}
	var ln net.Listener
	var err error
	// After down another process may hold the port briefly: retry a little.
	for range 50 {
		if ln, err = net.Listen("tcp", addr); err == nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil {
		return fmt.Errorf("fake %s: listen on %s: %w", s.name, addr, err)
	}
	s.addr = ln.Addr().String()
	srv := &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	s.srv = srv
	s.wg.Go(func() { _ = srv.Serve(ln) })
	return nil
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	f := s.fault
	s.mu.Unlock()
	if !f.matches(r) {
		s.handler.ServeHTTP(w, r)
		return
	}
	text := http.StatusText(f.Status)
	if f.Status == http.StatusForbidden {
		text = s.forbidden
	}
	writeText(w, nil, f.Status, text)
}

// down closes the listener and every open connection.
func (s *server) down() {
	s.mu.Lock()
	srv := s.srv
	s.srv = nil
	s.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
	s.wg.Wait()
}

// up serves again on the address it had.
func (s *server) up() error {
	s.mu.Lock()
	addr := s.addr
	s.mu.Unlock()
	return s.start(addr)
}

func (s *server) setFault(f Fault) {
	s.mu.Lock()
	s.fault = f
	s.mu.Unlock()
}

func (s *server) url() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "http://" + s.addr
}

// block runs read until the index it reports is above the request's index
// parameter, the request's wait (default 5 minutes, at most 10) passes,
// the client goes or quit closes, and returns the last read: a blocking
// query as both agents serve it. A query without an index answers at once.
func block[T any](r *http.Request, n *broadcast.Signal, quit <-chan struct{}, read func() (T, uint64)) (T, uint64) {
	q := r.URL.Query()
	index, _ := strconv.ParseUint(q.Get("index"), 10, 64)
	wait := 5 * time.Minute
	if d, err := time.ParseDuration(q.Get("wait")); err == nil && d > 0 {
		wait = min(d, 10*time.Minute)
	}
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

func setHeaders(w http.ResponseWriter, headers map[string]string) {
	for k, v := range headers {
		w.Header().Set(k, v)
	}
}

// writeJSON answers v as JSON with status 200 and the given headers.
func writeJSON(w http.ResponseWriter, headers map[string]string, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "fake cluster: encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	setHeaders(w, headers)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(b)
}

// writeText answers a plain-text error the way both agents do.
func writeText(w http.ResponseWriter, headers map[string]string, status int, msg string) {
	setHeaders(w, headers)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// readBody reads a request body (at most 32 MiB); readJSON decodes it.
func readBody(r *http.Request) ([]byte, error) { return io.ReadAll(io.LimitReader(r.Body, 32<<20)) }

func readJSON(r *http.Request, v any) error {
	b, err := readBody(r)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// newUUID returns a random ID in the 8-4-4-4-12 form Nomad and Consul use.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

func deref[T any](p *T) T {
	var zero T
	if p == nil {
		return zero
	}
	return *p
}
