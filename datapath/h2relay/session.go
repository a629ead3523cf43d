package h2relay

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strconv"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// side is one socket of a session: its connection state, its writer and
// the write in progress.
type side struct {
	nc net.Conn
	c  *Conn
	w  *Writer
	// keep holds a turn's deliveries (Writer.Apply's leftovers).
	keep []Action
	// out is what the flushing goroutine is writing; writing says one
	// is (the others leave their frames in w for it).
	out     []byte
	writing bool
	closing bool // CloseConn: close once the buffered bytes are out
	shut    bool // nc closed
	wdl     time.Time
}

// upstream is one connection to the app.
type upstream struct {
	side
	streams  map[uint32]*Stream // by upstream stream ID
	retiring bool               // GOAWAY from the app or closing: no new streams
	lost     bool               // the socket failed (not a protocol error)
}

// session is one downstream connection and its upstream connections.
//
// Everything in it is guarded by mu, held for one turn: a frame read
// (from any of its sockets), a timer's tick, a Grant. A turn steps the
// state machines, carries out their actions (writes into the sides'
// Writers, deliveries relayed to the other side), and before it unlocks
// claims the write of every side with frames waiting that no goroutine
// is writing; the claiming goroutine writes them after unlocking, in one
// system call per side, so a socket that does not take bytes blocks only
// the goroutine writing to it (and, through the windows, the streams
// waiting for it), never the session's lock.
type session struct {
	r      *Relay
	h      Handler
	remote string

	mu      sync.Mutex
	now     time.Time
	down    side
	ups     []*upstream
	streams map[uint32]*Stream // by downstream stream ID
	pending []*Stream          // admitted, waiting for an upstream stream
	dialing bool
	ended   bool
	freed   bool // a stream left an upstream this turn: pending ones may fit

	timer   *time.Timer
	timerAt time.Time

	touched []*Stream
	done    []*Stream
	closers []*side // sides whose connection ended, to flush and close
}

// tickEvery is the period of a session's housekeeping (its connections'
// SETTINGS, PING and idle clocks).
const tickEvery = time.Second

func newSession(r *Relay, nc net.Conn) (*session, error) {
	now := time.Now()
	c, err := NewConn(r.cfg.Down, now)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(16 << 10)
	if err != nil {
		return nil, err
	}
	s := &session{r: r, h: r.cfg.Handler, streams: map[uint32]*Stream{}}
	if a := nc.RemoteAddr(); a != nil {
		s.remote = a.String()
	}
	s.down = side{nc: nc, c: c, w: w}
	s.timer = time.AfterFunc(tickEvery, s.onTimer)
	s.timerAt = now.Add(tickEvery)
	s.mu.Lock()
	s.now = now
	s.endTurn(now)
	return s, nil
}

// newFramer reads frames from br as the relay's Conns expect them.
func newFramer(br *bufio.Reader, cfg *Config) *http2.Framer {
	fr := http2.NewFramer(nil, br)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	fr.MaxHeaderListSize = cfg.MaxHeaderListSize
	fr.SetMaxReadFrameSize(cfg.MaxFrameSize)
	fr.SetReuseFrames()
	return fr
}

// readDown reads the downstream connection's frames until it ends, then
// closes the session's upstream connections.
func (s *session) readDown() {
	cfg := s.down.c.cfg
	br := bufio.NewReaderSize(s.down.nc, 16<<10)
	fr := newFramer(br, &cfg)
	for {
		f, err := fr.ReadFrame()
		now := time.Now()
		s.mu.Lock()
		s.now = now
		for {
			if err != nil {
				s.down.c.ReadError(now, err)
			} else {
				s.down.c.Step(now, f)
			}
			if s.down.c.Closed() || !frameBuffered(br) {
				break
			}
			// The next frame is in the buffer: it joins this turn, so
			// that what the two ask to write leaves in one write.
			s.turn(now)
			f, err = fr.ReadFrame()
		}
		closed := s.down.c.Closed()
		s.endTurn(now)
		if closed {
			break
		}
	}
	s.mu.Lock()
	s.ended = true
	s.timer.Stop()
	for _, u := range s.ups {
		u.retiring = true
		if !u.writing {
			u.shut = true
			u.nc.Close()
		} else {
			u.closing = true
		}
	}
	s.endTurn(time.Now())
}

