// Package rawh2 is a test client that speaks HTTP/2 as raw frames
// (golang.org/x/net/http2's Framer and hpack): it writes what a test
// builds, legal or not (bad prefaces, frames on the wrong stream,
// oversized or badly padded frames, floods, HPACK bombs), and reads back
// every frame the server sends on that one connection until the
// connection ends, a GOAWAY comes, or the test has what it waited for.
// The HTTP/2 hostile-input tables of the gateway and the sidecar, and the
// gateway's HTTP/2 fuzz target, share it.
package rawh2

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Preface is the client connection preface (RFC 9113 §3.4).
const Preface = http2.ClientPreface

// WriteTimeout bounds one write to the server: a server that stops reading
// without closing fails the write instead of hanging the test.
const WriteTimeout = 20 * time.Second

// Conn is one client connection. Writes go through Fr (which may write
// illegal frames) or Write (raw bytes); Read starts the reader, which
// collects what the server sends into the connection's Outcome.
type Conn struct {
	NC net.Conn
	// Fr writes frames (AllowIllegalWrites) and, once Read started,
	// reads them on the reader's goroutine only.
	Fr   *http2.Framer
	enc  *hpack.Encoder
	ebuf bytes.Buffer

	mu      sync.Mutex
	out     Outcome
	changed chan struct{} // closed and replaced at every change
	reading bool
	// NoAck: the reader does not acknowledge the server's SETTINGS (a
	// test whose input may end in a cut frame: the ACK's bytes would
	// complete it).
	NoAck bool
	wmu   sync.Mutex // writes: the test's and the reader's SETTINGS ACKs
}

// Outcome is what the server sent on the connection.
type Outcome struct {
	Frames int
	// GoAway: the server sent a GOAWAY (its code, last stream, debug data).
	GoAway       bool
	GoAwayCode   http2.ErrCode
	LastStreamID uint32
	Debug        string
	// Resets are the streams the server reset, with the code.
	Resets map[uint32]http2.ErrCode
	// Statuses are the :status of the response heads, by stream;
	// Ended the streams the server ended (END_STREAM).
	Statuses map[uint32]string
	Ended    map[uint32]bool
	// SettingsAcks and PingAcks count the acknowledgements the server
	// sent (of the client's SETTINGS and PINGs); Settings its own.
	SettingsAcks, PingAcks, Settings int
	// PingAcked holds the payloads of the PINGs acknowledged.
	PingAcked map[[8]byte]bool
	// HTTP1 holds what the server sent when it did not answer in
	// HTTP/2 (an HTTP/1.1 response to what it did not take as a
	// preface).
	HTTP1 string
	// Closed: the connection ended (EOF or reset by the server); ReadErr
	// is a read error other than the end (a frame the client could not
	// parse, say).
	Closed  bool
	ReadErr error
}

// Ended reports whether the connection is over for the server: closed,
// or a GOAWAY sent.
func (o *Outcome) Over() bool { return o.Closed || o.GoAway || o.ReadErr != nil }

// Answered reports whether stream id got an end: a reset, or a response
// the server ended.
func (o *Outcome) Answered(id uint32) bool {
	_, reset := o.Resets[id]
	return reset || o.Ended[id]
}

func (o *Outcome) String() string {
	s := fmt.Sprintf("%d frames", o.Frames)
	if o.GoAway {
		s += fmt.Sprintf(", GOAWAY %v (last stream %d, %q)", o.GoAwayCode, o.LastStreamID, o.Debug)
	}
	if len(o.Resets) > 0 {
		codes := map[http2.ErrCode]int{}
		for _, c := range o.Resets {
			codes[c]++
		}
		s += fmt.Sprintf(", %d streams reset %v", len(o.Resets), codes)
	}
	if len(o.Statuses) > 0 {
		st := map[string]int{}
		for _, c := range o.Statuses {
			st[c]++
		}
		s += fmt.Sprintf(", %d responses %v (%d ended)", len(o.Statuses), st, len(o.Ended))
	}
	if o.SettingsAcks+o.PingAcks > 0 {
		s += fmt.Sprintf(", %d SETTINGS ACKs, %d PING ACKs", o.SettingsAcks, o.PingAcks)
	}
	if o.HTTP1 != "" {
		s += fmt.Sprintf(", HTTP/1 answer %q", o.HTTP1)
	}
	if o.Closed {
		s += ", closed"
	}
	if o.ReadErr != nil {
		s += fmt.Sprintf(", read error %v", o.ReadErr)
	}
	return s
}

