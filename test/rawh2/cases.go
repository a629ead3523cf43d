package rawh2

import (
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/net/http2"
)

// Target is the HTTP/2 listener under test and the instance behind it.
type Target struct {
	Addr string
	// Host is an :authority that reaches the instance; Path a path the
	// instance answers at once.
	Host, Path string
	// Hold is the path of a request the instance answers with a response
	// head and then holds until Release (i numbers the held requests).
	Hold    func(i int) string
	Release func(t testing.TB, n int)
	// AtInstance counts the requests the instance has seen so far.
	AtInstance func(t testing.TB) int64
	// MaxStreams is the server's SETTINGS_MAX_CONCURRENT_STREAMS;
	// MaxHeaderBytes its limit on a request's header list.
	MaxStreams, MaxHeaderBytes int
	// RapidResetReach bounds the requests of the rapid-reset case that
	// reach the instance (0: rawh2.RapidResetReach).
	RapidResetReach int64
	// MaxHeapGrowth bounds the test process's heap growth during a case
	// (the server runs in the test process).
	MaxHeapGrowth uint64
}

// Case is one hostile input. Its name says what is sent and the answer
// RFC 9113 (or RFC 7541 for HPACK) requires, which Want asserts.
type Case struct {
	Name string
	// Send writes the input; the preface is written before it unless
	// NoPreface. Send may wait for answers (Conn.Wait).
	Send      func(t testing.TB, c *Conn, tg *Target)
	NoPreface bool
	// ReadAfterSend: the reader starts only when Send is done (floods:
	// the server's answers pile up as a client that does not read them
	// would make them).
	ReadAfterSend bool
	// Done says when the answer is complete (nil: the connection is over,
	// closed or GOAWAY).
	Done func(o *Outcome) bool
	Want func(o *Outcome) error
	// AtInstance is the most requests the instance may see; AtInstanceFn,
	// when set, says it for the target.
	AtInstance   int64
	AtInstanceFn func(tg *Target) int64
	// After runs once the answer is in (releases held requests, say).
	After func(t testing.TB, c *Conn, tg *Target, o *Outcome)
}

// Within bounds every case: a server that has not answered by then hangs,
// and the case fails. It is generous: machine speed must not decide.
const Within = 60 * time.Second

// Run runs every case on its own connection, each a subtest: the server's
// answer is waited for (never longer than Within), checked, and what
// reached the instance and the process's heap and goroutines are measured.
func Run(t *testing.T, tg *Target, cases []Case) {
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) { runCase(t, tg, c) })
	}
}

func runCase(t *testing.T, tg *Target, c Case) {
	runtime.GC()
	baseG := runtime.NumGoroutine()
	before := tg.AtInstance(t)
	peak := sample()
	conn := Dial(t, tg.Addr)
	if !c.NoPreface {
		if err := conn.Start(); err != nil {
			t.Fatalf("preface: %v", err)
		}
	}
	if !c.ReadAfterSend {
		conn.Read()
	}
	c.Send(t, conn, tg)
	o, ok := conn.Wait(Within, c.Done)
	heap, gs := peak()
	if !ok {
		t.Fatalf("no answer within %s (a hang): %s", Within, &o)
	}
	if err := c.Want(&o); err != nil {
		t.Errorf("%v; the server sent: %s", err, &o)
	}
	if c.After != nil {
		c.After(t, conn, tg, &o)
	}
	conn.Close()
	// What reached the instance may still be on its way: let the server's
	// goroutines settle (until back to the start, or no fewer for a
	// second: idle connections to the instance stay).
	settle(baseG)
	most := c.AtInstance
	if c.AtInstanceFn != nil {
		most = c.AtInstanceFn(tg)
	}
	if saw := tg.AtInstance(t) - before; saw > most {
		t.Errorf("the instance saw %d requests, want at most %d", saw, most)
	} else {
		t.Logf("the instance saw %d requests (at most %d)", saw, most)
	}
	t.Logf("answer: %s; heap grew by at most %.1f MiB, goroutines by at most %d", &o, float64(heap)/(1<<20), gs-baseG)
	// Handlers, their requests to the instance and the instance's own
	// (in this process) are bounded by the streams one connection may
	// have open, whatever the input.
	if most := 8 * tg.MaxStreams; gs-baseG > most {
		t.Errorf("the goroutines grew by %d during the case, want at most %d", gs-baseG, most)
	}
	if heap > tg.MaxHeapGrowth {
		t.Errorf("the heap grew by %.1f MiB during the case, want at most %.1f MiB", float64(heap)/(1<<20), float64(tg.MaxHeapGrowth)/(1<<20))
	}
}

