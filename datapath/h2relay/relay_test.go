package h2relay

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// targetHandler routes each stream by its "x-target" field, and plays
// the gateway's rules for what fails: a dial failure or an answer with
// "x-not-served" is sent again (Rewind) to the target named by
// "x-then"; a stream with "x-hold" waits for the test's Admit.
type targetHandler struct {
	mu     sync.Mutex
	held   []*Stream
	done   atomic.Int64
	failed atomic.Int64
}

func (h *targetHandler) Request(s *Stream, now time.Time) Decision {
	s.Target = s.Header("x-target")
	s.KeepBody = 64 << 10
	if s.Header("x-hold") != "" {
		h.mu.Lock()
		h.held = append(h.held, s)
		h.mu.Unlock()
		return Hold
	}
	return Proceed
}

func (h *targetHandler) again(s *Stream) bool {
	then := s.Header("x-then")
	if then == "" || then == s.Target || !s.Rewind() {
		return false
	}
	s.Target = then
	s.Open()
	return true
}

func (h *targetHandler) Response(s *Stream, head []Field) []Field {
	for _, f := range head {
		if f.Name == "x-not-served" && h.again(s) {
			return nil
		}
	}
	return head
}

func (h *targetHandler) Timer(*Stream, time.Time) {}

func (h *targetHandler) Failed(s *Stream, err error) {
	h.failed.Add(1)
	var de *DialError
	if errors.As(err, &de) && h.again(s) {
		return
	}
	s.Respond(http.StatusBadGateway, nil, []byte(err.Error()))
}

func (h *targetHandler) Done(*Stream, time.Time) { h.done.Add(1) }

// h2cUpstream serves handler over h2c with prior knowledge.
func h2cUpstream(t *testing.T, handler http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http2.Server{}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(c, &http2.ServeConnOpts{Handler: handler})
		}
	}()
	t.Cleanup(func() { ln.Close() })
	return ln.Addr().String()
}

// startRelay serves h over a relay on a loopback port; the client speaks
// h2c to it.
func startRelay(t *testing.T, h Handler) (*Relay, string, *http.Client) {
	t.Helper()
	d := net.Dialer{Timeout: time.Second}
	r, err := NewRelay(RelayConfig{
		Up: Config{CreditConnOnReceipt: true},
		Dial: func(ctx context.Context, target string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", target)
		},
		Handler: h,
	})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				var p [len(http2.ClientPreface)]byte
				if _, err := io.ReadFull(c, p[:]); err != nil {
					c.Close()
					return
				}
				r.ServeConn(c, nil)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		r.Close()
		r.Wait(5 * time.Second)
	})
	client := &http.Client{Timeout: 20 * time.Second, Transport: &http2.Transport{
		AllowHTTP: true,
		DialTLSContext: func(ctx context.Context, network, addr string, _ *tls.Config) (net.Conn, error) {
			return d.DialContext(ctx, network, addr)
		},
	}}
	return r, "http://" + ln.Addr().String(), client
}

// Streams of one connection go to the targets their handler chose, each
// target with its pool; a stream whose dial fails or whose answer the
// handler refuses is sent again elsewhere, its body replayed from what
// the relay kept (a body beyond KeepBody is not sent again); a held
// stream opens when admitted, once.
func TestRelayTargetsRewindAdmit(t *testing.T) {
	echo := func(name string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			b, _ := io.ReadAll(r.Body)
			io.WriteString(w, name+":"+string(b))
		}
	}
	a := h2cUpstream(t, echo("a"))
	b := h2cUpstream(t, echo("b"))
	refusing := h2cUpstream(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("x-not-served", "1")
		w.WriteHeader(http.StatusBadGateway)
	})
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	dead := ln.Addr().String()
	ln.Close()

	h := &targetHandler{}
	_, url, client := startRelay(t, h)
	big := strings.Repeat("x", 40<<10)
	for _, tc := range []struct {
		name, target, then, body, want string
		status                         int
	}{
		{"to a", a, "", "1", "a:1", 200},
		{"to b", b, "", "2", "b:2", 200},
		{"dial fails, then b", dead, b, "3", "b:3", 200},
		{"not served, then a, body replayed", refusing, a, big, "a:" + big, 200},
		{"dial fails, nowhere else", dead, "", "5", "", 502},
		{"not served, body beyond what is kept", refusing, a, strings.Repeat("y", 256<<10), "", 502},
	} {
		req, _ := http.NewRequest(http.MethodPost, url+"/", strings.NewReader(tc.body))
		req.Header.Set("x-target", tc.target)
		if tc.then != "" {
			req.Header.Set("x-then", tc.then)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || tc.want != "" && string(got) != tc.want {
			t.Errorf("%s: %d %.60q, want %d %.60q", tc.name, resp.StatusCode, got, tc.status, tc.want)
		}
	}

	// Held, then admitted to b from another goroutine.
	res := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest(http.MethodPost, url+"/", strings.NewReader("held"))
		req.Header.Set("x-target", a)
		req.Header.Set("x-hold", "1")
		resp, err := client.Do(req)
		if err != nil {
			res <- err.Error()
			return
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res <- string(got)
	}()
	var s *Stream
	for deadline := time.Now().Add(10 * time.Second); s == nil; {
		if time.Now().After(deadline) {
			t.Fatal("no held stream")
		}
		h.mu.Lock()
		if len(h.held) > 0 {
			s = h.held[0]
		}
		h.mu.Unlock()
		time.Sleep(time.Millisecond)
	}
	if !s.Admit(func(time.Time) bool { s.Target = b; return true }) {
		t.Fatal("Admit refused a held stream")
	}
	if got := <-res; got != "b:held" {
		t.Errorf("held stream: %q, want b:held", got)
	}
	if s.Admit(func(time.Time) bool { t.Error("fn called for an admitted stream"); return true }) {
		t.Error("Admit accepted a stream twice")
	}
}
