package h2relay

import (
	"bufio"
	"io"
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
	// ep is the event loop's hold on the socket (nil: a reader goroutine
	// reads it).
	ep *esock
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
	pools    map[string]*upPool // by Stream.Target
	opening  []*Stream          // admitted this turn, opened at its end
	freed    bool               // a stream left an upstream this turn: pending ones may fit
	closed   bool
	// rewindOK: the handler is in a callback where Stream.Rewind may
	// take its stream back (Failed, Response).
	rewindOK bool

	timer   *time.Timer
	timerAt time.Time
	// loop reads the group's TCP sockets (eploop_linux.go); nil where
	// there is none: a reader goroutine per socket.
	loop *eploop

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
	g := &group{r: r, h: r.cfg.Handler, sessions: map[*session]struct{}{}, pools: map[string]*upPool{}}
	if !r.cfg.NoEventLoop {
		g.loop = newEploop(g)
	}
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

// newFramer reads frames from r as the relay's Conns expect them.
func newFramer(r io.Reader, cfg *Config) *http2.Framer {
	fr := http2.NewFramer(nil, r)
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
	for _, p := range g.pools {
		for _, u := range p.ups {
			g.mark(&u.side)
			u.c.Tick(now)
		}
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
	g.claimAndUnlock(now, false)
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
// writes them and tells the handler of the streams that ended. The event
// loop's writes (loop) do not block: what a socket does not take at once
// goes on in a goroutine.
func (g *group) claimAndUnlock(now time.Time, loop bool) {
	// Each goroutine its own list: it is read after the unlock.
	var fbuf [4]*side
	flush := fbuf[:0]
	claim := func(sd *side) {
		if sd.shut || sd.writing {
			if !sd.shut && sd.writing && sd.w.Buffered() > g.r.cfg.MaxBuffered {
				// The peer takes nothing while the relay has much more
				// for it than the windows should allow: cut it.
				sd.shut = true
				sd.close()
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
		if loop {
			g.tryWrite(sd, now)
			continue
		}
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
			sd.close()
		}
		g.mu.Unlock()
		return
	}
}

// tryWrite is write for the event loop: it writes what the socket takes
// now, and hands the rest to a goroutine of its own.
func (g *group) tryWrite(sd *side, now time.Time) {
	if sd.ep == nil {
		go g.write(sd, now)
		return
	}
	for {
		n, err := sd.ep.tryWrite(sd.out)
		if err == nil && n < len(sd.out) {
			sd.out = sd.out[n:]
			go g.write(sd, now)
			return
		}
		g.mu.Lock()
		sd.out = sd.out[:0]
		if err == nil && sd.w.Buffered() > 0 && !sd.shut {
			sd.out = sd.w.Take(sd.out)
			g.mu.Unlock()
			continue
		}
		sd.writing = false
		if (err != nil || sd.closing) && !sd.shut {
			sd.shut = true
			sd.close()
		}
		g.mu.Unlock()
		return
	}
}

// close closes the side's socket (group locked); one the event loop reads
// is shut down instead, and closed by the loop once it read its end.
func (sd *side) close() {
	if sd.ep != nil && !sd.ep.ended {
		sd.ep.shutdown()
		return
	}
	sd.nc.Close()
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
				p := u.pool
				for k, q := range p.ups {
					if q == u {
						p.ups = append(p.ups[:k], p.ups[k+1:]...)
						break
					}
				}
				g.closers = append(g.closers, &u.side)
				if len(p.pending) > 0 {
					g.freed = true
				}
				g.forget(p)
			}
		}
	}
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

// cut closes every socket of the group.
func (g *group) cut() {
	g.mu.Lock()
	g.closed = true
	g.timer.Stop()
	for s := range g.sessions {
		s.down.shut = true
		s.down.close()
	}
	for _, p := range g.pools {
		for _, u := range p.ups {
			u.shut = true
			u.close()
		}
	}
	g.mu.Unlock()
}
