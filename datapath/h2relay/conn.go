package h2relay

import (
	"errors"
	"fmt"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Role is which end of the connection the relay is.
type Role uint8

const (
	// Server: the relay accepted the connection (a client's to the
	// gateway, the gateway's to a sidecar); the peer opens odd streams.
	Server Role = iota
	// Client: the relay dialled it (the gateway to a sidecar, a sidecar
	// to an h2c app); it opens odd streams itself.
	Client
)

// Config sets a connection's limits. Zero fields take the defaults in
// brackets; NewConn refuses values outside the protocol's ranges.
type Config struct {
	Role Role
	// MaxConcurrentStreams the peer may open at once [250]; beyond it a
	// new stream is refused (RST_STREAM REFUSED_STREAM).
	MaxConcurrentStreams uint32
	// StreamWindow and ConnWindow are this side's receive windows [1 MiB
	// and 4 MiB]: what the peer may send before the relay has passed it
	// on. They bound what a connection can make the relay buffer.
	StreamWindow, ConnWindow uint32
	// MaxFrameSize this side accepts [16 KiB, the protocol's default].
	MaxFrameSize uint32
	// MaxHeaderListSize advertised [1 MiB]; the Framer enforces it while
	// it decodes (HPACK bombs, CONTINUATION floods).
	MaxHeaderListSize uint32
	// IdleTimeout closes a connection with no stream for that long [none].
	IdleTimeout time.Duration
	// SettingsTimeout bounds the wait for the peer's first SETTINGS and
	// for its acknowledgement of this side's [10 s].
	SettingsTimeout time.Duration
	// PingTimeout bounds the wait for the answer to this side's PING
	// [15 s].
	PingTimeout time.Duration
	// MaxControlPerSecond is how many SETTINGS, PING, WINDOW_UPDATE,
	// PRIORITY and empty DATA frames a peer may send a second before the
	// connection is closed with ENHANCE_YOUR_CALM [1000].
	MaxControlPerSecond int
	// MaxResetsPerSecond is how many streams a peer may reset a second
	// (CVE-2023-44487, rapid reset) [200].
	MaxResetsPerSecond int
	// CreditConnOnReceipt returns the connection window's credit for
	// DATA as it arrives (Consumed then returns the stream's only): a
	// connection whose streams go to many readers (a relay's pooled
	// upstream) is not held back as a whole by one slow reader, whose
	// own stream window still bounds what the relay holds for it.
	CreditConnOnReceipt bool
	// PrematureResetStreams, when set, closes the connection
	// (ENHANCE_YOUR_CALM) once the peer opened at least that many
	// streams and reset at least half of them within
	// PrematureResetLifetime [1 s] of their start: Envoy's
	// overload.premature_reset rule, which bounds rapid reset by streams
	// whatever the attacker's pace, where MaxResetsPerSecond bounds it
	// by time.
	PrematureResetStreams  int
	PrematureResetLifetime time.Duration
}

func (c *Config) setDefaults() {
	def := func(p *uint32, v uint32) {
		if *p == 0 {
			*p = v
		}
	}
	def(&c.MaxConcurrentStreams, 250)
	def(&c.StreamWindow, 1<<20)
	def(&c.ConnWindow, 4<<20)
	def(&c.MaxFrameSize, 16<<10)
	def(&c.MaxHeaderListSize, 1<<20)
	if c.SettingsTimeout == 0 {
		c.SettingsTimeout = 10 * time.Second
	}
	if c.PingTimeout == 0 {
		c.PingTimeout = 15 * time.Second
	}
	if c.MaxControlPerSecond == 0 {
		c.MaxControlPerSecond = 1000
	}
	if c.MaxResetsPerSecond == 0 {
		c.MaxResetsPerSecond = 200
	}
	if c.PrematureResetLifetime == 0 {
		c.PrematureResetLifetime = time.Second
	}
}

func (c *Config) validate() error {
	var errs []error
	if c.Role != Server && c.Role != Client {
		errs = append(errs, fmt.Errorf("role %d: want Server or Client", c.Role))
	}
	if c.StreamWindow > maxWindow || c.ConnWindow > maxWindow {
		errs = append(errs, fmt.Errorf("windows %d and %d: at most 2^31-1", c.StreamWindow, c.ConnWindow))
	}
	if c.StreamWindow < minWindow || c.ConnWindow < minWindow {
		errs = append(errs, fmt.Errorf("windows %d and %d: at least %d", c.StreamWindow, c.ConnWindow, minWindow))
	}
	if c.MaxFrameSize < 1<<14 || c.MaxFrameSize > 1<<24-1 {
		errs = append(errs, fmt.Errorf("max frame size %d: want 2^14 to 2^24-1", c.MaxFrameSize))
	}
	if c.IdleTimeout < 0 || c.SettingsTimeout < 0 || c.PingTimeout < 0 {
		errs = append(errs, errors.New("timeouts must not be negative"))
	}
	if c.MaxControlPerSecond < 0 || c.MaxResetsPerSecond < 0 || c.PrematureResetStreams < 0 || c.PrematureResetLifetime < 0 {
		errs = append(errs, errors.New("flood limits must not be negative"))
	}
	return errors.Join(errs...)
}

const (
	maxWindow     = 1<<31 - 1
	minWindow     = 65535 // the protocol's initial window
	initialWindow = 65535
)

// ActionKind says what an Action asks of the relay.
type ActionKind uint8

const (
	// Frames to write to the peer, in order.
	WriteSettings     ActionKind = iota // Settings
	WriteSettingsAck                    //
	WritePing                           // Ping (Ack: the answer to the peer's)
	WriteWindowUpdate                   // Stream (0: the connection), N
	WriteRST                            // Stream, Code
	WriteGoAway                         // Stream (the last one processed), Code
	WriteHeaders                        // Stream, Fields, End: encode with this connection's HPACK encoder
	WriteData                           // Stream, Data, End
	// Events for the relay.
	DeliverHeaders // Stream, Fields, End, Informational: a head or trailers from the peer
	DeliverData    // Stream, Data (valid until the next frame is read), End
	DeliverReset   // Stream, Code: the stream ended abnormally; cancel its other side
	DeliverCredit  // Stream (0: the connection): more may be sent (SendWindow)
	PeerSettings   // HeaderTableSize: the peer's HPACK table size, for the encoder
	PeerMaxFrame   // N: the largest frame the peer accepts, for the writer
	PeerGoAway     // Stream (the peer's last processed), Code: open no more streams
	// CloseConn: close the connection once the writes before it are out.
	CloseConn // Code
)

// Action is one thing the relay must do, in the order given.
type Action struct {
	Kind            ActionKind
	Stream          uint32
	Code            http2.ErrCode
	N               uint32
	End, Ack        bool
	Informational   bool
	Data            []byte
	Fields          []hpack.HeaderField
	Ping            [8]byte
	Settings        []http2.Setting
	HeaderTableSize uint32
}

// stream is what the connection keeps of one stream.
type stream struct {
	id    uint32
	state StreamState
	// send is what the peer lets this side send (its window); recv what
	// this side has left the peer, and unacked what the relay passed on
	// but has not been returned yet by a WINDOW_UPDATE.
	send          int64
	recv, unacked int64
	deadline      time.Time
	peerInitiated bool
	resetByPeerAt time.Time
	openedAt      time.Time // a peer's stream's start (premature resets)
}

// Conn is one HTTP/2 connection's protocol state, as a pure state machine
// in the style of etcd's raft: no I/O, no clock, no goroutine. The relay's
// connection loop reads frames with an http2.Framer (ReadMetaHeaders set,
// MaxHeaderListSize from Config) and feeds them to Step, reports read
// errors to ReadError, turns its own decisions into calls (Open,
// SendHeaders, SendData, Consumed, Reset, Drain, SetDeadline), calls Tick
// as time passes, and after each call carries out Actions in order:
// writes (coalesced into one system call per turn), and deliveries to the
// stream's other side.
//
// What it guarantees: every frame is checked against the stream state
// machine (Next) and the connection rules (preface, stream IDs, concurrency,
// SETTINGS, flow control on both levels with overflow checks), and every
// violation becomes the RST_STREAM or GOAWAY RFC 9113 asks for; what the
// peer may make the relay hold is bounded by the receive windows (credit
// goes back only through Consumed, once the bytes were passed on), the
// stream count by MaxConcurrentStreams, and control-frame and reset floods
// close the connection with ENHANCE_YOUR_CALM. It is not safe for
// concurrent use: it belongs to its connection's loop.
type Conn struct {
	cfg     Config
	streams map[uint32]*stream
	actions []Action
	spare   []Action // the other buffer of Actions
	// standIn is what lookup returns for a stream not open (it is never
	// kept): a frame for an unknown stream allocates nothing.
	standIn stream

	// lastPeer and lastLocal are the highest stream IDs each side opened;
	// a stream at or below them that is not in streams is closed.
	lastPeer, lastLocal uint32
	peerOpen            uint32 // streams the peer opened that are not closed

	// The peer's settings.
	peerInitialWindow int64
	peerMaxFrame      uint32
	peerMaxConcurrent uint32
	localOpen         uint32
	sendConn          int64 // the peer's connection window
	recvConn, unacked int64 // this side's connection window left, and credit not yet returned
	gotPeerSettings   bool
	settingsSentAt    time.Time
	settingsUnacked   bool
	pingSentAt        time.Time
	pingOutstanding   bool
	ping              [8]byte
	lastBusy          time.Time // when the last stream closed (or the connection began)

	goAwaySent, goAwayRecv bool
	peerLast               uint32 // from the peer's GOAWAY
	closed                 bool

	// Flood accounting: counts within the current second.
	floodSecond              time.Time
	controlCount, resetCount int
	// Premature resets: the peer's streams, and those it reset early.
	peerStreams, premature int
}

// NewConn starts a connection's state at now; its first Actions are this
// side's SETTINGS and the connection window's increase.
func NewConn(cfg Config, now time.Time) (*Conn, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, fmt.Errorf("h2relay: connection config: %w", err)
	}
	c := &Conn{
		cfg: cfg, streams: map[uint32]*stream{},
		peerInitialWindow: initialWindow, peerMaxFrame: 16 << 10, peerMaxConcurrent: ^uint32(0),
		sendConn: initialWindow, recvConn: int64(cfg.ConnWindow),
		settingsSentAt: now, settingsUnacked: true, lastBusy: now, floodSecond: now,
	}
	c.emit(Action{Kind: WriteSettings, Settings: []http2.Setting{
		{ID: http2.SettingEnablePush, Val: 0},
		{ID: http2.SettingMaxConcurrentStreams, Val: cfg.MaxConcurrentStreams},
		{ID: http2.SettingInitialWindowSize, Val: cfg.StreamWindow},
		{ID: http2.SettingMaxFrameSize, Val: cfg.MaxFrameSize},
		{ID: http2.SettingMaxHeaderListSize, Val: cfg.MaxHeaderListSize},
	}})
	if cfg.ConnWindow > initialWindow {
		c.emit(Action{Kind: WriteWindowUpdate, N: cfg.ConnWindow - initialWindow})
	}
	return c, nil
}

