package h2relay

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// peer writes frames as a peer would and feeds them, read back by a
// Framer set up as the relay's loop sets one up, to a Conn.
type peer struct {
	t    testing.TB
	c    *Conn
	now  time.Time
	buf  bytes.Buffer
	w, r *http2.Framer
	hbuf bytes.Buffer
	enc  *hpack.Encoder
}

func newPeer(t testing.TB, cfg Config) *peer {
	t.Helper()
	p := &peer{t: t, now: time.Unix(1000, 0)}
	c, err := NewConn(cfg, p.now)
	if err != nil {
		t.Fatal(err)
	}
	p.c = c
	p.w = http2.NewFramer(&p.buf, nil)
	p.r = http2.NewFramer(nil, &p.buf)
	p.r.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	p.r.MaxHeaderListSize = c.cfg.MaxHeaderListSize
	p.r.SetMaxReadFrameSize(c.cfg.MaxFrameSize)
	p.enc = hpack.NewEncoder(&p.hbuf)
	return p
}

// started is a peer past the preface, with this side's first actions
// taken.
func started(t testing.TB, cfg Config) *peer {
	p := newPeer(t, cfg)
	p.c.Actions()
	acts := p.send(func(w *http2.Framer) { w.WriteSettings() })
	if len(acts) != 1 || acts[0].Kind != WriteSettingsAck {
		t.Fatalf("preface: %v", acts)
	}
	return p
}

// send writes frames with write and steps the connection through them.
func (p *peer) send(write func(w *http2.Framer)) []Action {
	p.t.Helper()
	write(p.w)
	for p.buf.Len() > 0 {
		f, err := p.r.ReadFrame()
		if err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			p.c.ReadError(p.now, err)
			if p.c.Closed() {
				break
			}
			continue
		}
		p.c.Step(p.now, f)
	}
	return p.c.Actions()
}

// block encodes a header block.
func (p *peer) block(kv ...string) []byte {
	p.hbuf.Reset()
	for i := 0; i+1 < len(kv); i += 2 {
		p.enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
	}
	return bytes.Clone(p.hbuf.Bytes())
}

var get = []string{":method", "GET", ":scheme", "http", ":path", "/", ":authority", "x"}
var post = []string{":method", "POST", ":scheme", "http", ":path", "/", ":authority", "x"}

func (p *peer) headers(id uint32, end bool, kv ...string) func(*http2.Framer) {
	return func(w *http2.Framer) {
		w.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: p.block(kv...), EndHeaders: true, EndStream: end})
	}
}

// describe renders actions for failure messages and comparisons.
func describe(acts []Action) string {
	var b strings.Builder
	for _, a := range acts {
		switch a.Kind {
		case WriteRST:
			fmt.Fprintf(&b, "RST(%d,%v) ", a.Stream, a.Code)
		case WriteGoAway:
			fmt.Fprintf(&b, "GOAWAY(%d,%v) ", a.Stream, a.Code)
		case CloseConn:
			fmt.Fprintf(&b, "CLOSE(%v) ", a.Code)
		case WriteWindowUpdate:
			fmt.Fprintf(&b, "WU(%d,%d) ", a.Stream, a.N)
		case DeliverHeaders:
			fmt.Fprintf(&b, "headers(%d,end=%v) ", a.Stream, a.End)
		case DeliverData:
			fmt.Fprintf(&b, "data(%d,%d,end=%v) ", a.Stream, len(a.Data), a.End)
		case DeliverReset:
			fmt.Fprintf(&b, "reset(%d,%v) ", a.Stream, a.Code)
		case DeliverCredit:
			fmt.Fprintf(&b, "credit(%d) ", a.Stream)
		case WritePing:
			fmt.Fprintf(&b, "PING(ack=%v) ", a.Ack)
		case WriteSettingsAck:
			b.WriteString("SETTINGS-ACK ")
		case WriteHeaders:
			fmt.Fprintf(&b, "HEADERS(%d,end=%v) ", a.Stream, a.End)
		case WriteData:
			fmt.Fprintf(&b, "DATA(%d,%d,end=%v) ", a.Stream, len(a.Data), a.End)
		case PeerGoAway:
			fmt.Fprintf(&b, "peer-goaway(%d) ", a.Stream)
		default:
			fmt.Fprintf(&b, "kind%d ", a.Kind)
		}
	}
	return strings.TrimSpace(b.String())
}

