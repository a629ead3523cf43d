package h2relay

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"

	"github.com/nomad-serverless/nomad-serverless/datapath/rawio"
)

// side is one socket: its connection state, its writer and the write in
// progress.
type side struct {
	nc net.Conn
	// rw reads and writes nc with raw system calls (datapath/rawio): no
	// scheduler hand-off per call, so the runtime's monitor is not kept
	// awake by the relay's sockets.
	rw *rawio.Conn
	c  *Conn
	w  *Writer
	// keep holds a turn's deliveries (Writer.Apply's leftovers).
	keep []Action
	// out is what the writing goroutine is writing; writing says one is
	// (the others leave their frames in w for it).
	out     []byte
	writing bool
	closing bool // CloseConn: close once the buffered bytes are out
	shut    bool // nc closed
	marked  bool // in the group's dirty list this turn
	wdl     time.Time
	// down is the session of a downstream side; nil for an upstream.
	down *session
	up   *upstream
}

// upstream is one pooled connection to the app, shared by the group's
// sessions.
type upstream struct {
	side
	streams  map[uint32]*Stream // by upstream stream ID
	retiring bool               // GOAWAY from the app or closing: no new streams
	lost     bool               // the socket failed (not a protocol error)
}

// group is a lock domain of the relay: a set of downstream connections
// (sessions) and the pool of upstream connections their streams share.
// The relay has one per P (GOMAXPROCS; one at a sidecar's default
// reservation), each connection in one of them.
//
// Everything in a group is guarded by mu, held for one turn: a frame read
// from any of its sockets (with the frames already buffered behind it), a
// timer's tick, a Grant. A turn steps the state machines, carries out
// their actions (writes into the sides' Writers, deliveries relayed to the
// other side), and before it unlocks claims the write of every side with
// frames waiting that no goroutine is writing; the claiming goroutine
// writes them after unlocking, one system call per side, so a socket that
// does not take bytes blocks only the goroutine writing to it (and,
// through the windows, the streams waiting for it), never the lock.
// Goroutines: one reader per socket and the group's timer; none per
// stream.
type group struct {
	r *Relay
	h Handler

	mu       sync.Mutex
	now      time.Time
	sessions map[*session]struct{}
	ups      []*upstream
	pending  []*Stream // admitted, waiting for an upstream stream
	opening  []*Stream // admitted this turn, opened at its end
	dialing  bool
	freed    bool // a stream left an upstream this turn: pending ones may fit
	closed   bool

	timer   *time.Timer
	timerAt time.Time

	dirty   []*side // sides whose Conn was called this turn
	touched []*Stream
	settled []*Stream // touched's other buffer (turn)
	done    []*Stream
	closers []*side // upstream sides whose connection ended, to flush and close
}

// tickEvery is the period of a group's housekeeping (its connections'
// SETTINGS, PING and idle clocks).
const tickEvery = time.Second

func newGroup(r *Relay) *group {
	g := &group{r: r, h: r.cfg.Handler, sessions: map[*session]struct{}{}}
	// Under the lock: the timer's function takes it first.
	g.mu.Lock()
	g.timerAt = time.Now().Add(tickEvery)
	g.timer = time.AfterFunc(tickEvery, g.onTimer)
	g.mu.Unlock()
	return g
}

// lock takes the group for a turn at now.
func (g *group) lock() time.Time {
	g.mu.Lock()
	now := time.Now()
	g.now = now
	return now
}

// mark notes that sd's Conn was called this turn: its actions are carried
// out and its bytes written before the turn ends.
func (g *group) mark(sd *side) {
	if !sd.marked {
		sd.marked = true
		g.dirty = append(g.dirty, sd)
	}
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

// readUp reads an upstream connection's frames until it ends.
func (g *group) readUp(u *upstream) {
	cfg := u.c.cfg
	br := bufio.NewReaderSize(u.rw, 16<<10)
	fr := newFramer(br, &cfg)
	for {
		f, err := fr.ReadFrame()
		now := g.lock()
		g.mark(&u.side)
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
			// The next frame is in the buffer: it joins this turn, so
			// that what the two ask to write leaves in one write.
			g.turn(now)
			f, err = fr.ReadFrame()
		}
		closed := u.c.Closed()
		g.endTurn(now)
		if closed {
			return
		}
	}
}