// Actions returns what the relay must do, in order, and forgets it. The
// returned slice is valid until the next call of Actions (what calls on c
// emit meanwhile goes into a second buffer: the two alternate, so a
// connection's turns allocate no actions); the slices in the actions
// until the next call on c (Data until the next frame is read).
func (c *Conn) Actions() []Action {
	a := c.actions
	c.actions = c.spare[:0]
	c.spare = a
	if cap(a) > 64 {
		c.spare = nil // do not keep a flood's worth of room
	}
	return a
}

// Closed reports whether the connection is over (a CloseConn was emitted).
func (c *Conn) Closed() bool { return c.closed }

// Streams is the number of streams not closed.
func (c *Conn) Streams() int { return len(c.streams) }

// StreamOpen reports whether stream id is open (in any state but idle and
// closed).
func (c *Conn) StreamOpen(id uint32) bool { _, ok := c.streams[id]; return ok }

func (c *Conn) emit(a Action) { c.actions = append(c.actions, a) }

// connError ends the connection: GOAWAY with code, then close.
func (c *Conn) connError(code http2.ErrCode) {
	if c.closed {
		return
	}
	c.emit(Action{Kind: WriteGoAway, Stream: c.lastPeer, Code: code})
	c.goAwaySent = true
	for id := range c.streams {
		c.emit(Action{Kind: DeliverReset, Stream: id, Code: code})
	}
	clear(c.streams)
	c.peerOpen, c.localOpen = 0, 0
	c.emit(Action{Kind: CloseConn, Code: code})
	c.closed = true
}