func expect(t *testing.T, what string, acts []Action, want string) {
	t.Helper()
	if got := describe(acts); got != want {
		t.Fatalf("%s:\n got  %s\n want %s", what, got, want)
	}
}

func TestConnConfigValidated(t *testing.T) {
	for _, cfg := range []Config{
		{StreamWindow: 1 << 31},
		{ConnWindow: 100},
		{MaxFrameSize: 1 << 24},
		{IdleTimeout: -1},
		{Role: 7},
	} {
		if _, err := NewConn(cfg, time.Now()); err == nil {
			t.Errorf("%+v accepted", cfg)
		}
	}
	p := newPeer(t, Config{})
	acts := p.c.Actions()
	if len(acts) != 2 || acts[0].Kind != WriteSettings || acts[1].Kind != WriteWindowUpdate || acts[1].N != 4<<20-65535 {
		t.Fatalf("first actions: %v", describe(acts))
	}
}

// The whole life of one request and its answer, as a server.
func TestConnServerExchange(t *testing.T) {
	p := started(t, Config{StreamWindow: 65535, ConnWindow: 65535})
	expect(t, "GET", p.send(p.headers(1, true, get...)), "headers(1,end=true)")
	if err := p.c.SendHeaders(p.now, 1, []hpack.HeaderField{{Name: ":status", Value: "200"}}, false, false); err != nil {
		t.Fatal(err)
	}
	if err := p.c.SendData(p.now, 1, []byte("hello"), true); err != nil {
		t.Fatal(err)
	}
	expect(t, "answer", p.c.Actions(), "HEADERS(1,end=false) DATA(1,5,end=true)")
	if p.c.Streams() != 0 {
		t.Fatal("the stream outlived its exchange")
	}
	// A POST with a body and trailers.
	expect(t, "POST", p.send(func(w *http2.Framer) {
		p.headers(3, false, post...)(w)
		w.WriteData(3, false, []byte("abc"))
		p.headers(3, true, "grpc-status", "0")(w)
	}), "headers(3,end=false) data(3,3,end=false) headers(3,end=true)")
	// Trailers that do not end the stream.
	expect(t, "trailers without END_STREAM", p.send(func(w *http2.Framer) {
		p.headers(5, false, post...)(w)
		p.headers(5, false, "x", "y")(w)
	}), "headers(5,end=false) RST(5,PROTOCOL_ERROR) reset(5,PROTOCOL_ERROR)")
}