// Dial connects to addr; nothing is written yet.
func Dial(t testing.TB, addr string) *Conn {
	t.Helper()
	nc, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	return Wrap(t, nc)
}

// Wrap makes a Conn of a connection the test dialled itself.
func Wrap(t testing.TB, nc net.Conn) *Conn {
	t.Cleanup(func() { nc.Close() })
	c := &Conn{NC: nc, changed: make(chan struct{})}
	c.Fr = http2.NewFramer(writer{c}, nc)
	c.Fr.AllowIllegalWrites = true
	c.Fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.Fr.MaxHeaderListSize = 1 << 20
	c.enc = hpack.NewEncoder(&c.ebuf)
	c.out = Outcome{Resets: map[uint32]http2.ErrCode{}, Statuses: map[uint32]string{}, Ended: map[uint32]bool{}, PingAcked: map[[8]byte]bool{}}
	return c
}

// writer bounds every write by WriteTimeout.
type writer struct{ c *Conn }

func (w writer) Write(p []byte) (int, error) {
	w.c.NC.SetWriteDeadline(time.Now().Add(WriteTimeout))
	return w.c.NC.Write(p)
}

// Write writes raw bytes; an error means the server closed (or stopped
// reading for WriteTimeout).
func (c *Conn) Write(p []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	_, err := writer{c}.Write(p)
	return err
}

// Frames runs fn, which writes with Fr, under the write lock (the reader
// acknowledges the server's SETTINGS on the same connection).
func (c *Conn) Frames(fn func(fr *http2.Framer) error) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	return fn(c.Fr)
}

// Start writes the client preface: the magic and a SETTINGS frame.
func (c *Conn) Start(settings ...http2.Setting) error {
	if err := c.Write([]byte(Preface)); err != nil {
		return err
	}
	return c.Frames(func(fr *http2.Framer) error { return fr.WriteSettings(settings...) })
}

// Block HPACK-encodes fields (name, value, name, value...) with the
// connection's encoder (its dynamic table is the server's decoder's).
func (c *Conn) Block(fields ...string) []byte {
	c.ebuf.Reset()
	for i := 0; i+1 < len(fields); i += 2 {
		c.enc.WriteField(hpack.HeaderField{Name: fields[i], Value: fields[i+1]})
	}
	return bytes.Clone(c.ebuf.Bytes())
}

// RequestBlock is the field block of a request without body fields.
func (c *Conn) RequestBlock(method, authority, path string, extra ...string) []byte {
	return c.Block(append([]string{":method", method, ":scheme", "http", ":authority", authority, ":path", path}, extra...)...)
}

// Request writes a complete request head on stream id: one HEADERS frame
// with END_HEADERS, and END_STREAM when it has no body.
func (c *Conn) Request(id uint32, method, authority, path string, endStream bool) error {
	block := c.RequestBlock(method, authority, path)
	return c.Frames(func(fr *http2.Framer) error {
		return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true, EndStream: endStream})
	})
}

// Read starts the reader: every frame the server sends is recorded in the
// Outcome until the connection ends; the server's SETTINGS are
// acknowledged. A connection that does not speak HTTP/2 back has its
// first bytes kept in Outcome.HTTP1.
func (c *Conn) Read() {
	c.mu.Lock()
	if c.reading {
		c.mu.Unlock()
		return
	}
	c.reading = true
	c.mu.Unlock()
	go c.readLoop()
}