// readUp reads an upstream connection's frames until it ends.
func (s *session) readUp(u *upstream) {
	cfg := u.c.cfg
	br := bufio.NewReaderSize(u.nc, 16<<10)
	fr := newFramer(br, &cfg)
	for {
		f, err := fr.ReadFrame()
		now := time.Now()
		s.mu.Lock()
		s.now = now
		for {
			if err != nil {
				var se http2.StreamError
				var ce http2.ConnectionError
				if !errors.As(err, &se) && !errors.As(err, &ce) {
					u.lost = true
				}
				u.c.ReadError(now, err)
			} else {
				u.c.Step(now, f)
			}
			if u.c.Closed() || !frameBuffered(br) {
				break
			}
			s.turn(now)
			f, err = fr.ReadFrame()
		}
		closed := u.c.Closed()
		s.endTurn(now)
		if closed {
			return
		}
	}
}

// drain starts a graceful close of the downstream connection.
func (s *session) drain() {
	s.mu.Lock()
	now := time.Now()
	s.now = now
	s.down.c.Drain(now)
	s.endTurn(now)
}

// cut closes every socket of the session; the readers end it.
func (s *session) cut() {
	s.mu.Lock()
	s.down.nc.Close()
	for _, u := range s.ups {
		u.nc.Close()
	}
	s.mu.Unlock()
}

// onTimer runs the connections' clocks and the streams' deadlines.
func (s *session) onTimer() {
	s.mu.Lock()
	if s.ended {
		s.mu.Unlock()
		return
	}
	now := time.Now()
	s.now = now
	s.timerAt = time.Time{}
	s.down.c.Tick(now)
	for _, u := range s.ups {
		u.c.Tick(now)
	}
	next := now.Add(tickEvery)
	for _, st := range s.streams {
		if st.deadline.IsZero() {
			continue
		}
		if !now.Before(st.deadline) {
			st.deadline = time.Time{}
			s.h.Timer(st, now)
			s.touch(st)
		}
		if !st.deadline.IsZero() && st.deadline.Before(next) {
			next = st.deadline
		}
	}
	s.armAt(next)
	s.endTurn(now)
}

// armAt makes the timer fire at t at the latest.
func (s *session) armAt(t time.Time) {
	if s.ended || !s.timerAt.IsZero() && !t.Before(s.timerAt) {
		return
	}
	s.timerAt = t
	s.timer.Reset(max(time.Until(t), 0))
}

// touch notes a stream whose state changed this turn.
func (s *session) touch(st *Stream) {
	if !st.touched {
		st.touched = true
		s.touched = append(s.touched, st)
	}
}

// frameBuffered reports whether br holds a whole frame, so that reading
// it cannot block: a header block that CONTINUATION frames may follow
// does not count.
func frameBuffered(br *bufio.Reader) bool {
	if br.Buffered() < 9 {
		return false
	}
	h, err := br.Peek(9)
	if err != nil {
		return false
	}
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	typ, flags := http2.FrameType(h[3]), http2.Flags(h[4])
	if (typ == http2.FrameHeaders || typ == http2.FramePushPromise) && flags&http2.FlagHeadersEndHeaders == 0 {
		return false
	}
	return br.Buffered() >= 9+n
}

// endTurn carries out what the turn decided, unlocks, writes what this
// goroutine claimed and tells the handler of the streams that ended.
func (s *session) endTurn(now time.Time) {
	s.turn(now)
	s.claimAndUnlock(now)
}

// turn carries out what the turn decided so far: the machines' actions,
// and the streams whose state changed.
func (s *session) turn(now time.Time) {
	for {
		s.drive(now)
		if len(s.touched) == 0 && !s.freed {
			break
		}
		touched := s.touched
		s.touched = s.touched[len(s.touched):]
		for _, st := range touched {
			st.touched = false
			s.settle(st, now)
		}
		if len(s.touched) == 0 {
			s.touched = s.touched[:0]
		}
		if s.freed {
			s.freed = false
			s.retryPending(now)
		}
	}
}