// Flow control both ways: the peer may not send past this side's windows,
// credit returns only as the relay passes data on, and this side sends
// only within the peer's windows.
func TestConnFlowControl(t *testing.T) {
	p := started(t, Config{StreamWindow: 65535, ConnWindow: 1 << 20})
	p.send(p.headers(1, false, post...))
	full := make([]byte, 16384)
	acts := p.send(func(w *http2.Framer) {
		for range 3 {
			w.WriteData(1, false, full)
		}
		w.WriteData(1, false, full[:16383])
	})
	if len(acts) != 4 || p.c.streams[1].recv != 0 {
		t.Fatalf("a full window: %s, %d left", describe(acts), p.c.streams[1].recv)
	}
	expect(t, "one byte past the stream's window", p.send(func(w *http2.Framer) { w.WriteData(1, false, []byte{1}) }),
		"RST(1,FLOW_CONTROL_ERROR) reset(1,FLOW_CONTROL_ERROR)")

	// Credit comes back as the relay passes data on, half a window at a
	// time.
	p.send(p.headers(3, false, post...))
	p.send(func(w *http2.Framer) { w.WriteData(3, false, full) })
	p.c.Consumed(p.now, 3, 16384)
	expect(t, "a quarter consumed", p.c.Actions(), "")
	p.send(func(w *http2.Framer) { w.WriteData(3, false, full) })
	p.c.Consumed(p.now, 3, 16384)
	expect(t, "half consumed", p.c.Actions(), "WU(3,32768)")

	// This side's sending: within the peer's windows only.
	p.c.Actions()
	p.send(func(w *http2.Framer) { w.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 10}) })
	p.c.SendHeaders(p.now, 3, []hpack.HeaderField{{Name: ":status", Value: "200"}}, false, false)
	if n := p.c.SendWindow(3); n != 10 {
		t.Fatalf("send window %d, want 10", n)
	}
	if err := p.c.SendData(p.now, 3, make([]byte, 11), false); err == nil {
		t.Fatal("sent past the peer's window")
	}
	p.c.SendData(p.now, 3, make([]byte, 10), false)
	if p.c.SendWindow(3) != 0 {
		t.Fatal("window not spent")
	}
	p.c.Actions()
	expect(t, "the peer's credit", p.send(func(w *http2.Framer) { w.WriteWindowUpdate(3, 100) }), "credit(3)")
	if p.c.SendWindow(3) != 100 {
		t.Fatalf("send window %d after credit", p.c.SendWindow(3))
	}
}