func (c *Conn) readLoop() {
	// An HTTP/2 server's first frame is SETTINGS (type 4 at byte 3);
	// "HTTP/1.1 " is an HTTP/1 answer.
	head := make([]byte, 9)
	if n, err := io.ReadFull(c.NC, head); err != nil {
		c.update(func(o *Outcome) {
			o.HTTP1 = string(head[:n])
			o.Closed = true
		})
		return
	}
	if bytes.HasPrefix(head, []byte("HTTP/")) {
		rest, _ := io.ReadAll(io.LimitReader(c.NC, 4<<10))
		c.update(func(o *Outcome) {
			o.HTTP1 = string(head) + string(rest)
			o.Closed = true
		})
		return
	}
	fr := http2.NewFramer(nil, io.MultiReader(bytes.NewReader(head), c.NC))
	fr.ReadMetaHeaders = c.Fr.ReadMetaHeaders
	fr.MaxHeaderListSize = c.Fr.MaxHeaderListSize
	fr.SetMaxReadFrameSize(1<<24 - 1)
	for {
		f, err := fr.ReadFrame()
		if err != nil {
			c.update(func(o *Outcome) {
				if isEnd(err) {
					o.Closed = true
				} else {
					o.ReadErr = err
				}
			})
			return
		}
		ack := false
		c.update(func(o *Outcome) {
			o.Frames++
			switch f := f.(type) {
			case *http2.GoAwayFrame:
				o.GoAway, o.GoAwayCode, o.LastStreamID, o.Debug = true, f.ErrCode, f.LastStreamID, string(f.DebugData())
			case *http2.RSTStreamFrame:
				o.Resets[f.StreamID] = f.ErrCode
			case *http2.MetaHeadersFrame:
				if s := f.PseudoValue("status"); s != "" {
					if _, ok := o.Statuses[f.StreamID]; !ok {
						o.Statuses[f.StreamID] = s
					}
				}
				if f.StreamEnded() {
					o.Ended[f.StreamID] = true
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					o.Ended[f.StreamID] = true
				}
			case *http2.SettingsFrame:
				if f.IsAck() {
					o.SettingsAcks++
				} else {
					o.Settings++
					ack = true
				}
			case *http2.PingFrame:
				if f.IsAck() {
					o.PingAcks++
					o.PingAcked[f.Data] = true
				}
			}
		})
		if ack && !c.NoAck {
			_ = c.Frames(func(fr *http2.Framer) error { return fr.WriteSettingsAck() })
		}
	}
}

// isEnd reports whether err is the connection's end (closed or reset).
func isEnd(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.EPIPE)
}

func (c *Conn) update(fn func(*Outcome)) {
	c.mu.Lock()
	fn(&c.out)
	close(c.changed)
	c.changed = make(chan struct{})
	c.mu.Unlock()
}

// Wait waits, up to within, until done holds of what the server sent, or
// the connection is over (Outcome.Over) when done is nil. It starts the
// reader if the test had not. It returns a copy of the outcome and false
// when the time ran out: a server that hangs.
func (c *Conn) Wait(within time.Duration, done func(*Outcome) bool) (Outcome, bool) {
	c.Read()
	if done == nil {
		done = (*Outcome).Over
	}
	deadline := time.NewTimer(within)
	defer deadline.Stop()
	for {
		c.mu.Lock()
		ok := done(&c.out) || c.out.Closed || c.out.ReadErr != nil
		ch := c.changed
		snap := c.snapshot()
		c.mu.Unlock()
		if ok {
			return snap, true
		}
		select {
		case <-ch:
		case <-deadline.C:
			c.mu.Lock()
			defer c.mu.Unlock()
			return c.snapshot(), false
		}
	}
}

func (c *Conn) snapshot() Outcome {
	o := c.out
	o.Resets = clone(o.Resets)
	o.Statuses = clone(o.Statuses)
	o.Ended = clone(o.Ended)
	o.PingAcked = clone(o.PingAcked)
	return o
}

func clone[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// Close closes the connection.
func (c *Conn) Close() { c.NC.Close() }