// claimAndUnlock claims the writes no goroutine is making, unlocks,
// writes them and tells the handler of the streams that ended.
func (s *session) claimAndUnlock(now time.Time) {
	// Each goroutine its own list: it is read after the unlock.
	var fbuf [4]*side
	flush := fbuf[:0]
	claim := func(sd *side) {
		if sd.shut || sd.writing {
			if sd.writing && sd.w.Buffered() > s.r.cfg.MaxBuffered {
				// The peer takes nothing while the relay has much more
				// for it than the windows should allow: cut it.
				sd.shut = true
				sd.nc.Close()
			}
			return
		}
		if sd.w.Buffered() > 0 || sd.closing {
			sd.writing = true
			sd.out = sd.w.Take(sd.out[:0])
			flush = append(flush, sd)
		}
	}
	claim(&s.down)
	for _, u := range s.ups {
		claim(&u.side)
	}
	for _, sd := range s.closers {
		claim(sd)
	}
	s.closers = s.closers[:0]
	done := s.done
	s.done = nil
	s.mu.Unlock()
	for _, sd := range flush {
		s.write(sd, now)
	}
	for _, st := range done {
		s.h.Done(st, now)
	}
}

// write writes sd.out, then whatever gathered meanwhile, until nothing is
// left; a connection that is closing is closed after its last bytes.
func (s *session) write(sd *side, now time.Time) {
	for {
		var err error
		if len(sd.out) > 0 {
			if dl := now.Add(s.r.cfg.WriteTimeout); dl.Sub(sd.wdl) > time.Second {
				sd.wdl = dl
				_ = sd.nc.SetWriteDeadline(dl)
			}
			_, err = sd.nc.Write(sd.out)
		}
		s.mu.Lock()
		sd.out = sd.out[:0]
		if cap(sd.out) > 256<<10 {
			sd.out = nil
		}
		if err == nil && sd.w.Buffered() > 0 && !sd.shut {
			sd.out = sd.w.Take(sd.out)
			s.mu.Unlock()
			now = time.Now()
			continue
		}
		sd.writing = false
		if (err != nil || sd.closing) && !sd.shut {
			// A failed write: the reader finds the socket closed and
			// ends the connection's streams.
			sd.shut = true
			sd.nc.Close()
		}
		s.mu.Unlock()
		return
	}
}

// drive carries out the actions of every connection of the session until
// none is left: writes go into the Writers, deliveries are relayed.
func (s *session) drive(now time.Time) {
	for progress := true; progress; {
		progress = false
		if acts := s.down.c.Actions(); len(acts) > 0 {
			progress = true
			keep, err := s.down.w.Apply(acts, s.down.keep[:0])
			s.down.keep = keep[:0]
			if err != nil {
				s.r.log.Debug("h2 relay: downstream write", "error", err)
				s.down.c.ReadError(now, err)
			}
			for i := range keep {
				s.onDown(&keep[i], now)
			}
		}
		for i := 0; i < len(s.ups); i++ {
			u := s.ups[i]
			acts := u.c.Actions()
			if len(acts) == 0 {
				continue
			}
			progress = true
			keep, err := u.w.Apply(acts, u.keep[:0])
			u.keep = keep[:0]
			if err != nil {
				s.r.log.Debug("h2 relay: upstream write", "error", err)
				u.c.ReadError(now, err)
			}
			for j := range keep {
				s.onUp(u, &keep[j], now)
			}
			if u.c.Closed() {
				// Its streams were delivered their resets; it leaves the
				// pool and closes once its last bytes are out.
				s.ups = append(s.ups[:i], s.ups[i+1:]...)
				i--
				u.retiring, u.closing = true, true
				s.closers = append(s.closers, &u.side)
				if len(s.pending) > 0 {
					s.freed = true
				}
			}
		}
	}
}