// The hostile cases of test/rawh2, against the state machine: each ends
// as RFC 9113 (and the CVEs' mitigations) ask.
func TestConnHostile(t *testing.T) {
	big := make([]byte, 16384)
	for _, tc := range []struct {
		name string
		cfg  Config
		send func(p *peer) func(*http2.Framer)
		want string // the end of the actions
	}{
		{"bad preface: HEADERS first", Config{}, func(p *peer) func(*http2.Framer) { return p.headers(1, true, get...) },
			"GOAWAY(0,PROTOCOL_ERROR) CLOSE(PROTOCOL_ERROR)"},
		{"DATA on an idle stream", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) { w.WriteData(9, false, []byte("x")) }
		}, "GOAWAY(0,PROTOCOL_ERROR) CLOSE(PROTOCOL_ERROR)"},
		{"even stream from a client", Config{}, func(p *peer) func(*http2.Framer) { return p.headers(2, true, get...) },
			"GOAWAY(0,PROTOCOL_ERROR) CLOSE(PROTOCOL_ERROR)"},
		{"DATA on a closed stream", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				p.headers(1, false, post...)(w)
				w.WriteRSTStream(1, http2.ErrCodeCancel)
				w.WriteData(1, false, []byte("late"))
			}
		}, "RST(1,STREAM_CLOSED)"},
		{"HEADERS reusing an old stream ID (§5.1.1: PROTOCOL_ERROR)", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				p.headers(5, true, get...)(w)
				p.headers(3, true, get...)(w)
			}
		}, "headers(5,end=true) GOAWAY(5,PROTOCOL_ERROR) reset(5,PROTOCOL_ERROR) CLOSE(PROTOCOL_ERROR)"},
		{"RST on an idle stream", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) { w.WriteRSTStream(7, http2.ErrCodeCancel) }
		}, "GOAWAY(0,PROTOCOL_ERROR) CLOSE(PROTOCOL_ERROR)"},
		{"stream limit", Config{MaxConcurrentStreams: 2}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				for id := uint32(1); id <= 5; id += 2 {
					p.headers(id, false, post...)(w)
				}
			}
		}, "headers(1,end=false) headers(3,end=false) RST(5,REFUSED_STREAM)"},
		{"rapid reset: the 11th reset in a second", Config{MaxResetsPerSecond: 10}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				for id := uint32(1); id <= 23; id += 2 {
					p.headers(id, false, post...)(w)
					w.WriteRSTStream(id, http2.ErrCodeCancel)
				}
			}
		}, "GOAWAY(21,ENHANCE_YOUR_CALM) reset(21,ENHANCE_YOUR_CALM) CLOSE(ENHANCE_YOUR_CALM)"},
		{"PING flood", Config{MaxControlPerSecond: 5}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				for range 10 {
					w.WritePing(false, [8]byte{1})
				}
			}
		}, "PING(ack=true) PING(ack=true) PING(ack=true) PING(ack=true) GOAWAY(0,ENHANCE_YOUR_CALM) CLOSE(ENHANCE_YOUR_CALM)"},
		{"SETTINGS flood", Config{MaxControlPerSecond: 3}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				for range 10 {
					w.WriteSettings()
				}
			}
		}, "SETTINGS-ACK SETTINGS-ACK GOAWAY(0,ENHANCE_YOUR_CALM) CLOSE(ENHANCE_YOUR_CALM)"},
		{"WINDOW_UPDATE flood", Config{MaxControlPerSecond: 3}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				for range 10 {
					w.WriteWindowUpdate(0, 1)
				}
			}
		}, "credit(0) credit(0) GOAWAY(0,ENHANCE_YOUR_CALM) CLOSE(ENHANCE_YOUR_CALM)"},
		{"empty DATA flood", Config{MaxControlPerSecond: 3}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				p.headers(1, false, post...)(w)
				for range 10 {
					w.WriteData(1, false, nil)
				}
			}
		}, "data(1,0,end=false) data(1,0,end=false) GOAWAY(1,ENHANCE_YOUR_CALM) reset(1,ENHANCE_YOUR_CALM) CLOSE(ENHANCE_YOUR_CALM)"},
		{"connection window overflow", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) { w.WriteWindowUpdate(0, 1<<31-1) }
		}, "GOAWAY(0,FLOW_CONTROL_ERROR) CLOSE(FLOW_CONTROL_ERROR)"},
		{"stream window overflow", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				p.headers(1, false, post...)(w)
				w.WriteWindowUpdate(1, 1<<31-1)
			}
		}, "headers(1,end=false) RST(1,FLOW_CONTROL_ERROR) reset(1,FLOW_CONTROL_ERROR)"},
		{"SETTINGS window overflow", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				p.headers(1, false, post...)(w)
				w.WriteWindowUpdate(1, 1<<31-1-65535)
				w.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 70000})
			}
		}, "GOAWAY(1,FLOW_CONTROL_ERROR) reset(1,FLOW_CONTROL_ERROR) CLOSE(FLOW_CONTROL_ERROR)"},
		{"connection window exceeded", Config{StreamWindow: 1 << 20, ConnWindow: 65535}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				p.headers(1, false, post...)(w)
				for range 5 {
					w.WriteData(1, false, big)
				}
			}
		}, "GOAWAY(1,FLOW_CONTROL_ERROR) reset(1,FLOW_CONTROL_ERROR) CLOSE(FLOW_CONTROL_ERROR)"},
		{"PUSH_PROMISE", Config{}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				p.headers(1, false, post...)(w)
				w.WritePushPromise(http2.PushPromiseParam{StreamID: 1, PromiseID: 2, BlockFragment: p.block(get...), EndHeaders: true})
			}
		}, "GOAWAY(1,PROTOCOL_ERROR) reset(1,PROTOCOL_ERROR) CLOSE(PROTOCOL_ERROR)"},
		{"CONTINUATION flood", Config{MaxHeaderListSize: 4096}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				w.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: p.block(get...), EndHeaders: false})
				chunk := p.block("x-pad", strings.Repeat("a", 1000))
				for range 100 {
					w.WriteContinuation(1, false, chunk)
				}
			}
		}, "CLOSE"},
		{"HPACK bomb", Config{MaxHeaderListSize: 16 << 10}, func(p *peer) func(*http2.Framer) {
			return func(w *http2.Framer) {
				// One big entry in the dynamic table, then many references
				// to it: a small block that decodes huge.
				p.hbuf.Reset()
				p.enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("b", 3000)})
				first := bytes.Clone(p.hbuf.Bytes())
				w.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: append(p.block(get...), first...), EndHeaders: true})
				p.hbuf.Reset()
				for range 200 {
					p.enc.WriteField(hpack.HeaderField{Name: "x-bomb", Value: strings.Repeat("b", 3000)})
				}
				w.WriteHeaders(http2.HeadersFrameParam{StreamID: 3, BlockFragment: bytes.Clone(p.hbuf.Bytes()), EndHeaders: true, EndStream: true})
			}
		}, "RST(3,"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPeer(t, tc.cfg)
			p.c.Actions()
			var acts []Action
			if !strings.HasPrefix(tc.name, "bad preface") {
				acts = p.send(func(w *http2.Framer) { w.WriteSettings() })
			}
			acts = append(acts, p.send(tc.send(p))...)
			got := describe(acts)
			if !strings.HasSuffix(got, tc.want) && !(strings.HasSuffix(tc.want, ",") && strings.Contains(got, tc.want)) &&
				!(tc.want == "CLOSE" && p.c.Closed()) {
				t.Fatalf("got  %s\nwant ... %s", got, tc.want)
			}
			if p.c.Closed() && p.c.Streams() != 0 {
				t.Fatal("a closed connection keeps streams")
			}
		})
	}
}

