package keepalive

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
	"github.com/nomad-serverless/nomad-serverless/test/testcert"
)

// startTLSLoop serves h over TLS on 127.0.0.1: each connection is
// handshaken, then served by a Server as the gateway's HTTPS port does.
func startTLSLoop(t *testing.T, h http.Handler) (addr string, client *tls.Config) {
	t.Helper()
	cert, pool := testcert.SelfSigned(t, "a")
	cfg := &tls.Config{Certificates: []tls.Certificate{cert}}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Handler: h, IdleTimeout: time.Minute, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				tc := tls.Server(c, cfg)
				_ = tc.SetDeadline(time.Now().Add(10 * time.Second))
				if tc.Handshake() != nil {
					tc.Close()
					return
				}
				_ = tc.SetDeadline(time.Time{})
				s.ServeConn(tc, nil, nil, nil)
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		s.Close()
		if !s.Wait(5 * time.Second) {
			t.Error("connections still open 5s after Close")
		}
	})
	return ln.Addr().String(), &tls.Config{RootCAs: pool, ServerName: "a"}
}

// A TLS client's bytes wait on the socket as records, and a departing
// client's close_notify is one: the loop still notices it leave, whether
// the FIN comes with the alert (Close) or after it (CloseWrite, then
// Close), and a client that waits, a pipelined request's record unread
// meanwhile, is not taken for gone.
func TestClientGoneTLS(t *testing.T) {
	for _, leave := range []string{"close", "close_notify then FIN"} {
		for _, how := range []string{"Err", "Done"} {
			t.Run(leave+"/"+how, func(t *testing.T) {
				started := make(chan struct{}, 1)
				gone := make(chan struct{}, 1)
				addr, ccfg := startTLSLoop(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					start := time.Now()
					started <- struct{}{}
					ctx := r.Context()
					if r.URL.Path == "/stay" {
						if how == "Done" {
							select {
							case <-ctx.Done():
								t.Error("a waiting client was taken for gone")
							case <-time.After(time.Second):
							}
						}
						for time.Since(start) < time.Second {
							if ctx.Err() != nil {
								t.Error("a waiting client was taken for gone")
								break
							}
							time.Sleep(50 * time.Millisecond)
						}
						io.WriteString(w, "stayed")
						return
					}
					deadline := time.After(testbin.Bound(20 * time.Second))
				wait:
					for ctx.Err() == nil {
						if how == "Done" {
							select {
							case <-ctx.Done():
							case <-deadline:
								break wait
							}
						} else {
							select {
							case <-time.After(50 * time.Millisecond):
							case <-deadline:
								break wait
							}
						}
					}
					if !errors.Is(ctx.Err(), context.Canceled) {
						t.Errorf("context error %v, want canceled", ctx.Err())
					}
					gone <- struct{}{}
				}))
				c, err := tls.Dial("tcp", addr, ccfg)
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				_ = c.SetDeadline(time.Now().Add(testbin.Bound(20 * time.Second)))
				br := bufio.NewReader(c)
				// The second request is written while the first waits:
				// its record waits unread on the socket, as a
				// close_notify would, and must not be taken for one.
				io.WriteString(c, "GET /stay HTTP/1.1\r\nHost: a\r\n\r\n")
				<-started
				io.WriteString(c, "GET /stay HTTP/1.1\r\nHost: a\r\n\r\n")
				for i := range 2 {
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						t.Fatal(err)
					}
					b, _ := io.ReadAll(resp.Body)
					if string(b) != "stayed" {
						t.Fatalf("request %d: got %q", i+1, b)
					}
				}
				<-started
				io.WriteString(c, "GET /leave HTTP/1.1\r\nHost: a\r\n\r\n")
				<-started
				if leave == "close" {
					c.Close()
				} else {
					if err := c.CloseWrite(); err != nil { // the alert alone
						t.Fatal(err)
					}
					select {
					case <-gone:
						// net/http notices the alert itself; the loop
						// may too if the FIN is not needed. Either is
						// right.
						return
					case <-time.After(300 * time.Millisecond):
					}
					c.NetConn().Close()
				}
				left := time.Now()
				select {
				case <-gone:
					t.Logf("noticed %s after the FIN", time.Since(left).Round(time.Millisecond))
				case <-time.After(testbin.Bound(30 * time.Second)):
					t.Fatal("the handler never noticed the client leave")
				}
			})
		}
	}
}