// onDown carries out a delivery from the downstream connection.
func (s *session) onDown(a *Action, now time.Time) {
	switch a.Kind {
	case DeliverHeaders:
		st := s.streams[a.Stream]
		if st == nil {
			s.newStream(a, now)
			return
		}
		// Trailers (the state machine allows them only with END_STREAM).
		st.reqEnded = true
		switch st.phase {
		case phaseUpstream:
			if len(st.toUp) == 0 && !st.upEndSent {
				if st.up.c.SendHeaders(now, st.upID, a.Fields, true, false) == nil {
					st.upEndSent = true
				}
				break
			}
			st.toUpTrailers, st.toUpEnd = a.Fields, true
		case phaseHeld:
			st.toUpTrailers, st.toUpEnd = a.Fields, true
		}
		s.touch(st)
	case DeliverData:
		st := s.streams[a.Stream]
		if st == nil || st.phase == phaseAnswered {
			s.down.c.Consumed(now, a.Stream, len(a.Data))
			if st != nil {
				if a.End {
					st.reqEnded = true
				}
				s.touch(st)
			}
			return
		}
		if a.End {
			st.reqEnded = true
		}
		if st.phase == phaseUpstream {
			s.sendUp(st, a.Data, a.End, now)
		} else {
			st.toUp = append(st.toUp, a.Data...)
			st.toUpEnd = st.toUpEnd || a.End
		}
		s.touch(st)
	case DeliverReset:
		st := s.streams[a.Stream]
		if st == nil {
			return
		}
		if !st.downEndSent {
			st.clientReset = true
		}
		s.cancelUp(st, http2.ErrCodeCancel)
		st.phase = phaseAnswered
		s.unpend(st)
		s.touch(st)
	case DeliverCredit:
		if a.Stream != 0 {
			if st := s.streams[a.Stream]; st != nil && len(st.toDown) > 0 {
				s.pumpDown(st, now)
			}
			return
		}
		for _, st := range s.streams {
			if len(st.toDown) > 0 || st.toDownEnd && !st.downEndSent {
				s.pumpDown(st, now)
			}
		}
	case PeerGoAway:
		// The client opens no more streams; ours were never any.
	case CloseConn:
		s.down.closing = true
		s.ended = true
	}
}

// onUp carries out a delivery from an upstream connection.
func (s *session) onUp(u *upstream, a *Action, now time.Time) {
	switch a.Kind {
	case DeliverHeaders:
		st := u.streams[a.Stream]
		if st == nil {
			u.c.Reset(now, a.Stream, http2.ErrCodeCancel)
			return
		}
		switch {
		case a.Informational:
			if !st.respStarted {
				_ = s.down.c.SendHeaders(now, st.id, a.Fields, false, true)
			}
		case !st.respStarted:
			status, err := strconv.Atoi(pseudo(a.Fields, ":status"))
			if err != nil || status < 200 || status > 999 {
				s.cancelUp(st, http2.ErrCodeProtocol)
				s.h.Failed(st, errBadResponse)
				if !st.respStarted {
					st.phase = phaseAnswered
					s.down.c.Reset(now, st.id, http2.ErrCodeInternal)
				}
				break
			}
			head := s.h.Response(st, a.Fields)
			st.respStarted, st.status = true, status
			if s.down.c.SendHeaders(now, st.id, head, a.End, false) != nil {
				s.cancelUp(st, http2.ErrCodeCancel)
				st.phase = phaseAnswered
				break
			}
			st.downEndSent = a.End
		default:
			// Trailers.
			if len(st.toDown) == 0 {
				if s.down.c.SendHeaders(now, st.id, a.Fields, true, false) == nil {
					st.downEndSent = true
				}
				break
			}
			st.toDownTrailers, st.toDownEnd = a.Fields, true
		}
		s.touch(st)
	case DeliverData:
		st := u.streams[a.Stream]
		if st == nil || st.phase != phaseUpstream {
			u.c.Consumed(now, a.Stream, len(a.Data))
			return
		}
		s.sendDown(st, a.Data, a.End, now)
		s.touch(st)
	case DeliverReset:
		st := u.streams[a.Stream]
		if st == nil {
			return
		}
		delete(u.streams, a.Stream)
		st.appReset, st.appResetSet = a.Code, true
		s.touch(st)
		if st.phase != phaseUpstream {
			return
		}
		s.freed = true
		var err error = &ResetError{Code: a.Code}
		if u.lost {
			err = ErrUpstreamLost
		}
		if !st.respStarted && a.Code == http2.ErrCodeRefusedStream && !u.lost && st.sentUp == 0 && st.refusals < 2 {
			// Not processed by the app (RFC 9113 §8.7), and nothing of
			// the body left the relay: open it again elsewhere.
			st.refusals++
			st.phase, st.upEndSent = phaseHeld, false
			st.up, st.upID = nil, 0
			s.openUp(st, now)
			return
		}
		st.phase = phaseAnswered
		s.dropToUp(st, now)
		if !st.respStarted {
			s.dropToDown(st, now)
			s.h.Failed(st, err)
			if !st.respStarted {
				code := a.Code
				if u.lost {
					code = http2.ErrCodeInternal
				}
				s.down.c.Reset(now, st.id, code)
			}
			return
		}
		if a.Code == http2.ErrCodeNo && st.toDownEnd {
			// The app ended its response and stopped the request's
			// body: the response's rest still goes out.
			st.phase = phaseUpstream
			return
		}
		code := a.Code
		if u.lost {
			code = http2.ErrCodeInternal
		}
		s.dropToDown(st, now)
		s.down.c.Reset(now, st.id, code)
	case DeliverCredit:
		if a.Stream != 0 {
			if st := u.streams[a.Stream]; st != nil {
				s.pumpUp(st, now)
			}
			return
		}
		for _, st := range u.streams {
			if len(st.toUp) > 0 || st.toUpEnd && !st.upEndSent {
				s.pumpUp(st, now)
			}
		}
	case PeerGoAway:
		u.retiring = true
	case CloseConn:
		u.retiring, u.closing = true, true
	}
}