// onTimer runs the connections' clocks and the streams' deadlines.
func (g *group) onTimer() {
	now := g.lock()
	if g.closed {
		g.mu.Unlock()
		return
	}
	g.timerAt = time.Time{}
	next := now.Add(tickEvery)
	for s := range g.sessions {
		g.mark(&s.down)
		s.down.c.Tick(now)
		for _, st := range s.streams {
			if st.deadline.IsZero() {
				continue
			}
			if !now.Before(st.deadline) {
				st.deadline = time.Time{}
				g.h.Timer(st, now)
				g.touch(st)
			}
			if !st.deadline.IsZero() && st.deadline.Before(next) {
				next = st.deadline
			}
		}
	}
	for _, u := range g.ups {
		g.mark(&u.side)
		u.c.Tick(now)
	}
	g.armAt(next)
	g.endTurn(now)
}

// armAt makes the timer fire at t at the latest.
func (g *group) armAt(t time.Time) {
	if g.closed || !g.timerAt.IsZero() && !t.Before(g.timerAt) {
		return
	}
	g.timerAt = t
	g.timer.Reset(max(time.Until(t), 0))
}

// touch notes a stream whose state changed this turn.
func (g *group) touch(st *Stream) {
	if !st.touched {
		st.touched = true
		g.touched = append(g.touched, st)
	}
}

// endTurn carries out what the turn decided, unlocks, writes what this
// goroutine claimed and tells the handler of the streams that ended.
func (g *group) endTurn(now time.Time) {
	g.turn(now)
	g.openAdmitted(now)
	g.claimAndUnlock(now)
}

// openAdmitted opens upstream the streams admitted during the turn. They
// wait for the turn's end, not their own head: a stream the client reset
// in the frames read with its head (rapid reset) never reaches the app,
// and a head and the body read with it leave in one write.
func (g *group) openAdmitted(now time.Time) {
	for len(g.opening) > 0 {
		op := g.opening
		g.opening = nil
		for _, st := range op {
			g.openUp(st, now)
		}
		g.turn(now)
	}
}

// turn carries out what the turn decided so far: the machines' actions,
// and the streams whose state changed.
func (g *group) turn(now time.Time) {
	for {
		g.drive(now)
		if len(g.touched) == 0 && !g.freed {
			return
		}
		// Settling may touch streams again: they gather in the other
		// buffer, and the two alternate (no allocation a turn).
		touched := g.touched
		g.touched = g.settled[:0]
		for i, st := range touched {
			touched[i] = nil
			st.touched = false
			g.settle(st, now)
		}
		g.settled = touched[:0]
		if g.freed {
			g.freed = false
			g.retryPending(now)
		}
	}
}