// streamError resets stream id (known or not) with code.
func (c *Conn) streamError(id uint32, code http2.ErrCode) {
	c.emit(Action{Kind: WriteRST, Stream: id, Code: code})
	if s := c.streams[id]; s != nil {
		c.emit(Action{Kind: DeliverReset, Stream: id, Code: code})
		c.forget(s)
	}
}

// forget drops a closed stream; its ID stays closed (at or below lastPeer
// or lastLocal).
func (c *Conn) forget(s *stream) {
	if _, ok := c.streams[s.id]; !ok {
		return
	}
	delete(c.streams, s.id)
	if s.peerInitiated {
		c.peerOpen--
	} else {
		c.localOpen--
	}
}

// peerOpens reports whether id is a stream the peer would initiate.
func (c *Conn) peerOpens(id uint32) bool {
	odd := id%2 == 1
	return c.cfg.Role == Server && odd || c.cfg.Role == Client && !odd
}

// lookup returns the stream id, or a stand-in in the state an unknown ID
// is in: idle above the opener's last ID, closed at or below it.
func (c *Conn) lookup(id uint32) (*stream, bool) {
	if s := c.streams[id]; s != nil {
		return s, true
	}
	last := c.lastLocal
	if c.peerOpens(id) {
		last = c.lastPeer
	}
	c.standIn = stream{id: id, state: StreamState{Phase: PhaseIdle}}
	if id <= last {
		c.standIn.state.Phase = PhaseClosed
	}
	return &c.standIn, false
}