// errBadResponse is a response head without a valid :status.
var errBadResponse = errors.New("h2relay: the app's response has no valid :status")

// newStream admits a new downstream stream.
func (s *session) newStream(a *Action, now time.Time) {
	if !validRequest(a.Fields) {
		s.down.c.Reset(now, a.Stream, http2.ErrCodeProtocol)
		return
	}
	st := &Stream{sess: s, id: a.Stream, Head: a.Fields, Arrived: now, reqEnded: a.End, toUpEnd: a.End}
	s.streams[a.Stream] = st
	s.touch(st)
	switch s.h.Request(st, now) {
	case Proceed:
		st.granted, st.grantedAt = true, now
		s.openUp(st, now)
	case Answered:
		if !st.respStarted && st.phase != phaseAnswered {
			st.Cancel(http2.ErrCodeInternal)
		}
	}
}

// openUp opens st upstream on a pooled connection, or waits for one (a
// dial is started if the pool may grow).
func (s *session) openUp(st *Stream, now time.Time) {
	if st.phase != phaseHeld || st.done {
		return
	}
	end := st.reqEnded && len(st.toUp) == 0 && st.toUpTrailers == nil
	for _, u := range s.ups {
		if u.retiring {
			continue
		}
		id, err := u.c.Open(now, st.Head, end)
		if err != nil {
			continue
		}
		st.up, st.upID, st.phase, st.upEndSent = u, id, phaseUpstream, end
		u.streams[id] = st
		s.unpend(st)
		s.pumpUp(st, now)
		return
	}
	if !st.inPend {
		st.inPend = true
		s.pending = append(s.pending, st)
	}
	s.maybeDial()
}

// unpend takes st out of the pending list.
func (s *session) unpend(st *Stream) {
	if !st.inPend {
		return
	}
	st.inPend = false
	for i, p := range s.pending {
		if p == st {
			s.pending = append(s.pending[:i], s.pending[i+1:]...)
			return
		}
	}
}

// retryPending tries the pending streams again (a stream or connection
// left an upstream).
func (s *session) retryPending(now time.Time) {
	if len(s.pending) == 0 {
		return
	}
	p := append([]*Stream(nil), s.pending...)
	for _, st := range p {
		s.openUp(st, now)
	}
}

// maybeDial starts a dial if streams wait and the pool may grow.
func (s *session) maybeDial() {
	if s.dialing || s.ended || len(s.ups) >= s.r.cfg.MaxUpstreams {
		return
	}
	s.dialing = true
	go s.dialUp()
}

// dialUp makes an upstream connection; its goroutine then reads it.
func (s *session) dialUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	nc, err := s.r.cfg.Dial(ctx)
	cancel()
	now := time.Now()
	s.mu.Lock()
	s.now = now
	s.dialing = false
	if err == nil && s.ended {
		nc.Close()
		s.endTurn(now)
		return
	}
	if err != nil {
		p := s.pending
		s.pending = nil
		derr := &DialError{Err: err}
		for _, st := range p {
			st.inPend = false
			if st.done || st.phase != phaseHeld {
				continue
			}
			st.phase = phaseAnswered
			s.dropToUp(st, now)
			s.h.Failed(st, derr)
			if !st.respStarted {
				s.down.c.Reset(now, st.id, http2.ErrCodeRefusedStream)
			}
			s.touch(st)
		}
		s.endTurn(now)
		return
	}
	u, err := s.newUpstream(nc, now)
	if err != nil {
		nc.Close()
		s.endTurn(now)
		return
	}
	s.ups = append(s.ups, u)
	s.retryPending(now)
	s.endTurn(now)
	s.readUp(u)
}

