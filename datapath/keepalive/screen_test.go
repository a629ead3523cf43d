package keepalive

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"
)

// call is what a handler saw of one request.
type call struct {
	Method, URI string
	Length      int64
	Chunked     bool
	Body        string
	BodyErr     bool
}

// recorder serves net/http on ln, records every call and answers with the
// body's length.
type recorder struct {
	mu    sync.Mutex
	calls []call
	srv   *http.Server
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	rc.mu.Lock()
	rc.calls = append(rc.calls, call{Method: r.Method, URI: r.RequestURI, Length: r.ContentLength,
		Chunked: len(r.TransferEncoding) > 0, Body: string(b), BodyErr: err != nil})
	rc.mu.Unlock()
	fmt.Fprintf(w, "%d", len(b))
}

func (rc *recorder) take() []call {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := rc.calls
	rc.calls = nil
	return out
}

// streamServer serves a recorder behind ln (screened or not); conns gets
// the screens it made.
type streamServer struct {
	addr  string
	rec   *recorder
	mu    sync.Mutex
	conns []*ScreenConn
}

type recordingListener struct {
	net.Listener
	s      *streamServer
	screen bool
}

func (l recordingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil || !l.screen {
		return c, err
	}
	sc := NewScreenConn(c, http.DefaultMaxHeaderBytes+4<<10)
	l.s.mu.Lock()
	l.s.conns = append(l.s.conns, sc)
	l.s.mu.Unlock()
	return sc, nil
}

func startStreamServer(tb testing.TB, screen bool) *streamServer {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	s := &streamServer{addr: ln.Addr().String(), rec: &recorder{}}
	s.rec.srv = &http.Server{Handler: s.rec, ReadHeaderTimeout: 5 * time.Second, ErrorLog: discardLogger()}
	go func() { _ = s.rec.srv.Serve(recordingListener{ln, s, screen}) }()
	tb.Cleanup(func() { s.rec.srv.Close() })
	return s
}

// send writes stream, half-closes, and returns all that came back; the
// server has answered everything it read by then.
func (s *streamServer) send(tb testing.TB, stream string) string {
	tb.Helper()
	c, err := net.Dial("tcp", s.addr)
	if err != nil {
		tb.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	go func() {
		c.Write([]byte(stream))
		c.(*net.TCPConn).CloseWrite()
	}()
	b, _ := io.ReadAll(c)
	return string(b)
}

func (s *streamServer) refused() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		if c.state == screenRefused {
			return true
		}
	}
	return false
}