// settle waits until the process is back to base goroutines or their
// number stops falling for a second (at most Within).
func settle(base int) {
	end := time.Now().Add(Within)
	last, since := runtime.NumGoroutine(), time.Now()
	for time.Now().Before(end) && time.Since(since) < time.Second {
		n := runtime.NumGoroutine()
		if n <= base {
			return
		}
		if n < last {
			last, since = n, time.Now()
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sample watches the heap in use and the goroutines every few
// milliseconds until the returned function is called, which returns the
// heap's peak growth over its start and the most goroutines seen.
func sample() func() (heap uint64, goroutines int) {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	base := ms.HeapInuse
	var peakHeap uint64
	peakG := runtime.NumGoroutine()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	look := func() {
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > base {
			peakHeap = max(peakHeap, ms.HeapInuse-base)
		}
		peakG = max(peakG, runtime.NumGoroutine())
	}
	go func() {
		defer wg.Done()
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				look()
				return
			case <-tick.C:
				look()
			}
		}
	}()
	return func() (uint64, int) {
		close(stop)
		wg.Wait()
		return peakHeap, peakG
	}
}

// goAway wants a GOAWAY with one of codes (the connection error RFC 9113
// names) and, since it is a connection error, the connection closed after
// it; a GOAWAY is the answer, but RFC 9113 §5.4.1 lets a server close at
// once, so a bare close counts when closeOK.
func goAway(closeOK bool, codes ...http2.ErrCode) func(o *Outcome) error {
	return func(o *Outcome) error {
		switch {
		case o.GoAway && slices.Contains(codes, o.GoAwayCode):
			return nil
		case o.GoAway:
			return fmt.Errorf("GOAWAY %v, want %v", o.GoAwayCode, codes)
		case o.Closed && closeOK:
			return nil
		}
		return fmt.Errorf("want a GOAWAY %v", codes)
	}
}

// literal is one literal header field without indexing, never Huffman
// coded (RFC 7541 §6.2.2): the bytes a test sizes exactly.
func literal(name, value string) []byte {
	var b []byte
	b = append(b, 0x00)
	b = appendInt(b, 7, uint64(len(name)))
	b = append(b, name...)
	b = appendInt(b, 7, uint64(len(value)))
	return append(b, value...)
}

// indexedLiteral is a literal header field with incremental indexing, new
// name (RFC 7541 §6.2.1): it enters the dynamic table.
func indexedLiteral(name, value string) []byte {
	b := []byte{0x40}
	b = appendInt(b, 7, uint64(len(name)))
	b = append(b, name...)
	b = appendInt(b, 7, uint64(len(value)))
	return append(b, value...)
}

// appendInt appends an HPACK integer with an n-bit prefix (RFC 7541 §5.1)
// as a new byte (and more); the caller sets the flag bits above the
// prefix in that first byte.
func appendInt(b []byte, n uint, v uint64) []byte {
	limit := uint64(1)<<n - 1
	if v < limit {
		return append(b, byte(v))
	}
	b = append(b, byte(limit))
	v -= limit
	for v >= 128 {
		b = append(b, byte(v&0x7f|0x80))
		v >>= 7
	}
	return append(b, byte(v))
}

// indexed is an indexed header field (RFC 7541 §6.1).
func indexed(i uint64) []byte {
	b := appendInt(nil, 7, i)
	b[0] |= 0x80
	return b
}

// tableSizeUpdate is a dynamic table size update (RFC 7541 §6.3).
func tableSizeUpdate(size uint64) []byte {
	b := appendInt(nil, 5, size)
	b[0] |= 0x20
	return b
}

// headers writes block on stream id as one HEADERS frame and as many
// CONTINUATION frames as the 16 KiB frames it fits in take.
func headers(c *Conn, id uint32, block []byte, endStream bool) error {
	const max = 16 << 10
	return c.Frames(func(fr *http2.Framer) error {
		first := block[:min(len(block), max)]
		rest := block[len(first):]
		if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: first, EndStream: endStream, EndHeaders: len(rest) == 0}); err != nil {
			return err
		}
		for len(rest) > 0 {
			n := min(len(rest), max)
			if err := fr.WriteContinuation(id, n == len(rest), rest[:n]); err != nil {
				return err
			}
			rest = rest[n:]
		}
		return nil
	})
}