// apply runs e on s; a violation is turned into its reset or GOAWAY. It
// reports whether the stream lives on.
func (c *Conn) apply(s *stream, e StreamEvent) bool {
	next, v := Next(s.state, e)
	if v != nil {
		if v.Conn {
			c.connError(v.Code)
		} else {
			c.streamError(s.id, v.Code)
		}
		return false
	}
	s.state = next
	if next.Phase == PhaseClosed {
		c.forget(s)
		if len(c.streams) == 0 {
			c.lastBusy = time.Time{} // set by the caller's now (see touch)
		}
	}
	return true
}

// touch notes now as the last moment the connection had streams, if it
// has none left.
func (c *Conn) touch(now time.Time) {
	if len(c.streams) == 0 && c.lastBusy.IsZero() {
		c.lastBusy = now
	}
	if len(c.streams) > 0 {
		c.lastBusy = time.Time{}
	}
	c.maybeFinish()
}

// countControl counts a control frame (or a reset, if reset) against the
// flood limits; false: the connection was closed for it.
func (c *Conn) countControl(now time.Time, reset bool) bool {
	if now.Sub(c.floodSecond) >= time.Second || now.Before(c.floodSecond) {
		c.floodSecond, c.controlCount, c.resetCount = now, 0, 0
	}
	if reset {
		c.resetCount++
		if c.resetCount > c.cfg.MaxResetsPerSecond {
			c.connError(http2.ErrCodeEnhanceYourCalm)
			return false
		}
		return true
	}
	c.controlCount++
	if c.controlCount > c.cfg.MaxControlPerSecond {
		c.connError(http2.ErrCodeEnhanceYourCalm)
		return false
	}
	return true
}

// ReadError takes an error from the Framer's ReadFrame: a stream error
// resets its stream, anything else ends the connection (a connection
// error with its code, an I/O error quietly).
func (c *Conn) ReadError(now time.Time, err error) {
	if c.closed {
		return
	}
	var se http2.StreamError
	var ce http2.ConnectionError
	switch {
	case errors.As(err, &se):
		c.streamError(se.StreamID, se.Code)
		c.touch(now)
	case errors.As(err, &ce):
		c.connError(http2.ErrCode(ce))
	default:
		for id := range c.streams {
			c.emit(Action{Kind: DeliverReset, Stream: id, Code: http2.ErrCodeCancel})
		}
		clear(c.streams)
		c.emit(Action{Kind: CloseConn, Code: http2.ErrCodeNo})
		c.closed = true
	}
}