func (s *session) newUpstream(nc net.Conn, now time.Time) (*upstream, error) {
	c, err := NewConn(s.r.cfg.Up, now)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(16 << 10)
	if err != nil {
		return nil, err
	}
	w.WriteRaw([]byte(http2.ClientPreface))
	return &upstream{side: side{nc: nc, c: c, w: w}, streams: map[uint32]*Stream{}}, nil
}

// sendUp passes data of the client's to st's upstream stream: what the
// app's windows allow now, the rest held (and not credited back to the
// client until it is sent).
func (s *session) sendUp(st *Stream, data []byte, end bool, now time.Time) {
	if len(st.toUp) == 0 && !st.upEndSent && st.toUpTrailers == nil {
		u := st.up
		n := min(len(data), u.c.SendWindow(st.upID))
		if n == len(data) {
			if u.c.SendData(now, st.upID, data, end) == nil {
				s.down.c.Consumed(now, st.id, n)
				st.sentUp += int64(n)
				st.upEndSent = end
			}
			return
		}
		if n > 0 && u.c.SendData(now, st.upID, data[:n], false) == nil {
			s.down.c.Consumed(now, st.id, n)
			st.sentUp += int64(n)
			data = data[n:]
		}
	}
	st.toUp = append(st.toUp, data...)
	st.toUpEnd = st.toUpEnd || end
}

// pumpUp sends what st holds for the app as far as the windows allow.
func (s *session) pumpUp(st *Stream, now time.Time) {
	if st.phase != phaseUpstream || st.upEndSent {
		return
	}
	u := st.up
	for len(st.toUp) > 0 {
		n := min(len(st.toUp), u.c.SendWindow(st.upID))
		if n == 0 {
			return
		}
		end := n == len(st.toUp) && st.toUpEnd && st.toUpTrailers == nil
		if u.c.SendData(now, st.upID, st.toUp[:n], end) != nil {
			return
		}
		s.down.c.Consumed(now, st.id, n)
		st.sentUp += int64(n)
		st.upEndSent = end
		// The frame's bytes are read by the Writer later in the turn:
		// the buffer is never written to again (a new one is made).
		st.toUp = st.toUp[n:]
	}
	st.toUp = nil
	switch {
	case st.upEndSent:
	case st.toUpTrailers != nil:
		if u.c.SendHeaders(now, st.upID, st.toUpTrailers, true, false) == nil {
			st.upEndSent = true
		}
		st.toUpTrailers = nil
	case st.toUpEnd:
		if u.c.SendData(now, st.upID, nil, true) == nil {
			st.upEndSent = true
		}
	}
}

// dropToUp forgets what st holds for the app and credits it back to the
// client.
func (s *session) dropToUp(st *Stream, now time.Time) {
	if len(st.toUp) > 0 {
		s.down.c.Consumed(now, st.id, len(st.toUp))
	}
	st.toUp, st.toUpTrailers = nil, nil
}

// sendDown passes data of the app's to the client: what the client's
// windows allow now, the rest held (and not credited back to the app
// until it is sent).
func (s *session) sendDown(st *Stream, data []byte, end bool, now time.Time) {
	if len(st.toDown) == 0 && !st.downEndSent && st.toDownTrailers == nil {
		n := min(len(data), s.down.c.SendWindow(st.id))
		if n == len(data) {
			if s.down.c.SendData(now, st.id, data, end) == nil {
				s.creditUp(st, n, now)
				st.bytes += int64(n)
				st.lastDown = now
				st.downEndSent = end
			}
			return
		}
		if n > 0 && s.down.c.SendData(now, st.id, data[:n], false) == nil {
			s.creditUp(st, n, now)
			st.bytes += int64(n)
			data = data[n:]
		}
	}
	st.toDown = append(st.toDown, data...)
	st.toDownEnd = st.toDownEnd || end
}

// creditUp gives n bytes the client took back to the app (to its
// connection only, once the app's stream closed).
func (s *session) creditUp(st *Stream, n int, now time.Time) {
	if st.up != nil && !st.localBody {
		st.up.c.Consumed(now, st.upID, n)
	}
}

