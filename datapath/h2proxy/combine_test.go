package h2proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// tcpPair is a connected pair of loopback TCP connections.
func tcpPair(t *testing.T) (client, server net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		acc <- c
	}()
	client, err = net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server = <-acc
	if server == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { client.Close(); server.Close() })
	return client, server
}

// Writes from many goroutines arrive whole and, per writer, in order; a
// writer that then waits for an answer gets it (what it wrote was sent
// although nothing more was written); and frames written in a row go out
// in fewer writes of the socket than Writes.
func TestCombinedConnOrderAndFlush(t *testing.T) {
	client, server := tcpPair(t)
	c := NewCombinedConn(client)
	const writers, rounds = 8, 200
	// The server answers every record ("w<i> <seq> <pad>;") with the
	// record's writer and sequence number, after checking the order.
	srvErr := make(chan error, 1)
	go func() {
		next := make([]int, writers)
		buf := make([]byte, 0, 4096)
		rd := make([]byte, 4096)
		for {
			n, err := server.Read(rd)
			buf = append(buf, rd[:n]...)
			for {
				i := bytes.IndexByte(buf, ';')
				if i < 0 {
					break
				}
				var w, seq int
				var pad string
				if _, err := fmt.Sscanf(string(buf[:i]), "w%d %d %s", &w, &seq, &pad); err != nil {
					srvErr <- fmt.Errorf("record %q: %v", buf[:i], err)
					return
				}
				if seq != next[w] || pad != strings.Repeat("x", 10+seq%50) {
					srvErr <- fmt.Errorf("writer %d: record %d (pad %d) where %d was due", w, seq, len(pad), next[w])
					return
				}
				next[w]++
				fmt.Fprintf(server, "%d %d\n", w, seq)
				buf = buf[i+1:]
			}
			if err != nil {
				srvErr <- nil
				return
			}
		}
	}()
	// Answers are read by one goroutine and handed to their writer.
	answers := make([]chan int, writers)
	for i := range answers {
		answers[i] = make(chan int, rounds)
	}
	go func() {
		var w, seq int
		for {
			if _, err := fmt.Fscanf(client, "%d %d\n", &w, &seq); err != nil {
				return
			}
			answers[w] <- seq
		}
	}()
	var wg sync.WaitGroup
	var calls atomic.Int64
	var wmu sync.Mutex // a record's Writes are not interleaved (the transport's wmu)
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range rounds {
				// A record in three Writes, as the transport writes a
				// call's frames.
				rec := fmt.Sprintf("w%d %d %s;", w, seq, strings.Repeat("x", 10+seq%50))
				wmu.Lock()
				for _, part := range []string{rec[:3], rec[3:7], rec[7:]} {
					if _, err := c.Write([]byte(part)); err != nil {
						t.Error(err)
					}
					calls.Add(1)
				}
				wmu.Unlock()
				select {
				case got := <-answers[w]:
					if got != seq {
						t.Errorf("writer %d: answer %d to record %d", w, got, seq)
						return
					}
				case <-time.After(10 * time.Second):
					t.Errorf("writer %d: record %d was not sent", w, seq)
					return
				}
			}
		}()
	}
	wg.Wait()
	c.Close()
	if err := <-srvErr; err != nil {
		t.Fatal(err)
	}
	c.mu.Lock()
	writes := c.writes
	c.mu.Unlock()
	t.Logf("%d Writes, %d socket writes", calls.Load(), writes)
	if int64(writes) >= calls.Load() {
		t.Errorf("%d Writes took %d socket writes: nothing was combined", calls.Load(), writes)
	}
}

// A peer that does not read holds the writer back: at most maxHeld bytes
// wait in the combiner (and one taken batch in the socket). Once the
// peer reads, everything arrives in order.
func TestCombinedConnBackPressure(t *testing.T) {
	a, b := net.Pipe() // no buffer: a write waits for the read
	c := NewCombinedConn(a)
	piece := bytes.Repeat([]byte("0123456789abcdef"), 256) // 4 KiB
	const pieces = 4 * maxHeld / 4096
	var accepted atomic.Int64
	done := make(chan error, 1)
	go func() {
		for i := range pieces {
			p := bytes.Clone(piece)
			p[0] = byte(i)
			if _, err := c.Write(p); err != nil {
				done <- err
				return
			}
			accepted.Add(int64(len(p)))
		}
		done <- nil
	}()
	// Wait until the writer stops advancing.
	last := int64(-1)
	for accepted.Load() != last {
		last = accepted.Load()
		time.Sleep(50 * time.Millisecond)
	}
	if last > 2*maxHeld+int64(len(piece)) {
		t.Fatalf("%d bytes accepted while the peer read nothing", last)
	}
	got := make([]byte, pieces*len(piece))
	if _, err := io.ReadFull(b, got); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	for i := range pieces {
		p := got[i*len(piece) : (i+1)*len(piece)]
		if p[0] != byte(i) || !bytes.Equal(p[1:], piece[1:]) {
			t.Fatalf("piece %d changed or out of order", i)
		}
	}
}

