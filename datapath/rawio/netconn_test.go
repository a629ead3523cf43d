package rawio

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"os"
	"syscall"
	"testing"
	"time"
)

// NetConn carries another layer's bytes both ways, larger than the socket
// buffers, keeps the socket's deadlines, and still shows its socket to
// whoever peeks at it.
func TestNetConn(t *testing.T) {
	client, server := pair(t)
	nc := NewNetConn(server)
	if nc.NetConn() != server {
		t.Fatal("NetConn does not return the wrapped connection")
	}
	if sc, ok := any(nc).(syscall.Conn); !ok {
		t.Fatal("NetConn hides the socket")
	} else if rc, err := sc.SyscallConn(); err != nil || rc == nil {
		t.Fatalf("SyscallConn: %v", err)
	}

	msg := make([]byte, 4<<20)
	rand.Read(msg)
	_ = client.SetDeadline(time.Now().Add(20 * time.Second))
	_ = nc.SetDeadline(time.Now().Add(20 * time.Second))
	errc := make(chan error, 1)
	go func() {
		_, err := nc.Write(msg)
		errc <- err
	}()
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(client, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("client read: %v (equal %v)", err, bytes.Equal(got, msg))
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	go func() {
		_, err := client.Write(msg)
		errc <- err
	}()
	if _, err := io.ReadFull(nc, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("NetConn read: %v", err)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	_ = nc.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	if _, err := nc.Read(got[:1]); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read past the deadline: %v, want os.ErrDeadlineExceeded", err)
	}
}