// Step takes one frame from the peer.
func (c *Conn) Step(now time.Time, f http2.Frame) {
	if c.closed {
		return
	}
	if !c.gotPeerSettings {
		// The preface's SETTINGS comes first (RFC 9113 §3.4).
		sf, ok := f.(*http2.SettingsFrame)
		if !ok || sf.IsAck() {
			c.connError(http2.ErrCodeProtocol)
			return
		}
	}
	switch f := f.(type) {
	case *http2.SettingsFrame:
		c.stepSettings(now, f)
	case *http2.PingFrame:
		c.stepPing(now, f)
	case *http2.WindowUpdateFrame:
		c.stepWindowUpdate(now, f)
	case *http2.MetaHeadersFrame:
		c.stepHeaders(now, f)
	case *http2.DataFrame:
		c.stepData(now, f)
	case *http2.RSTStreamFrame:
		c.stepRST(now, f)
	case *http2.GoAwayFrame:
		c.stepGoAway(now, f)
	case *http2.PriorityFrame:
		if !c.countControl(now, false) {
			return
		}
		s, _ := c.lookup(f.StreamID)
		c.apply(s, RecvPriority)
	case *http2.PushPromiseFrame:
		c.connError(http2.ErrCodeProtocol) // pushes are off both ways
	case *http2.HeadersFrame, *http2.ContinuationFrame:
		// The Framer must merge header blocks (ReadMetaHeaders).
		c.connError(http2.ErrCodeInternal)
	default:
		// Unknown frame types are ignored (§5.5).
	}
	c.touch(now)
}

func (c *Conn) stepSettings(now time.Time, f *http2.SettingsFrame) {
	if f.IsAck() {
		c.settingsUnacked = false
		return
	}
	if !c.countControl(now, false) {
		return
	}
	c.gotPeerSettings = true
	err := f.ForeachSetting(func(s http2.Setting) error {
		if err := s.Valid(); err != nil {
			return err
		}
		switch s.ID {
		case http2.SettingInitialWindowSize:
			delta := int64(s.Val) - c.peerInitialWindow
			for _, st := range c.streams {
				if st.send+delta > maxWindow {
					return http2.ConnectionError(http2.ErrCodeFlowControl)
				}
			}
			for _, st := range c.streams {
				st.send += delta
			}
			c.peerInitialWindow = int64(s.Val)
			if delta > 0 {
				for id := range c.streams {
					c.emit(Action{Kind: DeliverCredit, Stream: id})
				}
			}
		case http2.SettingMaxFrameSize:
			c.peerMaxFrame = s.Val
			c.emit(Action{Kind: PeerMaxFrame, N: s.Val})
		case http2.SettingMaxConcurrentStreams:
			c.peerMaxConcurrent = s.Val
		case http2.SettingHeaderTableSize:
			c.emit(Action{Kind: PeerSettings, HeaderTableSize: s.Val})
		case http2.SettingEnablePush:
			if c.cfg.Role == Client && s.Val != 0 {
				return http2.ConnectionError(http2.ErrCodeProtocol) // a server may not enable it
			}
		}
		return nil
	})
	if err != nil {
		code := http2.ErrCodeProtocol
		var ce http2.ConnectionError
		if errors.As(err, &ce) {
			code = http2.ErrCode(ce)
		}
		c.connError(code)
		return
	}
	c.emit(Action{Kind: WriteSettingsAck})
}

func (c *Conn) stepPing(now time.Time, f *http2.PingFrame) {
	if f.IsAck() {
		if c.pingOutstanding && f.Data == c.ping {
			c.pingOutstanding = false
		}
		return
	}
	if !c.countControl(now, false) {
		return
	}
	c.emit(Action{Kind: WritePing, Ack: true, Ping: f.Data})
}

func (c *Conn) stepWindowUpdate(now time.Time, f *http2.WindowUpdateFrame) {
	if !c.countControl(now, false) {
		return
	}
	if f.StreamID == 0 {
		// The Framer refuses an increment of 0 on the connection as a
		// connection error, and on a stream as a stream error.
		if c.sendConn+int64(f.Increment) > maxWindow {
			c.connError(http2.ErrCodeFlowControl)
			return
		}
		c.sendConn += int64(f.Increment)
		c.emit(Action{Kind: DeliverCredit})
		return
	}
	s, known := c.lookup(f.StreamID)
	if !c.apply(s, RecvWindowUpdate) || !known {
		return
	}
	if s.send+int64(f.Increment) > maxWindow {
		c.streamError(s.id, http2.ErrCodeFlowControl)
		return
	}
	s.send += int64(f.Increment)
	c.emit(Action{Kind: DeliverCredit, Stream: s.id})
}