// Draining: GOAWAY with the last stream, new streams refused, the
// connection closes when the last stream ends. A peer's GOAWAY (as a
// client): streams it did not process come back as refused, for the relay
// to send elsewhere, and no new stream opens.
func TestConnGoAway(t *testing.T) {
	p := started(t, Config{})
	p.send(p.headers(1, true, get...))
	p.c.Drain(p.now)
	expect(t, "drain", p.c.Actions(), "GOAWAY(1,NO_ERROR)")
	expect(t, "a stream after the GOAWAY", p.send(p.headers(3, true, get...)), "RST(3,REFUSED_STREAM)")
	p.c.SendHeaders(p.now, 1, []hpack.HeaderField{{Name: ":status", Value: "204"}}, true, false)
	expect(t, "the last answer", p.c.Actions(), "HEADERS(1,end=true) CLOSE(NO_ERROR)")

	cl := newPeer(t, Config{Role: Client})
	cl.c.Actions()
	cl.send(func(w *http2.Framer) { w.WriteSettings() })
	var ids []uint32
	for range 3 {
		id, err := cl.c.Open(cl.now, nil, true)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	if ids[0] != 1 || ids[2] != 5 {
		t.Fatalf("stream IDs %v", ids)
	}
	cl.c.Actions()
	expect(t, "the peer's GOAWAY", cl.send(func(w *http2.Framer) { w.WriteGoAway(1, http2.ErrCodeNo, nil) }),
		"peer-goaway(1) reset(3,REFUSED_STREAM) reset(5,REFUSED_STREAM)")
	if _, err := cl.c.Open(cl.now, nil, true); !errors.Is(err, ErrRefused) {
		t.Fatalf("Open after GOAWAY: %v", err)
	}
	expect(t, "stream 1 answered", cl.send(cl.headers(1, true, ":status", "200")), "headers(1,end=true) CLOSE(NO_ERROR)")
}

// The clocks: stream deadlines cancel both ways, SETTINGS must come and be
// acknowledged, a PING must be answered, an idle connection goes away.
func TestConnTimers(t *testing.T) {
	p := started(t, Config{IdleTimeout: time.Minute})
	p.send(p.headers(1, false, post...))
	p.c.SetDeadline(1, p.now.Add(time.Second))
	p.c.Tick(p.now.Add(999 * time.Millisecond))
	expect(t, "before the deadline", p.c.Actions(), "")
	p.now = p.now.Add(time.Second)
	p.c.Tick(p.now)
	expect(t, "the deadline", p.c.Actions(), "RST(1,CANCEL) reset(1,CANCEL)")
	// SETTINGS acknowledged: no timeout.
	p.send(func(w *http2.Framer) { w.WriteSettingsAck() })
	p.c.Tick(p.now.Add(59 * time.Second))
	expect(t, "idle, not long enough", p.c.Actions(), "")
	p.c.Tick(p.now.Add(61 * time.Second))
	expect(t, "idle", p.c.Actions(), "GOAWAY(1,NO_ERROR) CLOSE(NO_ERROR)")

	q := started(t, Config{})
	q.c.Tick(q.now.Add(11 * time.Second))
	expect(t, "SETTINGS never acknowledged", q.c.Actions(), "GOAWAY(0,SETTINGS_TIMEOUT) CLOSE(SETTINGS_TIMEOUT)")

	r := started(t, Config{})
	r.send(func(w *http2.Framer) { w.WriteSettingsAck() })
	r.c.Ping(r.now, [8]byte{7})
	r.c.Actions()
	r.send(func(w *http2.Framer) { w.WritePing(true, [8]byte{7}) })
	r.c.Tick(r.now.Add(time.Minute))
	expect(t, "PING answered", r.c.Actions(), "")
	r.c.Ping(r.now, [8]byte{8})
	r.c.Actions()
	r.c.Tick(r.now.Add(16 * time.Second))
	expect(t, "PING not answered", r.c.Actions(), "GOAWAY(0,NO_ERROR) CLOSE(NO_ERROR)")
}

// Any bytes after the preface: the connection never panics, its windows
// stay within the protocol's range, it keeps no more streams than allowed,
// and once closed it does nothing more.
func FuzzConn(f *testing.F) {
	seed := func(write func(p *peer, w *http2.Framer)) {
		p := newPeer(f, Config{})
		write(p, p.w)
		f.Add(p.buf.Bytes())
	}
	seed(func(p *peer, w *http2.Framer) { p.headers(1, true, get...)(w) })
	seed(func(p *peer, w *http2.Framer) {
		p.headers(1, false, post...)(w)
		w.WriteData(1, false, []byte("abc"))
		w.WriteWindowUpdate(1, 100)
		w.WriteRSTStream(1, http2.ErrCodeCancel)
	})
	seed(func(p *peer, w *http2.Framer) {
		w.WritePing(false, [8]byte{})
		w.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: 1 << 20})
		w.WriteGoAway(0, http2.ErrCodeNo, nil)
	})
	f.Fuzz(func(t *testing.T, data []byte) {
		p := newPeer(t, Config{MaxConcurrentStreams: 8, StreamWindow: 65535, ConnWindow: 65535})
		p.c.Actions()
		p.send(func(w *http2.Framer) { w.WriteSettings() })
		p.buf.Write(data)
		for steps := 0; p.buf.Len() > 0 && steps < 1000; steps++ {
			fr, err := p.r.ReadFrame()
			if err != nil {
				if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
					break
				}
				p.c.ReadError(p.now, err)
			} else {
				p.c.Step(p.now, fr)
			}
			p.c.Actions()
			for _, s := range p.c.streams {
				if s.send > maxWindow || s.recv < 0 || s.recv > maxWindow {
					t.Fatalf("stream %d windows send %d recv %d", s.id, s.send, s.recv)
				}
			}
			if p.c.sendConn > maxWindow || p.c.recvConn < 0 || p.c.recvConn > maxWindow {
				t.Fatalf("connection windows send %d recv %d", p.c.sendConn, p.c.recvConn)
			}
			if p.c.peerOpen > 8 || uint32(len(p.c.streams)) > 8 {
				t.Fatalf("%d streams open", len(p.c.streams))
			}
			if p.c.Closed() {
				p.c.Step(p.now, fr)
				p.c.Tick(p.now.Add(time.Hour))
				if more := p.c.Actions(); len(more) > 0 {
					t.Fatalf("a closed connection acted: %s", describe(more))
				}
				return
			}
			if err != nil {
				// A read error the Framer cannot recover from ends the feed.
				var se http2.StreamError
				if !errors.As(err, &se) {
					return
				}
			}
		}
	})
}