// pumpDown sends what st holds for the client as far as the windows allow.
func (s *session) pumpDown(st *Stream, now time.Time) {
	if st.downEndSent {
		return
	}
	for len(st.toDown) > 0 {
		n := min(len(st.toDown), s.down.c.SendWindow(st.id))
		if n == 0 {
			return
		}
		end := n == len(st.toDown) && st.toDownEnd && st.toDownTrailers == nil
		if s.down.c.SendData(now, st.id, st.toDown[:n], end) != nil {
			return
		}
		s.creditUp(st, n, now)
		st.bytes += int64(n)
		st.lastDown = now
		st.downEndSent = end
		st.toDown = st.toDown[n:]
	}
	st.toDown = nil
	switch {
	case st.downEndSent:
	case st.toDownTrailers != nil:
		if s.down.c.SendHeaders(now, st.id, st.toDownTrailers, true, false) == nil {
			st.downEndSent = true
		}
		st.toDownTrailers = nil
	case st.toDownEnd:
		if s.down.c.SendData(now, st.id, nil, true) == nil {
			st.downEndSent = true
		}
	}
	s.touch(st)
}

// cancelUp resets st's upstream stream, if it has one open, and drops
// what the stream holds for either side (credited back).
func (s *session) cancelUp(st *Stream, code http2.ErrCode) {
	if st.phase == phaseUpstream && st.up != nil {
		st.up.c.Reset(s.now, st.upID, code)
		delete(st.up.streams, st.upID)
		s.freed = true
	}
	s.dropToUp(st, s.now)
	if !st.localBody {
		s.dropToDown(st, s.now)
	}
}

// dropToDown forgets what st holds for the client and credits it back to
// the app.
func (s *session) dropToDown(st *Stream, now time.Time) {
	if len(st.toDown) > 0 {
		s.creditUp(st, len(st.toDown), now)
	}
	st.toDown, st.toDownTrailers = nil, nil
}

// settle ends what is left of a stream whose state changed: a response
// that ended while the client still sends stops the client (RST_STREAM
// NO_ERROR), a client that went cancels the app's stream, and a stream
// closed on both sides is done.
func (s *session) settle(st *Stream, now time.Time) {
	if st.done {
		return
	}
	downOpen := s.down.c.StreamOpen(st.id)
	upOpen := st.phase == phaseUpstream && st.up != nil && st.up.c.StreamOpen(st.upID)
	if downOpen && !upOpen && st.downEndSent {
		s.down.c.Reset(now, st.id, http2.ErrCodeNo)
		downOpen = false
	}
	if !downOpen && upOpen {
		s.cancelUp(st, http2.ErrCodeCancel)
		upOpen = false
	}
	if downOpen || upOpen {
		return
	}
	if !st.downEndSent && !st.clientReset && !st.respStarted {
		st.clientReset = !st.appResetSet
	}
	st.done = true
	delete(s.streams, st.id)
	if st.up != nil && st.up.streams[st.upID] == st {
		delete(st.up.streams, st.upID)
		s.freed = true
	}
	s.unpend(st)
	s.dropToUp(st, now)
	s.dropToDown(st, now)
	s.done = append(s.done, st)
}

// pseudo returns the value of pseudo field name.
func pseudo(fields []Field, name string) string {
	for _, f := range fields {
		if f.Name == name {
			return f.Value
		}
		if len(f.Name) == 0 || f.Name[0] != ':' {
			break
		}
	}
	return ""
}

// validRequest checks a request head as RFC 9113 §8.3.1 and §8.2.2 ask of
// an intermediary: :method, :scheme and :path present (CONNECT is not
// relayed), no connection-specific fields, TE only "trailers". The Framer
// checked the pseudo fields' names, order and uniqueness and every field's
// characters.
func validRequest(fields []Field) bool {
	var method, scheme, path bool
	for _, f := range fields {
		switch f.Name {
		case ":method":
			method = f.Value != "" && f.Value != "CONNECT"
		case ":scheme":
			scheme = f.Value != ""
		case ":path":
			path = f.Value != ""
		case ":status", ":protocol":
			return false
		case "connection", "proxy-connection", "keep-alive", "transfer-encoding", "upgrade":
			return false
		case "te":
			if f.Value != "trailers" {
				return false
			}
		}
	}
	return method && scheme && path
}