func (c *Conn) stepHeaders(now time.Time, f *http2.MetaHeadersFrame) {
	id := f.StreamID
	s, known := c.lookup(id)
	end := f.StreamEnded()
	informational := false
	if c.cfg.Role == Client {
		if st := f.PseudoValue("status"); len(st) == 3 && st[0] == '1' {
			informational = true
		}
	}
	if !known && s.state.Phase == PhaseClosed && c.peerOpens(id) {
		// A header block on a stream of the peer's that is not open:
		// one below a stream it opened since (§5.1.1: the IDs must
		// grow, PROTOCOL_ERROR), or one it ended or this side reset
		// (§5.1: after END_STREAM a connection error STREAM_CLOSED).
		// The connection does not remember which, so it ends, as
		// net/http's server does for both.
		c.connError(http2.ErrCodeProtocol)
		return
	}
	if !known && s.state.Phase == PhaseIdle {
		// A new stream: the peer's to open, in order, within the limit.
		if !c.peerOpens(id) {
			c.connError(http2.ErrCodeProtocol)
			return
		}
		c.lastPeer = id
		if c.goAwaySent {
			c.emit(Action{Kind: WriteRST, Stream: id, Code: http2.ErrCodeRefusedStream})
			return
		}
		if c.peerOpen >= c.cfg.MaxConcurrentStreams {
			c.emit(Action{Kind: WriteRST, Stream: id, Code: http2.ErrCodeRefusedStream})
			return
		}
		s = &stream{id: id, peerInitiated: true, send: c.peerInitialWindow, recv: int64(c.cfg.StreamWindow), openedAt: now}
		c.streams[id] = s
		c.peerOpen++
		c.peerStreams++
	}
	e := RecvHeaders
	switch {
	case informational && !end:
		e = RecvInformational
	case end:
		e = RecvHeadersEnd
	}
	if !c.apply(s, e) || !known && s.state.Phase == PhaseClosed && c.streams[id] == nil && e != RecvHeadersEnd {
		return
	}
	c.emit(Action{Kind: DeliverHeaders, Stream: id, Fields: f.Fields, End: end, Informational: e == RecvInformational})
}

func (c *Conn) stepData(now time.Time, f *http2.DataFrame) {
	id := f.StreamID
	n := int64(f.Length) // padding included: it counts against the windows
	if n > c.recvConn {
		c.connError(http2.ErrCodeFlowControl)
		return
	}
	c.recvConn -= n
	data := f.Data()
	if len(data) == 0 && !f.StreamEnded() && !c.countControl(now, false) {
		return // empty DATA floods (CVE-2019-9518)
	}
	s, known := c.lookup(id)
	e := RecvData
	if f.StreamEnded() {
		e = RecvDataEnd
	}
	if !known {
		// Closed or idle: the bytes are not passed on, so they are
		// credited back at once.
		c.returnConn(n)
		c.apply(s, e)
		return
	}
	if n > s.recv {
		c.returnConn(n)
		c.streamError(id, http2.ErrCodeFlowControl)
		return
	}
	if !c.apply(s, e) {
		c.returnConn(n)
		return
	}
	s.recv -= n
	if c.cfg.CreditConnOnReceipt {
		c.returnConn(n)
	}
	if pad := n - int64(len(data)); pad > 0 {
		c.credit(s, pad) // padding is not passed on
	}
	c.emit(Action{Kind: DeliverData, Stream: id, Data: data, End: f.StreamEnded()})
}

func (c *Conn) stepRST(now time.Time, f *http2.RSTStreamFrame) {
	s, known := c.lookup(f.StreamID)
	if !c.countControl(now, true) {
		return
	}
	early := known && s.peerInitiated && now.Sub(s.openedAt) < c.cfg.PrematureResetLifetime
	if !c.apply(s, RecvRST) || !known {
		return
	}
	c.emit(Action{Kind: DeliverReset, Stream: f.StreamID, Code: f.ErrCode})
	if early && c.cfg.PrematureResetStreams > 0 {
		c.premature++
		if c.peerStreams >= c.cfg.PrematureResetStreams && 2*c.premature >= c.peerStreams {
			c.connError(http2.ErrCodeEnhanceYourCalm)
		}
	}
}

