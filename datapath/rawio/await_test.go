package rawio

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"
)

// echo answers every read on nc with the same bytes, after delay; it
// returns when nc fails.
func echo(nc net.Conn, delay time.Duration) {
	buf := make([]byte, 64<<10)
	for {
		n, err := nc.Read(buf)
		if err != nil {
			return
		}
		time.Sleep(delay)
		if _, err := nc.Write(buf[:n]); err != nil {
			return
		}
	}
}

// exchange writes req after AwaitReply and reads the whole echo of it.
func exchange(t *testing.T, c *Conn, req []byte) {
	t.Helper()
	c.AwaitReply()
	if n, err := c.Write(req); n != len(req) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(req))
	}
	got := make([]byte, len(req))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatalf("read the reply: %v", err)
	}
	if !bytes.Equal(got, req) {
		t.Fatalf("reply %q, want %q", got, req)
	}
}

// A reply that comes at once must not be missed: the write goes out
// inside the read that waits, after the poller forgot the connection's
// readiness, so however soon the reply arrives the wait sees it.
func TestAwaitReplySeesAnInstantReply(t *testing.T) {
	client, server := pair(t)
	go echo(server, 0)
	client.SetReadDeadline(time.Now().Add(20 * time.Second))
	c := New(client)
	for i := range 2000 {
		exchange(t, c, []byte{'a' + byte(i%26), 'z'})
	}
}

func TestAwaitReplyWriteLargerThanSocketBuffers(t *testing.T) {
	client, server := pair(t)
	req := make([]byte, 8<<20) // far more than the socket buffers hold
	rand.Read(req)
	got := make(chan []byte, 1)
	go func() {
		// Reads the whole request, slowly, then answers: the write meets
		// a full buffer on the way, and the wait starts only when it is
		// all out.
		b := make([]byte, len(req))
		for n := 0; n < len(b); {
			m, err := server.Read(b[n:min(len(b), n+64<<10)])
			if err != nil {
				t.Errorf("peer read after %d bytes: %v", n, err)
				break
			}
			n += m
			if n%(1<<20) < m {
				time.Sleep(5 * time.Millisecond)
			}
		}
		got <- b
		server.Write([]byte("done"))
	}()
	client.SetDeadline(time.Now().Add(20 * time.Second))
	c := New(client)
	c.AwaitReply()
	if n, err := c.Write(req); n != len(req) || err != nil {
		t.Fatalf("Write = %d, %v; want %d, nil", n, err, len(req))
	}
	if c.Written() != int64(len(req)) {
		t.Fatalf("Written = %d, want %d", c.Written(), len(req))
	}
	if b := <-got; !bytes.Equal(b, req) {
		t.Fatal("the peer read other bytes than were written")
	}
	reply, err := io.ReadAll(io.LimitReader(c, 4))
	if err != nil || string(reply) != "done" {
		t.Fatalf("reply %q, %v; want \"done\"", reply, err)
	}
}

// The wait's own failures are left to the Read that follows: the bytes
// were written, so Write reports them written.
func TestAwaitReplyLeavesTheWaitsErrorToRead(t *testing.T) {
	t.Run("deadline", func(t *testing.T) {
		client, server := pair(t)
		client.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
		c := New(client)
		c.AwaitReply()
		if n, err := c.Write([]byte("ping")); n != 4 || err != nil {
			t.Fatalf("Write = %d, %v; want 4, nil", n, err)
		}
		if _, err := c.Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("Read = %v; want os.ErrDeadlineExceeded", err)
		}
		server.SetReadDeadline(time.Now().Add(5 * time.Second))
		got := make([]byte, 4)
		if _, err := io.ReadFull(server, got); err != nil || string(got) != "ping" {
			t.Fatalf("peer read %q, %v; want \"ping\"", got, err)
		}
	})
	t.Run("peer closes", func(t *testing.T) {
		client, server := pair(t)
		go func() {
			io.ReadFull(server, make([]byte, 4))
			server.Close()
		}()
		client.SetReadDeadline(time.Now().Add(5 * time.Second))
		c := New(client)
		c.AwaitReply()
		if n, err := c.Write([]byte("ping")); n != 4 || err != nil {
			t.Fatalf("Write = %d, %v; want 4, nil", n, err)
		}
		if n, err := c.Read(make([]byte, 8)); n != 0 || err != io.EOF {
			t.Fatalf("Read = %d, %v; want 0, io.EOF", n, err)
		}
	})
	t.Run("closed while waiting", func(t *testing.T) {
		client, _ := pair(t)
		c := New(client)
		time.AfterFunc(50*time.Millisecond, func() { client.Close() })
		c.AwaitReply()
		if n, err := c.Write([]byte("ping")); n != 4 || err != nil {
			t.Fatalf("Write = %d, %v; want 4, nil", n, err)
		}
		if _, err := c.Read(make([]byte, 8)); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read = %v; want net.ErrClosed", err)
		}
	})
	t.Run("closed before", func(t *testing.T) {
		client, _ := pair(t)
		c := New(client)
		client.Close()
		c.AwaitReply()
		if _, err := c.Write([]byte("ping")); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Write = %v; want net.ErrClosed", err)
		}
	})
}
