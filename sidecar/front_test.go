package sidecar

import (
	"io"
	"log"
	"net"
	"testing"
)

// frontServer serves a sidecar's handler on 127.0.0.1 the way Serve does
// (the keepalive loop, net/http for the rest), for tests that need no
// admin port, probes or drain.
type frontServer struct {
	URL   string
	front *frontDoor
}

func serveFront(t *testing.T, s *Sidecar) *frontServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &frontServer{URL: "http://" + ln.Addr().String(), front: s.frontDoor(ln, log.New(io.Discard, "", 0))}
	go func() { _ = f.front.serve() }()
	t.Cleanup(f.Close)
	return f
}

func (f *frontServer) Close() { f.front.close() }
