package h2relay

import (
	"bufio"
	"context"
	"errors"
	"net"
	"time"

	"golang.org/x/net/http2"

	"github.com/nomad-serverless/nomad-serverless/datapath/rawio"
)

// The group's pool of upstream connections: reading them, relaying what
// the app sends, opening streams on them, dialling more.

// upstream is one pooled connection to the app, shared by the group's
// sessions.
type upstream struct {
	side
	pool     *upPool
	streams  map[uint32]*Stream // by upstream stream ID
	retiring bool               // GOAWAY from the app or closing: no new streams
	lost     bool               // the socket failed (not a protocol error)
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
			g.rewindOK = true
			st.rewound = false
			head := g.h.Response(st, a.Fields)
			g.rewindOK = false
			if st.rewound {
				// The handler sends the stream again (the instance
				// said the app did not serve it); this answer goes no
				// further.
				st.rewound = false
				break
			}
			if st.phase == phaseAnswered {
				break // answered by the handler instead
			}
			st.respStarted, st.status = true, status
			st.replay, st.replayLost = nil, true
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
		code := a.Code
		if u.lost {
			code = http2.ErrCodeInternal
		}
		if !st.respStarted {
			g.dropToDown(st, now)
			// Nothing is upstream now: held, for Rewind.
			st.phase, st.up, st.upID = phaseHeld, nil, 0
			if g.failed(st, err) {
				return
			}
			st.phase = phaseAnswered
			g.dropToUp(st, now)
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
		st.phase = phaseAnswered
		g.dropToUp(st, now)
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

// upPool is a group's connections to one upstream target (Stream.Target:
// the app's address in the sidecar, "" there; an instance's in the
// gateway), and the streams waiting for one of them.
type upPool struct {
	target  string
	ups     []*upstream
	pending []*Stream // admitted, waiting for an upstream stream
	dialing bool
}

// pool returns the group's pool for target, made on first use.
func (g *group) pool(target string) *upPool {
	if p := g.pools[target]; p != nil {
		return p
	}
	p := &upPool{target: target}
	g.pools[target] = p
	return p
}

// forget drops a pool with nothing left in it (targets come and go: the
// gateway's instances).
func (g *group) forget(p *upPool) {
	if len(p.ups) == 0 && len(p.pending) == 0 && !p.dialing && g.pools[p.target] == p {
		delete(g.pools, p.target)
	}
}

// openUp opens st upstream on a pooled connection to its target, or
// waits for one (a dial is started if the pool may grow).
func (g *group) openUp(st *Stream, now time.Time) {
	if st.phase != phaseHeld || st.done {
		return
	}
	end := st.reqEnded && len(st.toUp) == 0 && st.toUpTrailers == nil
	p := g.pool(st.Target)
	for _, u := range p.ups {
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
		st.pendIn = p
		p.pending = append(p.pending, st)
	}
	g.maybeDial(p)
}

// unpend takes st out of its pool's pending list.
func (g *group) unpend(st *Stream) {
	if !st.inPend {
		return
	}
	st.inPend = false
	p := st.pendIn
	st.pendIn = nil
	for i, q := range p.pending {
		if q == st {
			p.pending = append(p.pending[:i], p.pending[i+1:]...)
			break
		}
	}
	g.forget(p)
}

// retryPending tries the pending streams again (a stream or connection
// left an upstream).
func (g *group) retryPending(now time.Time) {
	for _, p := range g.pools {
		if len(p.pending) == 0 {
			continue
		}
		q := append([]*Stream(nil), p.pending...)
		for _, st := range q {
			g.openUp(st, now)
		}
	}
}

// maybeDial starts a dial if streams wait and the pool may grow.
func (g *group) maybeDial(p *upPool) {
	if p.dialing || g.closed || len(p.ups) >= g.r.cfg.MaxUpstreams {
		return
	}
	p.dialing = true
	go g.dialUp(p)
}

// dialUp makes an upstream connection of pool p; its goroutine then
// reads it.
func (g *group) dialUp(p *upPool) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	nc, err := g.r.cfg.Dial(ctx, p.target)
	cancel()
	now := g.lock()
	p.dialing = false
	if err == nil && g.closed {
		nc.Close()
		g.endTurn(now)
		return
	}
	if err != nil {
		q := p.pending
		p.pending = nil
		g.forget(p)
		derr := &DialError{Err: err}
		for _, st := range q {
			st.inPend, st.pendIn = false, nil
			if st.done || st.phase != phaseHeld {
				continue
			}
			g.mark(&st.sess.down)
			if g.failed(st, derr) {
				continue // opened again elsewhere, or held anew
			}
			st.phase = phaseAnswered
			g.dropToUp(st, now)
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
		g.forget(p)
		g.endTurn(now)
		return
	}
	u.pool = p
	p.ups = append(p.ups, u)
	g.mark(&u.side)
	if g.loop != nil {
		cfg := u.c.cfg
		if _, ok := g.loop.add(&u.side, nil, &cfg); ok {
			// The event loop reads it from now on.
			g.retryPending(now)
			g.endTurn(now)
			return
		}
	}
	g.retryPending(now)
	g.endTurn(now)
	g.readUp(u)
}

// failed tells the handler that st's upstream side failed before a
// response started; true: the handler took the stream back (Rewind) to
// open it again, and it is not to be answered.
func (g *group) failed(st *Stream, err error) bool {
	g.rewindOK = true
	st.rewound = false
	g.h.Failed(st, err)
	g.rewindOK = false
	if st.rewound {
		st.rewound = false
		g.touch(st)
		return true
	}
	return false
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

// retire drains the group's upstream connections (the relay drains and
// its last connection ended): each closes after its last stream.
func (g *group) retire(now time.Time) {
	for _, p := range g.pools {
		for _, u := range p.ups {
			u.retiring = true
			g.mark(&u.side)
			u.c.Drain(now)
		}
	}
}