func (c *Conn) stepGoAway(now time.Time, f *http2.GoAwayFrame) {
	c.goAwayRecv = true
	c.peerLast = f.LastStreamID
	c.emit(Action{Kind: PeerGoAway, Stream: f.LastStreamID, Code: f.ErrCode})
	// Streams this side opened above the peer's last were not processed:
	// the relay may send them elsewhere.
	for id, s := range c.streams {
		if !s.peerInitiated && id > f.LastStreamID {
			c.emit(Action{Kind: DeliverReset, Stream: id, Code: http2.ErrCodeRefusedStream})
			c.forget(s)
		}
	}
	c.maybeFinish()
}

// maybeFinish closes a connection that is going away once it has no
// streams left.
func (c *Conn) maybeFinish() {
	if !c.closed && (c.goAwaySent || c.goAwayRecv) && len(c.streams) == 0 {
		c.emit(Action{Kind: CloseConn, Code: http2.ErrCodeNo})
		c.closed = true
	}
}

// returnConn gives n bytes of connection window back at once.
func (c *Conn) returnConn(n int64) {
	c.recvConn += n
	c.unacked += n
	c.flushConnCredit()
}

func (c *Conn) flushConnCredit() {
	if c.unacked >= int64(c.cfg.ConnWindow)/2 {
		c.emit(Action{Kind: WriteWindowUpdate, N: uint32(c.unacked)})
		c.unacked = 0
	}
}

// credit returns n bytes of s's window (and the connection's) to the peer.
func (c *Conn) credit(s *stream, n int64) {
	s.recv += n
	s.unacked += n
	if s.unacked >= int64(c.cfg.StreamWindow)/2 && s.state.Phase != PhaseHalfClosedRemote {
		c.emit(Action{Kind: WriteWindowUpdate, Stream: s.id, N: uint32(s.unacked)})
		s.unacked = 0
	}
	if !c.cfg.CreditConnOnReceipt {
		c.returnConn(n)
	}
}

// Consumed says the relay passed n bytes of stream id's data on (the other
// side took them): that much credit goes back to the peer, in WINDOW_UPDATEs
// of at least half a window. Until then the peer cannot send more than the
// window, which is what bounds the relay's buffers.
func (c *Conn) Consumed(now time.Time, id uint32, n int) {
	if c.closed || n <= 0 {
		return
	}
	if s := c.streams[id]; s != nil {
		c.credit(s, int64(n))
		return
	}
	if !c.cfg.CreditConnOnReceipt {
		c.returnConn(int64(n)) // the stream ended meanwhile
	}
}

// SendWindow is how many bytes of DATA the relay may send on stream id now
// (the smaller of its and the connection's window, and at most one frame
// of the peer's size); 0 waits for a DeliverCredit.
func (c *Conn) SendWindow(id uint32) int {
	s := c.streams[id]
	if s == nil || c.closed {
		return 0
	}
	return int(max(0, min(s.send, c.sendConn, int64(c.peerMaxFrame))))
}

// ErrRefused is what Open returns when the peer's limit or its GOAWAY does
// not allow another stream: the relay holds the request or uses another
// connection.
var ErrRefused = errors.New("h2relay: no stream available on this connection")

// Open starts a stream of this side's (Client role) with a head; it returns
// the stream's ID.
func (c *Conn) Open(now time.Time, fields []hpack.HeaderField, end bool) (uint32, error) {
	if c.cfg.Role != Client {
		return 0, errors.New("h2relay: Open on a server connection")
	}
	if c.closed || c.goAwayRecv || c.goAwaySent || c.localOpen >= c.peerMaxConcurrent || c.lastLocal >= maxWindow-1 {
		return 0, ErrRefused
	}
	id := c.lastLocal + 2
	if c.lastLocal == 0 {
		id = 1
	}
	c.lastLocal = id
	s := &stream{id: id, send: c.peerInitialWindow, recv: int64(c.cfg.StreamWindow)}
	c.streams[id] = s
	c.localOpen++
	e := SendHeaders
	if end {
		e = SendHeadersEnd
	}
	c.apply(s, e)
	c.emit(Action{Kind: WriteHeaders, Stream: id, Fields: fields, End: end})
	c.touch(now)
	return id, nil
}

// errNoStream is returned for a call on a stream that is not open.
var errNoStream = errors.New("h2relay: stream not open")