// claimAndUnlock claims the writes no goroutine is making, unlocks,
// writes them and tells the handler of the streams that ended.
func (g *group) claimAndUnlock(now time.Time) {
	// Each goroutine its own list: it is read after the unlock.
	var fbuf [4]*side
	flush := fbuf[:0]
	claim := func(sd *side) {
		if sd.shut || sd.writing {
			if !sd.shut && sd.writing && sd.w.Buffered() > g.r.cfg.MaxBuffered {
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
	for _, sd := range g.dirty {
		sd.marked = false
		claim(sd)
	}
	clear(g.dirty)
	g.dirty = g.dirty[:0]
	for _, sd := range g.closers {
		claim(sd)
	}
	g.closers = g.closers[:0]
	done := g.done
	g.done = nil
	g.mu.Unlock()
	for _, sd := range flush {
		g.write(sd, now)
	}
	for _, st := range done {
		g.h.Done(st, now)
	}
}

// write writes sd.out, then whatever gathered meanwhile, until nothing is
// left; a connection that is closing is closed after its last bytes.
func (g *group) write(sd *side, now time.Time) {
	for {
		var err error
		if len(sd.out) > 0 {
			if dl := now.Add(g.r.cfg.WriteTimeout); dl.Sub(sd.wdl) > time.Second {
				sd.wdl = dl
				_ = sd.nc.SetWriteDeadline(dl)
			}
			_, err = sd.rw.Write(sd.out)
		}
		g.mu.Lock()
		sd.out = sd.out[:0]
		if cap(sd.out) > 256<<10 {
			sd.out = nil
		}
		if err == nil && sd.w.Buffered() > 0 && !sd.shut {
			sd.out = sd.w.Take(sd.out)
			g.mu.Unlock()
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
		g.mu.Unlock()
		return
	}
}

// drive carries out the actions of the connections called this turn
// until none is left: writes go into the Writers, deliveries are relayed.
func (g *group) drive(now time.Time) {
	for progress := true; progress; {
		progress = false
		for i := 0; i < len(g.dirty); i++ {
			sd := g.dirty[i]
			acts := sd.c.Actions()
			if len(acts) == 0 {
				continue
			}
			progress = true
			keep, err := sd.w.Apply(acts, sd.keep[:0])
			sd.keep = keep[:0]
			if err != nil {
				g.r.log.Debug("h2 relay: write", "error", err)
				sd.c.ReadError(now, err)
			}
			if s := sd.down; s != nil {
				for j := range keep {
					s.onDown(&keep[j], now)
				}
				continue
			}
			u := sd.up
			for j := range keep {
				g.onUp(u, &keep[j], now)
			}
			if u.c.Closed() && !u.closing {
				// Its streams were delivered their resets; it leaves the
				// pool and closes once its last bytes are out.
				u.retiring, u.closing = true, true
				for k, p := range g.ups {
					if p == u {
						g.ups = append(g.ups[:k], g.ups[k+1:]...)
						break
					}
				}
				g.closers = append(g.closers, &u.side)
				if len(g.pending) > 0 {
					g.freed = true
				}
			}
		}
	}
}

// onUp carries out a delivery from an upstream connection.
func (g *group) onUp(u *upstream, a *Action, now time.Time) {
	switch a.Kind {
	case DeliverHeaders:
		st := u.streams[a.Stream]
		if st == nil {
			u.c.Reset(now, a.Stream, http2.ErrCodeCancel)
			return
		}
		s := st.sess
		g.mark(&s.down)
		switch {
		case a.Informational:
			if !st.respStarted {
				_ = s.down.c.SendHeaders(now, st.id, a.Fields, false, true)
			}
		case !st.respStarted:
			status, ok := parseStatus(pseudo(a.Fields, ":status"))
			if !ok {
				g.cancelUp(st, http2.ErrCodeProtocol)
				g.h.Failed(st, errBadResponse)
				if !st.respStarted {
					st.phase = phaseAnswered
					s.down.c.Reset(now, st.id, http2.ErrCodeInternal)
				}
				break
			}
			head := g.h.Response(st, a.Fields)
			st.respStarted, st.status = true, status
			if s.down.c.SendHeaders(now, st.id, head, a.End, false) != nil {
				g.cancelUp(st, http2.ErrCodeCancel)
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
		g.touch(st)
	case DeliverData:
		st := u.streams[a.Stream]
		if st == nil || st.phase != phaseUpstream {
			u.c.Consumed(now, a.Stream, len(a.Data))
			return
		}
		g.sendDown(st, a.Data, a.End, now)
		g.touch(st)
	case DeliverReset:
		st := u.streams[a.Stream]
		if st == nil {
			return
		}
		delete(u.streams, a.Stream)
		st.appReset, st.appResetSet = a.Code, true
		g.touch(st)
		if st.phase != phaseUpstream {
			return
		}
		g.freed = true
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
			g.openUp(st, now)
			return
		}
		s := st.sess
		g.mark(&s.down)
		st.phase = phaseAnswered
		g.dropToUp(st, now)
		code := a.Code
		if u.lost {
			code = http2.ErrCodeInternal
		}
		if !st.respStarted {
			g.dropToDown(st, now)
			g.h.Failed(st, err)
			if !st.respStarted {
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
		g.dropToDown(st, now)
		s.down.c.Reset(now, st.id, code)
	case DeliverCredit:
		if a.Stream != 0 {
			if st := u.streams[a.Stream]; st != nil {
				g.pumpUp(st, now)
			}
			return
		}
		for _, st := range u.streams {
			if len(st.toUp) > 0 || st.toUpEnd && !st.upEndSent {
				g.pumpUp(st, now)
			}
		}
	case PeerGoAway:
		u.retiring = true
	case CloseConn:
		u.retiring = true
	}
}

// parseStatus reads a final response's :status (200 to 999).
func parseStatus(v string) (int, bool) {
	if len(v) != 3 {
		return 0, false
	}
	n := 0
	for i := range 3 {
		if v[i] < '0' || v[i] > '9' {
			return 0, false
		}
		n = n*10 + int(v[i]-'0')
	}
	return n, n >= 200
}

// errBadResponse is a response head without a valid :status.
var errBadResponse = errors.New("h2relay: the app's response has no valid :status")

// openUp opens st upstream on a pooled connection, or waits for one (a
// dial is started if the pool may grow).
func (g *group) openUp(st *Stream, now time.Time) {
	if st.phase != phaseHeld || st.done {
		return
	}
	end := st.reqEnded && len(st.toUp) == 0 && st.toUpTrailers == nil
	for _, u := range g.ups {
		if u.retiring {
			continue
		}
		id, err := u.c.Open(now, st.Head, end)
		if err != nil {
			continue
		}
		g.mark(&u.side)
		st.up, st.upID, st.phase, st.upEndSent = u, id, phaseUpstream, end
		u.streams[id] = st
		g.unpend(st)
		g.pumpUp(st, now)
		return
	}
	if !st.inPend {
		st.inPend = true
		g.pending = append(g.pending, st)
	}
	g.maybeDial()
}

// unpend takes st out of the pending list.
func (g *group) unpend(st *Stream) {
	if !st.inPend {
		return
	}
	st.inPend = false
	for i, p := range g.pending {
		if p == st {
			g.pending = append(g.pending[:i], g.pending[i+1:]...)
			return
		}
	}
}

// retryPending tries the pending streams again (a stream or connection
// left an upstream).
func (g *group) retryPending(now time.Time) {
	if len(g.pending) == 0 {
		return
	}
	p := append([]*Stream(nil), g.pending...)
	for _, st := range p {
		g.openUp(st, now)
	}
}

// maybeDial starts a dial if streams wait and the pool may grow.
func (g *group) maybeDial() {
	if g.dialing || g.closed || len(g.ups) >= g.r.cfg.MaxUpstreams {
		return
	}
	g.dialing = true
	go g.dialUp()
}

// dialUp makes an upstream connection; its goroutine then reads it.
func (g *group) dialUp() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	nc, err := g.r.cfg.Dial(ctx)
	cancel()
	now := g.lock()
	g.dialing = false
	if err == nil && g.closed {
		nc.Close()
		g.endTurn(now)
		return
	}
	if err != nil {
		p := g.pending
		g.pending = nil
		derr := &DialError{Err: err}
		for _, st := range p {
			st.inPend = false
			if st.done || st.phase != phaseHeld {
				continue
			}
			st.phase = phaseAnswered
			g.mark(&st.sess.down)
			g.dropToUp(st, now)
			g.h.Failed(st, derr)
			if !st.respStarted {
				st.sess.down.c.Reset(now, st.id, http2.ErrCodeRefusedStream)
			}
			g.touch(st)
		}
		g.endTurn(now)
		return
	}
	u, err := g.newUpstream(nc, now)
	if err != nil {
		nc.Close()
		g.endTurn(now)
		return
	}
	g.ups = append(g.ups, u)
	g.mark(&u.side)
	g.retryPending(now)
	g.endTurn(now)
	g.readUp(u)
}

func (g *group) newUpstream(nc net.Conn, now time.Time) (*upstream, error) {
	c, err := NewConn(g.r.cfg.Up, now)
	if err != nil {
		return nil, err
	}
	w, err := NewWriter(16 << 10)
	if err != nil {
		return nil, err
	}
	w.WriteRaw([]byte(http2.ClientPreface))
	u := &upstream{side: side{nc: nc, rw: rawio.New(nc), c: c, w: w}, streams: map[uint32]*Stream{}}
	u.up = u
	return u, nil
}

// sendUp passes data of the client's to st's upstream stream: what the
// app's windows allow now, the rest held (and not credited back to the
// client until it is sent).
func (g *group) sendUp(st *Stream, data []byte, end bool, now time.Time) {
	if len(st.toUp) == 0 && !st.upEndSent && st.toUpTrailers == nil {
		u := st.up
		g.mark(&u.side)
		n := min(len(data), u.c.SendWindow(st.upID))
		if n == len(data) {
			if u.c.SendData(now, st.upID, data, end) == nil {
				st.sess.down.c.Consumed(now, st.id, n)
				st.sentUp += int64(n)
				st.upEndSent = end
			}
			return
		}
		if n > 0 && u.c.SendData(now, st.upID, data[:n], false) == nil {
			st.sess.down.c.Consumed(now, st.id, n)
			st.sentUp += int64(n)
			data = data[n:]
		}
	}
	st.toUp = append(st.toUp, data...)
	st.toUpEnd = st.toUpEnd || end
}

// pumpUp sends what st holds for the app as far as the windows allow.
func (g *group) pumpUp(st *Stream, now time.Time) {
	if st.phase != phaseUpstream || st.upEndSent {
		return
	}
	u := st.up
	down := &st.sess.down
	g.mark(&u.side)
	g.mark(down)
	for len(st.toUp) > 0 {
		n := min(len(st.toUp), u.c.SendWindow(st.upID))
		if n == 0 {
			return
		}
		end := n == len(st.toUp) && st.toUpEnd && st.toUpTrailers == nil
		if u.c.SendData(now, st.upID, st.toUp[:n], end) != nil {
			return
		}
		down.c.Consumed(now, st.id, n)
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
func (g *group) dropToUp(st *Stream, now time.Time) {
	if len(st.toUp) > 0 {
		g.mark(&st.sess.down)
		st.sess.down.c.Consumed(now, st.id, len(st.toUp))
	}
	st.toUp, st.toUpTrailers = nil, nil
}

// sendDown passes data of the app's to the client: what the client's
// windows allow now, the rest held (and not credited back to the app
// until it is sent).
func (g *group) sendDown(st *Stream, data []byte, end bool, now time.Time) {
	down := &st.sess.down
	g.mark(down)
	if len(st.toDown) == 0 && !st.downEndSent && st.toDownTrailers == nil {
		n := min(len(data), down.c.SendWindow(st.id))
		if n == len(data) {
			if down.c.SendData(now, st.id, data, end) == nil {
				g.creditUp(st, n, now)
				st.bytes += int64(n)
				st.lastDown = now
				st.downEndSent = end
			}
			return
		}
		if n > 0 && down.c.SendData(now, st.id, data[:n], false) == nil {
			g.creditUp(st, n, now)
			st.bytes += int64(n)
			st.lastDown = now
			data = data[n:]
		}
	}
	st.toDown = append(st.toDown, data...)
	st.toDownEnd = st.toDownEnd || end
}

// creditUp gives n bytes the client took back to the app (to its
// connection only, once the app's stream closed).
func (g *group) creditUp(st *Stream, n int, now time.Time) {
	if st.up != nil && !st.localBody {
		g.mark(&st.up.side)
		st.up.c.Consumed(now, st.upID, n)
	}
}

// pumpDown sends what st holds for the client as far as the windows allow.
func (g *group) pumpDown(st *Stream, now time.Time) {
	if st.downEndSent {
		return
	}
	down := &st.sess.down
	g.mark(down)
	for len(st.toDown) > 0 {
		n := min(len(st.toDown), down.c.SendWindow(st.id))
		if n == 0 {
			return
		}
		end := n == len(st.toDown) && st.toDownEnd && st.toDownTrailers == nil
		if down.c.SendData(now, st.id, st.toDown[:n], end) != nil {
			return
		}
		g.creditUp(st, n, now)
		st.bytes += int64(n)
		st.lastDown = now
		st.downEndSent = end
		st.toDown = st.toDown[n:]
	}
	st.toDown = nil
	switch {
	case st.downEndSent:
	case st.toDownTrailers != nil:
		if down.c.SendHeaders(now, st.id, st.toDownTrailers, true, false) == nil {
			st.downEndSent = true
		}
		st.toDownTrailers = nil
	case st.toDownEnd:
		if down.c.SendData(now, st.id, nil, true) == nil {
			st.downEndSent = true
		}
	}
	g.touch(st)
}

// cancelUp resets st's upstream stream, if it has one open, and drops
// what the stream holds for either side (credited back).
func (g *group) cancelUp(st *Stream, code http2.ErrCode) {
	if st.phase == phaseUpstream && st.up != nil {
		g.mark(&st.up.side)
		st.up.c.Reset(g.now, st.upID, code)
		delete(st.up.streams, st.upID)
		g.freed = true
	}
	g.dropToUp(st, g.now)
	if !st.localBody {
		g.dropToDown(st, g.now)
	}
}

// dropToDown forgets what st holds for the client and credits it back to
// the app.
func (g *group) dropToDown(st *Stream, now time.Time) {
	if len(st.toDown) > 0 {
		g.creditUp(st, len(st.toDown), now)
	}
	st.toDown, st.toDownTrailers = nil, nil
}

// settle ends what is left of a stream whose state changed: a response
// that ended while the client still sends stops the client (RST_STREAM
// NO_ERROR), a client that went cancels the app's stream, and a stream
// closed on both sides is done.
func (g *group) settle(st *Stream, now time.Time) {
	if st.done {
		return
	}
	s := st.sess
	downOpen := s.down.c.StreamOpen(st.id)
	upOpen := st.phase == phaseUpstream && st.up != nil && st.up.c.StreamOpen(st.upID)
	if downOpen && !upOpen && st.downEndSent {
		g.mark(&s.down)
		s.down.c.Reset(now, st.id, http2.ErrCodeNo)
		downOpen = false
	}
	if !downOpen && upOpen {
		g.cancelUp(st, http2.ErrCodeCancel)
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
		g.freed = true
	}
	g.unpend(st)
	g.dropToUp(st, now)
	g.dropToDown(st, now)
	g.done = append(g.done, st)
}

// retire drains the group's upstream connections (the relay drains and
// its last connection ended): each closes after its last stream.
func (g *group) retire(now time.Time) {
	for _, u := range g.ups {
		u.retiring = true
		g.mark(&u.side)
		u.c.Drain(now)
	}
}

// cut closes every socket of the group.
func (g *group) cut() {
	g.mu.Lock()
	g.closed = true
	g.timer.Stop()
	for s := range g.sessions {
		s.down.nc.Close()
	}
	for _, u := range g.ups {
		u.nc.Close()
	}
	g.mu.Unlock()
}
