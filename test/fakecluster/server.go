package fakecluster

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
)

// Fault makes a fake server answer requests with an error instead of
// serving them, as a real agent does when a token lacks a permission or the
// server is overloaded. The zero Fault (Status 0) is no fault.
type Fault struct {
	// Status is the HTTP status to answer (403, 500, 503, ...).
	Status int
	// Body is the text/plain body; empty means the agent's usual words for
	// Status ("Permission denied" for Nomad's 403, for example).
	Body string
	// PathPrefix limits the fault to requests whose path starts with it
	// ("/v1/job/"); empty means every request. Method, when set, limits it
	// to one method.
	PathPrefix string
	Method     string
}

func (f Fault) matches(r *http.Request) bool {
	if f.Status == 0 {
		return false
	}
	if f.Method != "" && !strings.EqualFold(f.Method, r.Method) {
		return false
	}
	return strings.HasPrefix(r.URL.Path, f.PathPrefix)
}

// server is one fake agent's HTTP listener on 127.0.0.1. It can be taken
// down (the port then refuses connections, and open streams break) and
// brought back on the same address, and it can answer with an injected
// fault.
type server struct {
	name    string
	handler http.Handler
	// forbidden is the agent's text for a 403, the one fault whose words
	// differ between Nomad and Consul.
	forbidden string

	mu    sync.Mutex
	addr  string
	srv   *http.Server
	fault Fault
	wg    sync.WaitGroup
}

func newServer(name string, h http.Handler, forbidden string) *server {
	return &server{name: name, handler: h, forbidden: forbidden}
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
	// The port was ours a moment ago; after Down another process may hold
	// it briefly (TIME_WAIT does not block a listener), so retry a little.
	for attempt := 0; attempt < 50; attempt++ {
		ln, err = net.Listen("tcp", addr)
		if err == nil {
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
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		_ = srv.Serve(ln)
	}()
	return nil
}

func (s *server) serve(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	f := s.fault
	s.mu.Unlock()
	if f.matches(r) {
		body := cmp.Or(f.Body, s.faultText(f.Status))
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(f.Status)
		_, _ = w.Write([]byte(body))
		return
	}
	s.handler.ServeHTTP(w, r)
}

// faultText is what the agent says for a fault's status.
func (s *server) faultText(status int) string {
	switch status {
	case http.StatusForbidden:
		return s.forbidden
	case http.StatusInternalServerError:
		return "No cluster leader"
	case http.StatusTooManyRequests:
		return "rate limit exceeded"
	}
	return http.StatusText(status)
}

// down closes the listener and every open connection: clients then get
// "connection refused" until up.
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
	if addr == "" {
		return errors.New("fake " + s.name + ": never started")
	}
	return s.start(addr)
}

func (s *server) setFault(f Fault) {
	s.mu.Lock()
	s.fault = f
	s.mu.Unlock()
}

// url is the server's base URL (http://127.0.0.1:port).
func (s *server) url() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return "http://" + s.addr
}