// SendHeaders sends a head (a response, a 1xx) or trailers (end must be
// set) on stream id.
func (c *Conn) SendHeaders(now time.Time, id uint32, fields []hpack.HeaderField, end, informational bool) error {
	s := c.streams[id]
	if s == nil || c.closed {
		return errNoStream
	}
	e := SendHeaders
	switch {
	case informational:
		e = SendInformational
	case end:
		e = SendHeadersEnd
	}
	if !c.apply(s, e) {
		return fmt.Errorf("h2relay: %v on a stream %v: %w", e, s.state.Phase, errNoStream)
	}
	c.emit(Action{Kind: WriteHeaders, Stream: id, Fields: fields, End: end})
	c.touch(now)
	return nil
}

// SendData sends data on stream id; len(data) must be within SendWindow.
func (c *Conn) SendData(now time.Time, id uint32, data []byte, end bool) error {
	s := c.streams[id]
	if s == nil || c.closed {
		return errNoStream
	}
	if len(data) > c.SendWindow(id) {
		return fmt.Errorf("h2relay: %d bytes on stream %d beyond its window %d", len(data), id, c.SendWindow(id))
	}
	e := SendData
	if end {
		e = SendDataEnd
	}
	if !c.apply(s, e) {
		return fmt.Errorf("h2relay: DATA on a stream %v: %w", s.state.Phase, errNoStream)
	}
	s.send -= int64(len(data))
	c.sendConn -= int64(len(data))
	c.emit(Action{Kind: WriteData, Stream: id, Data: data, End: end})
	c.touch(now)
	return nil
}

// Reset ends stream id from this side (the other side of the relay reset
// or failed it) with code.
func (c *Conn) Reset(now time.Time, id uint32, code http2.ErrCode) {
	s := c.streams[id]
	if s == nil || c.closed {
		return
	}
	c.apply(s, SendRST)
	c.emit(Action{Kind: WriteRST, Stream: id, Code: code})
	c.touch(now)
	c.maybeFinish()
}

// SetDeadline makes stream id reset (CANCEL, both ways) if it is still open
// at t; the zero time removes it.
func (c *Conn) SetDeadline(id uint32, t time.Time) {
	if s := c.streams[id]; s != nil {
		s.deadline = t
	}
}

// Drain starts a graceful close: GOAWAY with the last stream the peer
// opened, no new streams, and the connection closes when the last stream
// ends.
func (c *Conn) Drain(now time.Time) {
	if c.closed || c.goAwaySent {
		return
	}
	c.goAwaySent = true
	c.emit(Action{Kind: WriteGoAway, Stream: c.lastPeer, Code: http2.ErrCodeNo})
	c.maybeFinish()
}

// Ping sends a PING (keep-alive, or a liveness check); its answer is
// awaited for PingTimeout.
func (c *Conn) Ping(now time.Time, data [8]byte) {
	if c.closed || c.pingOutstanding {
		return
	}
	c.ping, c.pingOutstanding, c.pingSentAt = data, true, now
	c.emit(Action{Kind: WritePing, Ping: data})
}

// Tick runs the connection's clocks: stream deadlines (reset with CANCEL
// both ways), the wait for SETTINGS and their acknowledgement, the PING's
// answer, and the idle timeout (a GOAWAY, then close).
func (c *Conn) Tick(now time.Time) {
	if c.closed {
		return
	}
	if (c.settingsUnacked || !c.gotPeerSettings) && now.Sub(c.settingsSentAt) >= c.cfg.SettingsTimeout {
		c.connError(http2.ErrCodeSettingsTimeout)
		return
	}
	if c.pingOutstanding && now.Sub(c.pingSentAt) >= c.cfg.PingTimeout {
		c.connError(http2.ErrCodeNo)
		return
	}
	for id, s := range c.streams {
		if !s.deadline.IsZero() && !now.Before(s.deadline) {
			c.emit(Action{Kind: WriteRST, Stream: id, Code: http2.ErrCodeCancel})
			c.emit(Action{Kind: DeliverReset, Stream: id, Code: http2.ErrCodeCancel})
			c.forget(s)
		}
	}
	c.touch(now)
	if c.cfg.IdleTimeout > 0 && len(c.streams) == 0 && !c.lastBusy.IsZero() && now.Sub(c.lastBusy) >= c.cfg.IdleTimeout {
		c.Drain(now)
	}
	c.maybeFinish()
}
