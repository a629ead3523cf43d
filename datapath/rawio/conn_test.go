package rawio

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/nomad-serverless/nomad-serverless/test/testbin"
)

// pair returns the two ends of a loopback TCP connection; both are closed
// when the test ends.
func pair(t testing.TB) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			t.Error(err)
		}
		accepted <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	select {
	case server = <-accepted:
	case <-time.After(5 * time.Second):
		t.Fatal("accept timed out")
	}
	if server == nil {
		t.FailNow()
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

func TestRoundTripLargerThanSocketBuffers(t *testing.T) {
	client, server := pair(t)
	// 8 MiB is far more than the socket buffers hold, so writes meet
	// EAGAIN and wait in the poller, and reads come in many pieces.
	want := make([]byte, 8<<20)
	rand.Read(want)
	w, r := New(client), New(server)
	done := make(chan error, 1)
	go func() {
		n, err := w.Write(want)
		if err == nil && n != len(want) {
			err = io.ErrShortWrite
		}
		done <- err
	}()
	got := make([]byte, 0, len(want))
	buf := make([]byte, 16<<10)
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	for len(got) < len(want) {
		n, err := r.Read(buf)
		if err != nil {
			t.Fatalf("read after %d bytes: %v", len(got), err)
		}
		// Slow reader: let the writer fill the buffers now and then.
		if len(got)%(1<<20) < n {
			time.Sleep(5 * time.Millisecond)
		}
		got = append(got, buf[:n]...)
	}
	if err := <-done; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("bytes read differ from bytes written")
	}
}

func TestReadEOFWhenPeerCloses(t *testing.T) {
	client, server := pair(t)
	if _, err := client.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	client.Close()
	server.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(New(server))
	if err != nil || string(got) != "bye" {
		t.Fatalf("ReadAll = %q, %v; want \"bye\", nil (io.EOF ends it)", got, err)
	}
	n, err := New(server).Read(make([]byte, 8))
	if n != 0 || err != io.EOF {
		t.Fatalf("Read after end = %d, %v; want 0, io.EOF", n, err)
	}
}

func TestReadHonoursDeadline(t *testing.T) {
	_, server := pair(t)
	server.SetReadDeadline(time.Now().Add(50 * time.Millisecond))
	start := time.Now()
	_, err := New(server).Read(make([]byte, 8))
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read = %v; want os.ErrDeadlineExceeded", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read error %v is not a net.Error timeout", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("Read waited far past its deadline")
	}
	// A deadline already past fails at once, as net.Conn's does.
	if _, err := New(server).Read(make([]byte, 8)); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Read with a past deadline = %v", err)
	}
}

func TestCloseUnblocksRead(t *testing.T) {
	_, server := pair(t)
	errc := make(chan error, 1)
	go func() {
		_, err := New(server).Read(make([]byte, 8))
		errc <- err
	}()
	time.Sleep(20 * time.Millisecond)
	server.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Read on a closed connection = %v; want net.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Read still blocked after Close")
	}
}

func TestWriteToResetPeerFails(t *testing.T) {
	client, server := pair(t)
	// SO_LINGER 0: the close resets the connection.
	server.(*net.TCPConn).SetLinger(0)
	server.Close()
	w := New(client)
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		_, err = w.Write([]byte("hello"))
		time.Sleep(time.Millisecond)
	}
	if !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("Write to a reset peer = %v; want ECONNRESET or EPIPE", err)
	}
}

func TestEmptyReadAndWrite(t *testing.T) {
	client, _ := pair(t)
	c := New(client)
	if n, err := c.Write(nil); n != 0 || err != nil {
		t.Fatalf("Write(nil) = %d, %v", n, err)
	}
	if n, err := c.Read(nil); n != 0 || err != nil {
		t.Fatalf("Read(nil) = %d, %v", n, err)
	}
}

// A connection without a raw socket (net.Pipe) is read and written as is.
func TestConnWithoutSocket(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	go New(a).Write([]byte("piped"))
	buf := make([]byte, 5)
	if _, err := io.ReadFull(New(b), buf); err != nil || string(buf) != "piped" {
		t.Fatalf("read %q, %v", buf, err)
	}
}

// BenchmarkPingPong is one small request and answer over loopback, the
// proxies' pattern, through net.Conn and through Conn.
func BenchmarkPingPong(b *testing.B) {
	for _, tc := range []struct {
		name string
		wrap func(net.Conn) io.ReadWriter
	}{
		{"net.Conn", func(c net.Conn) io.ReadWriter { return c }},
		{"rawio", func(c net.Conn) io.ReadWriter { return New(c) }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			client, server := pair(b)
			go func() {
				s := tc.wrap(server)
				buf := make([]byte, 512)
				for {
					n, err := s.Read(buf)
					if err != nil {
						return
					}
					if _, err := s.Write(buf[:n]); err != nil {
						return
					}
				}
			}()
			c := tc.wrap(client)
			msg := bytes.Repeat([]byte("x"), 200)
			buf := make([]byte, 512)
			b.ReportAllocs()
			for b.Loop() {
				if _, err := c.Write(msg); err != nil {
					b.Fatal(err)
				}
				if _, err := io.ReadFull(c, buf[:len(msg)]); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// Quiet tells an idle connection from one its peer closed, reset, or
// wrote to unasked, without consuming anything.
func TestQuiet(t *testing.T) {
	client, server := pair(t)
	if !Quiet(client) {
		t.Fatal("an open idle connection is not quiet")
	}
	server.Write([]byte("x"))
	waitUntil(t, func() bool { return !Quiet(client) })
	b := make([]byte, 1)
	if _, err := client.Read(b); err != nil || b[0] != 'x' {
		t.Fatalf("the peek consumed the byte: %v %q", err, b)
	}
	if !Quiet(client) {
		t.Fatal("quiet again once the byte is read")
	}
	server.Close()
	waitUntil(t, func() bool { return !Quiet(client) })
	client.Close()
	if Quiet(client) {
		t.Fatal("a closed connection is quiet")
	}
}

// Written counts what reached the kernel, and nothing of a failed write.
func TestWritten(t *testing.T) {
	client, server := pair(t)
	c := New(client)
	if _, err := c.Write([]byte("hello")); err != nil || c.Written() != 5 {
		t.Fatalf("written %d, err %v", c.Written(), err)
	}
	server.(*net.TCPConn).SetLinger(0)
	server.Close()
	before := c.Written()
	var err error
	for i := 0; i < 100 && err == nil; i++ {
		time.Sleep(5 * time.Millisecond)
		_, err = c.Write([]byte("more"))
	}
	if err == nil {
		t.Fatal("writes to a reset connection kept succeeding")
	}
	if c.Written() < before {
		t.Fatalf("written went down: %d < %d", c.Written(), before)
	}
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	bound := testbin.Bound(20 * time.Second)
	for deadline := time.Now().Add(bound); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %s", bound)
		}
	}
}