// Close sends what is held first; a peer that reads nothing holds Close
// back for closeGrace at most. Writes after Close fail.
func TestCombinedConnClose(t *testing.T) {
	client, server := tcpPair(t)
	c := NewCombinedConn(client)
	c.Write([]byte("last frames"))
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	server.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(server)
	if string(got) != "last frames" || err != nil {
		t.Fatalf("the peer read %q, %v", got, err)
	}
	if _, err := c.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}

	a, _ := net.Pipe()
	c = NewCombinedConn(a)
	c.Write([]byte("never read"))
	closed := make(chan struct{})
	go func() { c.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("Close waited for a peer that does not read")
	}
}

// A failed socket write fails the Writes after it, and what was held
// with it is dropped rather than sent after a gap.
func TestCombinedConnWriteError(t *testing.T) {
	a, b := net.Pipe()
	c := NewCombinedConn(a)
	b.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := c.Write([]byte("frame"))
		if err != nil {
			if !errors.Is(err, io.ErrClosedPipe) {
				t.Fatalf("got %v, want the socket's error", err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Writes kept succeeding on a closed connection")
		}
		time.Sleep(time.Millisecond)
	}
	c.Close()
}

// Through an HTTP/2 transport to an h2c server: streamed request bodies,
// trailers both ways, and many concurrent streams on the connection.
func TestCombineWritesH2C(t *testing.T) {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	srv := &http.Server{Protocols: &protos, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Got-Trailer")
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		// Echo each piece as it comes (a bidirectional stream).
		buf := make([]byte, 64)
		for {
			n, err := r.Body.Read(buf)
			w.Write(buf[:n])
			w.(http.Flusher).Flush()
			if err != nil {
				break
			}
		}
		w.Header().Set("Got-Trailer", r.Trailer.Get("Sent-Trailer"))
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(ln)
	defer srv.Close()

	var dials atomic.Int32
	tr := &http.Transport{Protocols: &protos}
	tr.DialContext = CombineWrites(func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return (&net.Dialer{}).DialContext(ctx, network, addr)
	})
	defer tr.CloseIdleConnections()
	url := "http://" + ln.Addr().String() + "/"

	// A stream whose body comes in pieces, each answered before the next
	// is sent: nothing waits in the combiner.
	pr, pw := io.Pipe()
	req, _ := http.NewRequest("POST", url, pr)
	req.Trailer = http.Header{"Sent-Trailer": nil}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		t.Fatal(err)
	}
	for _, piece := range []string{"one", "two", "three"} {
		pw.Write([]byte(piece))
		got := make([]byte, len(piece))
		if _, err := io.ReadFull(resp.Body, got); err != nil || string(got) != piece {
			t.Fatalf("echo of %q: %q, %v", piece, got, err)
		}
	}
	req.Trailer.Set("Sent-Trailer", "yes")
	pw.Close()
	if rest, _ := io.ReadAll(resp.Body); len(rest) != 0 {
		t.Fatalf("unexpected %q", rest)
	}
	if got := resp.Trailer.Get("Got-Trailer"); got != "yes" {
		t.Fatalf("trailer: %q", got)
	}

	var wg sync.WaitGroup
	for i := range 64 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := strings.Repeat(fmt.Sprint(i%10), 1000+i*300)
			resp, err := tr.RoundTrip(must(http.NewRequest("POST", url, strings.NewReader(body))))
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			got, err := io.ReadAll(resp.Body)
			if err != nil || string(got) != body {
				t.Errorf("stream %d: %d bytes back of %d, %v", i, len(got), len(body), err)
			}
		}()
	}
	wg.Wait()
	if n := dials.Load(); n != 1 {
		t.Errorf("%d connections; the streams should share one", n)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