// rawFrame writes a frame header with the given length, type, flags and
// stream, then payload as is (which may be shorter or longer than length).
func rawFrame(c *Conn, length int, typ http2.FrameType, flags http2.Flags, stream uint32, payload []byte) error {
	h := []byte{byte(length >> 16), byte(length >> 8), byte(length), byte(typ), byte(flags),
		byte(stream >> 24), byte(stream >> 16), byte(stream >> 8), byte(stream)}
	return c.Write(append(h, payload...))
}

// must fails the test on a write error: the server closed before the
// frames that the case needs were written.
func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("write: %v", err)
	}
}

// Cases is the table. Every case ends in a GOAWAY, stream errors
// (RST_STREAM) or a closed connection, as its name says.
func Cases() []Case {
	protocolError := goAway(true, http2.ErrCodeProtocol)
	cases := []Case{
		// Control: a legal request is answered on the same connection.
		{
			Name: "control: a GET is answered 200",
			Send: func(t testing.TB, c *Conn, tg *Target) { must(t, c.Request(1, "GET", tg.Host, tg.Path, true)) },
			Done: func(o *Outcome) bool { return o.Ended[1] },
			Want: func(o *Outcome) error {
				if o.Statuses[1] != "200" || o.GoAway {
					return fmt.Errorf("want 200 on stream 1")
				}
				return nil
			},
			AtInstance: 1,
		},

		// The preface (§3.4).
		{
			Name:      "bad preface (§3.4: invalid preface is a connection error PROTOCOL_ERROR; GOAWAY optional): closed, nothing passed on",
			NoPreface: true,
			Send: func(t testing.TB, c *Conn, tg *Target) {
				// The magic's first line, a wrong second one, then
				// frames a lenient server could take.
				_ = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n"))
				_ = c.Frames(func(fr *http2.Framer) error { return fr.WriteSettings() })
				_ = c.Request(1, "GET", tg.Host, tg.Path, true)
			},
			Want: func(o *Outcome) error {
				// HTTP/1 servers read the line as a request: an error
				// answer and a close is a close.
				if !o.Closed && !(o.GoAway && o.GoAwayCode == http2.ErrCodeProtocol) {
					return fmt.Errorf("want the connection closed")
				}
				if len(o.Statuses) > 0 {
					return fmt.Errorf("want no HTTP/2 response")
				}
				if o.HTTP1 != "" && !(strings.HasPrefix(o.HTTP1, "HTTP/1.1 4") || strings.HasPrefix(o.HTTP1, "HTTP/1.1 5")) {
					return fmt.Errorf("an HTTP/1 answer that is not an error: %.40q", o.HTTP1)
				}
				return nil
			},
		},
		{
			Name: "first frame not SETTINGS (§3.4: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			// The preface's magic alone, then a PING. The reader starts
			// after: it ACKs the server's SETTINGS, and an ACK that beat
			// the PING would be a SETTINGS frame first (a busy machine
			// hung here, the PING answered, waiting for a GOAWAY).
			NoPreface:     true,
			ReadAfterSend: true,
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Write([]byte(Preface)))
				must(t, c.Frames(func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{1}) }))
			},
			Want: protocolError,
		},

		// Frames on stream 0 that must not be (§6.1, §6.2, §6.4), and
		// connection frames on a stream (§6.5, §6.7).
		{
			Name: "DATA on stream 0 (§6.1: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Frames(func(fr *http2.Framer) error { return fr.WriteData(0, true, []byte("hello")) }))
			},
			Want: protocolError,
		},
		{
			Name: "HEADERS on stream 0 (§6.2: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := c.RequestBlock("GET", tg.Host, tg.Path)
				must(t, c.Frames(func(fr *http2.Framer) error {
					return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 0, BlockFragment: block, EndHeaders: true, EndStream: true})
				}))
			},
			Want: protocolError,
		},
		{
			Name: "RST_STREAM on stream 0 (§6.4: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Frames(func(fr *http2.Framer) error { return fr.WriteRSTStream(0, http2.ErrCodeCancel) }))
			},
			Want: protocolError,
		},
		{
			Name: "PING on stream 1 (§6.7: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, rawFrame(c, 8, http2.FramePing, 0, 1, make([]byte, 8)))
			},
			Want: protocolError,
		},
		{
			Name: "SETTINGS on stream 1 (§6.5: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, rawFrame(c, 0, http2.FrameSettings, 0, 1, nil))
			},
			Want: protocolError,
		},
		{
			Name: "SETTINGS of 5 bytes (§6.5: length not a multiple of 6 is FRAME_SIZE_ERROR): GOAWAY FRAME_SIZE_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, rawFrame(c, 5, http2.FrameSettings, 0, 0, make([]byte, 5)))
			},
			Want: goAway(true, http2.ErrCodeFrameSize),
		},

		// Stream states (§5.1, §5.1.1).
		{
			Name: "DATA on an idle stream (§5.1: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Frames(func(fr *http2.Framer) error { return fr.WriteData(1, true, []byte("hello")) }))
			},
			Want: protocolError,
		},
		{
			Name: "RST_STREAM on an idle stream (§5.1, §6.4: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Frames(func(fr *http2.Framer) error { return fr.WriteRSTStream(7, http2.ErrCodeCancel) }))
			},
			Want: protocolError,
		},
		{
			Name: "HEADERS on an even stream (§5.1.1: client streams are odd; PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) { _ = c.Request(2, "GET", tg.Host, tg.Path, true) },
			Want: protocolError,
		},
		{
			Name: "HEADERS on a stream lower than one opened (§5.1.1: PROTOCOL_ERROR): stream 5 answered, then GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Request(5, "GET", tg.Host, tg.Path, true))
				_ = c.Request(3, "GET", tg.Host, tg.Path, true)
			},
			Want:       protocolError,
			AtInstance: 1,
		},

		// Frame sizes and padding (§4.2, §6.1, §6.2).
		{
			Name: "HEADERS frame of 16 MiB, over SETTINGS_MAX_FRAME_SIZE (§4.2: FRAME_SIZE_ERROR, a connection error for a field block): GOAWAY FRAME_SIZE_ERROR without reading it",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				// The header says 16 MiB - 1; 4 KiB follow, and the
				// client then waits: a server reading the frame in
				// full would hang here.
				must(t, rawFrame(c, 1<<24-1, http2.FrameHeaders, http2.FlagHeadersEndHeaders, 1, make([]byte, 4<<10)))
			},
			Want: goAway(true, http2.ErrCodeFrameSize),
		},
		{
			Name: "DATA frame of 16 MiB on an open stream (§4.2: FRAME_SIZE_ERROR): GOAWAY FRAME_SIZE_ERROR (or RST_STREAM FRAME_SIZE_ERROR) without reading it",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Request(1, "POST", tg.Host, tg.Path, false))
				must(t, rawFrame(c, 1<<24-1, http2.FrameData, 0, 1, make([]byte, 4<<10)))
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Resets[1] == http2.ErrCodeFrameSize },
			Want: func(o *Outcome) error {
				if code, ok := o.Resets[1]; ok && code == http2.ErrCodeFrameSize {
					return nil
				}
				return goAway(true, http2.ErrCodeFrameSize)(o)
			},
			AtInstance: 1,
		},
		{
			Name: "DATA padded with a pad length beyond the payload (§6.1: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Request(1, "POST", tg.Host, tg.Path, false))
				// Payload: pad length 200, then 4 bytes.
				must(t, rawFrame(c, 5, http2.FrameData, http2.FlagDataPadded|http2.FlagDataEndStream, 1, []byte{200, 'a', 'b', 'c', 'd'}))
			},
			Want:       protocolError,
			AtInstance: 1,
		},
		{
			Name: "HEADERS padded with a pad length beyond the payload (§6.2: PROTOCOL_ERROR, of the stream or the connection): RST_STREAM or GOAWAY PROTOCOL_ERROR, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := c.RequestBlock("GET", tg.Host, tg.Path)
				payload := append([]byte{255}, block...)
				must(t, rawFrame(c, len(payload), http2.FrameHeaders, http2.FlagHeadersPadded|http2.FlagHeadersEndHeaders|http2.FlagHeadersEndStream, 1, payload))
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Answered(1) },
			Want: func(o *Outcome) error {
				if code, ok := o.Resets[1]; ok && code == http2.ErrCodeProtocol {
					return nil
				}
				return protocolError(o)
			},
		},

		// Field blocks cut by other frames (§6.10).
		{
			Name: "HEADERS without END_HEADERS, then a PING (§6.10: only CONTINUATION may follow; PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := c.RequestBlock("GET", tg.Host, tg.Path)
				must(t, c.Frames(func(fr *http2.Framer) error {
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true}); err != nil {
						return err
					}
					return fr.WritePing(false, [8]byte{})
				}))
			},
			Want: protocolError,
		},
		{
			Name: "HEADERS without END_HEADERS, then CONTINUATION of another stream (§6.10: PROTOCOL_ERROR): GOAWAY PROTOCOL_ERROR, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := c.RequestBlock("GET", tg.Host, tg.Path)
				must(t, c.Frames(func(fr *http2.Framer) error {
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block[:3], EndStream: true}); err != nil {
						return err
					}
					return fr.WriteContinuation(3, true, block[3:])
				}))
			},
			Want: protocolError,
		},
		{
			Name: "HEADERS without END_HEADERS, then junk (§6.10, §4.2: PROTOCOL_ERROR or FRAME_SIZE_ERROR): GOAWAY, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				block := c.RequestBlock("GET", tg.Host, tg.Path)
				must(t, c.Frames(func(fr *http2.Framer) error {
					return fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndStream: true})
				}))
				_ = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n" + strings.Repeat("\x00junk", 100)))
			},
			Want: goAway(true, http2.ErrCodeProtocol, http2.ErrCodeFrameSize),
		},
		{
			Name: "CONTINUATION flood: 64 MiB of header fields in one field block (CVE-2024-27316; §10.5.1: over the limit, 431 or a connection error): the server stops reading, GOAWAY or closed, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				start := c.RequestBlock("GET", tg.Host, tg.Path)
				field := literal("x-flood", strings.Repeat("f", 16<<10-20))
				_ = c.Frames(func(fr *http2.Framer) error {
					if err := fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: start, EndStream: true}); err != nil {
						return err
					}
					for range 64 << 20 / len(field) {
						if err := fr.WriteContinuation(1, false, field); err != nil {
							return err // the server closed: what the case wants
						}
					}
					return nil
				})
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Answered(1) },
			Want: func(o *Outcome) error {
				if _, reset := o.Resets[1]; reset || o.Statuses[1] == "431" {
					return nil
				}
				return goAway(true, http2.ErrCodeProtocol, http2.ErrCodeEnhanceYourCalm, http2.ErrCodeCompression)(o)
			},
		},

		// Floods of control frames (§10.5: a server may treat them as
		// abuse, ENHANCE_YOUR_CALM or a close).
		{
			Name: "SETTINGS flood: 200000 SETTINGS, ACKs not read, then a request (§6.5.3, §10.5: ENHANCE_YOUR_CALM allowed): the request answered 200 (ACKs may be coalesced), or GOAWAY ENHANCE_YOUR_CALM or closed; bounded memory",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				flood(c, 200000, func(fr *http2.Framer) error {
					return fr.WriteSettings(http2.Setting{ID: http2.SettingEnablePush, Val: 0})
				})
				_ = c.Request(1, "GET", tg.Host, tg.Path, true)
			},
			ReadAfterSend: true,
			Done:          func(o *Outcome) bool { return o.Over() || o.Ended[1] },
			Want:          floodAnswer(http2.ErrCodeEnhanceYourCalm),
			AtInstance:    1,
		},
		{
			Name: "PING flood: 200000 PINGs, ACKs not read, then a request (§6.7, §10.5: ENHANCE_YOUR_CALM allowed): the request answered 200, or GOAWAY ENHANCE_YOUR_CALM or closed; bounded memory",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				flood(c, 200000, func(fr *http2.Framer) error { return fr.WritePing(false, [8]byte{'p'}) })
				_ = c.Request(1, "GET", tg.Host, tg.Path, true)
			},
			ReadAfterSend: true,
			Done:          func(o *Outcome) bool { return o.Over() || o.Ended[1] },
			Want:          floodAnswer(http2.ErrCodeEnhanceYourCalm),
			AtInstance:    1,
		},
		{
			Name: "RST_STREAM flood on closed streams (§6.4, §10.5): ignored or GOAWAY ENHANCE_YOUR_CALM / closed; bounded memory, nothing passed on",
			Send: func(t testing.TB, c *Conn, tg *Target) {
				must(t, c.Request(1, "GET", tg.Host, tg.Path, true))
				if o, ok := c.Wait(Within, func(o *Outcome) bool { return o.Ended[1] }); !ok || o.Over() {
					t.Fatalf("stream 1: %s", &o)
				}
				flood(c, 200000, func(fr *http2.Framer) error { return fr.WriteRSTStream(1, http2.ErrCodeCancel) })
				// Then a request: still served when the flood was taken.
				_ = c.Request(3, "GET", tg.Host, tg.Path, true)
			},
			Done: func(o *Outcome) bool { return o.Over() || o.Ended[3] },
			// Stream 3 is the request after the flood.
			Want: func(o *Outcome) error {
				return floodAnswer(http2.ErrCodeEnhanceYourCalm)(o)
			},
			AtInstance: 2,
		},
	}
	return append(append(cases, resetCases()...), hpackCases()...)
}

// flood writes frame n times, stopping at the first write error (the
// server closed, which is an answer).
func flood(c *Conn, n int, frame func(fr *http2.Framer) error) {
	_ = c.Frames(func(fr *http2.Framer) error {
		for range n {
			if err := frame(fr); err != nil {
				return err
			}
		}
		return nil
	})
}

// floodAnswer takes what a flood may get: the request after it (the
// connection's last stream) answered 200, or the connection ended with a
// GOAWAY code or a close.
func floodAnswer(code http2.ErrCode) func(o *Outcome) error {
	return func(o *Outcome) error {
		var last uint32
		for id := range o.Statuses {
			last = max(last, id)
		}
		switch {
		case o.GoAway && o.GoAwayCode != code:
			return fmt.Errorf("GOAWAY %v, want %v", o.GoAwayCode, code)
		case o.ReadErr != nil:
			return fmt.Errorf("a frame the client could not read: %v", o.ReadErr)
		case o.Over():
			return nil
		case last == 0 || o.Statuses[last] != "200" || !o.Ended[last]:
			return fmt.Errorf("the request after the flood was not answered 200")
		}
		return nil
	}
}