// The screen is transparent to request streams net/http frames
// unambiguously (bodies of both kinds, pipelining, the CR/LF after a POST,
// trailers, an upgrade refused), and refuses with 400, before any of it
// reaches the handler, the heads a front proxy could frame differently.
func TestScreen(t *testing.T) {
	get := "GET /next HTTP/1.1\r\nHost: a\r\n\r\n"
	for _, c := range []struct {
		name    string
		stream  string
		refused bool
		calls   int // handler calls behind the screen
	}{
		{"plain requests", get + get + get, false, 3},
		{"fixed body", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello" + get, false, 2},
		{"chunked body with extension and trailer", "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nX-T: 1\r\n\r\n" + get, false, 2},
		{"body that looks like a head", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 58\r\n\r\nPOST /b HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: x\r\n\r\n" + get, false, 2},
		{"CRLF after a POST", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\n\r\nz\r\n" + get, false, 2},
		{"bare LF lines", "GET / HTTP/1.1\nHost: a\n\n" + get, false, 2},
		{"upgrade refused, then requests", "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n", false, 1},

		{"Content-Length and Transfer-Encoding", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get, true, 0},
		{"Transfer-Encoding then Content-Length", "POST /a HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n" + get, true, 0},
		{"two equal lengths", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\nz" + get, true, 0},
		{"obs-fold", "GET / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n 2\r\n\r\n" + get, true, 0},
		{"chunked HTTP/1.0", "POST /a HTTP/1.0\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc", true, 0},
		{"smuggled after a good request", get + "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n" + get, true, 1},
		{"smuggled inside a pipelined stream after a body", "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nokGET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\tfolded\r\n\r\n", true, 1},
	} {
		t.Run(c.name, func(t *testing.T) {
			plain, screened := startStreamServer(t, false), startStreamServer(t, true)
			plainOut := plain.send(t, c.stream)
			out := screened.send(t, c.stream)
			calls, plainCalls := screened.rec.take(), plain.rec.take()
			if screened.refused() != c.refused || len(calls) != c.calls {
				t.Fatalf("refused=%v with %d calls, want %v %d\n%s", screened.refused(), len(calls), c.refused, c.calls, out)
			}
			if !c.refused {
				if !reflect.DeepEqual(calls, plainCalls) {
					t.Fatalf("behind the screen:\n%+v\nwithout:\n%+v", calls, plainCalls)
				}
				if strip(out) != strip(plainOut) {
					t.Fatalf("answers differ:\n%q\n%q", out, plainOut)
				}
				return
			}
			if len(calls) > 0 && !reflect.DeepEqual(calls, plainCalls[:len(calls)]) {
				t.Fatalf("behind the screen:\n%+v\nnot a prefix of:\n%+v", calls, plainCalls)
			}
			if n := strings.Count(out, "HTTP/1.1 "); n != len(calls)+1 || !strings.Contains(out, "HTTP/1.1 400 Bad Request") ||
				!strings.Contains(out, "Connection: close") {
				t.Fatalf("want %d answers then one 400 that closes:\n%s", len(calls), out)
			}
		})
	}
}

// strip removes the Date headers, which differ between two servers.
func strip(s string) string {
	var b strings.Builder
	for line := range strings.SplitSeq(s, "\r\n") {
		if !strings.HasPrefix(line, "Date: ") {
			b.WriteString(line)
			b.WriteString("\r\n")
		}
	}
	return b.String()
}

// A head refused across reads of any size: the held CR, the empty line in
// the next read, net/http's one-byte background reads.
func TestScreenAcrossReads(t *testing.T) {
	head := "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
	good := "POST /a HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\n\r\nabcdGET / HTTP/1.1\r\nHost: a\r\n\r\n"
	for _, size := range []int{1, 2, 3, 7, 64, 4096} {
		for _, c := range []struct {
			stream  string
			refused bool
		}{{head, true}, {good, false}} {
			client, server := net.Pipe()
			sc := NewScreenConn(server, 1<<20)
			go func() {
				for i := 0; i < len(c.stream); i += size {
					client.Write([]byte(c.stream[i:min(i+size, len(c.stream))]))
				}
				client.Close()
			}()
			var got []byte
			buf := make([]byte, size)
			for {
				n, err := sc.Read(buf)
				got = append(got, buf[:n]...)
				if err != nil {
					break
				}
			}
			want := c.stream
			if c.refused {
				want = head[:strings.Index(head, "\r\n\r\n")+2] + string(poison)
			}
			if string(got) != want {
				t.Fatalf("reads of %d: got\n%q\nwant\n%q", size, got, want)
			}
		}
	}
}

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// A protocol switch: answered 101, the rest is a tunnel (passed as it is,
// even what looks like a refused head); answered otherwise before the
// client sends more, the screen goes on with the next head.
func TestScreenProtocolSwitch(t *testing.T) {
	upgrade := "GET /ws HTTP/1.1\r\nHost: a\r\nConnection: upgrade\r\nUpgrade: websocket\r\n\r\n"
	smuggled := "POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
	for _, c := range []struct {
		answer  string
		refused bool
	}{
		{"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n\r\n", false},
		{"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", true},
	} {
		client, server := net.Pipe()
		sc := NewScreenConn(server, 1<<20)
		go func() {
			client.Write([]byte(upgrade))
			// The answer comes before the client sends on.
			buf := make([]byte, 256)
			client.Read(buf)
			client.Write([]byte(smuggled))
			client.Close()
		}()
		buf := make([]byte, 4096)
		var got []byte
		for len(got) < len(upgrade) {
			n, err := sc.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got = append(got, buf[:n]...)
		}
		go sc.Write([]byte(c.answer))
		rest, _ := io.ReadAll(sc)
		refused := strings.Contains(string(rest), string(poison))
		if refused != c.refused || !refused && string(rest) != smuggled {
			t.Fatalf("answer %q: after it %q (refused=%v, want %v)", c.answer[:12], rest, refused, c.refused)
		}
	}
}

func TestScreenConnCloseWrite(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	sl := ScreenListener{Listener: ln, MaxHead: 1 << 10}
	done := make(chan error, 1)
	go func() {
		c, err := sl.Accept()
		if err != nil {
			done <- err
			return
		}
		defer c.Close()
		cw, ok := c.(interface{ CloseWrite() error })
		if !ok {
			done <- errors.New("the screened conn has no CloseWrite")
			return
		}
		done <- cw.CloseWrite()
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c.Read(make([]byte, 1)); n != 0 || err != io.EOF {
		t.Fatalf("after CloseWrite the client read %d, %v; want EOF", n, err)
	}
}

// chunkConn gives out its stream in the pieces it was given, one piece
// (or less, for a small read) a Read, and counts the Reads.
type chunkConn struct {
	net.Conn
	pieces [][]byte
	reads  int
	err    error // after the last piece
}

func (c *chunkConn) Read(p []byte) (int, error) {
	c.reads++
	if len(c.pieces) == 0 {
		return 0, c.err
	}
	n := copy(p, c.pieces[0])
	if c.pieces[0] = c.pieces[0][n:]; len(c.pieces[0]) == 0 {
		c.pieces = c.pieces[1:]
	}
	return n, nil
}

// h2Frame is an HTTP/2 frame of the given type and payload on stream 1.
func h2Frame(typ byte, payload string) string {
	n := len(payload)
	return string([]byte{byte(n >> 16), byte(n >> 8), byte(n), typ, 0, 0, 0, 0, 1}) + payload
}

// After HTTP/2's preface the screen reads ahead: the small reads an HTTP/2
// server makes (a frame header, then its payload) get the stream byte for
// byte, in order, errors included, from far fewer reads of the socket;
// reads larger than the buffer go to the socket directly.
func TestScreenReadsAheadAfterH2Preface(t *testing.T) {
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	frames := h2Frame(4, "") + h2Frame(1, strings.Repeat("h", 120)) + h2Frame(0, strings.Repeat("d", 37)) +
		h2Frame(8, "\x00\x00\x01\x00") + h2Frame(0, strings.Repeat("x", 5000))
	big := strings.Repeat("B", 3*aheadSize)
	stream := preface + frames + big
	// The server's reads: the preface in net/http's two peeks, frames as
	// the framer reads them (header, then payload), then a large read.
	sizes := []int{14, 10}
	for rest := frames; len(rest) > 0; {
		n := int(rest[0])<<16 | int(rest[1])<<8 | int(rest[2])
		sizes = append(sizes, 9, n)
		rest = rest[9+n:]
	}
	for _, split := range []int{1, 7, 24, 100, 1 << 20} {
		var pieces [][]byte
		for i := 0; i < len(stream); i += split {
			pieces = append(pieces, []byte(stream[i:min(i+split, len(stream))]))
		}
		cc := &chunkConn{pieces: pieces, err: io.ErrUnexpectedEOF}
		sc := NewScreenConn(cc, 1<<20)
		var got []byte
		read := func(size int) {
			t.Helper()
			buf := make([]byte, size)
			n, err := io.ReadFull(sc, buf)
			if err != nil {
				t.Fatalf("split %d: read of %d after %d bytes: %v", split, size, len(got), err)
			}
			got = append(got, buf[:n]...)
		}
		for _, size := range sizes {
			if size > 0 {
				read(size)
			}
		}
		if !sc.h2 {
			t.Fatalf("split %d: the preface did not turn the read-ahead on", split)
		}
		framesReads := cc.reads
		read(len(big))
		if string(got) != stream {
			t.Fatalf("split %d: the stream changed through the screen", split)
		}
		if n, err := sc.Read(make([]byte, 9)); n != 0 || err != io.ErrUnexpectedEOF {
			t.Fatalf("split %d: after the stream: %d, %v; want the socket's error", split, n, err)
		}
		if split == 1<<20 && framesReads > 4 {
			t.Errorf("the preface and %d frames arriving at once took %d reads of the socket", len(sizes)/2-1, framesReads)
		}
	}
}

// An error that comes with bytes is given out after them, once.
func TestScreenReadAheadErrorAfterBytes(t *testing.T) {
	sc := NewScreenConn(&errWithBytesConn{data: []byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nframes")}, 1<<20)
	buf := make([]byte, 24)
	if _, err := io.ReadFull(sc, buf); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(sc)
	if string(b) != "frames" || err != nil {
		t.Fatalf("got %q, %v", b, err)
	}
}

// errWithBytesConn returns its data and io.EOF in one read once the
// preface is in (what some conns do at their end).
type errWithBytesConn struct {
	net.Conn
	data []byte
	at   int
}

func (c *errWithBytesConn) Read(p []byte) (int, error) {
	n := copy(p, c.data[c.at:])
	c.at += n
	if c.at == len(c.data) {
		return n, io.EOF
	}
	return n, nil
}

// HTTP/1 streams are not read ahead: a head, a look-alike of the preface
// and what follows CONNECT reach the socket as net/http reads them.
func TestScreenNoReadAheadForHTTP1(t *testing.T) {
	for _, stream := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\nGET /b HTTP/1.1\r\nHost: a\r\n\r\n",
		"PRI * HTTP/1.1\r\nHost: a\r\n\r\nmore bytes after it",
		"PRI /x HTTP/2.0\r\n\r\nSM\r\n\r\nmore bytes after it",
		"CONNECT a:443 HTTP/1.1\r\nHost: a\r\n\r\ntunnel bytes",
	} {
		cc := &chunkConn{pieces: [][]byte{[]byte(stream)}, err: io.EOF}
		sc := NewScreenConn(cc, 1<<20)
		var got []byte
		buf := make([]byte, 5)
		for {
			n, err := sc.Read(buf)
			got = append(got, buf[:n]...)
			if err != nil {
				break
			}
		}
		if string(got) != stream || sc.h2 || sc.ahead != nil {
			t.Fatalf("%q: got %q, read ahead %v", stream, got, sc.h2)
		}
	}
}
